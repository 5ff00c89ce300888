//! Who is asking: bearer tokens checked against the replicated token records, and the
//! token changes an admin (or, once, anyone) proposes.
//!
//! A bearer token reads `rota_<id>_<secret>`: the id finds the record, the secret's
//! SHA-256 must equal the record's hash. Secrets are 32 random bytes made here and shown
//! once; only their hash enters the log. A node checks tokens against what it has
//! applied, so a token added or revoked a moment ago reaches a follower within a
//! heartbeat; writes are checked again by the leader, which relays them.

use std::sync::Arc;
use std::time::Duration;

use sha2::Digest;
use sha2::Sha256;
use store_sm::machine::ClientId;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::Role;
use store_sm::machine::ScopedRequest;
use store_sm::machine::TokenAddRequest;
use store_sm::machine::TokenRecord;
use store_sm::machine::TokenRevokeRequest;
use store_sm::machine::constants::TOKEN_ID_BYTES;
use store_sm::state_machine::AppliedState;

use super::Consistency;
use super::ServiceError;
use crate::node::Node;
use crate::random::random_bytes;

/// The prefix of every bearer token, so that a leaked one is recognisable.
pub const TOKEN_PREFIX: &str = "rota_";

/// Hex digits of a token's secret (32 bytes).
const SECRET_HEX_DIGITS: usize = 64;

/// How often [`Node::holds_token_within`] looks again.
const TOKEN_LOOK_EVERY: Duration = Duration::from_millis(10);

/// Whether the node checks tokens at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Every request but probes and the bootstrap needs a bearer token.
    Tokens,
    /// Nothing is checked: anyone who reaches the port may do anything.
    Off,
}

/// The one asking, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off on this node.
    Anyone,
    /// The bearer of a current token.
    Token {
        /// The token's id.
        id: String,
        /// Its role.
        role: Role,
        /// The group prefixes a worker token is limited to; empty: every group.
        groups: Vec<String>,
    },
}

/// What an endpoint needs of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Nothing: probes, documentation, the dashboard's files, the bootstrap.
    Open,
    /// Reading tasks, jobs, groups and the cluster's status: any role.
    Read,
    /// Metrics and the node's internals: a reader or an admin.
    Observe,
    /// Writing tasks and jobs: a worker or an admin.
    Write,
    /// Membership, backup, restore, settings, tokens: an admin.
    Admin,
}

impl Caller {
    /// Whether this caller may do what `access` needs, or why not.
    pub fn may(&self, access: Access) -> Result<(), ServiceError> {
        let Caller::Token { role, .. } = self else {
            return Ok(());
        };
        let allowed = match access {
            Access::Open | Access::Read => true,
            Access::Observe => matches!(role, Role::Reader | Role::Admin),
            Access::Write => matches!(role, Role::Worker | Role::Admin),
            Access::Admin => *role == Role::Admin,
        };
        if allowed {
            return Ok(());
        }
        let needed = match access {
            Access::Observe => "a reader or admin token",
            Access::Write => "a worker or admin token",
            _ => "an admin token",
        };
        Err(ServiceError::Forbidden(format!(
            "a {role} token cannot do this; it needs {needed}"
        )))
    }

    /// The group prefixes this caller is limited to, if it is limited.
    pub fn scope(&self) -> Option<&[String]> {
        match self {
            Caller::Token { groups, .. } if !groups.is_empty() => Some(groups),
            _ => None,
        }
    }

    /// Whether this caller may see or touch `group`.
    pub fn covers(&self, group: &str) -> bool {
        self.scope()
            .is_none_or(|prefixes| store_sm::machine::auth::scope_covers(prefixes, group))
    }

    /// `Ok` if this caller may touch `group`, else a 403 that names it.
    pub fn check_group(&self, group: &str) -> Result<(), ServiceError> {
        if self.covers(group) {
            return Ok(());
        }
        Err(ServiceError::Forbidden(format!(
            "group {group:?} is outside this token's groups; use a token that covers it"
        )))
    }

    /// `request` as this caller may make it: wrapped in its scope when it has one, so
    /// the machine refuses whatever it names outside the scope.
    pub fn limit(&self, request: Request) -> Request {
        match self.scope() {
            Some(groups) => Request::Scoped(ScopedRequest {
                groups: groups.to_vec(),
                request: Box::new(request),
            }),
            None => request,
        }
    }
}

