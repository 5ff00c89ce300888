//! What a node knows of the cluster: status, readiness and its state hash.

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::type_config::alias::InstantOf;
use rpc::admin::CAUGHT_UP_ENTRIES_MAX;
use rpc::admin::ClusterStatusJson;
use rpc::admin::NodeStatusJson;
use rpc::admin::StateHashJson;
use store_sm::raft_types::NodeId;

use super::ServiceError;
use super::off_thread;
use crate::node::Node;
use crate::types::NodeTypes;

fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

impl Node {
    /// This node's view of the cluster (SPEC section 3, "Status").
    pub fn cluster_status(&self) -> ClusterStatusJson {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let learners: Vec<NodeId> = membership.learner_ids().collect();
        let retired = self.state.read(|s| {
            s.machine
                .members_ever()
                .filter(|id| membership.get_node(id).is_none())
                .collect()
        });
        let membership_index = metrics.membership_config.log_id().map(|id| id.index());
        let committed = metrics.local_committed.map(|id| id.index());
        let last_log = metrics.last_log_index.unwrap_or(0);
        let nodes = membership
            .nodes()
            .map(|(id, addrs)| {
                let role = if Some(*id) == metrics.current_leader {
                    "leader"
                } else if *id == metrics.id {
                    role_name(metrics.state)
                } else if voters.contains(id) {
                    "follower"
                } else {
                    "learner"
                };
                // None until the member has matched an entry: a learner nobody reached
                // (a wrong address) is not "behind by the whole log", it is unknown, and
                // must not pass a catch-up check on a short log.
                let lag = metrics.replication.as_ref().and_then(|replication| {
                    let matched = replication.get(id)?.as_ref()?;
                    Some(last_log.saturating_sub(matched.index()))
                });
                NodeStatusJson {
                    id: *id,
                    api_addr: addrs.api_addr.clone(),
                    raft_addr: addrs.raft_addr.clone(),
                    role: role.to_string(),
                    lag,
                }
            })
            .collect();
        let removed = self.check_member().is_err();
        ClusterStatusJson {
            id: metrics.id,
            // A removed leader still believes it leads; nobody follows it any more.
            leader: metrics.current_leader.filter(|_| !removed),
            term: metrics.current_term,
            commit_index: committed,
            applied_index: metrics.last_applied.map(|id| id.index()),
            snapshot_index: metrics.snapshot.map(|id| id.index()),
            purged_index: metrics.purged.map(|id| id.index()),
            applied_time_ms: self.state.read(|s| s.machine.log_time().as_millis()),
            log_form: self.recorded_log_form(),
            voters,
            learners,
            retired,
            membership_index,
            membership_committed: membership_index <= committed,
            joint: membership.get_joint_config().len() > 1,
            removed,
            nodes,
        }
    }

    /// The last index in this node's log, if it holds any.
    pub fn last_log_index(&self) -> Option<u64> {
        self.raft.metrics().borrow_watched().last_log_index
    }

    /// Whether this node has a leader and has applied nearly all it knows is committed
    /// (within [`CAUGHT_UP_ENTRIES_MAX`] entries, so that readiness does not flap under load
    /// while apply trails commit by a few entries); the reason when it is not ready.
    pub fn readiness(&self) -> Result<(), String> {
        self.check_member().map_err(|removed| removed.to_string())?;
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        if metrics.state == ServerState::Shutdown {
            return Err("the node is shutting down".into());
        }
        if metrics.current_leader.is_none() {
            return Err("no leader is known".into());
        }
        let mut voters = metrics.membership_config.membership().voter_ids();
        let alone = voters.next() == Some(self.id()) && voters.next().is_none();
        if metrics.state == ServerState::Leader && !alone {
            // A leader cut off from its quorum still names itself, but refuses every
            // write and linearizable read once its lease (the longest election timeout)
            // lapses: it is not ready to serve either. (A lone voter is its own quorum.)
            let lease = self.config.timing.election_max;
            let heard = metrics
                .last_quorum_acked
                .as_ref()
                .map(|acked| <InstantOf<NodeTypes> as openraft::Instant>::now() - **acked);
            if heard.is_none_or(|since| since > lease) {
                return Err(format!(
                    "this node leads but no quorum has answered it for over {} ms; check the \
                     other nodes and the network between them",
                    lease.as_millis()
                ));
            }
        }
        let committed = metrics.local_committed.map(|id| id.index());
        let applied = metrics.last_applied.map(|id| id.index());
        let behind = committed.unwrap_or(0).saturating_sub(applied.unwrap_or(0));
        if applied < committed && (applied.is_none() || behind > CAUGHT_UP_ENTRIES_MAX) {
            return Err(format!(
                "catching up: applied {applied:?} of committed {committed:?}"
            ));
        }
        Ok(())
    }

    /// The hash of this node's applied state, to compare replicas. O(tasks), on a
    /// blocking thread so that the node serves meanwhile: for tests and operators, not
    /// for monitoring loops.
    pub async fn state_hash(&self) -> Result<StateHashJson, ServiceError> {
        let state = self.state.snapshot();
        off_thread("hashing the state", move || StateHashJson {
            applied_index: state.applied.map(|id| id.index()),
            state_hash: state.state_hash().to_string(),
            tasks: state.machine.task_count() as u64,
        })
        .await
    }
}
