//! The node's concrete openraft types: Rota's [`store_sm::raft_types::RotaConfig`] on the
//! tokio runtime, with RocksDB and a snapshot directory as storage.

use store_sm::machine::Command;
use store_sm::raft_types::Response;
use store_sm::raft_types::RotaNode;
use store_sm::rocks::RocksLogStore;
use store_sm::snapshot_dir::SnapshotDir;
use store_sm::state_machine::TaskStateMachine;

openraft::declare_raft_types!(
    /// Rota's Raft types for the production runtime.
    pub NodeTypes:
        D = Command,
        R = Response,
        Node = RotaNode,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The state machine as the node runs it.
pub type NodeStateMachine = TaskStateMachine<NodeTypes, SnapshotDir>;

/// The log store as the node runs it.
pub type NodeLogStore = RocksLogStore;

/// The Raft handle.
pub type NodeRaft = openraft::Raft<NodeTypes, NodeStateMachine>;
