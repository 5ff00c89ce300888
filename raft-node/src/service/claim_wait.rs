//! Blocking claims (`/claim` with `wait_ms`): wait on the leader until a task of the
//! group may be claimable, then propose the claim. Waiting proposes nothing; a waiter
//! proposes only when its group's queue grants it a claim (about as many grants as
//! claimable tasks, longest waiter first), and one that loses a race waits again.
//!
//! Every proposal of one blocking claim is a `Request::WaitingClaim` (for a claim with
//! a count, a `Request::WaitingClaimMany`) under the client's request id: the machine
//! forgets a proposal that found nothing, so the waiter may propose again under the
//! same id, and remembers the one that got a task, so a retry of the whole request
//! (after a timeout, through another node) gets that task and no second one. A claim
//! that commits after its waiter's request is gone (the client left, the node lost
//! leadership mid-proposal) is not handed to anybody else: the task stays the client's
//! until its lease lapses, as when a worker dies after claiming, and a retry with the
//! same request id gets it.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use store_sm::machine::ClaimManyRequest;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::TaskMachine;
use store_sm::state_machine::StateReader;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Consistency;
use super::ServiceError;
use super::auth::Caller;
use super::auth::HeldToken;
use crate::node::FORWARD_TIMEOUT;
use crate::node::Node;
use crate::waiting::WaitKind;
use crate::waiting::claims::ProposalResult;
use crate::waiting::grant_claims;

/// What an earlier proposal under this request id claimed (or why it was refused), if
/// the state applied now remembers one; an error if the id was used for a different
/// request. The live state, not a view: it is at least as new as any view taken before,
/// and a view's copy of the dedup table has no index to look the id up by.
fn remembered_claim(
    state: &StateReader,
    claim: &ClaimManyRequest,
    request_id: Option<&str>,
) -> Result<Option<Arc<Outcome>>, ServiceError> {
    let Some(request_id) = request_id else {
        return Ok(None);
    };
    let request = claim.to_request(false);
    let remembered = state.read(|s| {
        s.machine
            .remembered(claim.claim.client, request_id, &request)
    });
    remembered.map(Node::outcome_or_reused_id).transpose()
}

/// The outcome of a proposal in flight once it has finished; `None` if its write
/// failed (its outcome is unknown here).
async fn finished(mut result: watch::Receiver<ProposalResult>) -> Option<Arc<Outcome>> {
    match result.wait_for(Option::is_some).await {
        Ok(done) => done.clone().flatten(),
        Err(_) => None,
    }
}

/// The refusal `claim` would get from `machine` at `now` whatever is claimable, if any.
fn refusal(machine: &TaskMachine, claim: &ClaimManyRequest, now: LogTime) -> Option<Arc<Outcome>> {
    let refusals = machine.claim_refusals(&claim.claim, claim.count, now);
    (!refusals.is_empty()).then(|| Arc::new(Outcome::Refused(refusals)))
}

/// The 403 a claim of a token limited to some groups gets for naming a task outside
/// them (a dependency of another group), if it does. The machine looks at this before
/// anything else, its dedup table included, and so does a waiting claim before it
/// waits. Tasks never change group, so one that passes here passes at the end too.
fn scope_refused(
    machine: &TaskMachine,
    caller: &Caller,
    claim: &ClaimManyRequest,
) -> Option<Result<Arc<Outcome>, ServiceError>> {
    caller.scope()?;
    let refusal = machine.scope_refusal_of(&caller.limit(claim.to_request(true)))?;
    Some(Node::outcome_or_reused_id(Arc::new(Outcome::Refused(
        vec![refusal],
    ))))
}

fn empty() -> Arc<Outcome> {
    Arc::new(Outcome::Tasks(Vec::new()))
}

fn has_task(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Tasks(tasks) if !tasks.is_empty())
}

