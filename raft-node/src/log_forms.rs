//! Which log entries every member can read, so that a leader never logs one that an
//! older member would refuse to apply.
//!
//! Builds name the newest entry forms they read with a number, sent as a header on
//! every Raft answer. Form 1 is every build before the claimed-version finish: it reads
//! request variants 0 to 16. Form 2 adds `Finish`, `FinishMany`, `Fail` (the
//! claimed-only rule) and `FinishAndClaim`. A leader logs a form-2 entry only while every
//! member of the current configuration has answered it with form 2 or more since this
//! process started; until then a finish, a fail and a finish of many go into the log in
//! their legacy form, with the rule older builds apply, and a finish with `next` is
//! refused (409) so that the client sends its two parts apart. An answer without the
//! header comes from an older build: form 1.
//!
//! What is heard is not stored: a restarted leader hears from every reachable member
//! within a heartbeat, and a member it never heard from keeps the older forms in use,
//! which is safe. A member keeps the form it last announced while it is down. Putting an
//! older build in the place of a newer one (a downgrade) after form-2 entries were
//! logged is not supported: that node cannot read them.
//!
//! The gate lives in each leader's memory, so a finish's rule (and whether `next` is
//! taken) depends on whom the current leader has heard from: a fully upgraded cluster
//! with a member down since its leader started logs finishes in the older form. A
//! one-way floor kept in the replicated state, raised once every member announced
//! form 2, would end that; it is not built yet.

use std::collections::HashMap;
use std::sync::Mutex;

use rpc::job::NEXT_NOT_READ_BY_ALL;
use store_sm::machine::Request;
use store_sm::machine::ScopedRequest;
use store_sm::raft_types::NodeId;

/// The newest log entry form this build reads (see the module documentation); the
/// network announces it on every Raft answer (`crate::network::LOG_FORMS_HEADER`).
pub const LOG_FORMS_READ: u32 = 2;

/// Form of the entries a build before the header reads, and of an answer without it.
pub const FORM_BEFORE_HEADER: u32 = 1;

/// The form `FinishAndClaim` and the claimed-only finish, fail and finish of many need.
const CLAIMED_RULE_FORM: u32 = 2;

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

    /// Whether one of `members`, other than `leader`, has neither answered this node nor
    /// failed to.
    pub fn any_unheard(&self, members: &[NodeId], leader: NodeId) -> bool {
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        members
            .iter()
            .any(|id| *id != leader && !heard.contains_key(id))
    }

    /// `request` in a form every one of `members` reads, `leader` being this node: as it
    /// is, or a finish, fail or finish of many in its legacy form. A finish with `next`,
    /// which has no older form, comes back with why it cannot be logged.
    pub fn readable(
        &self,
        request: Request,
        members: impl IntoIterator<Item = NodeId>,
        leader: NodeId,
    ) -> Result<Request, Box<Unreadable>> {
        if !needs_claimed_rule_form(&request) {
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
        let unheard = forms.readable(finish_and_claim(), [1, 2, 3], 1).err();
        assert!(unheard.is_some_and(|e| e.request == finish_and_claim()
            && e.behind.heard.is_none()
            && e.behind.to_string().contains("may be down")));
        assert_eq!(
            forms.readable(finish.clone(), [1, 2, 3], 1).ok(),
            Some(Request::LegacyFinish(self::finish()))
        );
        forms.heard(2, LOG_FORMS_READ);
        assert!(forms.any_unheard(&[1, 2, 3], 1));
        // Tried and not reached: no more waiting for it, and still not known to read.
        forms.unanswered(3);
        assert!(!forms.any_unheard(&[1, 2, 3], 1));
        assert!(forms.readable(finish_and_claim(), [1, 2, 3], 1).is_err());
        forms.heard(3, FORM_BEFORE_HEADER);
        let refused = forms.readable(finish_and_claim(), [1, 2, 3], 1);
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
            forms.readable(finish.clone(), [1, 2, 3], 1).ok(),
            Some(finish)
        );
        assert_eq!(
            forms.readable(finish_and_claim(), [1, 2, 3], 1).ok(),
            Some(finish_and_claim())
        );
        // A member that answers as an older build again (a downgrade) is heard.
        forms.heard(2, FORM_BEFORE_HEADER);
        assert!(forms.readable(finish_and_claim(), [1, 2, 3], 1).is_err());
        // A single-node cluster reads what its leader reads.
        assert!(
            PeerLogForms::default()
                .readable(finish_and_claim(), [1], 1)
                .is_ok()
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
            forms.readable(scoped, [1, 2], 1).ok(),
            Some(Request::Scoped(ScopedRequest {
                groups: vec!["g".into()],
                request: Box::new(Request::LegacyFail(fail)),
            }))
        );
        assert_eq!(
            forms.readable(Request::PassTime, [1, 2], 1).ok(),
            Some(Request::PassTime)
        );
    }
}
