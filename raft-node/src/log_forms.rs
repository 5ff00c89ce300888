//! Which log entries every member can read, so that a leader never logs one that an
//! older member would refuse to apply.
//!
//! Builds name the newest entry forms they read with a number, sent as a header on
//! every Raft answer. Form 1 is every build before the claimed-version finish: it reads
//! request variants 0 to 16. Form 2 adds `Finish`, `FinishMany`, `Fail` (the
//! claimed-only rule) and `FinishAndClaim`. Form 3 adds `RaiseLogForm` and snapshot
//! format 7. Form 4 changes what the machine does with entries older builds read as
//! well, once it is recorded: a late renewal retakes its lease (`RETAKEN_LEASE_FORM`),
//! the dedup table keeps young outcomes past its limits (`DEDUP_KEEP_FORM`), a job takes
//! a bounded number of dependants (`DEPENDANTS_LIMIT_FORM`), and a limited token's
//! request naming another group's cancelled task is out of scope
//! (`SCOPE_OF_CANCELLED_FORM`). The machine follows the record, never this build's
//! number. So that no member of an older build goes on applying the older rules, form 4
//! and later are recorded with `RaiseRulesForm`, which older builds cannot read, and
//! such a machine is written as snapshot format 8. Form 5 adds `Batch`, many commands
//! in one entry (`BATCH_FORM`): a leader batches only once form 5 is recorded, and
//! changes no rule. An answer without the header comes from an older build: form 1.
//!
//! Two sources say that every member reads a form:
//!
//! - **The replicated record** (`TaskMachine::log_form`). Once every member of the
//!   configuration has answered the leader with form 3 or more, the leader asks each
//!   again (an answer from before a restart may be stale) and logs `RaiseLogForm` with
//!   the lowest form they announced (`Node::record_log_form`). The record never goes
//!   down (a backup keeps it; a restore records its new members' form in the restored
//!   state), so every later leader
//!   logs those forms at once, whoever it has heard from: a fully upgraded cluster keeps
//!   taking `next` while a member is down. A node announcing a form below the record is
//!   refused as a new learner and as a new voter.
//! - **What this leader heard** since its process started, until the record is made
//!   (a cluster in the middle of an upgrade, or with a member of form 2 left). A member
//!   this leader never heard from is not known to read anything new.
//!
//! A request whose form not every member is known to read goes into the log in its
//! legacy form, with the rule older builds apply (a finish, a fail, a finish of many),
//! or, for a finish with `next`, which has no older form, is refused (409) so that the
//! client sends its two parts apart. Putting an older build in the place of a newer one
//! (a downgrade) after newer entries were logged is not supported: that node cannot
//! read them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use rpc::job::NEXT_NOT_READ_BY_ALL;
use store_sm::machine::Request;
use store_sm::machine::ScopedRequest;
use store_sm::raft_types::NodeId;

use crate::node::SharedNode;

/// The newest log entry form this build reads (see the module documentation); the
/// network announces it on every Raft answer (`crate::network::LOG_FORMS_HEADER`).
pub const LOG_FORMS_READ: u32 = 5;

/// The first form whose builds read `Request::Batch`: a leader batches writes only once
/// the record says every member reads it (see `crate::service::group_commit`).
pub const BATCH_FORM: u32 = 5;

/// The first form whose builds read `Request::RaiseLogForm`: the record is made only
/// once every member announced this one or a newer.
pub const RECORDED_FORM: u32 = 3;

/// The environment variable that makes a node announce an older form than it reads,
/// as an older build would: for tests of what a cluster in the middle of an upgrade
/// does. It changes nothing the node itself reads.
pub const ANNOUNCE_FORM_ENV: &str = "ROTA_ANNOUNCE_LOG_FORM";

/// The form this node announces: [`LOG_FORMS_READ`], or a lower one set in
/// [`ANNOUNCE_FORM_ENV`].
pub fn announced_form() -> u32 {
    static ANNOUNCED: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ANNOUNCED.get_or_init(|| {
        std::env::var(ANNOUNCE_FORM_ENV)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .map_or(LOG_FORMS_READ, |form| form.min(LOG_FORMS_READ))
    })
}

