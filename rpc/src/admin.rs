//! The admin and status API's JSON shapes (SPEC section 3).

use serde::Deserialize;
use serde::Serialize;

/// `GET /cluster`: this node's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatusJson {
    /// This node's id.
    pub id: u64,
    /// The leader this node knows of.
    pub leader: Option<u64>,
    /// Current term.
    pub term: u64,
    /// Highest log index known committed.
    pub commit_index: Option<u64>,
    /// Highest log index applied to this node's state machine.
    pub applied_index: Option<u64>,
    /// Last log index covered by this node's current snapshot.
    pub snapshot_index: Option<u64>,
    /// Last log index purged from this node's log.
    pub purged_index: Option<u64>,
    /// Log time of the last applied entry, milliseconds since the Unix epoch.
    pub applied_time_ms: i64,
    /// Voting members.
    pub voters: Vec<u64>,
    /// Non-voting members.
    pub learners: Vec<u64>,
    /// Every member with its addresses and, seen from the leader, its lag.
    pub nodes: Vec<NodeStatusJson>,
}

/// One member in [`ClusterStatusJson`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatusJson {
    /// Node id.
    pub id: u64,
    /// Where workers reach it (`host:port`).
    pub api_addr: String,
    /// Where Raft traffic goes (`host:port`).
    pub raft_addr: String,
    /// `leader`, `follower`, `learner` or `candidate`, as this node sees it.
    pub role: String,
    /// Entries it is behind the leader's log; known only on the leader.
    pub lag: Option<u64>,
}

/// `POST /admin/init`: form a cluster from these members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitRequestJson {
    /// The initial voters.
    pub members: Vec<MemberJson>,
}

/// A member's id and addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberJson {
    /// Node id; never reused.
    pub id: u64,
    /// Where workers reach it (`host:port`).
    pub api_addr: String,
    /// Where Raft traffic goes (`host:port`).
    pub raft_addr: String,
}

/// `GET /ready` and `GET /health` bodies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeJson {
    /// `ok`, or what is missing.
    pub status: String,
}

/// `GET /admin/state-hash`: the applied state's hash, to compare replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHashJson {
    /// Log index the state is at.
    pub applied_index: Option<u64>,
    /// SHA-256 of the canonical snapshot encoding, in hex.
    pub state_hash: String,
    /// Live tasks.
    pub tasks: u64,
}

/// `POST /admin/add-learner`: a new node that replicates without voting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddLearnerJson {
    /// The new node's id; never one that was a member before.
    pub id: u64,
    /// Where workers reach it (`host:port`).
    pub api_addr: String,
    /// Where Raft traffic goes (`host:port`).
    pub raft_addr: String,
}

/// `POST /admin/promote`, `/admin/remove`, `/admin/transfer-leader`: one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeIdJson {
    /// The node.
    pub id: u64,
}