/// A new token: its record's fields and the bearer token shown once.
#[derive(Clone, Debug)]
pub struct NewToken {
    /// What the machine stores.
    pub add: TokenAddRequest,
    /// The bearer token, `rota_<id>_<secret>`.
    pub bearer: String,
}

/// SHA-256 of `secret`, lowercase hex.
fn secret_hash(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh token for `role`, limited to `groups`.
pub fn new_token(client: ClientId, name: String, role: Role, groups: Vec<String>) -> NewToken {
    let id = hex(&random_bytes::<{ TOKEN_ID_BYTES / 2 }>());
    let secret = hex(&random_bytes::<{ SECRET_HEX_DIGITS / 2 }>());
    NewToken {
        bearer: format!("{TOKEN_PREFIX}{id}_{secret}"),
        add: TokenAddRequest {
            client,
            id,
            name,
            role,
            groups,
            secret_hash: secret_hash(&secret),
        },
    }
}

/// The 401 of a token the cluster does not hold.
pub fn unknown_token() -> ServiceError {
    unauthorized("the token is unknown or revoked")
}

/// A 401 that says `why` and how to send a token.
pub fn unauthorized(why: &str) -> ServiceError {
    ServiceError::Unauthorized(format!(
        "{why}; send `Authorization: Bearer <token>` (rota: --token or ROTA_TOKEN)"
    ))
}

/// The token id and the SHA-256 of the secret that an `Authorization` header value
/// carries, or why it carries none.
fn parse_authorization(authorization: Option<&str>) -> Result<(&str, String), ServiceError> {
    let Some(value) = authorization else {
        return Err(unauthorized("this node requires a token"));
    };
    // The scheme's name is case-insensitive (RFC 9110, section 11.1).
    let bearer = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, credentials)| credentials)
        .ok_or_else(|| unauthorized("the Authorization header is not a bearer token"))?;
    let (id, secret) = split_bearer(bearer.trim())
        .ok_or_else(|| unauthorized("the bearer token is not a Rota token"))?;
    Ok((id, secret_hash(secret)))
}

/// The caller that token `id` with a secret hashing to `hash` is in `state`: `None` if
/// `state` has no token `id`, a 401 if the secret is wrong.
fn look_up(state: &AppliedState, id: &str, hash: &str) -> Option<Result<Caller, ServiceError>> {
    let record = state.machine.token(id)?;
    Some(if equal_in_constant_time(&record.secret_hash, hash) {
        Ok(caller_of(record))
    } else {
        Err(unknown_token())
    })
}

/// The id and secret of a bearer token, if it has the shape of one.
fn split_bearer(bearer: &str) -> Option<(&str, &str)> {
    let (id, secret) = bearer.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (id.len() == TOKEN_ID_BYTES && secret.len() == SECRET_HEX_DIGITS).then_some((id, secret))
}

/// Whether two strings are equal, in time that does not depend on where they differ.
fn equal_in_constant_time(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |differ, (x, y)| differ | (x ^ y))
            == 0
}

/// Whether a node held a caller's token when it looked ([`Node::holds_token`]).
#[derive(Clone, Copy, Debug)]
pub struct HeldToken(bool);

/// The caller a token record makes.
fn caller_of(record: &TokenRecord) -> Caller {
    Caller::Token {
        id: record.id.clone(),
        role: record.role,
        groups: record.groups.clone(),
    }
}

impl Node {
    /// Whether this node's applied state holds `caller`'s token (always, without tokens):
    /// what a request that waits notes before it waits, for [`Node::still_authorized`].
    pub fn holds_token(&self, caller: &Caller) -> HeldToken {
        HeldToken(match caller {
            Caller::Anyone => true,
            Caller::Token { id, .. } => self.state.read(|state| state.machine.token(id).is_some()),
        })
    }

    /// Whether `caller` may still be served after a wait (a blocking claim, a long poll,
    /// an event stream), before it claims or answers: a token this node held when the
    /// request came and holds no more was revoked meanwhile, and takes nothing more. A
    /// token it did not hold then (the leader vouched for it: a new or lagging member)
    /// is not judged here, as it was not when the request came.
    pub fn still_authorized(&self, caller: &Caller, held: HeldToken) -> Result<(), ServiceError> {
        if held.0 && !self.holds_token(caller).0 {
            return Err(unknown_token());
        }
        Ok(())
    }

