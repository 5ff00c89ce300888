//! The job layer's types (SPEC section 4): keys, attempts, outcomes, dead letters,
//! dependencies and group settings, kept in the same machine as the seed's tasks.
//!
//! A task added with a `key` is a job: it has a [`JobRecord`] that outlives its task
//! versions and records its attempts and outcome. A task without a key is a seed task
//! and behaves exactly as the seed says; only `priority` and finish/fail apply to it.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::Serialize;

use crate::LogTime;
use crate::constants::BACKOFF_BASE_MS_DEFAULT;
use crate::constants::BACKOFF_FACTOR_MILLI_DEFAULT;
use crate::constants::BACKOFF_FACTOR_MILLI_MAX;
use crate::constants::BACKOFF_MAX_MS_DEFAULT;
use crate::constants::JOB_KEY_BYTES_MAX;
use crate::constants::JOB_RETENTION_MS_DEFAULT;
use crate::constants::JOB_RETENTION_MS_MAX;
use crate::ids::ClientId;
use crate::ids::GroupName;
use crate::ids::Millis;
use crate::ids::TaskId;

/// A job's key: unique among the live tasks of its group.
pub type JobKey = Arc<str>;

/// Why `key` is no valid job key (empty, or longer than [`JOB_KEY_BYTES_MAX`]), or
/// `Ok`: the one statement of the rule, for the machine and the HTTP edge alike.
pub fn check_key_length(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > JOB_KEY_BYTES_MAX {
        return Err(format!(
            "a key is 1 to {JOB_KEY_BYTES_MAX} bytes; this one is {} bytes",
            key.len()
        ));
    }
    Ok(())
}

/// What an add does when its key names a live task of the group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnConflict {
    /// Refuse the whole transaction, naming the key and the live task.
    #[default]
    Refuse,
    /// Leave the live task as it is and answer it in the add's place.
    Keep,
    /// As `Keep`, and if the task is running, run it once more after it succeeds.
    Resubmit,
}

impl OnConflict {
    /// The name the JSON API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Refuse => "refuse",
            OnConflict::Keep => "keep",
            OnConflict::Resubmit => "resubmit",
        }
    }
}

/// The job fields an add may carry; all default for a seed add.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddJob {
    /// Makes the task a job, unique among the group's live tasks.
    pub key: Option<String>,
    /// What to do when the key is live.
    pub on_conflict: OnConflict,
    /// Keys of the group that must succeed before this task may be claimed.
    pub after: Vec<String>,
    /// Claims pick higher priorities first.
    pub priority: i64,
    /// Attempts before the job is dead; overrides the group's setting (0: unlimited).
    pub max_attempts: Option<u32>,
    /// Re-enqueue this long after each success.
    pub every_ms: Option<Millis>,
}

impl AddJob {
    /// Whether any field needs a key (everything but priority does).
    pub fn needs_key(&self) -> bool {
        !self.after.is_empty()
            || self.max_attempts.is_some()
            || self.every_ms.is_some()
            || self.on_conflict != OnConflict::Refuse
    }
}

/// The job fields of a task version. Default (and invisible in the seed API) for a
/// task added without a key or priority.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskJob {
    /// The job's key, if the task is a job.
    pub key: Option<JobKey>,
    /// Claim priority; higher first.
    pub priority: i64,
    /// The attempt this version belongs to (1 for the first claim); 0 before any claim
    /// and for tasks without a key.
    pub attempt: u32,
    /// Whether this version is a claim's lease (its available time is the lease end),
    /// which counts toward the group's `max_running`.
    pub leased: bool,
}

impl TaskJob {
    /// Whether the task shows no job field (a seed task).
    pub fn is_plain(&self) -> bool {
        self.key.is_none() && self.priority == 0 && self.attempt == 0
    }
}

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// Live, not claimed (perhaps waiting for prerequisites or an available time).
    Waiting,
    /// Live and claimed: its owner holds the lease.
    Running,
    /// Live: the last attempt failed and the job waits for its back-off to retry.
    Failed,
    /// Finished with success.
    Succeeded,
    /// Out of attempts: out of the claimable set, kept until retried or cancelled.
    Dead,
    /// Cancelled (or a prerequisite ended dead or cancelled).
    Cancelled,
}

impl JobState {
    /// Every state, in order.
    pub const ALL: [JobState; 6] = [
        JobState::Waiting,
        JobState::Running,
        JobState::Failed,
        JobState::Succeeded,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// The name the JSON API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Waiting => "waiting",
            JobState::Running => "running",
            JobState::Failed => "failed",
            JobState::Succeeded => "succeeded",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state named `name` in the JSON API.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }

