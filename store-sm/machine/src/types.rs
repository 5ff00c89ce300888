//! The machine's domain types: tasks, the commands that change them, and outcomes.
//!
//! These are store-sm's own types, deliberately separate from the JSON shapes in `rpc`,
//! so that a change to either is visible at the boundary where one maps to the other.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::Serialize;

use crate::LogTime;
use crate::auth::ScopedRequest;
use crate::auth::TokenAddRequest;
use crate::auth::TokenRecord;
use crate::auth::TokenRevokeRequest;
use crate::constants::CLAIM_DURATION_MS_MAX;
use crate::constants::REQUEST_ID_BYTES_MAX;
use crate::constants::REQUEST_ITEMS_MAX;
pub use crate::ids::*;
use crate::jobs::AddJob;
use crate::jobs::CancelRequest;
use crate::jobs::FailRequest;
use crate::jobs::FinishAndClaimRequest;
use crate::jobs::FinishManyRequest;
use crate::jobs::FinishRequest;
use crate::jobs::GroupSettings;
use crate::jobs::JobKey;
use crate::jobs::JobState;
use crate::jobs::RetryRequest;
use crate::jobs::SettingsRequest;
use crate::jobs::TaskJob;

/// One immutable task version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Identity and fencing token of this version.
    pub id: TaskId,
    /// The group this task belongs to; never changes across versions.
    pub group: GroupName,
    /// Opaque payload.
    pub data: String,
    /// When the task becomes available to every client; until then `owner` holds it.
    /// The seed's JSON calls it `timespec`.
    pub available_at: LogTime,
    /// The client that wrote this version.
    pub owner: ClientId,
    /// Job fields; default for a seed task.
    pub job: TaskJob,
}

impl Task {
    /// Whether `client` may update or delete this task at log time `now`
    /// (`canModify = at <= now || owner == client`).
    pub fn modifiable_by(&self, client: ClientId, now: LogTime) -> bool {
        self.available_at <= now || self.owner == client
    }

    /// Whether some client owns this task at log time `now`.
    pub fn is_owned_at(&self, now: LogTime) -> bool {
        self.available_at > now
    }
}

/// A new task in an update's `adds`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddTask {
    /// Group of the new task; must not be empty.
    pub group: String,
    /// Payload; the seed's default is empty.
    pub data: String,
    /// `None` is now, negative is now + |t|, otherwise absolute.
    pub timespec: Option<Millis>,
    /// Job fields; default for a seed add.
    pub job: AddJob,
}

impl AddTask {
    /// A seed add: no job fields.
    pub fn seed(
        group: impl Into<String>,
        data: impl Into<String>,
        timespec: Option<Millis>,
    ) -> Self {
        Self {
            group: group.into(),
            data: data.into(),
            timespec,
            job: AddJob::default(),
        }
    }
}

/// A replacement of an existing task in an update's `updates`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateTask {
    /// The version being replaced.
    pub id: TaskId,
    /// New payload; a missing `data` sets it empty.
    pub data: String,
    /// `None` is now, negative is now + |t|, otherwise absolute.
    pub timespec: Option<Millis>,
}

/// The seed's `/update` transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateRequest {
    /// The writing client; becomes the owner of every task written.
    pub client: ClientId,
    /// Tasks to create.
    pub adds: Vec<AddTask>,
    /// Tasks to replace.
    pub updates: Vec<UpdateTask>,
    /// Tasks to remove.
    pub deletes: Vec<TaskId>,
    /// Tasks that must exist, left untouched.
    pub depends: Vec<TaskId>,
}

/// The seed's `/claim`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// The claiming client.
    pub client: ClientId,
    /// Group to claim from.
    pub group: String,
    /// How long the claim owns the task, in milliseconds; positive.
    pub duration_ms: Millis,
    /// Tasks that must exist, left untouched (never the claimed one).
    pub depends: Vec<TaskId>,
}

/// A claim of up to `count` tasks in one command (`/claim` with `count`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimManyRequest {
    /// What each task is claimed under.
    pub claim: ClaimRequest,
    /// Most tasks to claim, from 1 to [`CLAIM_COUNT_MAX`](crate::constants::CLAIM_COUNT_MAX).
    pub count: u32,
}

/// Why `count` is no claim count the machine grants (1 to
/// [`CLAIM_COUNT_MAX`](crate::constants::CLAIM_COUNT_MAX)), or `Ok`: the one statement
/// of the rule, for the machine and the HTTP edge alike.
pub fn check_claim_count(count: u32) -> Result<(), Refusal> {
    if (1..=crate::constants::CLAIM_COUNT_MAX).contains(&count) {
        Ok(())
    } else {
        Err(Refusal::InvalidCount { count })
    }
}

