//! Waiting's JSON shapes (issue 13): a page of a group's changes from `GET /watch`.
//! Revisions are log indexes: every change carries the index of the entry that made
//! it, and a page says which revision to ask from next.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::Serialize;

use crate::job::JobJson;
use crate::job::SettingsJson;
use crate::worker::TaskJson;

/// Where a group's changes are read.
pub const WATCH_PATH: &str = "/watch";

/// Longest wait a request may ask for (`wait_ms`), in milliseconds.
pub const WAIT_MS_MAX: u64 = 60_000;

/// Changes one `/watch` page holds when it names no `limit` (whole revisions: a page may
/// exceed it by the rest of its last revision).
pub const WATCH_PAGE_DEFAULT: usize = 1_000;

/// Most changes a `/watch` page may ask for.
pub const WATCH_PAGE_MAX: usize = 10_000;

/// One change to a group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[schemars(rename = "WatchEvent")]
pub enum WatchEventJson {
    /// A task version was written (added, updated, claimed, retried).
    Task {
        /// The log index of the entry that wrote it.
        revision: u64,
        /// The version as it was written.
        task: TaskJson,
    },
    /// A task version was removed (deleted, replaced by a newer version, finished,
    /// cancelled). A claim or an update removes the old version and writes a new one.
    Removed {
        /// The log index of the entry that removed it.
        revision: u64,
        /// The removed version's id.
        id: u64,
    },
    /// A job record changed (its state, attempts, result).
    Job {
        /// The log index of the entry that changed it.
        revision: u64,
        /// The record after the change.
        job: Box<JobJson>,
    },
    /// A finished job record passed the group's retention and was dropped.
    JobDropped {
        /// The log index of the entry that dropped it.
        revision: u64,
        /// The job's key.
        key: String,
    },
    /// The group's settings changed.
    Settings {
        /// The log index of the entry that changed them.
        revision: u64,
        /// The settings after the change.
        settings: SettingsJson,
    },
}

impl WatchEventJson {
    /// The log index of the entry that made this change.
    pub fn revision(&self) -> u64 {
        match self {
            Self::Task { revision, .. }
            | Self::Removed { revision, .. }
            | Self::Job { revision, .. }
            | Self::JobDropped { revision, .. }
            | Self::Settings { revision, .. } => *revision,
        }
    }
}

/// The answer of `GET /watch`: a group's changes after the asked revision, in log order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "WatchPage")]
pub struct WatchPageJson {
    /// The node that served the page (any node serves watches from what it applied).
    pub node: u64,
    /// The group watched.
    pub group: String,
    /// Ask from this revision next (`after=`): every change up to it is in this page or
    /// an earlier one.
    pub revision: u64,
    /// The changes, oldest first; empty if none came before the wait ended.
    pub changes: Vec<WatchEventJson>,
}

/// The answer of `GET /watch` with 410: the asked revision is older than what the node
/// keeps; re-read the group and watch from `revision`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "WatchGone")]
pub struct WatchGoneJson {
    /// What happened and what to do.
    pub error: String,
    /// The node's current revision: re-read, then watch after it.
    pub revision: u64,
    /// The oldest revision the node can still answer `after=` from.
    pub oldest: u64,
}

/// Checks a `wait_ms` value: 0 to [`WAIT_MS_MAX`] milliseconds.
pub fn check_wait_ms(wait_ms: u64) -> Result<(), String> {
    if wait_ms > WAIT_MS_MAX {
        return Err(format!(
            "wait_ms {wait_ms} is above {WAIT_MS_MAX}; wait at most a minute, then ask again"
        ));
    }
    Ok(())
}

/// Parses a `wait_ms` query value (see [`check_wait_ms`]).
pub fn parse_wait_ms(value: &str) -> Result<u64, String> {
    let wait_ms: u64 = value.parse().map_err(|_| {
        format!("wait_ms {value:?} is not a whole number of milliseconds from 0 to {WAIT_MS_MAX}")
    })?;
    check_wait_ms(wait_ms)?;
    Ok(wait_ms)
}
