//! Rebuilding a machine from a snapshot's parts, refusing parts no machine could produce.

use std::fmt;
use std::sync::Arc;

use super::DedupKey;
use super::GroupName;
use super::GroupSettings;
use super::JobRecord;
use super::LogTime;
use super::MemberId;
use super::Outcome;
use super::Task;
use super::TaskId;
use super::TaskMachine;
use super::TokenRecord;
use super::constants::RESTORED_IDS_PER_MS;

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
    /// A job record with an empty group or key, or a keyed task without its record.
    BadJob {
        /// What is wrong.
        what: String,
    },
    /// A token record that breaks the token rules, or one id twice.
    BadToken {
        /// What is wrong.
        what: String,
    },
}

/// The access control parts of a snapshot.
#[derive(Clone, Debug, Default)]
pub struct AuthParts {
    /// Whether the first admin token was ever made.
    pub bootstrapped: bool,
    /// Every current token.
    pub tokens: Vec<TokenRecord>,
}

/// The job layer's parts of a snapshot: records and group settings.
#[derive(Clone, Debug, Default)]
pub struct JobParts {
    /// Every job record.
    pub records: Vec<JobRecord>,
    /// Group settings that differ from the defaults.
    pub settings: Vec<(GroupName, GroupSettings)>,
}

impl fmt::Display for InvalidParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidParts::IdNotBelowNext { id, next_id } => {
                write!(f, "task {id} is not below next id {next_id}")
            }
            InvalidParts::EmptyGroup { id } => write!(f, "task {id} has an empty group"),
            InvalidParts::DuplicateTask { id } => write!(f, "task {id} appears twice"),
            InvalidParts::BadJob { what } | InvalidParts::BadToken { what } => f.write_str(what),
        }
    }
}

impl std::error::Error for InvalidParts {}

impl TaskMachine {
    /// Readies a machine decoded from a backup to start a new cluster at `now` (the
    /// restoring node's clock, I/O the caller does). Log time moves forward to `now`, so
    /// leases and available times are judged as the backed-up cluster would judge them
    /// today rather than from the moment of the backup. The next id rises to at least
    /// `now` in [`RESTORED_IDS_PER_MS`] units: the backed-up cluster may have gone on
    /// issuing ids after the backup, and SPEC 1.1 forbids issuing them again. By
    /// induction over restores, a cluster's ids stay below its log time in those units as
    /// long as it issues fewer than that many per millisecond on average, so the floor
    /// is above every id the old cluster issued, provided the two clusters' clocks agree
    /// within the slack that rate leaves. The recorded log entry form is kept: the
    /// restored state must be the backup's, whose format only builds that read it take.
    pub fn start_restored_cluster(&mut self, now: LogTime) {
        let now = self.advance_time(now);
        let floor = u64::try_from(now.as_millis())
            .unwrap_or(0)
            .saturating_mul(RESTORED_IDS_PER_MS);
        self.next_id = self.next_id.max(floor);
    }

    /// Rebuilds a machine from a snapshot's parts; refuses parts no machine could produce.
    pub fn from_parts(
        next_id: TaskId,
        log_time: LogTime,
        tasks: impl IntoIterator<Item = Task>,
        dedup: impl IntoIterator<Item = (DedupKey, LogTime, Arc<Outcome>, Option<u64>)>,
        members_ever: impl IntoIterator<Item = MemberId>,
        jobs: JobParts,
        auth: AuthParts,
    ) -> Result<Self, InvalidParts> {
        let mut machine = Self {
            next_id,
            log_time,
            members_ever: members_ever.into_iter().collect(),
            settings: jobs.settings.into_iter().collect(),
            auth_bootstrapped: auth.bootstrapped,
            ..Self::new()
        };
        for token in auth.tokens {
            let as_added = crate::TokenAddRequest {
                client: 0,
                id: token.id.clone(),
                name: token.name.clone(),
                role: token.role,
                groups: token.groups.clone(),
                secret_hash: token.secret_hash.clone(),
            };
            if let Some(refusal) = crate::auth::check_token_fields(&as_added).first() {
                return Err(InvalidParts::BadToken {
                    what: format!("token {:?}: {refusal}", token.id),
                });
            }
            if !machine.auth_bootstrapped {
                return Err(InvalidParts::BadToken {
                    what: format!("token {:?} exists but no token was ever made", token.id),
                });
            }
            if machine.tokens.insert(token.id.clone(), token).is_some() {
                return Err(InvalidParts::BadToken {
                    what: format!("token {:?} appears twice", as_added.id),
                });
            }
        }
        // Records first: where a task is indexed depends on its job's prerequisites.
        for record in jobs.records {
            if record.group.is_empty() || record.key.is_empty() {
                return Err(InvalidParts::BadJob {
                    what: format!(
                        "a job record has group {:?} and key {:?}",
                        record.group, record.key
                    ),
                });
            }
            if let Some(at) = record.expires_at {
                machine
                    .expiries
                    .insert((at, Arc::clone(&record.group), Arc::clone(&record.key)));
            }
            if let Some(id) = record.cancelled_task {
                machine
                    .cancelled
                    .insert(id, (Arc::clone(&record.group), Arc::clone(&record.key)));
            }
            if let Some(id) = record.id
                && let Some((group, key)) = machine
                    .job_ids
                    .insert(id, (Arc::clone(&record.group), Arc::clone(&record.key)))
            {
                return Err(InvalidParts::BadJob {
                    what: format!(
                        "jobs {key:?} of group {group:?} and {:?} of group {:?} both have id {id}",
                        record.key, record.group
                    ),
                });
            }
            machine.put_record(record);
        }
        for task in tasks {
            if let Some(key) = &task.job.key
                && machine
                    .job(&task.group, key)
                    .is_none_or(|r| r.task != Some(task.id))
            {
                return Err(InvalidParts::BadJob {
                    what: format!(
                        "task {} of job {key:?} has no record that names it",
                        task.id
                    ),
                });
            }
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
        for (key, applied_at, outcome, fingerprint) in dedup {
            machine.dedup.restore(key, applied_at, outcome, fingerprint);
        }
        machine.changes.clear();
        Ok(machine)
    }
}