/// Form of the entries a build before the header reads, and of an answer without it.
pub const FORM_BEFORE_HEADER: u32 = 1;

/// The form `FinishAndClaim` and the claimed-only finish, fail and finish of many need.
const CLAIMED_RULE_FORM: u32 = 2;

/// How often a leader looks whether every member announced a newer form than the one
/// recorded: soon after an election, so that the record lands before most writes.
const RECORD_LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long a leader waits before it asks the members again, after one did not answer.
const RECORD_RETRY_AFTER: Duration = Duration::from_secs(2);

/// Runs until Raft shuts down or the recorded form is the one this node announces,
/// above which it never records: while this node leads, records in the replicated
/// state the newest form every member announced (`Node::record_log_form`).
pub async fn keep_form_recorded(node: SharedNode) {
    let server = node.raft.server_metrics();
    loop {
        let state = server.borrow_watched().state;
        if state == ServerState::Shutdown || node.recorded_log_form() >= announced_form() {
            return;
        }
        let mut wait = RECORD_LOOK_EVERY;
        if state == ServerState::Leader && node.check_member().is_ok() {
            match node.record_log_form().await {
                Ok(Some(form)) => {
                    tracing::info!(form, "every member reads log form {form}: recorded");
                }
                Ok(None) => {}
                Err(e) => {
                    // A member heard once and not answering now: asked again later, not
                    // ten times a second.
                    tracing::debug!(error = %e, "could not record the log form");
                    wait = RECORD_RETRY_AFTER;
                }
            }
        }
        // Slept, not woken by the metrics: tokio's watch wakes its waiters in an order
        // the simulation cannot replay.
        tokio::time::sleep(wait).await;
    }
}

/// The forms each peer last announced in answer to this node.
#[derive(Debug, Default)]
pub struct PeerLogForms {
    /// By peer: the form it last announced, or `None` if this node only ever failed to
    /// reach it.
    heard: Mutex<HashMap<NodeId, Option<u32>>>,
}

/// Why a request cannot go into the log in any form every member reads.
#[derive(Debug, thiserror::Error)]
#[error(
    "this cluster {NEXT_NOT_READ_BY_ALL} yet: node {member} {why}; send POST /finish without \
     next, then POST /claim (Rota's clients do so on their own)",
    why = match heard {
        Some(forms) => format!(
            "runs an older build (it reads log form {forms}, a finish with next needs {CLAIMED_RULE_FORM}): upgrade it"
        ),
        None => "has not answered this leader since it started (it may be down)".to_string(),
    }
)]
pub struct NotReadByAll {
    /// A member that may not read the request.
    pub member: NodeId,
    /// The form it announced, if this leader heard from it.
    pub heard: Option<u32>,
}

impl PeerLogForms {
    /// Notes that `peer` answered announcing `forms`.
    pub fn heard(&self, peer: NodeId, forms: u32) {
        let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.insert(peer, Some(forms));
    }

    /// Notes that a message to `peer` got no answer: a finish with `next` stops waiting
    /// for word from it (see [`PeerLogForms::any_unheard`]); a form it announced before
    /// is kept.
    pub fn unanswered(&self, peer: NodeId) {
        let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.entry(peer).or_insert(None);
    }

    /// A member of `members`, other than `leader`, not known to read `form`, with the
    /// form it announced if it was heard from.
    fn first_behind(
        &self,
        members: impl IntoIterator<Item = NodeId>,
        leader: NodeId,
        form: u32,
    ) -> Option<NotReadByAll> {
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        members
            .into_iter()
            .filter(|&id| id != leader)
            .map(|member| NotReadByAll {
                member,
                heard: heard.get(&member).copied().flatten(),
            })
            .find(|behind| behind.heard.is_none_or(|forms| forms < form))
    }

    /// The newest form every one of `members` other than `leader` announced, never
    /// above what this node announces (its own for a cluster of one), or `None` while
    /// one was not heard from.
    pub fn common_form(&self, members: &[NodeId], leader: NodeId) -> Option<u32> {
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        members
            .iter()
            .filter(|&&id| id != leader)
            .map(|id| heard.get(id).copied().flatten())
            .try_fold(announced_form(), |lowest, forms| Some(lowest.min(forms?)))
    }