impl Node {
    /// Claims from the claim's group, waiting up to `wait` for a task when none is
    /// claimable; see the module documentation. A follower answers
    /// [`ServiceError::NotLeader`], so the whole request goes to the leader.
    pub async fn claim_waiting(
        self: &Arc<Self>,
        claim: ClaimManyRequest,
        request_id: Option<String>,
        wait: Duration,
        caller: &Caller,
    ) -> Result<Arc<Outcome>, ServiceError> {
        // A linearizable look first: it confirms this node leads (a follower answers
        // NotLeader and the whole request goes to the leader) and that what it sees
        // holds every write acknowledged before, so that a claim that finds nothing here
        // and waits in vain may answer empty as of now.
        let view = self.read(Consistency::Linearizable).await?;
        let held = self.holds_token(caller);
        let slot = self.waiters.enter(WaitKind::Claim)?;
        if let Some(refused) = scope_refused(&view.state.machine, caller, &claim) {
            return refused;
        }
        if let Some(outcome) = remembered_claim(&self.state, &claim, request_id.as_deref())? {
            return Ok(outcome);
        }
        // A claim the machine would refuse whatever became claimable (no group, a
        // missing dependency) is refused now, as without a wait, rather than answered
        // empty when the wait ends.
        if let Some(refused) = refusal(&view.state.machine, &claim, view.now) {
            return Ok(refused);
        }
        if let Some(outcome) = self.joined_claim(&claim, request_id.as_deref()).await? {
            return Ok(outcome);
        }
        let deadline = Instant::now() + wait;
        let ticket = self
            .claims
            .join_excluding(&claim.claim.group, claim.claim.depends.clone());
        grant_claims(
            &self.claims,
            &view.state.machine.as_of(view.now),
            &claim.claim.group,
            view.now,
        );
        // Not kept while waiting: an old state held would pin what apply replaces.
        drop(view);
        // The arrival looked already; every wake after it looks again.
        let mut look = false;
        loop {
            if look {
                self.grant_claims_now(&claim.claim.group);
            }
            if ticket.is_granted() {
                // On an error the ticket drops with its grant, which passes it on.
                let outcome = self
                    .propose_claim(&claim, request_id.as_deref(), caller, held)
                    .await?;
                let claimed = has_task(&outcome) || outcome.is_refused();
                slot.woken(!claimed);
                if claimed {
                    return Ok(outcome);
                }
                // Lost the race (or the tasks left are ones this claim may not take):
                // the grant goes to a waiter that may use it, and this one waits in
                // place for the next change rather than look again at once.
                ticket.pass_grant();
                self.grant_claims_now(&claim.claim.group);
            }
            if self.waiters.is_stopping() || Instant::now() >= deadline {
                return self.settle_claim(&claim, request_id.as_deref()).await;
            }
            let next = self.next_claimable(&claim.claim.group);
            ticket.armed_for(next.map(|(at, _)| at));
            let wake_at = next.map_or(deadline, |(_, at)| at.min(deadline));
            let stopped = self.waiters.stopped();
            tokio::pin!(stopped);
            stopped.as_mut().enable();
            if self.waiters.is_stopping() {
                return self.settle_claim(&claim, request_id.as_deref()).await;
            }
            tokio::select! {
                // Polled in order: the simulation needs the same choice on every replay.
                biased;
                () = ticket.woken() => {}
                () = &mut stopped => {}
                // Nothing of this wait is in flight here, so the whole request can go to
                // the new leader (relayed, or retried by its client) rather than wait
                // out its time on a node that can no longer grant it anything.
                () = self.until_not_leading() => return Err(self.stepped_down(deadline).await),
                () = tokio::time::sleep_until(wake_at) => {}
            }
            ticket.unpass();
            look = true;
        }
    }

    /// Proposes `claim` as a waiting claim. Under a request id the proposal runs in a
    /// task of its own and is registered as in flight until it finishes, so that a retry
    /// of the same request that comes while it is pending (its first try timed out, or
    /// its client left) joins it rather than answering without it; if one is already
    /// pending, this joins it first.
    async fn propose_claim(
        self: &Arc<Self>,
        claim: &ClaimManyRequest,
        request_id: Option<&str>,
        caller: &Caller,
        held: HeldToken,
    ) -> Result<Arc<Outcome>, ServiceError> {
        // The token may have been revoked while the claim waited.
        self.still_authorized(caller, held)?;
        let proposal = caller.limit(claim.to_request(true));
        let Some(request_id) = request_id else {
            return self.write(proposal, None).await;
        };
        if let Some(outcome) = self.joined_claim(claim, Some(request_id)).await? {
            return Ok(outcome);
        }
        let key = (claim.claim.client, request_id.to_string());
        let (seen, result) = watch::channel(None);
        let (answer, answered) = tokio::sync::oneshot::channel();
        let number = self.claims_in_flight.start(key.clone(), result);
        let node = Arc::clone(self);
        let request_id = Some(request_id.to_string());
        tokio::spawn(async move {
            let outcome = node.write(proposal, request_id).await;
            let _ = seen.send(Some(outcome.as_ref().ok().cloned()));
            let _ = answer.send(outcome);
            node.claims_in_flight.done(&key, number);
        });
        answered.await.unwrap_or_else(|_| {
            Err(ServiceError::Unavailable(
                "the claim's outcome is unknown; retry with the same requestid".into(),
            ))
        })
    }