    /// Whether this node holds `caller`'s token within `within`, looking again every few
    /// milliseconds: a request that is served for long (an event stream) starts only
    /// once it does, so that the token's revocation, which the node applies after its
    /// creation, is sure to end it. A token the leader vouched for is usually applied
    /// here within a heartbeat.
    pub async fn holds_token_within(&self, caller: &Caller, within: Duration) -> Option<HeldToken> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let held = self.holds_token(caller);
            if held.0 {
                return Some(held);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(TOKEN_LOOK_EVERY).await;
        }
    }

    /// Who sent a request with this `Authorization` header value (if any), by this
    /// node's applied state. A well-formed token it does not know may be one the cluster
    /// made a moment ago: [`Node::authenticate_confirmed`] settles that.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, ServiceError> {
        self.authenticate_known(authorization)
            .unwrap_or_else(|| Err(unknown_token()))
    }

    /// The caller `authorization` names, when this node can tell at once: authentication
    /// is off, the header is malformed, or the token is one this node has applied; `None`
    /// for a token it does not know, which [`Node::authenticate_confirmed`] confirms.
    pub fn authenticate_known(
        &self,
        authorization: Option<&str>,
    ) -> Option<Result<Caller, ServiceError>> {
        if self.config.auth == AuthMode::Off {
            return Some(Ok(Caller::Anyone));
        }
        let (id, hash) = match parse_authorization(authorization) {
            Ok(parsed) => parsed,
            Err(malformed) => return Some(Err(malformed)),
        };
        self.state.read(|state| look_up(state, id, &hash))
    }

    /// As [`Node::authenticate`], but a token this node does not know is not refused on
    /// its word: the leader looks it up after a linearizable read, and elsewhere the
    /// answer is [`ServiceError::NotLeader`], for the caller to ask the leader (`GET
    /// /auth/whoami`), so that no node refuses a token the cluster has made because it
    /// has not applied it yet (it restarted, lags or is new). A request `forwarded` by
    /// another node is not sent onwards: it gets 503 where no leader can answer.
    pub async fn authenticate_confirmed(
        &self,
        authorization: Option<&str>,
        forwarded: bool,
    ) -> Result<Caller, ServiceError> {
        if let Some(known) = self.authenticate_known(authorization) {
            return known;
        }
        let (id, hash) = parse_authorization(authorization)?;
        if store_sm::planted::is_planted(store_sm::planted::Bug::LocalTokenCheck) {
            return Err(unknown_token());
        }
        match self.read(Consistency::Linearizable).await {
            Ok(view) => look_up(&view.state, id, &hash).ok_or_else(unknown_token)?,
            // The caller (the HTTP layer) asks the leader who the token is.
            Err(not_leader @ ServiceError::NotLeader { .. }) if !forwarded => Err(not_leader),
            Err(ServiceError::NotLeader { .. }) => Err(ServiceError::Unavailable(
                "leadership is moving and this node cannot check the token yet; retry shortly"
                    .into(),
            )),
            Err(other) => Err(other),
        }
    }

    /// Adds a token (the caller is an admin) and returns it with its bearer form.
    pub async fn add_token(&self, new: NewToken) -> Result<(TokenRecord, String), ServiceError> {
        let outcome = self.write(Request::TokenAdd(new.add), None).await?;
        Ok((token_outcome(&outcome)?, new.bearer))
    }

    /// Makes the cluster's first admin token: refused once any token was ever made.
    pub async fn bootstrap_auth(
        &self,
        new: NewToken,
    ) -> Result<(TokenRecord, String), ServiceError> {
        let outcome = self.write(Request::AuthBootstrap(new.add), None).await?;
        Ok((token_outcome(&outcome)?, new.bearer))
    }

    /// Revokes a token by id and returns the record it had.
    pub async fn revoke_token(
        &self,
        client: ClientId,
        id: String,
        request_id: Option<String>,
    ) -> Result<TokenRecord, ServiceError> {
        let request = Request::TokenRevoke(TokenRevokeRequest { client, id });
        let outcome = self.write(request, request_id).await?;
        token_outcome(&outcome)
    }
}