impl ClaimManyRequest {
    /// The request that makes this claim: the seed's one-task forms for a count of 1 (the
    /// very entry a build without counts logs), a claim of many otherwise.
    pub fn to_request(&self, waiting: bool) -> Request {
        match (self.count, waiting) {
            (1, false) => Request::Claim(self.claim.clone()),
            (1, true) => Request::WaitingClaim(self.claim.clone()),
            (_, false) => Request::ClaimMany(self.clone()),
            (_, true) => Request::WaitingClaimMany(self.clone()),
        }
    }
}

/// What a command asks the machine to do.
///
/// The variants' order is their encoding in the Raft log: new ones go at the end, so
/// entries written by earlier builds still decode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// An update without job fields, in the encoding builds before the job layer wrote
    /// (see `legacy.rs`); applied exactly as [`Request::Update`].
    LegacyUpdate(#[serde(with = "crate::legacy::seed_encoding")] UpdateRequest),
    /// Claim the oldest available task of a group.
    Claim(ClaimRequest),
    /// Add, update and delete tasks atomically.
    Update(UpdateRequest),
    /// A finish as builds before the claimed-version rule logged it, applied with their
    /// rule (the owner may finish any version it holds, claimed or not), so that an entry
    /// of theirs applies alike on every build. New builds log [`Request::Finish`].
    LegacyFinish(FinishRequest),
    /// A fail as builds before the claimed-version rule logged it; see
    /// [`Request::LegacyFinish`]. New builds log [`Request::Fail`].
    LegacyFail(FailRequest),
    /// Cancel jobs by key.
    Cancel(CancelRequest),
    /// Re-drive dead jobs by key.
    Retry(RetryRequest),
    /// Change a group's settings.
    Settings(SettingsRequest),
    /// A blocking claim's proposal: a claim whose empty answer is not remembered under
    /// its request id, so that the waiter may propose it again under the same id until
    /// it gets a task, which is then remembered as usual (a retry gets that task).
    WaitingClaim(ClaimRequest),
    /// Claim up to `count` tasks of a group at once: each as a claim would, in the
    /// order successive claims would take them.
    ClaimMany(ClaimManyRequest),
    /// A blocking claim of up to `count` tasks, as [`Request::WaitingClaim`] is to
    /// [`Request::Claim`].
    WaitingClaimMany(ClaimManyRequest),
    /// Add an access token (an admin's request).
    TokenAdd(TokenAddRequest),
    /// Revoke an access token (an admin's request).
    TokenRevoke(TokenRevokeRequest),
    /// The cluster's first admin token: refused once any token was ever made.
    AuthBootstrap(TokenAddRequest),
    /// A worker token's request, refused if it names or touches a group outside the
    /// token's prefixes.
    Scoped(ScopedRequest),
    /// A finish of many as builds before the claimed-version rule logged it; see
    /// [`Request::LegacyFinish`]. New builds log [`Request::FinishMany`].
    LegacyFinishMany(FinishManyRequest),
    /// Nothing but time passing: the leader proposes it when a lease or a record's
    /// retention ends with nothing applied since, so the lapse reaches the log (and
    /// every watch) on an idle cluster too.
    PassTime,
    /// End a claim with success. A job's version must be claimed (see
    /// [`Refusal::NotClaimed`]).
    Finish(FinishRequest),
    /// End the claims of several tasks with success, all or none.
    FinishMany(FinishManyRequest),
    /// End a claim with an error. A job's version must be claimed, as for a finish.
    Fail(FailRequest),
    /// A finish and then a claim by the same client, all or nothing: refused as a whole
    /// if either would be; the claim may still find no task.
    FinishAndClaim(FinishAndClaimRequest),
    /// Records that every member reads log entry forms up to this one (the node's
    /// numbering, see raft-node's `log_forms`): a one-way floor, never lowered, so
    /// that any later leader logs those forms without hearing from every member first.
    /// Below [`RULES_FORM`](crate::constants::RULES_FORM) only: a higher one raises the
    /// floor to the form before it (see [`Request::RaiseRulesForm`]).
    RaiseLogForm(u32),
    /// [`Request::RaiseLogForm`] to a form that changes what the machine does (from
    /// [`RULES_FORM`](crate::constants::RULES_FORM) on), in a variant that builds of
    /// older forms cannot decode: such a member stops at it, rather than go on applying
    /// the older rules while the others apply the new ones.
    RaiseRulesForm(u32),
    /// Several commands in one log entry (group commit): each applies in turn exactly as
    /// if it were an entry of its own, with its own stamp and request id, and the entry's
    /// outcome is [`Outcome::Batch`], one outcome per command in order. A leader batches
    /// the writes that arrive together once every member reads it (the node's log form
    /// 5); no client request becomes one.
    Batch(Vec<Command>),
}

