//! Log time: the cluster's time, as the command log carries it.

use std::fmt;

use serde::Deserialize;
use serde::Serialize;

use crate::Millis;

/// A point in log time, in milliseconds since the Unix epoch: the leader's stamp on a
/// command, made monotonic by the machine (`max(stamp, previous)`). It is never a node's
/// raw wall clock, and every lease and available time is judged by it.
///
/// Encoded as the bare number (serde `transparent`), so JSON, the log and snapshots
/// hold exactly what they held when it was a plain `i64`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LogTime(Millis);

impl LogTime {
    /// The Unix epoch: the time of a machine that has applied nothing.
    pub const EPOCH: LogTime = LogTime(0);

    /// The end of representable time: every available time is at or before it.
    pub const MAX: LogTime = LogTime(Millis::MAX);

    /// The log time `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: Millis) -> Self {
        LogTime(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> Millis {
        self.0
    }

    /// `millis` later, or `None` past the end of representable time.
    pub fn checked_add(self, millis: Millis) -> Option<LogTime> {
        self.0.checked_add(millis).map(LogTime)
    }

    /// Milliseconds from `earlier` to `self`, saturating at the ends of the range.
    pub fn millis_since(self, earlier: LogTime) -> Millis {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for LogTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The bare number, as messages showed it before the type existed.
        write!(f, "{}", self.0)
    }
}