    /// Whether the job has a task version in the store.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            JobState::Waiting | JobState::Running | JobState::Failed
        )
    }

    /// Whether the job has ended for good (a dead job may still be retried).
    pub fn is_finished(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Cancelled)
    }

    /// Whether the job has come to an end state, one that only a new command (a retry
    /// of a dead job, an add of its key) leaves: what waits for outcomes wait for.
    pub fn has_ended(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptEnd {
    /// Finished with success.
    Succeeded,
    /// Failed with this error.
    Failed(String),
    /// The lease lapsed without a finish or fail.
    Lost,
    /// The owner gave the task back (a seed update that made it available).
    Released,
    /// The job was cancelled while the attempt ran.
    Cancelled,
}

/// One claim of a job and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The enqueue this attempt belongs to (1 for the first, +1 per re-enqueue).
    pub run: u32,
    /// 1 for the first claim of the run; never skips or repeats within a run.
    pub number: u32,
    /// The claiming client.
    pub owner: ClientId,
    /// When it was claimed.
    pub started_at: LogTime,
    /// When it ended; `None` while it runs.
    pub ended_at: Option<LogTime>,
    /// How it ended; `None` while it runs.
    pub end: Option<AttemptEnd>,
}

/// Everything the store keeps about one job, across its task versions and runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's group.
    pub group: GroupName,
    /// The job's key.
    pub key: JobKey,
    /// Where it stands.
    pub state: JobState,
    /// The live task version while the job is live.
    pub task: Option<TaskId>,
    /// The payload while the job has no live task (dead, finished), so it can be read
    /// and re-driven.
    pub data: Option<String>,
    /// Claim priority of its tasks.
    pub priority: i64,
    /// Per-job attempt limit (0: unlimited), overriding the group's.
    pub max_attempts: Option<u32>,
    /// Re-enqueue interval after a success.
    pub every_ms: Option<Millis>,
    /// Enqueue count: 1 at the first add, +1 for each re-enqueue (recurring, resubmit,
    /// an add after the job finished).
    pub run: u32,
    /// Claims in this run.
    pub attempts: u32,
    /// Attempts of this run that a retry of a dead job has forgiven.
    pub attempts_forgiven: u32,
    /// The latest attempts, oldest first, at most `ATTEMPT_HISTORY_MAX`.
    pub history: Vec<Attempt>,
    /// The result of the last success (JSON text).
    pub result: Option<String>,
    /// Why the job is dead or cancelled.
    pub reason: Option<String>,
    /// When the job was first added (this run).
    pub created_at: LogTime,
    /// When it last finished (succeeded, dead or cancelled).
    pub finished_at: Option<LogTime>,
    /// When the machine drops this finished record (the group's retention after it
    /// finished); `None` while live or dead.
    pub expires_at: Option<LogTime>,
    /// Prerequisite keys that have not succeeded yet.
    pub after: Vec<JobKey>,
    /// Keys of live jobs waiting for this one.
    pub dependants: Vec<JobKey>,
    /// A resubmit arrived while running: the data to run once more with after success.
    pub resubmit: Option<String>,
    /// The task version a cancel removed, so that its owner's next write names the
    /// cancellation rather than a missing task.
    pub cancelled_task: Option<TaskId>,
    /// The job's id: the task id its current run began with (what the add answered),
    /// by which its outcome can be read. `None` only for records from snapshots older
    /// than format 6. Not in the record's serde form: format 6 writes it after the
    /// record, so that formats 3 to 5 still decode.
    #[serde(skip)]
    pub id: Option<TaskId>,
}

impl JobRecord {
    /// Attempts that count toward the limit: those since the last retry of a dead job.
    pub fn attempts_counted(&self) -> u32 {
        self.attempts.saturating_sub(self.attempts_forgiven)
    }

    /// The attempt now running, if the last one has not ended.
    pub fn open_attempt_mut(&mut self) -> Option<&mut Attempt> {
        self.history
            .last_mut()
            .filter(|attempt| attempt.end.is_none())
    }
}

/// Retry back-off: `base_ms * factor^(attempt-1)`, at most `max_ms`, with jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// The first delay.
    pub base_ms: Millis,
    /// Growth per attempt in thousandths (2000 doubles), so the machine needs no
    /// floating point.
    pub factor_milli: u32,
    /// The largest delay.
    pub max_ms: Millis,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_ms: BACKOFF_BASE_MS_DEFAULT,
            factor_milli: BACKOFF_FACTOR_MILLI_DEFAULT,
            max_ms: BACKOFF_MAX_MS_DEFAULT,
        }
    }
}

impl Backoff {
    /// The delay before retry `attempt` (1 after the first failure), before jitter.
    pub fn delay_ms(&self, attempt: u32) -> Millis {
        let mut delay = self.base_ms.max(0);
        for _ in 1..attempt {
            if delay >= self.max_ms {
                break;
            }
            delay = delay.saturating_mul(i64::from(self.factor_milli)) / 1000;
        }
        delay.min(self.max_ms).max(0)
    }

    /// The delay with "equal jitter": between half and all of [`Self::delay_ms`], chosen
    /// by `seed`, which the caller derives from the log entry so every replica agrees.
    pub fn jittered_ms(&self, attempt: u32, seed: u64) -> Millis {
        let delay = self.delay_ms(attempt);
        let half = delay / 2;
        let spread = (delay - half) as u64 + 1;
        half + (mix64(seed) % spread) as Millis
    }
}