impl Request {
    /// The client that issued the request.
    pub fn client(&self) -> ClientId {
        match self {
            Request::LegacyUpdate(update) => update.client,
            Request::Update(update) => update.client,
            Request::Claim(claim) | Request::WaitingClaim(claim) => claim.client,
            Request::ClaimMany(many) | Request::WaitingClaimMany(many) => many.claim.client,
            Request::Finish(finish) | Request::LegacyFinish(finish) => finish.client,
            Request::FinishMany(many) | Request::LegacyFinishMany(many) => many.client,
            Request::Fail(fail) | Request::LegacyFail(fail) => fail.client,
            Request::FinishAndClaim(both) => both.finish.client,
            Request::Cancel(cancel) => cancel.client,
            Request::Retry(retry) => retry.client,
            Request::Settings(settings) => settings.client,
            Request::TokenAdd(add) | Request::AuthBootstrap(add) => add.client,
            Request::TokenRevoke(revoke) => revoke.client,
            Request::Scoped(scoped) => scoped.request.client(),
            Request::PassTime
            | Request::RaiseLogForm(_)
            | Request::RaiseRulesForm(_)
            | Request::Batch(_) => 0,
        }
    }

    /// The request without its scope.
    pub fn unscoped(&self) -> &Request {
        match self {
            Request::Scoped(scoped) => scoped.request.unscoped(),
            other => other,
        }
    }
}

/// One log entry's worth of work: a request, the leader's time stamp and an optional
/// client request id for deduplication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// The leader's log clock when it proposed the entry; the machine never lets time go
    /// back, so the command applies at `max(stamp, previous log time)`.
    pub stamp: LogTime,
    /// A retried command with the same `(client, request_id)` returns its first outcome.
    pub request_id: Option<String>,
    /// The work itself.
    pub request: Request,
}

/// A one-line summary for logs (openraft prints every entry it appends).
impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Request::Scoped(scoped) = &self.request {
            write!(f, "scoped(groups={:?}) ", scoped.groups)?;
        }
        match self.request.unscoped() {
            Request::LegacyUpdate(u) | Request::Update(u) => {
                let lists = [
                    u.adds.len(),
                    u.updates.len(),
                    u.deletes.len(),
                    u.depends.len(),
                ];
                write_update(f, u.client, lists)?
            }
            Request::Claim(c) => write!(f, "claim(client={} group={:?})", c.client, c.group)?,
            Request::WaitingClaim(c) => {
                write!(f, "waiting claim(client={} group={:?})", c.client, c.group)?
            }
            Request::ClaimMany(m) => write!(
                f,
                "claim(client={} group={:?} count={})",
                m.claim.client, m.claim.group, m.count
            )?,
            Request::WaitingClaimMany(m) => write!(
                f,
                "waiting claim(client={} group={:?} count={})",
                m.claim.client, m.claim.group, m.count
            )?,
            Request::Finish(r) | Request::LegacyFinish(r) => {
                write!(f, "finish(client={} id={})", r.client, r.id)?
            }
            Request::FinishMany(r) | Request::LegacyFinishMany(r) => {
                write!(f, "finish(client={} tasks={})", r.client, r.finishes.len())?
            }
            Request::Fail(r) | Request::LegacyFail(r) => {
                write!(f, "fail(client={} id={})", r.client, r.id)?
            }
            Request::FinishAndClaim(r) => write!(
                f,
                "finish and claim(client={} id={} group={:?} count={})",
                r.finish.client, r.finish.id, r.next.claim.group, r.next.count
            )?,
            Request::Cancel(r) => write!(
                f,
                "cancel(client={} group={:?} keys={})",
                r.client,
                r.group,
                r.keys.len()
            )?,
            Request::Retry(r) => write!(
                f,
                "retry(client={} group={:?} keys={})",
                r.client,
                r.group,
                r.keys.len()
            )?,
            Request::Settings(r) => write!(f, "settings(client={} group={:?})", r.client, r.group)?,
            Request::TokenAdd(r) => write!(f, "token add(id={} role={})", r.id, r.role)?,
            Request::AuthBootstrap(r) => write!(f, "auth bootstrap(id={})", r.id)?,
            Request::TokenRevoke(r) => write!(f, "token revoke(id={})", r.id)?,
            Request::Scoped(_) => f.write_str("scoped")?,
            Request::PassTime => f.write_str("pass time")?,
            Request::RaiseLogForm(form) | Request::RaiseRulesForm(form) => {
                write!(f, "raise log form to {form}")?
            }
            Request::Batch(commands) => write!(f, "batch of {}", commands.len())?,
        }
        write!(f, "@{}", self.stamp)
    }
}

