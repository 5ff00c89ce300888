//! Access tokens and the scope of a worker's request, as replicated state.
//!
//! A token's secret never reaches the log: the node hashes it and proposes the hash,
//! so every node can check a bearer token and none can recover one. The machine only
//! keeps the records, refuses changes that break their rules, and refuses a scoped
//! request that names or touches a group outside its scope. The scope is checked here,
//! in log order, because a task id's group is only known for certain at apply.

use std::fmt;

use serde::Deserialize;
use serde::Serialize;

use crate::LogTime;
use crate::Refusal;
use crate::Request;
use crate::TaskId;
use crate::TaskMachine;
use crate::constants::SCOPE_OF_CANCELLED_FORM;
use crate::constants::TOKEN_GROUPS_MAX;
use crate::constants::TOKEN_ID_BYTES;
use crate::constants::TOKEN_NAME_BYTES_MAX;
use crate::constants::TOKENS_MAX;
use crate::ids::ClientId;
use crate::types::ListName;

/// What a token's bearer may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// The seed and job API (reads and writes), `/watch` and `/cluster`; optionally
    /// limited to groups whose names start with given prefixes.
    Worker,
    /// Every read, `/watch`, `/metrics` and the dashboard, read-only.
    Reader,
    /// Everything: membership, backup, restore, settings, tokens.
    Admin,
}

impl Role {
    /// The role's name as the API and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Reader => "reader",
            Role::Admin => "admin",
        }
    }

    /// The role named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "worker" => Some(Role::Worker),
            "reader" => Some(Role::Reader),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token as the cluster stores it: everything but the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public identity, the part of the bearer token before the secret.
    pub id: String,
    /// What the operator called it.
    pub name: String,
    /// What its bearer may do.
    pub role: Role,
    /// Group name prefixes a worker token is limited to; empty: every group.
    pub groups: Vec<String>,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_hash: String,
    /// When it was made, in log time.
    pub created_at: LogTime,
}

impl TokenRecord {
    /// Whether this token's bearer may touch `group`.
    pub fn covers(&self, group: &str) -> bool {
        scope_covers(&self.groups, group)
    }
}

/// Whether a list of group prefixes covers `group`; an empty list covers every group.
pub fn scope_covers(prefixes: &[String], group: &str) -> bool {
    prefixes.is_empty() || prefixes.iter().any(|p| group.starts_with(p.as_str()))
}

/// A new token, as the node proposes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenAddRequest {
    /// The client that asked (for dedup).
    pub client: ClientId,
    /// Public identity: [`TOKEN_ID_BYTES`] lowercase hex digits.
    pub id: String,
    /// A name for people.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Group prefixes (worker tokens only).
    pub groups: Vec<String>,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_hash: String,
}

/// Revoke a token by id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRevokeRequest {
    /// The client that asked (for dedup).
    pub client: ClientId,
    /// The token's id.
    pub id: String,
}

/// A worker's request, limited to groups whose names start with one of `groups`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopedRequest {
    /// The group prefixes of the token that sent it (never empty: an unlimited token's
    /// requests are not wrapped).
    pub groups: Vec<String>,
    /// The request.
    pub request: Box<Request>,
}

