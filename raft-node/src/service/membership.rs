//! Forming the cluster and changing its membership. Every change runs on the leader;
//! elsewhere it fails with [`ServiceError::NotLeader`], which the routers relay.

use std::collections::BTreeMap;

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver;
use openraft::error::ClientWriteError;
use openraft::error::InitializeError;
use openraft::error::RaftError;
use rpc::admin::CAUGHT_UP_ENTRIES_MAX;
use rpc::admin::ClusterStatusJson;
use rpc::admin::MemberJson;
use rpc::admin::NewLearner;
use rpc::admin::check_new_learner;
use rpc::admin::id_list;
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
    /// caller watches its lag in the cluster status and promotes it later. The id rules
    /// are `rpc::admin::check_new_learner`, which the CLI checks too; re-adding a current
    /// learner with the same addresses is a retry and changes nothing.
    pub async fn add_learner(&self, id: NodeId, addrs: RotaNode) -> Result<(), ServiceError> {
        // Held through the change: a log form recorded meanwhile counts the learner.
        let _forms_fixed = self.log_form_change.lock().await;
        let status = self.ready_for_change()?;
        let member = MemberJson {
            id,
            api_addr: addrs.api_addr.clone(),
            raft_addr: addrs.raft_addr.clone(),
        };
        match check_new_learner(&status, &member) {
            Ok(NewLearner::New) => {}
            Ok(NewLearner::AlreadyAdded) => return Ok(()),
            Err(e) if e.is_malformed() => return Err(ServiceError::Invalid(e.to_string())),
            Err(e) => return Err(ServiceError::Conflict(e.to_string())),
        }
        self.check_learner_reads_the_log(id, &addrs).await?;
        let change = self.raft.add_learner(id, addrs, false).await;
        self.membership_changed(change)
    }

    /// Refuses to promote learner `id` unless it says it reads the log entry form the
    /// cluster recorded: a voter that cannot apply the log would count toward majorities
    /// without a copy.
    async fn check_voter_reads_the_log(&self, id: NodeId) -> Result<(), ServiceError> {
        let recorded = self.recorded_log_form();
        if recorded == 0 {
            return Ok(());
        }
        let form = self.member_log_form(id).await.map_err(|e| {
            ServiceError::Conflict(format!(
                "{e}; a voter must read log form {recorded}: check that node {id} runs, then retry"
            ))
        })?;
        if form < recorded {
            return Err(older_build(id, form, recorded));
        }
        Ok(())
    }

    /// Refuses a learner that says it reads an older log entry form than the one the
    /// cluster recorded (see `crate::log_forms`): it could not apply the log. A learner
    /// that does not answer (not started yet) is added; should it run an older build,
    /// it will not apply the log, and promoting it is refused.
    async fn check_learner_reads_the_log(
        &self,
        id: NodeId,
        addrs: &RotaNode,
    ) -> Result<(), ServiceError> {
        let recorded = self.recorded_log_form();
        if recorded == 0 {
            return Ok(());
        }
        match self
            .peer(id, addrs.raft_addr.clone())
            .announced_log_form()
            .await
        {
            Ok(form) if form < recorded => Err(older_build(id, form, recorded)),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(
                    learner = id,
                    error = %e,
                    "adding a learner whose build could not be checked; it must read log form {recorded}"
                );
                Ok(())
            }
        }
    }

    /// Makes learner `id` a voter.
    pub async fn promote(&self, id: NodeId) -> Result<(), ServiceError> {
        // Taken first, so that the checks below see the status the change is made in.
        let _forms_fixed = self.log_form_change.lock().await;
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
        // A voter that holds nothing would count toward majorities without a copy.
        let lag = status.nodes.iter().find(|n| n.id == id).and_then(|n| n.lag);
        if lag.is_none_or(|lag| lag > CAUGHT_UP_ENTRIES_MAX) {
            let lag = lag.map_or(
                "unknown: it has not answered the leader yet".into(),
                |lag| format!("{lag} entries"),
            );
            return Err(ServiceError::Conflict(format!(
                "node {id} has not caught up (lag {lag}); check that its Raft address is its \
                 own and that it runs, and promote it once its lag is at most \
                 {CAUGHT_UP_ENTRIES_MAX}"
            )));
        }
        self.check_voter_reads_the_log(id).await?;
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
        let removed_raft_addr = self.member_raft_addr(id);
        let change = self.raft.change_membership(change, false).await;
        self.membership_changed(change)?;
        if let Some(addr) = removed_raft_addr
            && id != self.id()
        {
            self.tell_removed(id, addr);
        }
        Ok(())
    }

    /// Tells node `id` (Raft listener at `addr`) it was removed, in the background and
    /// at best: a removed follower is sent nothing more, so it would not know otherwise
    /// and would go on answering as a member. One that is down hears nothing; it finds
    /// no leader when it comes back, and answers 503 for that.
    fn tell_removed(&self, id: NodeId, addr: String) {
        const TRIES: u32 = 3;
        let members: Vec<String> = self
            .member_ids()
            .into_iter()
            .filter_map(|member| self.member_api_addr(member))
            .collect();
        let peer = self.peer(id, addr);
        tokio::spawn(async move {
            for attempt in 1..=TRIES {
                match peer.tell_removed(&members).await {
                    Ok(()) => return,
                    Err(e) if attempt == TRIES => {
                        tracing::info!(node = id, error = %e, "could not tell a removed node it was removed");
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
                }
            }
        });
    }

    fn membership_changed<T>(&self, change: ChangeResult<T>) -> Result<(), ServiceError> {
        match change {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(self.not_leader(&forward))
            }
            // The message this node gives when it sees the change first, rather than
            // openraft's, which names its log ids.
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                openraft::error::ChangeMembershipError::InProgress(in_progress),
            ))) => Err(ServiceError::Conflict(format!(
                "another membership change is in flight (configuration at index {}); wait until `rota cluster status` shows it committed, then retry",
                in_progress.membership_log_id.map_or(0, |id| id.index)
            ))),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(
                ServiceError::Conflict(format!("membership change refused: {e}")),
            ),
            Err(e) => Err(ServiceError::Unavailable(format!(
                "membership change failed: {e}; retry"
            ))),
        }
    }

    /// Completes a membership change that a previous leader left in its joint
    /// configuration (it died between the two entries of a promote or a remove): without
    /// this, every later change is refused as in flight, for good. Called in each term
    /// this node leads; for a bounded time, waits for the configuration to commit and, if
    /// it is joint, moves to the joint's newer half, as the interrupted change would have.
    /// A refused attempt is tried again within that time: a new leader's first entry may
    /// not have committed yet, and openraft refuses a change until it has.
    pub async fn finish_interrupted_change(&self) {
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut announced = false;
        loop {
            let status = self.cluster_status();
            if status.leader != Some(self.id()) || status.removed {
                return;
            }
            if status.membership_committed {
                if !status.joint {
                    return;
                }
                let target = {
                    let watch = self.raft.metrics();
                    let metrics = watch.borrow_watched();
                    let joint = metrics.membership_config.membership().get_joint_config();
                    match joint.last() {
                        Some(newer) => newer.clone(),
                        None => return,
                    }
                };
                if !announced {
                    announced = true;
                    tracing::warn!(
                        voters = %id_list(&target.iter().copied().collect::<Vec<_>>()),
                        "finishing a membership change that an earlier leader left joint"
                    );
                }
                // retain = false, as a remove does; a promote removes no voter, so it
                // loses nothing.
                let change = self
                    .raft
                    .change_membership(ChangeMembers::ReplaceAllVoters(target), false)
                    .await;
                match self.membership_changed(change) {
                    Ok(()) => return,
                    Err(e) if tokio::time::Instant::now() >= deadline => {
                        tracing::warn!(error = %e, "could not finish the interrupted membership change");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "finishing the interrupted membership change: trying again");
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
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
        // Already there: openraft would hand leadership to its own holder, and a lone
        // voter would then wait for a transfer that never ends, refusing every write.
        if id == self.id() {
            return Ok(());
        }
        if let Some(silent) = self.silent_for(id) {
            return Err(ServiceError::Conflict(format!(
                "node {id} has not answered this leader for {silent:.1?}; is it running? \
                 Leadership would not reach it (start it, or name another voter)"
            )));
        }
        self.raft
            .trigger()
            .transfer_leader(id)
            .await
            .map_err(Self::stopped)
    }

    /// How long member `id` has not answered this leader, when that is longer than an
    /// election would take (it is likely down); `None` if it answers, or if this node
    /// has no answer of it to go by yet (just elected, or just promoted).
    fn silent_for(&self, id: NodeId) -> Option<std::time::Duration> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        let last = metrics.heartbeat.as_ref()?.get(&id).copied().flatten()?;
        let silent = openraft::Instant::elapsed(&*last);
        (silent > 2 * self.config.timing.election_max).then_some(silent)
    }

    /// Builds a snapshot of this node's state machine now (and lets openraft purge the log
    /// behind it).
    pub async fn snapshot(&self) -> Result<(), ServiceError> {
        self.check_member()?;
        self.raft.trigger().snapshot().await.map_err(Self::stopped)
    }
}

/// The refusal of node `id`, which reads log entry forms up to `form`, in a cluster
/// whose members are recorded to read `recorded`.
fn older_build(id: NodeId, form: u32, recorded: u32) -> ServiceError {
    ServiceError::Conflict(format!(
        "node {id} runs an older build: it reads log entry forms up to {form}, and every \
         member of this cluster reads form {recorded}, which its log uses; upgrade node \
         {id} to this release, then retry"
    ))
}