/// An update's one-line summary: its client and the lengths of its four lists.
fn write_update(f: &mut fmt::Formatter<'_>, client: ClientId, lists: [usize; 4]) -> fmt::Result {
    let [adds, updates, deletes, depends] = lists;
    write!(
        f,
        "update(client={client} adds={adds} updates={updates} deletes={deletes} depends={depends})"
    )
}

/// The list of a request that a refusal is about, named as in the JSON API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ListName {
    /// `adds`
    Adds,
    /// `updates`
    Updates,
    /// `deletes`
    Deletes,
    /// `depends`
    Depends,
    /// the `id` of a `/finish`
    Finish,
    /// the `id` of a `/fail`
    Fail,
    /// the `keys` of a `/cancel` or `/retry`
    Keys,
}

impl fmt::Display for ListName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ListName::Adds => "adds",
            ListName::Updates => "updates",
            ListName::Deletes => "deletes",
            ListName::Depends => "depends",
            ListName::Finish => "finish",
            ListName::Fail => "fail",
            ListName::Keys => "keys",
        })
    }
}

/// One reason a command was refused. A refused command changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// A named task does not exist (any more).
    Missing {
        /// Where the id was named.
        list: ListName,
        /// The id.
        id: TaskId,
    },
    /// A named task is owned by another client.
    Owned {
        /// Where the id was named.
        list: ListName,
        /// The id.
        id: TaskId,
        /// Its owner.
        owner: ClientId,
        /// Until when: the task's available time.
        available_at: LogTime,
    },
    /// An id is named more than once across updates, deletes and depends.
    Duplicate {
        /// Where it was named again.
        list: ListName,
        /// The id.
        id: TaskId,
    },
    /// An update with no adds, updates or deletes.
    NothingToDo,
    /// An add without a group, or with an empty one.
    MissingGroup {
        /// Position in `adds`.
        index: usize,
    },
    /// A claim without a group, or with an empty one.
    ClaimWithoutGroup,
    /// A claim duration that is not positive.
    InvalidDuration {
        /// What was asked.
        duration_ms: Millis,
    },
    /// A timespec whose resolved time does not fit in 64 bits.
    TimespecOutOfRange {
        /// Where it was given.
        list: ListName,
        /// Position in that list.
        index: usize,
        /// What was given.
        timespec: Millis,
    },
    /// A claim whose duration runs past the end of representable time.
    DurationOutOfRange {
        /// What was asked.
        duration_ms: Millis,
    },
    /// A request id longer than [`REQUEST_ID_BYTES_MAX`].
    RequestIdTooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// More ids than [`REQUEST_ITEMS_MAX`] in one request.
    TooManyItems {
        /// How many were named.
        items: usize,
    },
    /// A claim longer than [`CLAIM_DURATION_MS_MAX`]. Last, so that the encoding of the
    /// variants before it (stored in the dedup table of snapshots) is unchanged.
    DurationTooLong {
        /// What was asked.
        duration_ms: Millis,
    },
    /// A field out of its bounds (the HTTP edge refuses most of these with a 400 first;
    /// the machine refuses them too, to stay total).
    InvalidField {
        /// The field, as the JSON API names it (`adds[2].key`).
        field: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// An add's key names a live task of its group, and `on_conflict` is `refuse`.
    KeyLive {
        /// Position in `adds`.
        index: usize,
        /// The key.
        key: JobKey,
        /// The live task.
        id: TaskId,
    },
    /// A key added twice in one request.
    KeyTwice {
        /// Position in `adds` of the second add.
        index: usize,
        /// The key.
        key: JobKey,
    },
    /// An add's `after` names a key that is neither a live or succeeded job of the group
    /// nor added earlier in the same request.
    AfterUnknown {
        /// Position in `adds`.
        index: usize,
        /// The unknown key.
        key: JobKey,
    },
    /// An add's `after` names a job that ended without success.
    AfterEnded {
        /// Position in `adds`.
        index: usize,
        /// The prerequisite's key.
        key: JobKey,
        /// How it ended.
        state: JobState,
    },
    /// A finish or fail names a task its client does not hold (another owner, or the
    /// lease lapsed).
    NotHeld {
        /// Where the id was named.
        list: ListName,
        /// The id.
        id: TaskId,
        /// The task's owner.
        owner: ClientId,
        /// When its lease ends or ended.
        available_at: LogTime,
    },
    /// A finish or fail names a job's task version that its client owns but no claim
    /// leased: one waiting to run (scheduled, backing off, a recurring job's next run).
    NotClaimed {
        /// Where the id was named.
        list: ListName,
        /// The id.
        id: TaskId,
        /// The job's key.
        key: JobKey,
    },
    /// A write names a task version that a cancel removed: the worker should stop.
    Cancelled {
        /// Where the id was named.
        list: ListName,
        /// The id.
        id: TaskId,
        /// The cancelled job's key.
        key: JobKey,
    },
    /// A cancel or retry names a key with no job record in the group.
    UnknownKey {
        /// The key.
        key: JobKey,
    },
    /// A retry names a job that is not dead, or a cancel one that already succeeded.
    WrongState {
        /// The key.
        key: JobKey,
        /// Its state.
        state: JobState,
        /// What the request needed.
        needed: String,
    },
    /// The request id names an earlier, different request of the same client (a retry
    /// must send the same request; a new request needs a fresh id).
    RequestIdReused {
        /// The id.
        request_id: String,
    },
    /// A claim's count outside 1 to [`CLAIM_COUNT_MAX`](crate::constants::CLAIM_COUNT_MAX).
    InvalidCount {
        /// What was asked.
        count: u32,
    },
    /// A worker token's request names or touches a group outside its prefixes (an
    /// empty group: a request no worker token may make).
    OutOfScope {
        /// The group.
        group: String,
    },
    /// A token with this id exists already.
    TokenExists {
        /// The id.
        id: String,
    },
    /// No current token has this id.
    UnknownToken {
        /// The id.
        id: String,
    },
    /// The cluster holds [`TOKENS_MAX`](crate::constants::TOKENS_MAX) tokens.
    TooManyTokens,
    /// The first admin token was made already.
    AlreadyBootstrapped,
    /// A late renewal would take a lapsed lease back in a group that runs its
    /// `max_running` tasks already.
    RetakeOverLimit {
        /// The task.
        id: TaskId,
        /// When its lease ended.
        ended_at: LogTime,
        /// The group's limit.
        max_running: u32,
    },
    /// A request through a token limited to groups names a task (or a cancelled job's
    /// task) of a group outside them; the group is not named, as reads hide the task.
    TaskOutOfScope {
        /// Where the id was named.
        list: ListName,
        /// The id.
        id: TaskId,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing { list, id } => write!(f, "{list}: task {id} does not exist"),
            Refusal::Owned {
                list,
                id,
                owner,
                available_at,
            } => write!(
                f,
                "{list}: task {id} is owned by client {owner} until {available_at}"
            ),
            Refusal::Duplicate { list, id } => write!(
                f,
                "{list}: task {id} is named more than once in the request; name each id once"
            ),
            Refusal::NothingToDo => f.write_str(
                "the update has no adds, updates or deletes (depends alone changes nothing)",
            ),
            Refusal::MissingGroup { index } => {
                write!(
                    f,
                    "adds: item {index} has no group; give every added task a non-empty group"
                )
            }
            Refusal::ClaimWithoutGroup => f.write_str("claim: group is missing or empty"),
            Refusal::InvalidDuration { duration_ms } => {
                write!(
                    f,
                    "claim: duration {duration_ms} is not a positive number of milliseconds"
                )
            }
            Refusal::TimespecOutOfRange {
                list,
                index,
                timespec,
            } => write!(
                f,
                "{list}: item {index} has timespec {timespec}, which is out of range"
            ),
            Refusal::DurationOutOfRange { duration_ms } => {
                write!(f, "claim: duration {duration_ms} runs past the end of time")
            }
            Refusal::RequestIdTooLong { bytes } => write!(
                f,
                "requestid is {bytes} bytes long; the limit is {REQUEST_ID_BYTES_MAX}"
            ),
            Refusal::TooManyItems { items } => write!(
                f,
                "the request names {items} tasks; the limit is {REQUEST_ITEMS_MAX}, split it"
            ),
            Refusal::DurationTooLong { duration_ms } => write!(
                f,
                "claim: duration {duration_ms} is longer than the limit of {CLAIM_DURATION_MS_MAX} milliseconds"
            ),
            Refusal::InvalidField { field, reason } => write!(f, "{field}: {reason}"),
            Refusal::KeyLive { index, key, id } => write!(
                f,
                "adds: item {index} has key {key:?}, which live task {id} of the group holds; \
                 set on_conflict to \"keep\" or \"resubmit\" to enqueue idempotently"
            ),
            Refusal::KeyTwice { index, key } => {
                write!(f, "adds: item {index} adds key {key:?} a second time")
            }
            Refusal::AfterUnknown { index, key } => write!(
                f,
                "adds: item {index} names key {key:?} in after, which is neither a live or \
                 succeeded job of the group nor added earlier in this request"
            ),
            Refusal::AfterEnded { index, key, state } => {
                // Only a dead job can be retried; a cancelled one must be added again.
                let fix = if *state == JobState::Dead {
                    "retry or re-add it first"
                } else {
                    "add it again first"
                };
                write!(
                    f,
                    "adds: item {index} names key {key:?} in after, which ended {state} and \
                     can never succeed; {fix}"
                )
            }
            Refusal::NotHeld {
                list,
                id,
                owner,
                available_at,
            } => write!(
                f,
                "{list}: task {id} is not held by this client (owner {owner}, lease ends \
                 {available_at}); claim it again"
            ),
            Refusal::NotClaimed { list, id, key } => write!(
                f,
                "{list}: task {id} of job {key:?} is waiting to run, not claimed: only a \
                 claim's lease can be finished or failed; claim it first (POST /claim)"
            ),
            Refusal::Cancelled { list, id, key } => write!(
                f,
                "{list}: task {id} was cancelled (job {key:?}); stop working on it"
            ),
            Refusal::UnknownKey { key } => {
                write!(f, "keys: no job with key {key:?} in the group")
            }
            Refusal::WrongState { key, state, needed } => {
                write!(f, "keys: job {key:?} is {state}; {needed}")
            }
            Refusal::RetakeOverLimit {
                id,
                ended_at,
                max_running,
            } => write!(
                f,
                "updates: task {id} is no longer held: this client's lease on it ended at {ended_at} (log time, ms), and its group runs its max_running of {max_running} tasks already, so the lease was not taken back; stop working on it, and claim it again later"
            ),
            Refusal::TaskOutOfScope { list, id } => write!(
                f,
                "{list}: task {id} is in a group outside this token's groups; use a token that covers its group"
            ),
            Refusal::RequestIdReused { request_id } => write!(
                f,
                "requestid {request_id:?} was used for a different request of this client; a retry must send the same request, a new request needs a fresh requestid"
            ),
            Refusal::InvalidCount { count } => write!(
                f,
                "claim: count {count} is not between 1 and {}",
                crate::constants::CLAIM_COUNT_MAX
            ),
            Refusal::OutOfScope { group } if group.is_empty() => {
                f.write_str("a worker token cannot make this request; use an admin token")
            }
            Refusal::OutOfScope { group } => write!(
                f,
                "group {group:?} is outside this token's groups; use a token that covers it"
            ),
            Refusal::TokenExists { id } => write!(f, "a token with id {id} exists already"),
            Refusal::UnknownToken { id } => {
                write!(f, "no token has id {id}; `rota auth token list` shows them")
            }
            Refusal::TooManyTokens => write!(
                f,
                "the cluster holds {} tokens, its limit; revoke unused ones first",
                crate::constants::TOKENS_MAX
            ),
            Refusal::AlreadyBootstrapped => f.write_str(
                "this cluster made its first admin token already; make more with `rota auth token add` and an admin token",
            ),
        }
    }
}

/// The result of applying one command: exactly one of the seed's two shapes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Success: adds first, then updates, in request order; a claim's one task, or none.
    Tasks(Vec<Task>),
    /// Refusal with every reason; nothing changed.
    Refused(Vec<Refusal>),
    /// A group's settings after a change.
    Settings(GroupSettings),
    /// The token a token request added or revoked.
    Token(TokenRecord),
    /// A [`Request::Batch`]'s outcomes, one per command in order.
    Batch(Vec<Arc<Outcome>>),
}

impl Outcome {
    /// Whether the command changed nothing because it was refused.
    pub fn is_refused(&self) -> bool {
        matches!(self, Outcome::Refused(_))
    }
}