    /// Whether one of `members`, other than `leader`, has neither answered this node nor
    /// failed to.
    pub fn any_unheard(&self, members: &[NodeId], leader: NodeId) -> bool {
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        members
            .iter()
            .any(|id| *id != leader && !heard.contains_key(id))
    }

    /// `request` in a form every one of `members` reads, `leader` being this node and
    /// `recorded` the form the replicated state says every member reads: as it is, or a
    /// finish, fail or finish of many in its legacy form. A finish with `next`, which has
    /// no older form, comes back with why it cannot be logged.
    pub fn readable(
        &self,
        request: Request,
        members: impl IntoIterator<Item = NodeId>,
        leader: NodeId,
        recorded: u32,
    ) -> Result<Request, Box<Unreadable>> {
        if !needs_claimed_rule_form(&request) || recorded >= CLAIMED_RULE_FORM {
            return Ok(request);
        }
        match self.first_behind(members, leader, CLAIMED_RULE_FORM) {
            None => Ok(request),
            Some(behind) => {
                legacy_form(request).map_err(|request| Box::new(Unreadable { request, behind }))
            }
        }
    }
}

/// A request no form of which every member reads, and a member that may not.
#[derive(Debug)]
pub struct Unreadable {
    /// The request, unchanged.
    pub request: Request,
    /// Why it cannot be logged.
    pub behind: NotReadByAll,
}

/// Whether `request` is logged in a form builds before [`CLAIMED_RULE_FORM`] cannot read.
pub fn needs_claimed_rule_form(request: &Request) -> bool {
    matches!(
        request.unscoped(),
        Request::Finish(_) | Request::FinishMany(_) | Request::Fail(_) | Request::FinishAndClaim(_)
    )
}

