//! The job API's JSON shapes (SPEC section 4, issue 12): finish, fail, cancel, retry,
//! job records and group settings. Requests reject unknown fields; `null` counts as
//! missing, as in the seed API. Writes answer with the seed's [`WriteResultJson`]
//! shape.
//!
//! [`WriteResultJson`]: crate::worker::WriteResultJson

use schemars::JsonSchema;
use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;
use task_machine::constants::BACKOFF_FACTOR_MILLI_MAX;
use task_machine::constants::JOB_AFTER_KEYS_MAX;
pub use task_machine::constants::JOB_ERROR_BYTES_MAX;
use task_machine::constants::JOB_INTERVAL_MS_MAX;
pub use task_machine::constants::JOB_RESULT_BYTES_MAX;
use task_machine::jobs::Backoff;
use task_machine::jobs::SettingsChange;
use task_machine::jobs::check_key_length;

use crate::client::percent_encode;
use crate::worker::AddJson;

/// Where a finish is posted.
pub const FINISH_PATH: &str = "/finish";

/// Where a finish of several tasks is posted.
pub const FINISH_MANY_PATH: &str = "/finish/many";

/// Where a fail is posted.
pub const FAIL_PATH: &str = "/fail";

/// Where a cancel is posted.
pub const CANCEL_PATH: &str = "/cancel";

/// Where a retry is posted.
pub const RETRY_PATH: &str = "/retry";

/// Most job records one `/jobs` or `/dead` read returns; `next` continues.
pub const JOBS_PAGE_MAX: usize = 1_000;

/// Job records a `/jobs` read returns when it names no `limit`.
pub const JOBS_PAGE_DEFAULT: usize = 100;

/// What an add does when its key names a live task of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(rename = "OnConflict")]
pub enum OnConflictJson {
    /// Refuse the whole update, naming the key and the live task.
    Refuse,
    /// Answer the live task in the add's place; the update still succeeds.
    Keep,
    /// As keep, and if the task is running, run it once more after it succeeds.
    Resubmit,
}

/// What a leader's refusal (409) of a finish with `next` says while a member may not read
/// that log entry (an older build during a rolling upgrade, or one not heard from).
pub const NEXT_NOT_READ_BY_ALL: &str = "cannot log a finish with `next`";

/// Whether a node's answer `status` with error `message` says that the cluster takes no
/// finish with `next` yet: the leader's 409 ([`NEXT_NOT_READ_BY_ALL`]), or the 400 of a
/// node whose build predates `next` (its body check names the unknown field). Nothing
/// was written; send the finish without `next`, then a claim.
pub fn next_not_taken(status: u16, message: &str) -> bool {
    match status {
        409 => message.contains(NEXT_NOT_READ_BY_ALL),
        400 => message.contains("unknown field `next`"),
        _ => false,
    }
}

/// The body of `POST /finish`: the owner ends its claim with success.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "FinishRequest")]
pub struct FinishRequestJson {
    /// The client that holds the task.
    #[schemars(transform = crate::schema::client_id)]
    pub clientid: i64,
    /// The claimed task version: the fence (a stale id is refused).
    pub id: u64,
    /// Any JSON value, kept in the job's record (at most 256 KiB as compact JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
    /// Also claim this client's next tasks, in the same command: a worker's cycle in one
    /// commit. The answer's `tasks` are the claimed ones (empty when none is claimable:
    /// this claim never waits). Refused as a whole, finish included, if either part
    /// would be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextClaimJson>,
}

/// The claim that follows a finish (`next` of `POST /finish`), as `POST /claim` would
/// make it, without `depends` and without waiting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "NextClaim")]
pub struct NextClaimJson {
    /// Group to claim from.
    pub group: String,
    /// Milliseconds of ownership; positive and at most the node's configured maximum.
    #[schemars(transform = crate::schema::claim_duration)]
    pub duration: i64,
    /// Claim up to this many tasks (1 to 1 000; 1 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::worker::CLAIM_COUNT_MAX))]
    pub count: Option<u32>,
}