/// SplitMix64's finaliser: spreads a seed's bits so nearby seeds jitter differently.
fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A group's settings, replicated state that outlives the group's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSettings {
    /// Claims answer empty while this many of the group's tasks are leased (0: no limit).
    pub max_running: u32,
    /// Claims answer empty; adds are still accepted.
    pub paused: bool,
    /// Attempts before a job is dead (0: unlimited), unless the job sets its own.
    pub max_attempts: u32,
    /// Delay before a failed job is retried.
    pub backoff: Backoff,
    /// How long finished job records are kept, in log time.
    pub retention_ms: Millis,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            max_running: 0,
            paused: false,
            max_attempts: 0,
            backoff: Backoff::default(),
            retention_ms: JOB_RETENTION_MS_DEFAULT,
        }
    }
}

/// A change of a group's settings: each field left `None` keeps its value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsChange {
    /// New concurrency limit (0: none).
    pub max_running: Option<u32>,
    /// Pause or resume.
    pub paused: Option<bool>,
    /// New attempt limit (0: unlimited).
    pub max_attempts: Option<u32>,
    /// New back-off.
    pub backoff: Option<Backoff>,
    /// New retention.
    pub retention_ms: Option<Millis>,
}

impl SettingsChange {
    /// Every field out of its range, as `(field, reason)`: the one statement of the
    /// settings' bounds, which the machine refuses by and the HTTP edge answers 400 by.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if let Some(backoff) = &self.backoff {
            if !(0..=JOB_RETENTION_MS_MAX).contains(&backoff.base_ms) {
                let reason = format!(
                    "{} is not between 0 and {JOB_RETENTION_MS_MAX}",
                    backoff.base_ms
                );
                problems.push(("backoff.base_ms", reason));
            }
            if !(backoff.base_ms.max(0)..=JOB_RETENTION_MS_MAX).contains(&backoff.max_ms) {
                let reason = format!(
                    "{} is not between base_ms and {JOB_RETENTION_MS_MAX}",
                    backoff.max_ms
                );
                problems.push(("backoff.max_ms", reason));
            }
            if !(1000..=BACKOFF_FACTOR_MILLI_MAX).contains(&backoff.factor_milli) {
                let reason = format!(
                    "{} is not between 1 and {}",
                    f64::from(backoff.factor_milli) / 1000.0,
                    BACKOFF_FACTOR_MILLI_MAX / 1000
                );
                problems.push(("backoff.factor", reason));
            }
        }
        if let Some(retention) = self.retention_ms
            && !(0..=JOB_RETENTION_MS_MAX).contains(&retention)
        {
            let reason = format!("{retention} is not between 0 and {JOB_RETENTION_MS_MAX}");
            problems.push(("retention_ms", reason));
        }
        problems
    }
}

/// `/finish`: the owner ends its claim with success.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishRequest {
    /// The finishing client; must own the task.
    pub client: ClientId,
    /// The claimed version: the fence.
    pub id: TaskId,
    /// The result (JSON text), kept in the job record.
    pub result: Option<String>,
}

/// `/finish/many`: the owner ends its claims of several tasks with success, all or
/// none (a refusal names every task that cannot be finished).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishManyRequest {
    /// The finishing client; must own every task.
    pub client: ClientId,
    /// The tasks, from 1 to [`FINISH_COUNT_MAX`](crate::constants::FINISH_COUNT_MAX),
    /// each named once.
    pub finishes: Vec<FinishItem>,
}

/// One task of a [`FinishManyRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishItem {
    /// The claimed version: the fence.
    pub id: TaskId,
    /// The result (JSON text), kept in the job record.
    pub result: Option<String>,
}

/// `/finish` with `next`: the owner ends its claim with success and, in the same
/// command, claims the next tasks: a worker's whole cycle in one commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishAndClaimRequest {
    /// The finish; its client is the claim's too.
    pub finish: FinishRequest,
    /// The claim that follows it: the client, group, lease and count.
    pub next: crate::types::ClaimManyRequest,
}

/// `/fail`: the owner ends its claim with an error; the job retries or dies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailRequest {
    /// The failing client; must own the task.
    pub client: ClientId,
    /// The claimed version: the fence.
    pub id: TaskId,
    /// What went wrong.
    pub error: String,
    /// Retry after this long instead of the group's back-off.
    pub retry_in_ms: Option<Millis>,
}

/// `/cancel`: remove jobs of a group, running or not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// The cancelling client.
    pub client: ClientId,
    /// The jobs' group.
    pub group: String,
    /// The jobs' keys.
    pub keys: Vec<String>,
}

/// `/retry`: re-drive dead jobs of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRequest {
    /// The client that becomes the new tasks' owner.
    pub client: ClientId,
    /// The jobs' group.
    pub group: String,
    /// The dead jobs' keys.
    pub keys: Vec<String>,
}

/// `PUT /groups/{g}/settings`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsRequest {
    /// The client making the change.
    pub client: ClientId,
    /// The group.
    pub group: String,
    /// What to change.
    pub change: SettingsChange,
}
