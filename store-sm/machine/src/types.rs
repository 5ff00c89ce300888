//! The machine's domain types: tasks, the commands that change them, and outcomes.
//!
//! These are store-sm's own types, deliberately separate from the JSON shapes in `rpc`,
//! so that a change to either is visible at the boundary where one maps to the other.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::Serialize;

use crate::LogTime;
use crate::constants::CLAIM_DURATION_MS_MAX;
use crate::constants::REQUEST_ID_BYTES_MAX;
use crate::constants::REQUEST_ITEMS_MAX;

/// A task version's identity and fencing token; strictly increasing, never reused.
pub type TaskId = u64;

/// The numeric identity a worker chooses for itself (the seed's `clientid`).
pub type ClientId = i64;

/// A count of milliseconds: a duration, or a time as a request states it, before the
/// machine resolves it to a [`LogTime`].
pub type Millis = i64;

/// A cluster node's id, as the machine records membership history.
pub type MemberId = u64;

/// A group name, shared between a group's tasks and its index.
pub type GroupName = Arc<str>;

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

/// What a command asks the machine to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Add, update and delete tasks atomically.
    Update(UpdateRequest),
    /// Claim the oldest available task of a group.
    Claim(ClaimRequest),
}

impl Request {
    /// The client that issued the request.
    pub fn client(&self) -> ClientId {
        match self {
            Request::Update(update) => update.client,
            Request::Claim(claim) => claim.client,
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
        match &self.request {
            Request::Update(u) => write!(
                f,
                "update(client={} adds={} updates={} deletes={} depends={})",
                u.client,
                u.adds.len(),
                u.updates.len(),
                u.deletes.len(),
                u.depends.len()
            )?,
            Request::Claim(c) => write!(f, "claim(client={} group={:?})", c.client, c.group)?,
        }
        write!(f, "@{}", self.stamp)
    }
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
}

impl fmt::Display for ListName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ListName::Adds => "adds",
            ListName::Updates => "updates",
            ListName::Deletes => "deletes",
            ListName::Depends => "depends",
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
}

impl Outcome {
    /// Whether the command changed nothing because it was refused.
    pub fn is_refused(&self) -> bool {
        matches!(self, Outcome::Refused(_))
    }
}