/// The form-1 entry that does what `request` does under the older rule, or `request`
/// back if there is none.
fn legacy_form(request: Request) -> Result<Request, Request> {
    match request {
        Request::Finish(finish) => Ok(Request::LegacyFinish(finish)),
        Request::FinishMany(many) => Ok(Request::LegacyFinishMany(many)),
        Request::Fail(fail) => Ok(Request::LegacyFail(fail)),
        Request::Scoped(ScopedRequest { groups, request }) => {
            let rewrap = |request| {
                Request::Scoped(ScopedRequest {
                    groups,
                    request: Box::new(request),
                })
            };
            match legacy_form(*request) {
                Ok(legacy) => Ok(rewrap(legacy)),
                Err(unchanged) => Err(rewrap(unchanged)),
            }
        }
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use store_sm::machine::ClaimManyRequest;
    use store_sm::machine::ClaimRequest;
    use store_sm::machine::FailRequest;
    use store_sm::machine::FinishAndClaimRequest;
    use store_sm::machine::FinishRequest;

    use super::*;

    fn finish() -> FinishRequest {
        FinishRequest {
            client: 7,
            id: 3,
            result: None,
        }
    }

    fn finish_and_claim() -> Request {
        Request::FinishAndClaim(FinishAndClaimRequest {
            finish: finish(),
            next: ClaimManyRequest {
                claim: ClaimRequest {
                    client: 7,
                    group: "g".into(),
                    duration_ms: 1000,
                    depends: Vec::new(),
                },
                count: 1,
            },
        })
    }

    #[test]
    fn new_forms_only_once_every_other_member_announced_them() {
        let forms = PeerLogForms::default();
        let finish = Request::Finish(finish());
        // Not heard from node 2 or 3 yet.
        let unheard = forms.readable(finish_and_claim(), [1, 2, 3], 1, 0).err();
        assert!(unheard.is_some_and(|e| e.request == finish_and_claim()
            && e.behind.heard.is_none()
            && e.behind.to_string().contains("may be down")));
        assert_eq!(
            forms.readable(finish.clone(), [1, 2, 3], 1, 0).ok(),
            Some(Request::LegacyFinish(self::finish()))
        );
        forms.heard(2, LOG_FORMS_READ);
        assert!(forms.any_unheard(&[1, 2, 3], 1));
        // Tried and not reached: no more waiting for it, and still not known to read.
        forms.unanswered(3);
        assert!(!forms.any_unheard(&[1, 2, 3], 1));
        assert!(forms.readable(finish_and_claim(), [1, 2, 3], 1, 0).is_err());
        forms.heard(3, FORM_BEFORE_HEADER);
        let refused = forms.readable(finish_and_claim(), [1, 2, 3], 1, 0);
        let Err(refused) = refused.map_err(|e| e.behind) else {
            panic!("node 3 reads form 1")
        };
        assert_eq!((refused.member, refused.heard), (3, Some(1)));
        assert!(
            refused.to_string().contains("runs an older build"),
            "{refused}"
        );
        assert!(!forms.any_unheard(&[1, 2, 3], 1));
        forms.heard(3, LOG_FORMS_READ);
        assert_eq!(
            forms.readable(finish.clone(), [1, 2, 3], 1, 0).ok(),
            Some(finish)
        );
        assert_eq!(
            forms.readable(finish_and_claim(), [1, 2, 3], 1, 0).ok(),
            Some(finish_and_claim())
        );
        // A member that answers as an older build again (a downgrade) is heard.
        forms.heard(2, FORM_BEFORE_HEADER);
        assert!(forms.readable(finish_and_claim(), [1, 2, 3], 1, 0).is_err());
        // A single-node cluster reads what its leader reads.
        assert!(
            PeerLogForms::default()
                .readable(finish_and_claim(), [1], 1, 0)
                .is_ok()
        );
    }

    #[test]
    fn the_recorded_form_opens_the_gate_without_word_from_any_member() {
        let forms = PeerLogForms::default();
        // Never heard from 2 or 3 (a new leader with members down).
        assert_eq!(
            forms
                .readable(finish_and_claim(), [1, 2, 3], 1, RECORDED_FORM)
                .ok(),
            Some(finish_and_claim())
        );
        assert_eq!(
            forms
                .readable(Request::Finish(finish()), [1, 2, 3], 1, RECORDED_FORM)
                .ok(),
            Some(Request::Finish(finish()))
        );
        assert!(forms.readable(finish_and_claim(), [1, 2, 3], 1, 0).is_err());
    }

    #[test]
    fn the_common_form_waits_for_every_other_member() {
        let forms = PeerLogForms::default();
        assert_eq!(forms.common_form(&[1], 1), Some(LOG_FORMS_READ), "alone");
        assert_eq!(forms.common_form(&[1, 2, 3], 1), None);
        forms.heard(2, LOG_FORMS_READ);
        forms.unanswered(3);
        assert_eq!(forms.common_form(&[1, 2, 3], 1), None, "3 never answered");
        forms.heard(3, CLAIMED_RULE_FORM);
        assert_eq!(forms.common_form(&[1, 2, 3], 1), Some(CLAIMED_RULE_FORM));
        forms.heard(3, LOG_FORMS_READ + 5);
        assert_eq!(
            forms.common_form(&[1, 2, 3], 1),
            Some(LOG_FORMS_READ),
            "never above what this build reads"
        );
    }

    #[test]
    fn legacy_forms_keep_scope_and_leave_other_requests_alone() {
        let forms = PeerLogForms::default();
        let fail = FailRequest {
            client: 7,
            id: 3,
            error: "boom".into(),
            retry_in_ms: None,
        };
        let scoped = Request::Scoped(ScopedRequest {
            groups: vec!["g".into()],
            request: Box::new(Request::Fail(fail.clone())),
        });
        assert_eq!(
            forms.readable(scoped, [1, 2], 1, 0).ok(),
            Some(Request::Scoped(ScopedRequest {
                groups: vec!["g".into()],
                request: Box::new(Request::LegacyFail(fail)),
            }))
        );
        assert_eq!(
            forms.readable(Request::PassTime, [1, 2], 1, 0).ok(),
            Some(Request::PassTime)
        );
    }
}
