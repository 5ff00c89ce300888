//! Forming the cluster and changing its membership. Every change runs on the leader;
//! elsewhere it fails with [`ServiceError::NotLeader`], which the routers relay.

use std::collections::BTreeMap;

use openraft::ChangeMembers;
use openraft::error::ClientWriteError;
use openraft::error::InitializeError;
use openraft::error::RaftError;
use rpc::admin::ClusterStatusJson;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;

use super::ServiceError;
use crate::node::Node;
use crate::types::NodeTypes;

/// What openraft answers to a membership change.
type ChangeResult<T> = Result<T, RaftError<NodeTypes, ClientWriteError<NodeTypes>>>;

impl Node {
    /// Forms a cluster with `members` as its voters; this node must be one of them.
    pub async fn initialize(
        &self,
        members: BTreeMap<NodeId, RotaNode>,
    ) -> Result<(), ServiceError> {
        if !members.contains_key(&self.id()) {
            return Err(ServiceError::Invalid(format!(
                "the members do not include this node ({}); send init to a node you list",
                self.id()
            )));
        }
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                Err(ServiceError::Conflict(format!(
                    "this node already belongs to a cluster ({e}); nothing to do"
                )))
            }
            Err(e) => Err(ServiceError::Internal(format!("initialising failed: {e}"))),
        }
    }

    /// The cluster as the leader sees it, when this node leads and no other membership
    /// change is in flight: membership changes go one at a time, decided on the leader.
    fn ready_for_change(&self) -> Result<ClusterStatusJson, ServiceError> {
        self.check_member()?;
        let status = self.cluster_status();
        if status.leader != Some(self.id()) {
            return Err(self.leader_elsewhere(&status));
        }
        if status.joint || !status.membership_committed {
            return Err(ServiceError::Conflict(format!(
                "another membership change is in flight (configuration at index {}{}); wait until `rota cluster status` shows it committed, then retry",
                status.membership_index.unwrap_or(0),
                if status.joint { ", joint" } else { "" }
            )));
        }
        Ok(status)
    }

    /// Where to send what only the leader can do, from this node's view `status`.
    fn leader_elsewhere(&self, status: &ClusterStatusJson) -> ServiceError {
        match status.leader.and_then(|id| self.member_api_addr(id)) {
            Some(leader_api) => ServiceError::NotLeader { leader_api },
            None => ServiceError::Unavailable("no leader is known; retry shortly".into()),
        }
    }

    /// Adds node `id` at `addrs` as a learner, without waiting for it to catch up: the
    /// caller watches its lag in the cluster status and promotes it later. Re-adding a
    /// current learner with the same addresses is a retry and changes nothing.
    pub async fn add_learner(&self, id: NodeId, addrs: RotaNode) -> Result<(), ServiceError> {
        if id == 0 {
            return Err(ServiceError::Invalid("node ids start at 1".into()));
        }
        let status = self.ready_for_change()?;
        if check_new_learner(&status, id, &addrs)? == NewLearner::AlreadyAdded {
            return Ok(());
        }
        let change = self.raft.add_learner(id, addrs, false).await;
        self.membership_changed(change)
    }

    /// Makes learner `id` a voter.
    pub async fn promote(&self, id: NodeId) -> Result<(), ServiceError> {
        let status = self.ready_for_change()?;
        if status.voters.contains(&id) {
            return Err(ServiceError::Conflict(format!(
                "node {id} is already a voter; nothing to promote"
            )));
        }
        if !status.learners.contains(&id) {
            return Err(ServiceError::Conflict(format!(
                "node {id} is not a learner (learners: {}); add it with add-learner first",
                id_list(&status.learners)
            )));
        }
        let change = self
            .raft
            .change_membership(ChangeMembers::AddVoterIds([id].into()), true)
            .await;
        self.membership_changed(change)
    }

    /// Removes node `id`, voter or learner, from the membership for good.
    pub async fn remove(&self, id: NodeId) -> Result<(), ServiceError> {
        let status = self.ready_for_change()?;
        let change = if status.voters.contains(&id) {
            // retain = false: the removed voter leaves the membership entirely.
            ChangeMembers::RemoveVoters([id].into())
        } else if status.learners.contains(&id) {
            ChangeMembers::RemoveNodes([id].into())
        } else if status.retired.contains(&id) {
            return Err(ServiceError::Conflict(format!(
                "node {id} was removed already; nothing to remove"
            )));
        } else {
            return Err(ServiceError::Conflict(format!(
                "node {id} is not a member (voters: {}, learners: {}); nothing to remove",
                id_list(&status.voters),
                id_list(&status.learners)
            )));
        };
        let change = self.raft.change_membership(change, false).await;
        self.membership_changed(change)
    }

    fn membership_changed<T>(&self, change: ChangeResult<T>) -> Result<(), ServiceError> {
        match change {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(self.not_leader(&forward))
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(
                ServiceError::Conflict(format!("membership change refused: {e}")),
            ),
            Err(e) => Err(ServiceError::Unavailable(format!(
                "membership change failed: {e}; retry"
            ))),
        }
    }

    /// Hands leadership to voter `id`; only the leader can.
    pub async fn transfer_leader(&self, id: NodeId) -> Result<(), ServiceError> {
        self.check_member()?;
        let status = self.cluster_status();
        if !status.voters.contains(&id) {
            return Err(ServiceError::Invalid(format!(
                "node {id} is not a voter; leadership can only go to a voter"
            )));
        }
        if status.leader != Some(self.id()) {
            return Err(
                match status.leader.and_then(|id| self.member_api_addr(id)) {
                    Some(leader_api) => ServiceError::NotLeader { leader_api },
                    None => ServiceError::Unavailable("no leader is known; retry shortly".into()),
                },
            );
        }
        self.raft
            .trigger()
            .transfer_leader(id)
            .await
            .map_err(Self::stopped)
    }

    /// Builds a snapshot of this node's state machine now (and lets openraft purge the log
    /// behind it).
    pub async fn snapshot(&self) -> Result<(), ServiceError> {
        self.check_member()?;
        self.raft.trigger().snapshot().await.map_err(Self::stopped)
    }
}

/// Whether a learner id is new or already added with the same addresses.
#[derive(Debug, PartialEq, Eq)]
enum NewLearner {
    /// Not a member: add it.
    New,
    /// Already a learner at these addresses: a retry, nothing to change.
    AlreadyAdded,
}

/// Refuses a learner id that is taken or was ever taken: an id names one data directory
/// for the life of the cluster, and a reused id could vote with another node's history.
fn check_new_learner(
    status: &ClusterStatusJson,
    id: NodeId,
    addrs: &RotaNode,
) -> Result<NewLearner, ServiceError> {
    if status.voters.contains(&id) {
        return Err(ServiceError::Conflict(format!(
            "node {id} is already a voter; nothing to add"
        )));
    }
    if let Some(current) = status.nodes.iter().find(|n| n.id == id) {
        if current.api_addr == addrs.api_addr && current.raft_addr == addrs.raft_addr {
            return Ok(NewLearner::AlreadyAdded);
        }
        return Err(ServiceError::Conflict(format!(
            "node {id} is already a learner at {}/{}; remove it first or choose a new id",
            current.api_addr, current.raft_addr
        )));
    }
    if status.retired.contains(&id) {
        return Err(ServiceError::Conflict(format!(
            "node id {id} was a member before and ids are never reused; start the new node with a new --id and an empty data directory"
        )));
    }
    Ok(NewLearner::New)
}

/// Ids as `1,2,3`, or `none`.
fn id_list(ids: &[NodeId]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
