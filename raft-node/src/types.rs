//! The node's concrete openraft types: Rota's [`store_sm::raft_types::RotaConfig`] on the
//! runtime of [`crate::runtime`], with the snapshot store of [`crate::storage`].

use store_sm::machine::Command;
use store_sm::raft_types::Response;
use store_sm::raft_types::RotaNode;
use store_sm::state_machine::TaskStateMachine;

use crate::storage::NodeSnapshots;

openraft::declare_raft_types!(
    /// Rota's Raft types as the node runs them.
    pub NodeTypes:
        D = Command,
        R = Response,
        Node = RotaNode,
        AsyncRuntime = crate::runtime::NodeRuntime,
);

/// The state machine as the node runs it.
pub type NodeStateMachine = TaskStateMachine<NodeTypes, NodeSnapshots>;

/// The Raft handle.
pub type NodeRaft = openraft::Raft<NodeTypes, NodeStateMachine>;
