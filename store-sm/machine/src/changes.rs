//! What the last applied command changed, for watchers and waiters outside the machine
//! (the node's change feed). The journal is not state: it is emptied when the next
//! command begins, never encoded in a snapshot, and never read by the machine.

use crate::GroupName;
use crate::JobKey;
use crate::TaskId;

/// One change a command made, in the order it made them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A task version was written (the same command may remove it again).
    TaskWritten(TaskId),
    /// A task version was removed (deleted, updated, claimed, finished, cancelled).
    TaskRemoved {
        /// Its group.
        group: GroupName,
        /// The removed version.
        id: TaskId,
    },
    /// A job record was created or changed (the same command may drop it again).
    Job {
        /// Its group.
        group: GroupName,
        /// Its key.
        key: JobKey,
    },
    /// A finished job record passed its retention and was dropped.
    JobDropped {
        /// Its group.
        group: GroupName,
        /// Its key.
        key: JobKey,
    },
    /// A group's settings changed.
    Settings(GroupName),
}
