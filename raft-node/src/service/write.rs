//! Writes: a task request proposed through Raft, stamped with the leader's log clock.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::error::ClientWriteError;
use openraft::error::ForwardToLeader;
use openraft::error::RaftError;
use store_sm::machine::Command;
use store_sm::machine::Outcome;
use store_sm::machine::Refusal;
use store_sm::machine::Request;
use store_sm::machine::constants::RULES_FORM;
use store_sm::raft_types::NodeId;

use super::ServiceError;
use super::group_commit::ProposalError;
use crate::log_forms::BATCH_FORM;
use crate::log_forms::RECORDED_FORM;
use crate::log_forms::Unreadable;
use crate::log_forms::announced_form;
use crate::node::FORWARD_TIMEOUT;
use crate::node::Node;

/// How often a write that arrived before its new leader's clock settled looks again.
const SETTLED_POLL: Duration = Duration::from_millis(2);

/// How long a finish with `next` waits for word from members its leader has not heard
/// from (see `Node::readable_by_members`): a few heartbeats.
const UNHEARD_MEMBER_WAIT: Duration = Duration::from_millis(500);

impl Node {
    /// `outcome`, unless it refuses a request id reused for another request: that is
    /// not an outcome of the request but a client's bug, answered apart (422) so that a
    /// retry loop stops instead of reading it as the first outcome; or a request outside
    /// the token's groups (403).
    pub(crate) fn outcome_or_reused_id(
        outcome: Arc<Outcome>,
    ) -> Result<Arc<Outcome>, ServiceError> {
        let Outcome::Refused(refusals) = &*outcome else {
            return Ok(outcome);
        };
        let reasons = || {
            let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
            reasons.join("; ")
        };
        if refusals
            .iter()
            .any(|r| matches!(r, Refusal::RequestIdReused { .. }))
        {
            return Err(ServiceError::ReusedRequestId(reasons()));
        }
        // Not an outcome of the request either: the token may not make it (403).
        if refusals.iter().any(|r| {
            matches!(
                r,
                Refusal::OutOfScope { .. } | Refusal::TaskOutOfScope { .. }
            )
        }) {
            return Err(ServiceError::Forbidden(reasons()));
        }
        Ok(outcome)
    }

    /// Proposes `request` through Raft, stamped with this node's log clock, and returns
    /// the machine's outcome once a majority has the entry and this node applied it.
    pub async fn write(
        &self,
        request: Request,
        request_id: Option<String>,
    ) -> Result<Arc<Outcome>, ServiceError> {
        self.check_member()?;
        self.settled_leader().await?;
        let request = match self.readable_by_members(request).await {
            Ok(request) => request,
            Err(unreadable) => {
                // Boxed, as the write below: a rare answer that would otherwise make
                // every write's future (and each copy of it) kilobytes larger.
                return Box::pin(self.answer_unreadable(*unreadable, request_id.as_deref())).await;
            }
        };
        let command = Command {
            stamp: self.clock.now(),
            request_id,
            request,
        };
        // A leader that lost its quorum normally refuses at once (its lease lapsed); the
        // deadline covers the rest, where the outcome is unknown.
        let may_batch = self.recorded_log_form() >= BATCH_FORM;
        let write = self.group_commit.propose(&self.raft, command, may_batch);
        let written = tokio::time::timeout(FORWARD_TIMEOUT, write)
            .await
            .map_err(|_| {
                ServiceError::Unavailable(
                    "the write was not committed in time; its outcome is unknown: retry with the same requestid".into(),
                )
            })?;
        match written {
            Ok(outcome) => Self::outcome_or_reused_id(outcome),
            Err(ProposalError::Raft(RaftError::APIError(ClientWriteError::ForwardToLeader(
                forward,
            )))) => Err(self.not_leader(&forward)),
            Err(ProposalError::Raft(RaftError::APIError(ClientWriteError::LogEntryDiscarded(
                _,
            )))) => Err(ServiceError::Unavailable(
                "leadership changed while the write was in flight; its outcome is unknown: retry with the same requestid".into(),
            )),
            Err(ProposalError::Raft(RaftError::APIError(other))) => Err(ServiceError::Internal(
                format!("write refused by Raft: {other}"),
            )),
            Err(ProposalError::Raft(RaftError::Fatal(fatal))) => Err(Self::stopped(fatal)),
            Err(ProposalError::Unanswered) => Err(ServiceError::Unavailable(
                "the write's proposal ended without an answer (is this node stopping?); its outcome is unknown: retry with the same requestid".into(),
            )),
            Err(ProposalError::Mismatched(what)) => Err(ServiceError::Internal(what)),
            Err(ProposalError::Unencodable(why)) => Err(ServiceError::Internal(format!(
                "the write could not be encoded for the log ({why}); nothing was written: report this"
            ))),
        }
    }

