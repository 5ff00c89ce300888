//! Blocking claims (`/claim` with `wait_ms`): wait on the leader until a task of the
//! group may be claimable, then propose the claim. Waiting proposes nothing; a waiter
//! proposes only when its group's queue grants it a claim (about as many grants as
//! claimable tasks, longest waiter first), and one that loses a race waits again.
//!
//! Each proposal of one blocking claim carries its own request id, derived from the
//! client's (`R`, then `R#2`, `R#3`...), so a retry of the whole request first looks up
//! what its earlier proposals got and answers a task one of them claimed. A claim that
//! commits after its waiter's request is gone (the client left, the node lost
//! leadership mid-proposal) is not handed to anybody else: the task stays the client's
//! until its lease lapses, as when a worker dies after claiming.

use std::sync::Arc;
use std::time::Duration;

use store_sm::machine::ClaimRequest;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use tokio::time::Instant;

use super::ServiceError;
use crate::node::Node;
use crate::waiting::WaitKind;
use crate::waiting::grant_claims;

/// Earlier proposals of one blocking claim a retry looks up, at most.
const REPLAYED_PROPOSALS_MAX: u32 = 64;

/// The request id of proposal `attempt` (from 1) of a blocking claim whose client gave
/// `base`: `base` itself first, then `base#n`, or a digest of `base` with `#n` when that
/// would be longer than a request id may be.
pub fn proposal_request_id(base: Option<&str>, attempt: u32) -> Option<String> {
    let base = base?;
    if attempt <= 1 {
        return Some(base.to_string());
    }
    let suffix = format!("#{attempt}");
    if base.len() + suffix.len() <= store_sm::machine::constants::REQUEST_ID_BYTES_MAX {
        return Some(format!("{base}{suffix}"));
    }
    // FNV-1a: stable across nodes and builds, so every leader derives the same ids.
    let digest = base.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    Some(format!("~{digest:016x}{suffix}"))
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
        self.check_member()?;
        if self.leader_id() != Some(self.id()) {
            return Err(self.to_leader());
        }
        let slot = self.waiters.enter(WaitKind::Claim)?;
        let (mut attempt, replayed) = self.replayed_proposals(&claim, request_id.as_deref());
        if let Some(outcome) = replayed {
            return Ok(outcome);
        }
        let deadline = Instant::now() + wait;
        let ticket = self.claims.join(&claim.group);
        let mut look = true;
        loop {
            if look {
                self.grant_claims_now(&claim.group);
            }
            look = true;
            if ticket.is_granted() {
                attempt += 1;
                let proposal = proposal_request_id(request_id.as_deref(), attempt);
                let outcome = self.write(Request::Claim(claim.clone()), proposal).await;
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

    /// Where a request that only the leader serves goes from here.
    fn to_leader(&self) -> ServiceError {
        match self.leader_id().and_then(|id| self.member_api_addr(id)) {
            Some(leader_api) => ServiceError::NotLeader { leader_api },
            None => ServiceError::Unavailable(
                "no leader is known or its lease has lapsed; retry shortly".into(),
            ),
        }
    }

    /// How many earlier proposals of this blocking claim the applied state remembers,
    /// and the task one of them claimed, if any.
    fn replayed_proposals(
        &self,
        claim: &ClaimRequest,
        request_id: Option<&str>,
    ) -> (u32, Option<Arc<Outcome>>) {
        if request_id.is_none() {
            return (0, None);
        }
        self.state.read(|state| {
            let dedup = state.machine.dedup();
            let mut attempt = 0;
            while attempt < REPLAYED_PROPOSALS_MAX {
                let Some(id) = proposal_request_id(request_id, attempt + 1) else {
                    break;
                };
                let Some(outcome) = dedup.get(&(claim.client, Arc::from(id.as_str()))) else {
                    break;
                };
                attempt += 1;
                if has_task(outcome) || outcome.is_refused() {
                    return (attempt, Some(Arc::clone(outcome)));
                }
            }
            (attempt, None)
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposal_ids_are_stable_distinct_and_short_enough() {
        assert_eq!(proposal_request_id(None, 3), None);
        assert_eq!(proposal_request_id(Some("r"), 1).as_deref(), Some("r"));
        assert_eq!(proposal_request_id(Some("r"), 2).as_deref(), Some("r#2"));
        let long = "x".repeat(64);
        let second = proposal_request_id(Some(&long), 2).expect("an id");
        assert!(second.len() <= 64, "{second}");
        assert_eq!(proposal_request_id(Some(&long), 2), Some(second.clone()));
        assert_ne!(proposal_request_id(Some(&long), 3), Some(second));
        assert_eq!(proposal_request_id(Some(&long), 1), Some(long));
    }
}