/// Whether `s` is `len` lowercase hex digits.
fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why a new token's fields are not acceptable, as one refusal per field.
pub fn check_token_fields(add: &TokenAddRequest) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    let mut invalid = |field: &str, reason: String| {
        refusals.push(Refusal::InvalidField {
            field: field.into(),
            reason,
        })
    };
    if !is_hex(&add.id, TOKEN_ID_BYTES) {
        invalid(
            "id",
            format!("a token id is {TOKEN_ID_BYTES} lowercase hex digits"),
        );
    }
    if add.name.len() > TOKEN_NAME_BYTES_MAX {
        invalid(
            "name",
            format!(
                "{} bytes; the limit is {TOKEN_NAME_BYTES_MAX}",
                add.name.len()
            ),
        );
    }
    if !is_hex(&add.secret_hash, 64) {
        invalid("secret_hash", "a SHA-256 in 64 lowercase hex digits".into());
    }
    if add.groups.len() > TOKEN_GROUPS_MAX {
        invalid(
            "groups",
            format!(
                "{} prefixes; the limit is {TOKEN_GROUPS_MAX}",
                add.groups.len()
            ),
        );
    }
    if add.groups.iter().any(String::is_empty) {
        invalid(
            "groups",
            "a prefix is empty; leave the list empty for every group".into(),
        );
    }
    if add.role != Role::Worker && !add.groups.is_empty() {
        invalid(
            "groups",
            format!("only worker tokens are limited to groups, not {}", add.role),
        );
    }
    refusals
}