    /// What an earlier try of this request still in flight on this node claimed (or why
    /// it was refused), once it has finished; `None` if none is in flight or it found
    /// nothing.
    async fn joined_claim(
        &self,
        claim: &ClaimManyRequest,
        request_id: Option<&str>,
    ) -> Result<Option<Arc<Outcome>>, ServiceError> {
        let Some(id) = request_id else {
            return Ok(None);
        };
        let Some(pending) = self
            .claims_in_flight
            .get(&(claim.claim.client, id.to_string()))
        else {
            return Ok(None);
        };
        let outcome = finished(pending).await;
        Ok(outcome.filter(|o| has_task(o) || o.is_refused()))
    }

    /// The answer of a blocking claim that got no grant in time: empty, unless an
    /// earlier try of the same request (same request id) claimed a task. A try still in
    /// flight on this node is waited for; one that reached the log through another
    /// leader is found by a linearizable read, which sees every committed entry.
    async fn settle_claim(
        self: &Arc<Self>,
        claim: &ClaimManyRequest,
        request_id: Option<&str>,
    ) -> Result<Arc<Outcome>, ServiceError> {
        if request_id.is_some() {
            if let Some(outcome) = self.joined_claim(claim, request_id).await? {
                return Ok(outcome);
            }
            // A linearizable read first, so that the state looked at holds every
            // committed entry.
            self.read(Consistency::Linearizable).await?;
            if let Some(outcome) = remembered_claim(&self.state, claim, request_id)? {
                return Ok(outcome);
            }
        }
        // A dependency deleted during the wait: refused, as a claim without a wait would
        // be now. The applied state is newer than the linearizable look the wait began
        // with, so the refusal held at a moment inside the request.
        let now = self.clock.now();
        Ok(self
            .state
            .read(|s| refusal(&s.machine, claim, now))
            .unwrap_or_else(empty))
    }

    /// Returns once this node is not the leader (at once if it is not now).
    async fn until_not_leading(&self) {
        let mut server = self.raft.server_metrics();
        loop {
            if server.borrow_watched().state != ServerState::Leader {
                return;
            }
            if server.changed().await.is_err() {
                return;
            }
        }
    }

    /// Where a request goes once this node stopped leading: the new leader, once one is
    /// known (waited for until `deadline`, at most [`FORWARD_TIMEOUT`]).
    async fn stepped_down(&self, deadline: Instant) -> ServiceError {
        let mut server = self.raft.server_metrics();
        let give_up = deadline.min(Instant::now() + FORWARD_TIMEOUT);
        let new_leader = async {
            loop {
                let leader = server.borrow_watched().current_leader;
                if let Some(leader_api) = leader
                    .filter(|id| *id != self.id())
                    .and_then(|id| self.member_api_addr(id))
                {
                    return Some(leader_api);
                }
                if server.changed().await.is_err() {
                    return None;
                }
            }
        };
        let left = give_up.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, new_leader).await {
            Ok(Some(leader_api)) => ServiceError::NotLeader { leader_api },
            _ => ServiceError::Unavailable(super::LEADERSHIP_MOVING.into()),
        }
    }

    /// Grants `group`'s blocking claims what is claimable now, by this node's clock.
    fn grant_claims_now(&self, group: &str) {
        let now = self.clock.now();
        let machine = self.state.read(|state| state.machine.clone());
        grant_claims(&self.claims, &machine.as_of(now), group, now);
    }

    /// When, by this node's clock, a task of `group` next becomes claimable by time
    /// alone: a delay or back-off passes, or a lease ends (which may also end a job).
    pub(super) fn next_claimable_at(&self, group: &str) -> Option<Instant> {
        self.next_claimable(group).map(|(_, at)| at)
    }

    /// [`Node::next_claimable_at`], with the log time it comes from.
    pub(super) fn next_claimable(&self, group: &str) -> Option<(LogTime, Instant)> {
        let now = self.clock.now();
        let at: LogTime = self
            .state
            .read(|state| state.machine.next_claimable_after(group, now))?;
        let ms = at.as_millis().saturating_sub(now.as_millis()).max(1) as u64;
        Some((at, Instant::now() + Duration::from_millis(ms)))
    }
}
