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
    /// Ids that were members once and are not now; never to be used again.
    #[serde(default)]
    pub retired: Vec<u64>,
    /// Log index of the membership configuration in effect on this node.
    #[serde(default)]
    pub membership_index: Option<u64>,
    /// Whether that configuration is committed; a change is in flight until it is.
    #[serde(default)]
    pub membership_committed: bool,
    /// Whether the configuration is joint (old and new voters both decide).
    #[serde(default)]
    pub joint: bool,
    /// Whether this node was removed from the cluster: it serves nothing, and its process
    /// should be stopped and its data directory wiped.
    #[serde(default)]
    pub removed: bool,
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

/// `POST /admin/add-learner`: a new node that replicates without voting; its id is never
/// one that was a member before.
pub type AddLearnerJson = MemberJson;

/// `POST /admin/promote`, `/admin/remove`, `/admin/transfer-leader`: one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeIdJson {
    /// The node.
    pub id: u64,
}

/// `POST /admin/restore`'s answer: what the node installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreJson {
    /// Log index the restored state sits at in the new cluster.
    pub applied_index: u64,
    /// The restored state's hash; equal to the backup's.
    pub state_hash: String,
    /// Live tasks restored.
    pub tasks: u64,
}

/// Header of `POST /admin/restore` carrying the new cluster's members as
/// [`InitRequestJson`] JSON (the body is the backup itself).
pub const RESTORE_MEMBERS_HEADER: &str = "x-rota-restore-members";

/// Header of `GET /admin/backup` naming the log index the backup covers.
pub const BACKUP_INDEX_HEADER: &str = "x-rota-applied-index";

/// Header of `GET /admin/backup` carrying the backup's state hash (hex SHA-256 of its
/// canonical body).
pub const BACKUP_HASH_HEADER: &str = "x-rota-state-hash";

/// Largest backup `POST /admin/restore` accepts: about 90 million small tasks, more than
/// a node holds in memory. A larger body is refused with 413 before it is read.
pub const RESTORE_BYTES_MAX: usize = 4 << 30;

/// Parses a member list `ID=API_HOST:PORT/RAFT_HOST:PORT,...` (the `--initial-cluster`
/// syntax of `rota-node` and `rota`), or says what is wrong with it.
pub fn parse_members(list: &str) -> Result<Vec<MemberJson>, String> {
    let mut members: Vec<MemberJson> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addrs) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not ID=API_ADDR/RAFT_ADDR"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|&id| id > 0)
            .ok_or_else(|| format!("{id:?} is not a positive node id"))?;
        let (api_addr, raft_addr) = addrs
            .split_once('/')
            .filter(|(api, raft)| api.contains(':') && raft.contains(':'))
            .ok_or_else(|| format!("{addrs:?} is not API_HOST:PORT/RAFT_HOST:PORT"))?;
        if members.iter().any(|m| m.id == id) {
            return Err(format!("node {id} is listed twice"));
        }
        members.push(MemberJson {
            id,
            api_addr: api_addr.to_string(),
            raft_addr: raft_addr.to_string(),
        });
    }
    members.sort_by_key(|m| m.id);
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lists_parse_or_say_what_is_wrong() {
        let members =
            parse_members("2=h2:7002/h2:8002, 1=127.0.0.1:7001/127.0.0.1:8001").expect("parses");
        assert_eq!(members.iter().map(|m| m.id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(members[1].raft_addr, "h2:8002");
        assert!(
            parse_members("0=a:1/b:2")
                .expect_err("refused")
                .contains("positive")
        );
        assert!(
            parse_members("1=a:1")
                .expect_err("refused")
                .contains("RAFT")
        );
        assert!(
            parse_members("1=a:1/b:2,1=c:1/d:2")
                .expect_err("refused")
                .contains("twice")
        );
        assert!(parse_members("x").expect_err("refused").contains("ID="));
    }
}