impl NextClaimJson {
    /// The claim count, checked as [`crate::worker::ClaimRequestJson::checked_count`]
    /// checks it: 1 when absent.
    pub fn checked_count(&self) -> Result<u32, String> {
        let count = self.count.unwrap_or(1);
        task_machine::check_claim_count(count)
            .map(|()| count)
            .map_err(|refusal| refusal.to_string())
    }
}

/// The body of `POST /finish/many`: the owner ends its claims of several tasks with
/// success, all or none (a refusal names every task that cannot be finished).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "FinishManyRequest")]
pub struct FinishManyRequestJson {
    /// The client that holds the tasks.
    #[schemars(transform = crate::schema::client_id)]
    pub clientid: i64,
    /// The tasks, from 1 to 1 000, each named once.
    pub finishes: Vec<FinishItemJson>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
}

/// One task of a `POST /finish/many`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "FinishItem")]
pub struct FinishItemJson {
    /// The claimed task version: the fence (a stale id is refused).
    pub id: u64,
    /// Any JSON value, kept in the job's record (at most 256 KiB as compact JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// Checks a finish of several tasks before it is sent: 1 to
/// [`FINISH_COUNT_MAX`](task_machine::constants::FINISH_COUNT_MAX) tasks, each result
/// within its bound; the results as the machine keeps them.
pub fn finish_items(request: &FinishManyRequestJson) -> Result<Vec<(u64, Option<String>)>, String> {
    let count = request.finishes.len();
    let max = task_machine::constants::FINISH_COUNT_MAX;
    if !(1..=max).contains(&count) {
        return Err(format!(
            "finishes names {count} tasks; name from 1 to {max}"
        ));
    }
    request
        .finishes
        .iter()
        .map(|item| {
            let result = item.result.as_ref().map(result_text).transpose();
            result
                .map(|result| (item.id, result))
                .map_err(|e| format!("task {}: {e}", item.id))
        })
        .collect()
}

/// The body of `POST /fail`: the owner ends its claim with an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "FailRequest")]
pub struct FailRequestJson {
    /// The client that holds the task.
    #[schemars(transform = crate::schema::client_id)]
    pub clientid: i64,
    /// The claimed task version: the fence (a stale id is refused).
    pub id: u64,
    /// What went wrong (at most 64 KiB), kept in the job's attempt history.
    #[serde(default)]
    pub error: String,
    /// Retry after this many milliseconds instead of the group's back-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<i64>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
}

/// The body of `POST /cancel` and `POST /retry`: jobs of one group by key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "KeysRequest")]
pub struct KeysRequestJson {
    /// Who asks (recorded in the reason; 0 if not given).
    #[serde(default)]
    pub clientid: i64,
    /// The jobs' group.
    pub group: String,
    /// The jobs' keys.
    pub keys: Vec<String>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
}

/// Retry back-off: `base_ms * factor^(attempt-1)`, at most `max_ms`, with equal jitter
/// (between half and all of it).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Backoff")]
pub struct BackoffJson {
    /// The first delay, in milliseconds.
    pub base_ms: i64,
    /// Growth per attempt, from 1 to 100 (three decimals kept).
    pub factor: f64,
    /// The largest delay, in milliseconds.
    pub max_ms: i64,
}

/// A group's counts as `GET /groups/{group}/stats` answers them (the dashboard's
/// figures): its tasks by availability and its job records by state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "GroupStats")]
pub struct GroupStatsJson {
    /// The group.
    pub group: String,
    /// Tasks in the group.
    pub tasks: u64,
    /// Tasks whose available time has come (claimable, unless waiting on a prerequisite
    /// or the group's limits).
    pub available: u64,
    /// Tasks whose available time is still ahead: leased by a claim, or scheduled.
    pub owned: u64,
    /// Job records by state: `waiting`, `running`, `failed`, `succeeded`, `dead`,
    /// `cancelled` (every state present, 0 when none).
    pub jobs: std::collections::BTreeMap<String, u64>,
}

/// A group's settings as `GET /groups/{group}/settings` answers them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "GroupSettings")]
pub struct SettingsJson {
    /// The group.
    pub group: String,
    /// Claims answer empty while this many of the group's tasks are leased (0: no limit).
    pub max_running: u32,
    /// Claims answer empty; adds are still accepted.
    pub paused: bool,
    /// Attempts before a job is dead (0: unlimited), unless the job sets its own.
    pub max_attempts: u32,
    /// Delay before a failed job is retried.
    pub backoff: BackoffJson,
    /// How long finished job records are kept, in milliseconds of log time.
    pub retention_ms: i64,
    /// How many of the group's tasks are leased now.
    pub running: usize,
}

/// The body of `PUT /groups/{group}/settings`: the fields given change, the others keep
/// their value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SettingsChange")]
pub struct SettingsChangeJson {
    /// Who asks (0 if not given).
    #[serde(default)]
    pub clientid: i64,
    /// Concurrency limit (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<i64>,
    /// Pause (true) or resume (false) claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Attempt limit (0: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i64>,
    /// Retry back-off, all three fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffJson>,
    /// Retention of finished job records, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<i64>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
}

/// One claim of a job and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Attempt")]
pub struct AttemptJson {
    /// The enqueue it belongs to.
    pub run: u32,
    /// Its number in the run, from 1.
    pub attempt: u32,
    /// The claiming client.
    pub owner: i64,
    /// When it was claimed (ms since the epoch, log time).
    pub started_at: i64,
    /// When it ended; null while it runs.
    pub ended_at: Option<i64>,
    /// `running`, `succeeded`, `failed`, `lost` (its lease lapsed), `released` (given back
    /// by an update) or `cancelled`.
    pub outcome: String,
    /// The error of a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a wait for several jobs is asked (`GET` with a query, `POST` with a body).
pub const JOBS_WAIT_PATH: &str = "/jobs/wait";

/// Most keys one `/jobs/wait` may name.
pub const WAIT_KEYS_MAX: usize = 1_000;

/// Longest `GET /jobs/wait` path and query a client sends; a longer one goes as
/// `POST /jobs/wait`. Nodes take about 16 KiB of headers over HTTP/2, and proxies in
/// front of them often 8 KiB (nginx's default); 1 000 keys of up to 256 bytes (three
/// times that once percent-encoded) take far more.
pub const WAIT_QUERY_BYTES_MAX: usize = 8 * 1024;

/// Longest `GET /jobs/wait` path and query a node takes over HTTP/1.1 (a request line
/// of up to 64 KiB): what a client sends a build before the POST, which answers it 405.
pub const WAIT_QUERY_BYTES_MAX_HTTP1: usize = 60 * 1024;

/// The `GET /jobs/wait` path and query for `keys` of `group`, or `None` when it would
/// be longer than `bytes_max`. Past [`WAIT_QUERY_BYTES_MAX`], send
/// [`JobWaitRequestJson`] as `POST /jobs/wait`; a build before the POST answers it 405,
/// and gets the GET after all if it fits [`WAIT_QUERY_BYTES_MAX_HTTP1`] (over HTTP/1.1).
pub fn jobs_wait_path(
    group: &str,
    keys: &[&str],
    wait_ms: u64,
    bytes_max: usize,
) -> Option<String> {
    let mut path = format!("{JOBS_WAIT_PATH}?group={}", percent_encode(group));
    for key in keys {
        path.push_str("&key=");
        path.push_str(&percent_encode(key));
        if path.len() > bytes_max {
            return None;
        }
    }
    path.push_str(&format!("&wait_ms={wait_ms}"));
    (path.len() <= bytes_max).then_some(path)
}

/// The body of `POST /jobs/wait`: `GET /jobs/wait` for more keys than a URL holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "JobWaitRequest")]
pub struct JobWaitRequestJson {
    /// The jobs' group.
    pub group: String,
    /// The jobs' keys, 1 to 1 000.
    pub keys: Vec<String>,
    /// How long to wait for them all to finish, 0 to 60 000 ms (0 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// `linearizable` (when absent) or `stale`, as for every read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
}

/// The answer of `GET /jobs/wait`: the named jobs' records once all have finished, or
/// as they are at the deadline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "JobWait")]
pub struct JobWaitJson {
    /// Whether every named job has finished (succeeded, dead or cancelled).
    pub finished: bool,
    /// The records of the named jobs that have one, in the order named.
    pub jobs: Vec<JobJson>,
    /// Named keys with no record in the group (never added, or past the retention).
    pub missing: Vec<String>,
}

/// A job's record, as `GET /job` answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Job")]
pub struct JobJson {
    /// The job's group.
    pub group: String,
    /// The job's key.
    pub key: String,
    /// The job's id: the task id its current run began with (what its add answered),
    /// by which `GET /job?id=` reads it. Null for a job last enqueued before the
    /// store's snapshot format 6, and absent from older servers' answers.
    #[serde(default)]
    pub id: Option<u64>,
    /// `waiting`, `running`, `failed` (waiting for its retry), `succeeded`, `dead` or
    /// `cancelled`, as of the last applied command.
    pub state: String,
    /// The live task version (waiting, running, failed), else null.
    pub task: Option<u64>,
    /// When the live task is available (a running job's lease end), else null.
    pub available_at: Option<i64>,
    /// The payload (of the live task, or kept by a dead or cancelled job).
    pub data: Option<String>,
    /// Claim priority.
    pub priority: i64,
    /// The job's own attempt limit; null: the group's.
    pub max_attempts: Option<u32>,
    /// Re-enqueue interval of a recurring job.
    pub every_ms: Option<i64>,
    /// Enqueue count: 1 for the first add, +1 per re-enqueue.
    pub run: u32,
    /// Claims in this run.
    pub attempts: u32,
    /// The latest attempts, oldest first (at most 10).
    pub history: Vec<AttemptJson>,
    /// The result of the last success.
    pub result: Option<Value>,
    /// Why the job is dead or cancelled.
    pub reason: Option<String>,
    /// When this run was enqueued.
    pub created_at: i64,
    /// When it last finished.
    pub finished_at: Option<i64>,
    /// When this finished record will be dropped.
    pub expires_at: Option<i64>,
    /// Prerequisites that have not succeeded yet.
    pub after: Vec<String>,
    /// Jobs waiting for this one.
    pub dependants: Vec<String>,
    /// Whether it runs once more after its current run succeeds.
    pub resubmitted: bool,
}

/// A page of job records, in key order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "JobPage")]
pub struct JobPageJson {
    /// The records.
    pub jobs: Vec<JobJson>,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<String>,
}

/// Why a job field of an add is malformed, naming the field, or `Ok`. The node answers
/// these with 400 before anything reaches the log.
pub fn check_add_job(index: usize, add: &AddJson) -> Result<(), String> {
    let field = |name: &str| format!("adds[{index}].{name}");
    if let Some(key) = &add.key {
        check_key(&field("key"), key)?;
    } else if add.on_conflict.is_some()
        || !add.after.is_empty()
        || add.max_attempts.is_some()
        || add.every_ms.is_some()
    {
        return Err(format!(
            "adds[{index}]: on_conflict, after, max_attempts and every_ms need a key; give the task a key"
        ));
    }
    if add.after.len() > JOB_AFTER_KEYS_MAX {
        return Err(format!(
            "{}: names {} keys; name at most {JOB_AFTER_KEYS_MAX}",
            field("after"),
            add.after.len()
        ));
    }
    for (n, prerequisite) in add.after.iter().enumerate() {
        check_key(&format!("adds[{index}].after[{n}]"), prerequisite)?;
        if add.key.as_deref() == Some(prerequisite.as_str()) {
            return Err(format!(
                "adds[{index}].after[{n}]: names the task's own key; a task cannot wait for itself"
            ));
        }
    }
    if let Some(every) = add.every_ms
        && !(1..=JOB_INTERVAL_MS_MAX).contains(&every)
    {
        return Err(format!(
            "{}: {every} is not between 1 and {JOB_INTERVAL_MS_MAX} milliseconds",
            field("every_ms")
        ));
    }
    Ok(())
}

/// Why a key is malformed (empty, or longer than 256 bytes), naming `field`.
pub fn check_key(field: &str, key: &str) -> Result<(), String> {
    check_key_length(key).map_err(|reason| format!("{field}: {reason}"))
}

/// Checks a cancel or retry body.
pub fn check_keys_request(request: &KeysRequestJson) -> Result<(), String> {
    if request.group.is_empty() {
        return Err("group: give the jobs' group".into());
    }
    if request.keys.is_empty() {
        return Err("keys: name at least one key".into());
    }
    if request.keys.len() > task_machine::constants::REQUEST_ITEMS_MAX {
        return Err(format!(
            "keys: {} keys; name at most {}",
            request.keys.len(),
            task_machine::constants::REQUEST_ITEMS_MAX
        ));
    }
    for (n, key) in request.keys.iter().enumerate() {
        check_key(&format!("keys[{n}]"), key)?;
    }
    Ok(())
}

/// The compact JSON text of a finish's result, or why it is too large.
pub fn result_text(result: &Value) -> Result<String, String> {
    let text = result.to_string();
    if text.len() > JOB_RESULT_BYTES_MAX {
        return Err(format!(
            "result: {} bytes as compact JSON; the limit is {JOB_RESULT_BYTES_MAX}: store large results elsewhere and record a reference",
            text.len()
        ));
    }
    Ok(text)
}

/// Checks a fail body's error and delay.
pub fn check_fail(request: &FailRequestJson) -> Result<(), String> {
    if request.error.len() > JOB_ERROR_BYTES_MAX {
        return Err(format!(
            "error: {} bytes; the limit is {JOB_ERROR_BYTES_MAX}",
            request.error.len()
        ));
    }
    if let Some(delay) = request.retry_in_ms
        && !(0..=JOB_INTERVAL_MS_MAX).contains(&delay)
    {
        return Err(format!(
            "retry_in_ms: {delay} is not between 0 and {JOB_INTERVAL_MS_MAX}"
        ));
    }
    Ok(())
}

/// A back-off's factor in thousandths, or why it is out of range.
pub fn factor_milli(factor: f64) -> Result<u32, String> {
    let max = f64::from(BACKOFF_FACTOR_MILLI_MAX) / 1000.0;
    if !factor.is_finite() || !(1.0..=max).contains(&factor) {
        return Err(format!(
            "backoff.factor: {factor} is not between 1 and {max}"
        ));
    }
    Ok((factor * 1000.0).round() as u32)
}

/// Checks a settings change, naming the first bad field.
pub fn check_settings_change(change: &SettingsChangeJson) -> Result<(), String> {
    let count = |name: &str, value: Option<i64>| match value {
        Some(v) if !(0..=i64::from(u32::MAX)).contains(&v) => {
            Err(format!("{name}: {v} is not between 0 and {}", u32::MAX))
        }
        _ => Ok(()),
    };
    count("max_running", change.max_running)?;
    count("max_attempts", change.max_attempts)?;
    let backoff = match &change.backoff {
        Some(backoff) => Some(Backoff {
            base_ms: backoff.base_ms,
            factor_milli: factor_milli(backoff.factor)?,
            max_ms: backoff.max_ms,
        }),
        None => None,
    };
    let bounded = SettingsChange {
        backoff,
        retention_ms: change.retention_ms,
        ..SettingsChange::default()
    };
    if let Some((field, reason)) = bounded.problems().into_iter().next() {
        return Err(format!("{field}: {reason}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_path_keeps_to_the_query_limit_and_leaves_longer_ones_to_a_body() {
        const MAX: usize = WAIT_QUERY_BYTES_MAX;
        assert_eq!(
            jobs_wait_path("g 1", &["a", "b/c"], 500, MAX).as_deref(),
            Some("/jobs/wait?group=g%201&key=a&key=b%2Fc&wait_ms=500")
        );
        let long = "k".repeat(100);
        let keys: Vec<&str> = vec![long.as_str(); 100];
        assert!(jobs_wait_path("g", &keys[..50], 0, MAX).is_some());
        assert_eq!(jobs_wait_path("g", &keys, 0, MAX), None);
        let fits = (0..=keys.len())
            .take_while(|&n| jobs_wait_path("g", &keys[..n], 60_000, MAX).is_some())
            .last()
            .expect("no keys fit");
        let longest = jobs_wait_path("g", &keys[..fits], 60_000, MAX).expect("fits");
        assert!(longest.len() <= MAX);
        assert!(longest.len() + "&key=".len() + long.len() > MAX);
    }

    #[test]
    fn bad_job_fields_are_named() {
        let add = |json: &str| serde_json::from_str::<AddJson>(json).expect("parses");
        let long = "k".repeat(257);
        let cases = [
            (
                format!(r#"{{"group":"g","key":"{long}"}}"#),
                "adds[0].key: a key is 1 to 256 bytes; this one is 257 bytes",
            ),
            (
                r#"{"group":"g","key":"a","after":["a"]}"#.to_string(),
                "adds[0].after[0]: names the task's own key",
            ),
            (r#"{"group":"g","after":["a"]}"#.to_string(), "need a key"),
            (
                r#"{"group":"g","key":"a","every_ms":0}"#.to_string(),
                "adds[0].every_ms: 0 is not between 1",
            ),
        ];
        for (json, expected) in cases {
            let error = check_add_job(0, &add(&json)).expect_err(&json);
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
        assert!(
            check_add_job(
                0,
                &add(r#"{"group":"g","key":"a","after":["b"],"priority":-3}"#)
            )
            .is_ok()
        );
        let unknown =
            serde_json::from_str::<AddJson>(r#"{"group":"g","key":"a","on_conflict":"merge"}"#)
                .expect_err("unknown on_conflict");
        assert!(
            unknown.to_string().contains("unknown variant `merge`"),
            "{unknown}"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let change = |json: &str| serde_json::from_str::<SettingsChangeJson>(json).expect("parses");
        let error = check_settings_change(&change(r#"{"max_running":-1}"#)).expect_err("negative");
        assert_eq!(error, "max_running: -1 is not between 0 and 4294967295");
        let error = check_settings_change(&change(
            r#"{"backoff":{"base_ms":10,"factor":0.5,"max_ms":20}}"#,
        ))
        .expect_err("factor");
        assert!(error.starts_with("backoff.factor: 0.5"), "{error}");
        assert_eq!(factor_milli(1.5), Ok(1500));
        assert!(check_settings_change(&change(r#"{"paused":true,"retention_ms":0}"#)).is_ok());
    }

    #[test]
    fn results_over_the_limit_are_refused() {
        let big = Value::String("x".repeat(JOB_RESULT_BYTES_MAX));
        assert!(
            result_text(&big)
                .expect_err("too big")
                .starts_with("result: ")
        );
        assert_eq!(
            result_text(&serde_json::json!({"ok": 1})),
            Ok(r#"{"ok":1}"#.to_string())
        );
    }
}