impl TaskMachine {
    /// Every token, by id.
    pub fn tokens(&self) -> impl Iterator<Item = &TokenRecord> + '_ {
        self.tokens.values()
    }

    /// The token with this id, if it is current.
    pub fn token(&self, id: &str) -> Option<&TokenRecord> {
        self.tokens.get(id)
    }

    /// Whether the cluster's first admin token was ever made.
    pub fn auth_bootstrapped(&self) -> bool {
        self.auth_bootstrapped
    }

    /// Adds a token; `bootstrap` only once, and only an admin token.
    pub(crate) fn apply_token_add(
        &mut self,
        add: &TokenAddRequest,
        bootstrap: bool,
        now: LogTime,
    ) -> Result<TokenRecord, Vec<Refusal>> {
        let mut refusals = check_token_fields(add);
        if bootstrap && self.auth_bootstrapped {
            refusals.push(Refusal::AlreadyBootstrapped);
        }
        if bootstrap && add.role != Role::Admin {
            refusals.push(Refusal::InvalidField {
                field: "role".into(),
                reason: "the first token is an admin token".into(),
            });
        }
        if self.tokens.contains_key(add.id.as_str()) {
            refusals.push(Refusal::TokenExists { id: add.id.clone() });
        }
        if self.tokens.len() >= TOKENS_MAX {
            refusals.push(Refusal::TooManyTokens);
        }
        if !refusals.is_empty() {
            return Err(refusals);
        }
        let record = TokenRecord {
            id: add.id.clone(),
            name: add.name.clone(),
            role: add.role,
            groups: add.groups.clone(),
            secret_hash: add.secret_hash.clone(),
            created_at: now,
        };
        self.tokens.insert(add.id.clone(), record.clone());
        self.auth_bootstrapped = true;
        Ok(record)
    }

    /// Revokes a token; the record it had is the answer.
    pub(crate) fn apply_token_revoke(
        &mut self,
        revoke: &TokenRevokeRequest,
    ) -> Result<TokenRecord, Vec<Refusal>> {
        self.tokens.remove(revoke.id.as_str()).ok_or_else(|| {
            vec![Refusal::UnknownToken {
                id: revoke.id.clone(),
            }]
        })
    }

    /// The first group a request limited to `prefixes` names or touches outside them,
    /// as a refusal. Ids that name no task are left to the request's own checks (a
    /// missing task has no group, and ids are never reused).
    pub(crate) fn scope_refusal(&self, prefixes: &[String], request: &Request) -> Option<Refusal> {
        let outside = |group: &str| {
            (!scope_covers(prefixes, group)).then(|| Refusal::OutOfScope {
                group: group.to_string(),
            })
        };
        // A task of another group is refused without naming its group (or, for a
        // cancelled one, its key): reads answer 404 for it, as if it did not exist.
        let of_task = |list: ListName| {
            move |id: &TaskId| {
                let group = match self.tasks.get(id) {
                    Some(task) => &task.group,
                    None if self.log_form() >= SCOPE_OF_CANCELLED_FORM => {
                        &self.cancelled.get(id)?.0
                    }
                    None => return None,
                };
                (!scope_covers(prefixes, group))
                    .then_some(Refusal::TaskOutOfScope { list, id: *id })
            }
        };
        let of_depends = of_task(ListName::Depends);
        match request {
            Request::LegacyUpdate(update) | Request::Update(update) => update
                .adds
                .iter()
                .find_map(|add| outside(&add.group))
                .or_else(|| {
                    let of_updated = of_task(ListName::Updates);
                    update
                        .updates
                        .iter()
                        .find_map(|change| of_updated(&change.id))
                })
                .or_else(|| update.deletes.iter().find_map(of_task(ListName::Deletes)))
                .or_else(|| update.depends.iter().find_map(of_depends)),
            Request::Claim(claim) | Request::WaitingClaim(claim) => {
                outside(&claim.group).or_else(|| claim.depends.iter().find_map(of_depends))
            }
            Request::ClaimMany(many) | Request::WaitingClaimMany(many) => {
                outside(&many.claim.group)
                    .or_else(|| many.claim.depends.iter().find_map(of_depends))
            }
            Request::Finish(finish) | Request::LegacyFinish(finish) => {
                of_task(ListName::Finish)(&finish.id)
            }
            Request::FinishMany(many) | Request::LegacyFinishMany(many) => {
                let of_finished = of_task(ListName::Finish);
                many.finishes.iter().find_map(|item| of_finished(&item.id))
            }
            Request::Fail(fail) | Request::LegacyFail(fail) => of_task(ListName::Fail)(&fail.id),
            Request::FinishAndClaim(both) => of_task(ListName::Finish)(&both.finish.id)
                .or_else(|| outside(&both.next.claim.group))
                .or_else(|| both.next.claim.depends.iter().find_map(of_depends)),
            Request::Cancel(cancel) => outside(&cancel.group),
            Request::Retry(retry) => outside(&retry.group),
            Request::Settings(settings) => outside(&settings.group),
            Request::Scoped(inner) => self.scope_refusal(prefixes, &inner.request),
            Request::TokenAdd(_)
            | Request::TokenRevoke(_)
            | Request::AuthBootstrap(_)
            | Request::PassTime
            | Request::RaiseLogForm(_)
            | Request::RaiseRulesForm(_)
            | Request::Batch(_) => Some(Refusal::OutOfScope {
                group: String::new(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AddTask;
    use crate::ClaimRequest;
    use crate::Command;
    use crate::FinishRequest;
    use crate::Outcome;
    use crate::UpdateRequest;

    const T0: i64 = 1_700_000_000_000;

    fn run(machine: &mut TaskMachine, request_id: Option<&str>, request: Request) -> Outcome {
        let stamp = machine.log_time().max(LogTime::from_millis(T0));
        let command = Command {
            stamp,
            request_id: request_id.map(String::from),
            request,
        };
        (*machine.apply(&command)).clone()
    }

    fn token(id: &str, role: Role, groups: &[&str]) -> TokenAddRequest {
        TokenAddRequest {
            client: 1,
            id: id.into(),
            name: format!("{role} token"),
            role,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            secret_hash: "0f".repeat(32),
        }
    }

    fn scoped(groups: &[&str], request: Request) -> Request {
        Request::Scoped(ScopedRequest {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            request: Box::new(request),
        })
    }

    fn add(client: ClientId, group: &str) -> Request {
        Request::Update(UpdateRequest {
            client,
            adds: vec![AddTask::seed(group, "d", None)],
            ..Default::default()
        })
    }

    fn added_id(outcome: &Outcome) -> TaskId {
        match outcome {
            Outcome::Tasks(tasks) => tasks[0].id,
            other => panic!("expected a task, got {other:?}"),
        }
    }

    fn refusals(outcome: &Outcome) -> Vec<Refusal> {
        match outcome {
            Outcome::Refused(refusals) => refusals.clone(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn out_of(group: &str) -> Vec<Refusal> {
        vec![Refusal::OutOfScope {
            group: group.into(),
        }]
    }

    #[test]
    fn the_first_admin_token_is_made_once_ever() {
        let mut machine = TaskMachine::new();
        assert!(!machine.auth_bootstrapped());
        let worker = token("000000000000000a", Role::Worker, &[]);
        assert!(matches!(
            refusals(&run(&mut machine, None, Request::AuthBootstrap(worker)))[..],
            [Refusal::InvalidField { .. }]
        ));
        let first = token("000000000000000b", Role::Admin, &[]);
        let made = run(&mut machine, None, Request::AuthBootstrap(first.clone()));
        assert!(
            matches!(&made, Outcome::Token(t) if t.id == first.id && t.created_at.as_millis() == T0)
        );
        assert!(machine.auth_bootstrapped());
        let revoke = TokenRevokeRequest {
            client: 1,
            id: first.id.clone(),
        };
        assert!(matches!(
            run(&mut machine, None, Request::TokenRevoke(revoke.clone())),
            Outcome::Token(_)
        ));
        assert_eq!(machine.tokens().count(), 0);
        // Revoking every token does not reopen the door.
        let again = token("000000000000000c", Role::Admin, &[]);
        assert_eq!(
            refusals(&run(&mut machine, None, Request::AuthBootstrap(again))),
            vec![Refusal::AlreadyBootstrapped]
        );
        assert_eq!(
            refusals(&run(&mut machine, None, Request::TokenRevoke(revoke))),
            vec![Refusal::UnknownToken {
                id: first.id.clone()
            }]
        );
    }

    #[test]
    fn token_fields_are_checked_and_ids_are_unique() {
        let mut machine = TaskMachine::new();
        let mut bad = token("XYZ", Role::Reader, &["jobs-"]);
        bad.secret_hash = "plain".into();
        bad.name = "n".repeat(TOKEN_NAME_BYTES_MAX + 1);
        let fields: Vec<String> = refusals(&run(&mut machine, None, Request::TokenAdd(bad)))
            .iter()
            .map(|r| match r {
                Refusal::InvalidField { field, .. } => field.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(fields, ["id", "name", "secret_hash", "groups"]);
        let empty_prefix = token("0000000000000001", Role::Worker, &[""]);
        assert_eq!(
            refusals(&run(&mut machine, None, Request::TokenAdd(empty_prefix))).len(),
            1
        );
        let good = token("0000000000000001", Role::Worker, &["jobs-"]);
        assert!(matches!(
            run(&mut machine, None, Request::TokenAdd(good.clone())),
            Outcome::Token(_)
        ));
        assert_eq!(
            refusals(&run(&mut machine, None, Request::TokenAdd(good.clone()))),
            vec![Refusal::TokenExists { id: good.id }]
        );
        assert!(
            machine
                .token("0000000000000001")
                .is_some_and(|t| t.covers("jobs-a"))
        );
        assert!(
            machine
                .token("0000000000000001")
                .is_some_and(|t| !t.covers("other"))
        );
    }

    #[test]
    fn a_scoped_request_touches_only_its_groups() {
        let mut machine = TaskMachine::new();
        let theirs = added_id(&run(&mut machine, None, add(1, "other")));
        let ours = added_id(&run(&mut machine, None, add(1, "jobs-a")));
        let limited = ["jobs-"];

        assert_eq!(
            refusals(&run(&mut machine, None, scoped(&limited, add(2, "other")))),
            out_of("other")
        );
        let delete_theirs = Request::Update(UpdateRequest {
            client: 2,
            adds: vec![AddTask::seed("jobs-b", "d", None)],
            deletes: vec![theirs],
            ..Default::default()
        });
        let before = machine.next_id();
        assert_eq!(
            refusals(&run(&mut machine, None, scoped(&limited, delete_theirs))),
            vec![Refusal::TaskOutOfScope {
                list: ListName::Deletes,
                id: theirs
            }],
            "refused without naming the group"
        );
        assert_eq!(machine.next_id(), before, "nothing was added");
        assert!(machine.task(theirs).is_some(), "nothing was deleted");
        let claim = |group: &str| {
            Request::Claim(ClaimRequest {
                client: 2,
                group: group.into(),
                duration_ms: 1_000,
                depends: vec![],
            })
        };
        assert_eq!(
            refusals(&run(&mut machine, None, scoped(&limited, claim("other")))),
            out_of("other")
        );
        let claimed = added_id(&run(&mut machine, None, scoped(&limited, claim("jobs-a"))));
        assert_eq!(machine.task(claimed).map(|t| &*t.group), Some("jobs-a"));
        assert_ne!(claimed, ours, "a claim writes a new version");
        let finish_theirs = Request::Finish(FinishRequest {
            client: 2,
            id: theirs,
            result: None,
        });
        assert_eq!(
            refusals(&run(&mut machine, None, scoped(&limited, finish_theirs))),
            vec![Refusal::TaskOutOfScope {
                list: ListName::Finish,
                id: theirs
            }]
        );
        let text = Refusal::TaskOutOfScope {
            list: ListName::Finish,
            id: theirs,
        }
        .to_string();
        assert!(!text.contains("other"), "{text}");
        let admin = Request::TokenAdd(token("0000000000000002", Role::Admin, &[]));
        assert_eq!(
            refusals(&run(&mut machine, None, scoped(&limited, admin))),
            out_of("")
        );
        assert_eq!(machine.tokens().count(), 0);
    }

    /// Another group's cancelled job: its task id is refused as out of scope, not
    /// answered with the job's key, as a caller of that group would be (from form 4).
    #[test]
    fn a_cancelled_task_of_another_group_does_not_give_its_key_away() {
        let mut machine = TaskMachine::new();
        machine.raise_log_form(SCOPE_OF_CANCELLED_FORM);
        let mut job = AddTask::seed("other", "d", None);
        job.job.key = Some("secret-key".into());
        let added = run(
            &mut machine,
            None,
            Request::Update(UpdateRequest {
                client: 1,
                adds: vec![job],
                ..Default::default()
            }),
        );
        let id = added_id(&added);
        let cancel = Request::Cancel(crate::CancelRequest {
            client: 1,
            group: "other".into(),
            keys: vec!["secret-key".into()],
        });
        assert!(matches!(run(&mut machine, None, cancel), Outcome::Tasks(_)));
        let finish = |client| {
            Request::Finish(FinishRequest {
                client,
                id,
                result: None,
            })
        };
        assert_eq!(
            refusals(&run(&mut machine, None, scoped(&["jobs-"], finish(2)))),
            vec![Refusal::TaskOutOfScope {
                list: ListName::Finish,
                id
            }]
        );
        assert!(matches!(
            refusals(&run(&mut machine, None, scoped(&["oth"], finish(2))))[..],
            [Refusal::Cancelled { .. }]
        ));
    }

    #[test]
    fn a_request_id_does_not_hand_a_scoped_caller_an_answer_it_could_not_get() {
        let mut machine = TaskMachine::new();
        let first = run(&mut machine, Some("r1"), add(5, "other"));
        assert!(matches!(first, Outcome::Tasks(_)));
        // The same request and id through a limited token: refused, not answered.
        assert_eq!(
            refusals(&run(
                &mut machine,
                Some("r1"),
                scoped(&["jobs-"], add(5, "other"))
            )),
            out_of("other")
        );
        // Through a token that covers the group, a retry gets the first answer.
        assert_eq!(
            run(&mut machine, Some("r1"), scoped(&["oth"], add(5, "other"))),
            first
        );
        assert_eq!(
            crate::fingerprint(&scoped(&["oth"], add(5, "other"))),
            crate::fingerprint(&add(5, "other"))
        );
    }
}