/// The token a token request answered, or its refusals as an error.
fn token_outcome(outcome: &Arc<Outcome>) -> Result<TokenRecord, ServiceError> {
    match &**outcome {
        Outcome::Token(record) => Ok(record.clone()),
        Outcome::Refused(refusals) => {
            let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
            let reasons = reasons.join("; ");
            let conflict = refusals.iter().any(|r| {
                matches!(
                    r,
                    store_sm::machine::Refusal::AlreadyBootstrapped
                        | store_sm::machine::Refusal::TokenExists { .. }
                        | store_sm::machine::Refusal::TooManyTokens
                )
            });
            let unknown = refusals
                .iter()
                .any(|r| matches!(r, store_sm::machine::Refusal::UnknownToken { .. }));
            Err(if conflict {
                ServiceError::Conflict(reasons)
            } else if unknown {
                ServiceError::NotFound(reasons)
            } else {
                ServiceError::Invalid(reasons)
            })
        }
        other => Err(ServiceError::Internal(format!(
            "a token request answered {other:?}; report this"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_token_has_the_documented_shape_and_its_secret_matches_its_hash() {
        let new = new_token(1, "ci".into(), Role::Worker, vec!["jobs-".into()]);
        let (id, secret) = split_bearer(&new.bearer).expect("a Rota token");
        assert_eq!(id, new.add.id);
        assert_eq!(secret_hash(secret), new.add.secret_hash);
        assert!(store_sm::machine::auth::check_token_fields(&new.add).is_empty());
        let other = new_token(1, "ci".into(), Role::Worker, vec![]);
        assert_ne!(other.add.id, new.add.id, "ids are random");
        assert!(split_bearer("rota_short_secret").is_none());
        assert!(split_bearer(&new.bearer.replace("rota_", "xyz_")).is_none());
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case_and_nothing_else_is_taken() {
        let new = new_token(1, "ci".into(), Role::Worker, vec![]);
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let header = format!("{scheme} {}", new.bearer);
            let (id, hash) = parse_authorization(Some(&header)).expect("a bearer token");
            assert_eq!(
                (id, hash),
                (new.add.id.as_str(), new.add.secret_hash.clone())
            );
        }
        for header in [
            format!("Basic {}", new.bearer),
            format!("Bearer{}", new.bearer),
            new.bearer.clone(),
        ] {
            assert!(
                matches!(
                    parse_authorization(Some(&header)),
                    Err(ServiceError::Unauthorized(_))
                ),
                "{header}"
            );
        }
        assert!(parse_authorization(None).is_err());
    }

    #[test]
    fn roles_allow_what_the_spec_says() {
        let caller = |role| Caller::Token {
            id: "x".into(),
            role,
            groups: vec![],
        };
        let allowed = |role, access| caller(role).may(access).is_ok();
        for access in [Access::Open, Access::Read] {
            assert!(allowed(Role::Worker, access) && allowed(Role::Reader, access));
        }
        assert!(allowed(Role::Worker, Access::Write) && !allowed(Role::Reader, Access::Write));
        assert!(allowed(Role::Reader, Access::Observe) && !allowed(Role::Worker, Access::Observe));
        assert!(!allowed(Role::Worker, Access::Admin) && !allowed(Role::Reader, Access::Admin));
        for access in [Access::Read, Access::Observe, Access::Write, Access::Admin] {
            assert!(allowed(Role::Admin, access));
            assert!(Caller::Anyone.may(access).is_ok());
        }
    }

    #[test]
    fn a_limited_caller_wraps_its_requests_and_checks_groups() {
        let limited = Caller::Token {
            id: "x".into(),
            role: Role::Worker,
            groups: vec!["jobs-".into()],
        };
        assert!(limited.check_group("jobs-1").is_ok());
        assert!(matches!(
            limited.check_group("other"),
            Err(ServiceError::Forbidden(_))
        ));
        let request = Request::Retry(store_sm::machine::RetryRequest {
            client: 1,
            group: "other".into(),
            keys: vec![],
        });
        assert!(matches!(limited.limit(request.clone()), Request::Scoped(_)));
        assert_eq!(Caller::Anyone.limit(request.clone()), request);
        assert!(equal_in_constant_time("abc", "abc") && !equal_in_constant_time("abc", "abd"));
    }
}