    /// `request` in a form every member reads (see `crate::log_forms`). A finish with
    /// `next`, refused while a member is not known to read it, first waits a little for
    /// members this leader has not heard from yet: a leader just elected hears from each
    /// within a heartbeat.
    async fn readable_by_members(&self, request: Request) -> Result<Request, Box<Unreadable>> {
        if !crate::log_forms::needs_claimed_rule_form(&request) {
            return Ok(request);
        }
        let recorded = self.recorded_log_form();
        let members = self.member_ids();
        if recorded < RECORDED_FORM && matches!(request.unscoped(), Request::FinishAndClaim(_)) {
            let deadline = tokio::time::Instant::now() + UNHEARD_MEMBER_WAIT;
            while self.peer_forms.any_unheard(&members, self.id())
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(SETTLED_POLL).await;
            }
        }
        self.peer_forms
            .readable(request, members, self.id(), recorded)
    }

    /// Records in the replicated state the newest log entry form every member reads,
    /// once it is [`RECORDED_FORM`] or newer and above the record (see
    /// `crate::log_forms`). Returns the form recorded, if one was. Every member is asked
    /// again first, so that none is counted from an answer it gave before a restart
    /// (with an older build, say); a member that does not answer now holds the record
    /// back. Serialised with adding and promoting a learner, so that a member added
    /// meanwhile is counted.
    pub async fn record_log_form(&self) -> Result<Option<u32>, ServiceError> {
        let _members_fixed = self.log_form_change.lock().await;
        let recorded = self.recorded_log_form();
        let members = self.member_ids();
        let heard = self.peer_forms.common_form(&members, self.id());
        if heard.is_none_or(|common| common < RECORDED_FORM || common <= recorded) {
            return Ok(None);
        }
        let others = members
            .iter()
            .filter(|&&id| id != self.id())
            .map(|&id| Ok((id, self.known_member_raft_addr(id)?)))
            .collect::<Result<Vec<_>, ServiceError>>()?;
        let common = self
            .lowest_form_now(others)
            .await
            .map_err(|(id, e)| unannounced(id, &e))?;
        if common < RECORDED_FORM || common <= recorded {
            return Ok(None);
        }
        // A form that changes the machine's rules goes in the variant older builds
        // cannot read: a member of one that was not asked (a learner added while down)
        // stops there instead of applying the old rules.
        let raise = if common >= RULES_FORM {
            Request::RaiseRulesForm(common)
        } else {
            Request::RaiseLogForm(common)
        };
        let outcome = self.write(raise, None).await?;
        match &*outcome {
            Outcome::Refused(refusals) => Err(ServiceError::Internal(format!(
                "recording log form {common} was refused: {refusals:?}"
            ))),
            _ => Ok(Some(common)),
        }
    }

    /// The log entry form member `id` announces when asked now.
    pub(crate) async fn member_log_form(&self, id: NodeId) -> Result<u32, ServiceError> {
        self.peer(id, self.known_member_raft_addr(id)?)
            .announced_log_form()
            .await
            .map_err(|e| unannounced(id, &e))
    }

    /// The newest log entry form this node and every one of `others` (id and Raft
    /// address) read, each asked now, all at once; each answer is noted in
    /// `peer_forms`. `Err` names one that did not answer.
    pub(crate) async fn lowest_form_now(
        &self,
        others: Vec<(NodeId, String)>,
    ) -> Result<u32, (NodeId, rpc::client::ClientError)> {
        let asked = others.into_iter().map(|(id, raft_addr)| {
            let peer = self.peer(id, raft_addr);
            async move { (id, peer.announced_log_form().await) }
        });
        let mut common = announced_form();
        for (id, answer) in futures_util::future::join_all(asked).await {
            let form = answer.map_err(|e| (id, e))?;
            self.peer_forms.heard(id, form);
            common = common.min(form);
        }
        Ok(common)
    }

    fn known_member_raft_addr(&self, id: NodeId) -> Result<String, ServiceError> {
        self.member_raft_addr(id)
            .ok_or_else(|| ServiceError::Conflict(format!("node {id} is not a member")))
    }

    /// The answer to a request no form of which every member reads (a finish with
    /// `next`): 409, unless its request id names a command already applied. Then it is
    /// a retry whose first attempt went into the log while every member read it, and
    /// it gets that first outcome: otherwise a client that sends the finish alone next
    /// finds its task gone and the task it claimed held for nothing. The dedup table is
    /// read after a linearizable barrier, so that every committed entry is applied.
    async fn answer_unreadable(
        &self,
        unreadable: Unreadable,
        request_id: Option<&str>,
    ) -> Result<Arc<Outcome>, ServiceError> {
        let Unreadable { request, behind } = unreadable;
        if let Some(id) = request_id {
            let view = self.read(super::read::Consistency::Linearizable).await?;
            if let Some(first) = view
                .state
                .machine
                .remembered(request.client(), id, &request)
            {
                return Self::outcome_or_reused_id(first);
            }
        }
        Err(ServiceError::Conflict(behind.to_string()))
    }

    /// Returns once this node leads with its clock settled in its term (see
    /// `time_keeper::catch_up`), so that its stamp may go into the log. A node that does
    /// not lead answers where the leader is without proposing: a stamp taken now could
    /// reach the log in a term this node is just winning, before its catch-up.
    async fn settled_leader(&self) -> Result<(), ServiceError> {
        let deadline = tokio::time::Instant::now() + FORWARD_TIMEOUT;
        loop {
            let Some(term) = self.leading_term() else {
                let forward = ForwardToLeader {
                    leader_id: self.raft.metrics().borrow_watched().current_leader,
                    leader_node: None,
                    reason: Default::default(),
                };
                return Err(self.not_leader(&forward));
            };
            if self.clock_settled_term.load(Ordering::Acquire) >= term {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ServiceError::Unavailable(
                    "this node was just elected and has not yet agreed on the cluster's time with a majority of voters; retry shortly".into(),
                ));
            }
            // Polled rather than woken: only the first writes of a term wait here, and
            // tokio's watch wakes its waiters in a random order the simulation cannot
            // replay.
            tokio::time::sleep(SETTLED_POLL).await;
        }
    }
}

/// Why member `id`'s log entry form is not known: it did not answer when asked.
fn unannounced(id: NodeId, error: &rpc::client::ClientError) -> ServiceError {
    ServiceError::Unavailable(format!(
        "node {id} did not say which log entry forms it reads: {error}"
    ))
}
