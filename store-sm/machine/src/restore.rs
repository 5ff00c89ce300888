//! Rebuilding a machine from a snapshot's parts, refusing parts no machine could produce.

use std::fmt;
use std::sync::Arc;

use super::DedupKey;
use super::LogTime;
use super::MemberId;
use super::Outcome;
use super::Task;
use super::TaskId;
use super::TaskMachine;

/// Why a snapshot's parts describe a state no machine could have reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidParts {
    /// A task's id is not below the next id, so it could be handed out again.
    IdNotBelowNext {
        /// The task's id.
        id: TaskId,
        /// The next id the parts claim.
        next_id: TaskId,
    },
    /// A task has an empty group name.
    EmptyGroup {
        /// The task's id.
        id: TaskId,
    },
    /// A task id appears more than once.
    DuplicateTask {
        /// The repeated id.
        id: TaskId,
    },
}

impl fmt::Display for InvalidParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidParts::IdNotBelowNext { id, next_id } => {
                write!(f, "task {id} is not below next id {next_id}")
            }
            InvalidParts::EmptyGroup { id } => write!(f, "task {id} has an empty group"),
            InvalidParts::DuplicateTask { id } => write!(f, "task {id} appears twice"),
        }
    }
}

impl std::error::Error for InvalidParts {}

impl TaskMachine {
    /// Rebuilds a machine from a snapshot's parts; refuses parts no machine could produce.
    pub fn from_parts(
        next_id: TaskId,
        log_time: LogTime,
        tasks: impl IntoIterator<Item = Task>,
        dedup: impl IntoIterator<Item = (DedupKey, LogTime, Arc<Outcome>)>,
        members_ever: impl IntoIterator<Item = MemberId>,
    ) -> Result<Self, InvalidParts> {
        let mut machine = Self {
            next_id,
            log_time,
            members_ever: members_ever.into_iter().collect(),
            ..Self::new()
        };
        for task in tasks {
            if task.id >= next_id {
                return Err(InvalidParts::IdNotBelowNext {
                    id: task.id,
                    next_id,
                });
            }
            if task.group.is_empty() {
                return Err(InvalidParts::EmptyGroup { id: task.id });
            }
            if machine.tasks.contains_key(&task.id) {
                return Err(InvalidParts::DuplicateTask { id: task.id });
            }
            machine.index_task(task);
        }
        for (key, applied_at, outcome) in dedup {
            machine.dedup.insert(key, applied_at, outcome);
        }
        Ok(machine)
    }
}
