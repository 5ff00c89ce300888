//! The openraft types Rota's storage is written for.
//!
//! The storage is generic over [`RotaConfig`], openraft's type configuration with every
//! type fixed except the async runtime: production uses tokio, the simulation madsim.

use std::fmt;
use std::sync::Arc;

use openraft::RaftTypeConfig;
use serde::Deserialize;
use serde::Serialize;

use crate::machine::Command;
use crate::machine::Outcome;

/// A node's identity; never reused once it has been a member.
pub type NodeId = u64;

/// Raft term.
pub type Term = u64;

/// Leader identity (openraft's "advanced" leader id, which is also the committed one).
pub type RotaLeaderId = openraft::impls::leader_id_adv::LeaderId<Term, NodeId>;

/// Position of an entry in the log.
pub type RotaLogId = openraft::LogId<RotaLeaderId>;

/// A node's vote.
pub type RotaVote = openraft::impls::Vote<RotaLeaderId>;

/// What a log entry carries.
pub type RotaPayload = openraft::EntryPayload<Command, NodeId, RotaNode>;

/// One log entry.
pub type RotaEntry = openraft::Entry<RotaLeaderId, RotaPayload>;

/// A membership configuration with the log id that set it.
pub type RotaStoredMembership = openraft::StoredMembership<RotaLeaderId, NodeId, RotaNode>;

/// Metadata of a snapshot.
pub type RotaSnapshotMeta = openraft::SnapshotMeta<RotaLeaderId, NodeId, RotaNode>;

/// The state machine's answer to one entry.
pub type Response = Arc<Outcome>;

/// A snapshot's bytes (see [`crate::snapshot`]), in memory or on disk; shared, not
/// copied, between the store, the network and the state machine.
pub use crate::snapshot_data::SnapshotData;

/// A snapshot with its metadata.
pub type RotaSnapshot = openraft::Snapshot<RotaLeaderId, NodeId, RotaNode, SnapshotData>;

/// The addresses of one member, as stored in the membership configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotaNode {
    /// Where workers reach this node's HTTP API (`host:port`).
    pub api_addr: String,
    /// Where other nodes send Raft traffic (`host:port`).
    pub raft_addr: String,
}

impl fmt::Display for RotaNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "api={} raft={}", self.api_addr, self.raft_addr)
    }
}

/// openraft's type configuration as Rota's storage needs it: every type fixed but the
/// runtime. Declare one with [`openraft::declare_raft_types!`] giving `D = Command`,
/// `R = Response`, `Node = RotaNode` and an `AsyncRuntime`; the defaults fill the rest.
pub trait RotaConfig:
    RaftTypeConfig<
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = RotaNode,
        Term = Term,
        LeaderId = RotaLeaderId,
        Vote = RotaVote,
        Payload = RotaPayload,
        Entry = RotaEntry,
    >
{
}

impl<C> RotaConfig for C where
    C: RaftTypeConfig<
            D = Command,
            R = Response,
            NodeId = NodeId,
            Node = RotaNode,
            Term = Term,
            LeaderId = RotaLeaderId,
            Vote = RotaVote,
            Payload = RotaPayload,
            Entry = RotaEntry,
        >
{
}

/// How the log store treats durability (SPEC section 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncMode {
    /// fsync every append before reporting it durable (the seed's strict journaling).
    #[default]
    Always,
    /// Leave flushing to the OS (opportunistic journaling): a crash of every node at
    /// once may lose acknowledged writes; a process crash loses nothing.
    Never,
}
