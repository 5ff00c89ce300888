//! The machine's identities and plain quantities, at the bottom of the crate: every
//! other module names them, and they name nothing.

use std::sync::Arc;

/// A task version's identity and fencing token; strictly increasing, never reused.
pub type TaskId = u64;

/// The numeric identity a worker chooses for itself (the seed's `clientid`).
pub type ClientId = i64;

/// A count of milliseconds: a duration, or a time as a request states it, before the
/// machine resolves it to a [`LogTime`](crate::LogTime).
pub type Millis = i64;

/// A cluster node's id, as the machine records membership history.
pub type MemberId = u64;

/// A group name, shared between a group's tasks and its index.
pub type GroupName = Arc<str>;
