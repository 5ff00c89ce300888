//! The admin and status API's JSON shapes (SPEC section 3).

use schemars::JsonSchema;
use serde::Deserialize;
use serde::Serialize;

/// `GET /cluster`: this node's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "ClusterStatus")]
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
    /// The newest log entry form every member is recorded to read (0 until one is):
    /// once it is set, the cluster's upgrade is complete and new learners must read it.
    #[serde(default)]
    pub log_form: u32,
    /// Every member with its addresses and, seen from the leader, its lag.
    pub nodes: Vec<NodeStatusJson>,
}

/// One member in `GET /cluster`'s `nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NodeStatus")]
pub struct NodeStatusJson {
    /// Node id.
    pub id: u64,
    /// Where workers reach it (`host:port`).
    pub api_addr: String,
    /// Where Raft traffic goes (`host:port`).
    pub raft_addr: String,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`, as this node sees it.
    #[schemars(transform = crate::schema::node_role)]
    pub role: String,
    /// Entries it is behind the leader's log; known only on the leader.
    pub lag: Option<u64>,
}

/// `POST /admin/init`: form a cluster from these members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "InitRequest")]
pub struct InitRequestJson {
    /// The initial voters.
    pub members: Vec<MemberJson>,
}

/// A member's id and addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Member")]
pub struct MemberJson {
    /// Node id; never reused.
    pub id: u64,
    /// Where workers reach it (`host:port`).
    pub api_addr: String,
    /// Where Raft traffic goes (`host:port`).
    pub raft_addr: String,
}

/// `GET /ready` and `GET /health` bodies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Probe")]
pub struct ProbeJson {
    /// `ok`, or what is missing.
    pub status: String,
}

/// `GET /admin/state-hash`: the applied state's hash, to compare replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "StateHash")]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "NodeId")]
pub struct NodeIdJson {
    /// The node.
    pub id: u64,
}

/// `POST /admin/restore`'s answer: what the node installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Restore")]
pub struct RestoreJson {
    /// Log index the restored state sits at in the new cluster.
    pub applied_index: u64,
    /// The backup's state hash, as its file records it: the node read the backup intact.
    pub state_hash: String,
    /// The hash of the state the new cluster starts from: the backup's, with log time
    /// moved to the restore and task ids above a floor from it. Every member holds it.
    pub restored_state_hash: String,
    /// Live tasks restored.
    pub tasks: u64,
    /// The id the new cluster's next task version gets: above every id the backed-up
    /// cluster issued, also after the backup.
    pub next_id: u64,
    /// The new cluster's log time at the restore, in ms since the Unix epoch.
    pub log_time: i64,
}

/// Header of `POST /admin/restore` carrying the new cluster's members as
/// [`InitRequestJson`] JSON (the body is the backup itself).
pub const RESTORE_MEMBERS_HEADER: &str = "x-rota-restore-members";

/// Header of `GET /admin/backup` naming the log index the backup covers.
pub const BACKUP_INDEX_HEADER: &str = "x-rota-applied-index";

/// Header of `GET /admin/backup` carrying the backup's state hash (hex SHA-256 of its
/// canonical body).
pub const BACKUP_HASH_HEADER: &str = "x-rota-state-hash";

/// Default of a node's `--snapshot-max-bytes`, the largest backup `POST /admin/restore`
/// accepts and the largest snapshot a follower accepts: about 90 million small tasks,
/// more than a node holds in memory. A larger body is refused with 413.
pub const RESTORE_BYTES_MAX: usize = 4 << 30;

/// How far behind a node may be and still count as caught up, in log entries: a learner
/// this close to the leader's log may be promoted (the next commits will not wait on it),
/// and a node whose applied index is this close to its commit index is ready.
pub const CAUGHT_UP_ENTRIES_MAX: u64 = 100;

/// An id that may be added as a learner, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewLearner {
    /// No member has or had the id: add the node.
    New,
    /// The node is a learner already, with the same addresses: this is a retry of the
    /// same add and passes.
    AlreadyAdded,
}

/// Why an id cannot become a learner: an id names one data directory for the life of the
/// cluster, and a reused id could vote with another node's history.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LearnerIdError {
    /// Node ids start at 1 (0 stands for no node).
    #[error("node ids start at 1")]
    Zero,
    /// The id is a voter's.
    #[error("node {id} is already a voter; nothing to add, and a new node needs a new id")]
    Voter {
        /// The id.
        id: u64,
    },
    /// The id is a learner's, at other addresses.
    #[error(
        "node {id} is already a learner at {api_addr} / {raft_addr}; remove it first or choose a new id"
    )]
    OtherLearner {
        /// The id.
        id: u64,
        /// The learner's API address.
        api_addr: String,
        /// The learner's Raft address.
        raft_addr: String,
    },
    /// The id was a member once.
    #[error(
        "node id {id} was a member before and ids are never reused; start the new node with a new --id and an empty data directory (retired ids: {})",
        id_list(retired)
    )]
    Retired {
        /// The id.
        id: u64,
        /// Every retired id, so the operator sees which to avoid.
        retired: Vec<u64>,
    },
    /// An address is another member's (or both of the new node's addresses are one):
    /// one process would then answer for two members, and Raft traffic meant for one
    /// would reach the other.
    #[error(
        "address {addr} is node {owner}'s; give node {id} an API and a Raft address of its own"
    )]
    AddressTaken {
        /// The new node's id.
        id: u64,
        /// The address.
        addr: String,
        /// The member it belongs to.
        owner: u64,
    },
}

impl LearnerIdError {
    /// Whether the request itself is malformed (HTTP 400) rather than in conflict with
    /// the cluster's members (HTTP 409).
    pub fn is_malformed(&self) -> bool {
        matches!(self, Self::Zero)
            || matches!(self, Self::AddressTaken { id, owner, .. } if id == owner)
    }
}

/// Node ids as messages show them: `1,2,3`, or `none`.
pub fn id_list(ids: &[u64]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// Whether `member` may be added as a learner to the cluster that `cluster` describes
/// (the leader's view): its id must be above 0, belong to no voter, to no learner at
/// other addresses, and to no former member, and its two addresses must be its own. The one rule for the node's
/// `/admin/add-learner` and the CLI's check before it.
pub fn check_new_learner(
    cluster: &ClusterStatusJson,
    member: &MemberJson,
) -> Result<NewLearner, LearnerIdError> {
    let id = member.id;
    if id == 0 {
        return Err(LearnerIdError::Zero);
    }
    if cluster.voters.contains(&id) {
        return Err(LearnerIdError::Voter { id });
    }
    if let Some(current) = cluster.nodes.iter().find(|n| n.id == id) {
        if current.api_addr == member.api_addr && current.raft_addr == member.raft_addr {
            return Ok(NewLearner::AlreadyAdded);
        }
        return Err(LearnerIdError::OtherLearner {
            id,
            api_addr: current.api_addr.clone(),
            raft_addr: current.raft_addr.clone(),
        });
    }
    if cluster.retired.contains(&id) {
        return Err(LearnerIdError::Retired {
            id,
            retired: cluster.retired.clone(),
        });
    }
    if member.api_addr == member.raft_addr {
        return Err(LearnerIdError::AddressTaken {
            id,
            addr: member.api_addr.clone(),
            owner: id,
        });
    }
    for node in &cluster.nodes {
        for addr in [&member.api_addr, &member.raft_addr] {
            if *addr == node.api_addr || *addr == node.raft_addr {
                return Err(LearnerIdError::AddressTaken {
                    id,
                    addr: addr.clone(),
                    owner: node.id,
                });
            }
        }
    }
    Ok(NewLearner::New)
}

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
        members.push(MemberJson {
            id,
            api_addr: api_addr.to_string(),
            raft_addr: raft_addr.to_string(),
        });
    }
    check_members(&members)?;
    members.sort_by_key(|m| m.id);
    Ok(members)
}

/// Checks a new cluster's member list (init, restore): ids positive and each listed
/// once, and no address given to two members or as both addresses of one, since one
/// process would then answer for two.
pub fn check_members(members: &[MemberJson]) -> Result<(), String> {
    let mut ids = std::collections::BTreeSet::new();
    let mut addrs: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for member in members {
        let id = member.id;
        if id == 0 {
            return Err("node id 0 is not a positive node id".into());
        }
        if !ids.insert(id) {
            return Err(format!("node {id} is listed twice"));
        }
        for addr in [member.api_addr.as_str(), member.raft_addr.as_str()] {
            if let Some(other) = addrs.insert(addr, id) {
                return Err(format!(
                    "address {addr} is given to node {other} and to node {id}; each node needs addresses of its own"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_list_names_each_node_and_address_once() {
        assert_eq!(
            check_members(&[member(1, "a:1", "r:1"), member(2, "a:2", "r:2")]),
            Ok(())
        );
        for (members, says) in [
            (
                vec![member(1, "a:1", "r:1"), member(1, "a:2", "r:2")],
                "node 1 is listed twice",
            ),
            (
                vec![member(1, "a:1", "r:1"), member(2, "a:2", "r:1")],
                "address r:1",
            ),
            (vec![member(1, "a:1", "a:1")], "address a:1"),
            (vec![member(0, "a:1", "r:1")], "node id 0"),
        ] {
            let error = check_members(&members).expect_err(says);
            assert!(error.contains(says), "{error}");
        }
        assert!(
            parse_members("1=a:1/r:1,2=a:2/r:1").is_err(),
            "the CLI's parser too"
        );
    }

    fn member(id: u64, api_addr: &str, raft_addr: &str) -> MemberJson {
        MemberJson {
            id,
            api_addr: api_addr.into(),
            raft_addr: raft_addr.into(),
        }
    }

    /// Voters 1 and 2, learner 3 at a:3/r:3, node 4 retired; parsed from JSON, as a
    /// client reads it, so that fields added later with a default change nothing here.
    fn cluster() -> ClusterStatusJson {
        let node = |id: u64, role: &str| {
            format!(
                r#"{{"id":{id},"api_addr":"a:{id}","raft_addr":"r:{id}","role":"{role}","lag":0}}"#
            )
        };
        let nodes = [node(1, "leader"), node(2, "follower"), node(3, "learner")].join(",");
        let json = format!(
            r#"{{"id":1,"leader":1,"term":2,"commit_index":9,"applied_index":9,
                "snapshot_index":null,"purged_index":null,"applied_time_ms":0,
                "voters":[1,2],"learners":[3],"retired":[4],"membership_index":8,
                "membership_committed":true,"joint":false,"nodes":[{nodes}]}}"#
        );
        serde_json::from_str(&json).expect("a cluster status")
    }

    #[test]
    fn a_learner_id_is_new_or_a_retry_and_never_reused() {
        let cluster = cluster();
        let check = |m: MemberJson| check_new_learner(&cluster, &m);
        assert_eq!(check(member(5, "a:5", "r:5")), Ok(NewLearner::New));
        assert_eq!(check(member(3, "a:3", "r:3")), Ok(NewLearner::AlreadyAdded));
        assert_eq!(check(member(0, "a:0", "r:0")), Err(LearnerIdError::Zero));
        assert_eq!(
            check(member(2, "a:2", "r:2")),
            Err(LearnerIdError::Voter { id: 2 })
        );
        assert_eq!(
            check(member(3, "a:9", "r:3")),
            Err(LearnerIdError::OtherLearner {
                id: 3,
                api_addr: "a:3".into(),
                raft_addr: "r:3".into()
            })
        );
        assert_eq!(
            check(member(4, "a:4", "r:4")),
            Err(LearnerIdError::Retired {
                id: 4,
                retired: vec![4]
            })
        );
        let taken = check(member(5, "a:5", "r:3"));
        assert_eq!(
            taken,
            Err(LearnerIdError::AddressTaken {
                id: 5,
                addr: "r:3".into(),
                owner: 3
            })
        );
        let message = taken.map_err(|e| (e.is_malformed(), e.to_string()));
        assert_eq!(
            message,
            Err((
                false,
                "address r:3 is node 3's; give node 5 an API and a Raft address of its own".into()
            ))
        );
        assert!(matches!(
            check(member(5, "a:1", "r:5")),
            Err(LearnerIdError::AddressTaken { owner: 1, .. })
        ));
        let same = check(member(5, "x:5", "x:5")).map_err(|e| e.is_malformed());
        assert_eq!(same, Err(true), "one address for both is malformed");
    }

    #[test]
    fn learner_id_refusals_say_what_to_do() {
        let message = |e: LearnerIdError| (e.is_malformed(), e.to_string());
        assert_eq!(
            message(LearnerIdError::Zero),
            (true, "node ids start at 1".into())
        );
        let (malformed, voter) = message(LearnerIdError::Voter { id: 2 });
        assert!(
            !malformed && voter.contains("node 2 is already a voter"),
            "{voter}"
        );
        let (_, other) = message(LearnerIdError::OtherLearner {
            id: 3,
            api_addr: "a:3".into(),
            raft_addr: "r:3".into(),
        });
        assert!(other.contains("already a learner at a:3 / r:3"), "{other}");
        let (_, retired) = message(LearnerIdError::Retired {
            id: 4,
            retired: vec![4, 6],
        });
        assert!(
            retired.contains("never reused") && retired.contains("retired ids: 4,6"),
            "{retired}"
        );
    }

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
