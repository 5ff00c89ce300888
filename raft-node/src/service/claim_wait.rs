//! Blocking claims (`/claim` with `wait_ms`): wait on the leader until a task of the
//! group may be claimable, then propose the claim. Waiting proposes nothing; a waiter
//! proposes only when its group's queue grants it a claim (about as many grants as
//! claimable tasks, longest waiter first), and one that loses a race waits again.
//!
//! Every proposal of one blocking claim is a [`Request::WaitingClaim`] under the
//! client's request id: the machine forgets a proposal that found nothing, so the
//! waiter may propose again under the same id, and remembers the one that got a task,
//! so a retry of the whole request (after a timeout, through another node) gets that
//! task and no second one. A claim that commits after its waiter's request is gone (the
//! client left, the node lost leadership mid-proposal) is not handed to anybody else:
//! the task stays the client's until its lease lapses, as when a worker dies after
//! claiming, and a retry with the same request id gets it.

use std::sync::Arc;
use std::time::Duration;

use store_sm::machine::ClaimRequest;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::TaskMachine;
use tokio::time::Instant;

use super::Consistency;
use super::ServiceError;
use crate::node::Node;
use crate::waiting::WaitKind;
use crate::waiting::grant_claims;

/// What an earlier proposal under this request id claimed (or why it was refused), if
/// `machine` remembers one.
fn remembered_claim(
    machine: &TaskMachine,
    claim: &ClaimRequest,
    request_id: Option<&str>,
) -> Option<Arc<Outcome>> {
    let key = (claim.client, Arc::<str>::from(request_id?));
    machine.dedup().get(&key).cloned()
}

fn empty() -> Arc<Outcome> {
    Arc::new(Outcome::Tasks(Vec::new()))
}

fn has_task(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Tasks(tasks) if !tasks.is_empty())
}

impl Node {
    /// Claims from `claim.group`, waiting up to `wait` for a task when none is
    /// claimable; see the module documentation. A follower answers
    /// [`ServiceError::NotLeader`], so the whole request goes to the leader.
    pub async fn claim_waiting(
        &self,
        claim: ClaimRequest,
        request_id: Option<String>,
        wait: Duration,
    ) -> Result<Arc<Outcome>, ServiceError> {
        // A linearizable look first: it confirms this node leads (a follower answers
        // NotLeader and the whole request goes to the leader) and that what it sees
        // holds every write acknowledged before, so that a claim that finds nothing here
        // and waits in vain may answer empty as of now.
        let view = self.read(Consistency::Linearizable).await?;
        let slot = self.waiters.enter(WaitKind::Claim)?;
        if let Some(outcome) = remembered_claim(&view.state.machine, &claim, request_id.as_deref())
        {
            return Ok(outcome);
        }
        let deadline = Instant::now() + wait;
        let ticket = self.claims.join(&claim.group);
        grant_claims(
            &self.claims,
            &view.state.machine.as_of(view.now),
            &claim.group,
            view.now,
        );
        // Not kept while waiting: an old state held would pin what apply replaces.
        drop(view);
        let mut look = false;
        loop {
            if look {
                self.grant_claims_now(&claim.group);
            }
            look = true;
            if ticket.is_granted() {
                let proposal = Request::WaitingClaim(claim.clone());
                let outcome = self.write(proposal, request_id.clone()).await;
                // On an error the ticket drops with its grant, which passes it on.
                let outcome = outcome?;
                let claimed = has_task(&outcome) || outcome.is_refused();
                slot.woken(!claimed);
                if claimed {
                    return Ok(outcome);
                }
                // Lost the race: wait in place for the next change rather than look
                // again at once.
                ticket.release_grant();
                look = false;
            }
            if self.waiters.is_stopping() || Instant::now() >= deadline {
                return Ok(empty());
            }
            let wake_at = self
                .next_claimable_at(&claim.group)
                .map_or(deadline, |at| at.min(deadline));
            let stopped = self.waiters.stopped();
            tokio::pin!(stopped);
            stopped.as_mut().enable();
            if self.waiters.is_stopping() {
                return Ok(empty());
            }
            tokio::select! {
                () = ticket.woken() => {}
                () = &mut stopped => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Grants `group`'s blocking claims what is claimable now, by this node's clock.
    fn grant_claims_now(&self, group: &str) {
        let now = self.clock.now();
        let machine = self.state.read(|state| state.machine.clone());
        grant_claims(&self.claims, &machine.as_of(now), group, now);
    }

    /// When, by this node's clock, a task of `group` next becomes claimable by time
    /// alone.
    fn next_claimable_at(&self, group: &str) -> Option<Instant> {
        let now = self.clock.now();
        let at: LogTime = self
            .state
            .read(|state| state.machine.next_claimable_after(group, now))?;
        let ms = at.as_millis().saturating_sub(now.as_millis()).max(1) as u64;
        Some(Instant::now() + Duration::from_millis(ms))
    }
}
