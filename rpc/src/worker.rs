//! The worker API's JSON shapes, exactly as the seed (entrogo TaskStore) and SPEC
//! section 2 fix them.
//!
//! Requests reject unknown fields, except the fields of a task as GET returns it, so a
//! client may send a task back as it read it: `id` and `ownerid` in an add, `group` and
//! `ownerid` in an update are accepted when their type is right, and ignored. `null`
//! stands for a missing value, as in the seed's Go service: a `null` list is empty, a
//! `null` `data` is empty, a `null` `timespec` is now.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::Deserializer;
use serde::Serialize;
use serde::de;
use task_machine::check_claim_count;
pub use task_machine::constants::CLAIM_COUNT_MAX;
pub use task_machine::constants::CLAIM_DURATION_MS_MAX;

/// The longest claim a node grants unless started with another
/// `--claim-duration-max-ms` (one day); clients warn about longer leases.
pub const CLAIM_DURATION_MAX_MS_DEFAULT: i64 = 24 * 60 * 60 * 1000;
const _: () = assert!(CLAIM_DURATION_MAX_MS_DEFAULT <= CLAIM_DURATION_MS_MAX);
use task_machine::constants::REQUEST_ID_BYTES_MAX;

/// A task as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Task")]
pub struct TaskJson {
    /// Identity and fencing token of this version.
    pub id: u64,
    /// The task's group.
    pub group: String,
    /// Opaque payload.
    pub data: String,
    /// Available time, milliseconds since the Unix epoch.
    pub timespec: i64,
    /// The client that wrote this version.
    pub ownerid: i64,
    /// The job's key; only on tasks added with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Claim priority; only when not 0.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub priority: i64,
    /// The attempt this version belongs to (1 for a job's first claim); only on jobs
    /// that were claimed.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub attempt: u32,
}

fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// One entry of an update's `adds`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "AddTask")]
pub struct AddJson {
    /// Group of the new task; required (an add without one, or with an empty one, is
    /// refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Payload; empty by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Missing: now; negative: now + |t|; otherwise absolute milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timespec: Option<i64>,
    /// A task read back may carry its id here: an integer, ignored.
    #[serde(
        default,
        rename = "id",
        skip_serializing,
        deserialize_with = "optional_task_id"
    )]
    pub ignored_id: Option<u64>,
    /// A task read back may carry its owner here: an integer, ignored (the writer owns
    /// what it writes).
    #[serde(default, rename = "ownerid", skip_serializing)]
    pub ignored_ownerid: Option<i64>,
    /// A job read back may carry its attempt here: an integer, ignored (a new task has
    /// had none).
    #[serde(default, rename = "attempt", skip_serializing)]
    pub ignored_attempt: Option<u32>,
    /// Makes the task a job: 1 to 256 bytes, unique among the group's live tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What to do when `key` names a live task of the group: `refuse` (the default),
    /// `keep` (answer the live task) or `resubmit` (as keep, and run a running task once
    /// more after it succeeds). Needs a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_conflict: Option<crate::job::OnConflictJson>,
    /// Keys of the group that must succeed before this task may be claimed: live or
    /// succeeded jobs, or jobs added earlier in the same request. Needs a key.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<String>>")]
    pub after: Vec<String>,
    /// Claims pick higher priorities first; 0 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Attempts before the job is dead (0: unlimited), instead of the group's setting.
    /// Needs a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Re-enqueue the job this many milliseconds after each success. Needs a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<i64>,
}

/// One entry of an update's `updates`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ChangeTask")]
pub struct ChangeJson {
    /// The task version being replaced.
    #[serde(deserialize_with = "task_id")]
    pub id: u64,
    /// New payload; a missing `data` sets it empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Missing: now; negative: now + |t|; otherwise absolute milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timespec: Option<i64>,
    /// A task read back carries its group: a string, ignored (an update never moves a
    /// task to another group).
    #[serde(default, rename = "group", skip_serializing)]
    pub ignored_group: Option<String>,
    /// A task read back carries its owner: an integer, ignored.
    #[serde(default, rename = "ownerid", skip_serializing)]
    pub ignored_ownerid: Option<i64>,
    /// A job read back carries its key: a string, ignored (the new version keeps the
    /// job's key).
    #[serde(default, rename = "key", skip_serializing)]
    pub ignored_key: Option<String>,
    /// A task read back carries its priority when not 0: an integer, ignored (the new
    /// version keeps it).
    #[serde(default, rename = "priority", skip_serializing)]
    pub ignored_priority: Option<i64>,
    /// A job read back carries its attempt: an integer, ignored (the new version keeps
    /// it).
    #[serde(default, rename = "attempt", skip_serializing)]
    pub ignored_attempt: Option<u32>,
}

/// The body of `POST /update`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "UpdateRequest")]
pub struct UpdateRequestJson {
    /// The writing client; owner of every task written.
    #[schemars(transform = crate::schema::client_id)]
    pub clientid: i64,
    /// Tasks to create.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Option<Vec<AddJson>>")]
    pub adds: Vec<AddJson>,
    /// Tasks to replace.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Option<Vec<ChangeJson>>")]
    pub updates: Vec<ChangeJson>,
    /// Tasks to remove.
    #[serde(default, deserialize_with = "task_ids")]
    #[schemars(with = "Option<Vec<u64>>")]
    pub deletes: Vec<u64>,
    /// Tasks that must exist, left untouched.
    #[serde(default, deserialize_with = "task_ids")]
    #[schemars(with = "Option<Vec<u64>>")]
    pub depends: Vec<u64>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
}

/// The body of `POST /claim`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ClaimRequest")]
pub struct ClaimRequestJson {
    /// The claiming client.
    #[schemars(transform = crate::schema::client_id)]
    pub clientid: i64,
    /// Group to claim from.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(with = "Option<String>")]
    pub group: String,
    /// Milliseconds of ownership; positive and at most the node's configured maximum.
    #[schemars(transform = crate::schema::claim_duration)]
    pub duration: i64,
    /// Tasks that must exist, left untouched.
    #[serde(default, deserialize_with = "task_ids")]
    #[schemars(with = "Option<Vec<u64>>")]
    pub depends: Vec<u64>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::request_id)]
    pub requestid: Option<String>,
    /// When nothing is claimable, wait up to this many milliseconds (at most 60 000) for
    /// a task, then claim it; the usual empty list at the deadline. Waiting costs no log
    /// entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = crate::watch::WAIT_MS_MAX))]
    pub wait_ms: Option<u64>,
    /// Claim up to this many tasks at once (1 to 1 000; 1 when absent), each its own new
    /// version and fence, in the order successive claims would take them; fewer when
    /// fewer are available or their data passes 4 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = CLAIM_COUNT_MAX))]
    pub count: Option<u32>,
}

/// A task id in a request body: a JSON integer from 0 to 2^64-1. Anything else gets a
/// message that says so (serde's own calls a too-large integer a floating point value).
struct TaskIdVisitor;

impl de::Visitor<'_> for TaskIdVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a task id: an integer from 0 to 18446744073709551615")
    }

    fn visit_u64<E: de::Error>(self, id: u64) -> Result<u64, E> {
        Ok(id)
    }

    fn visit_i64<E: de::Error>(self, id: i64) -> Result<u64, E> {
        u64::try_from(id)
            .map_err(|_| E::custom(format!("task id {id} out of range: ids are not negative")))
    }

    fn visit_f64<E: de::Error>(self, id: f64) -> Result<u64, E> {
        // serde_json reads an integer past u64 as a float, and so 1.0 and 1e3.
        const PAST_U64: f64 = 18_446_744_073_709_551_616.0;
        if id.fract() != 0.0 || id.is_nan() {
            Err(E::custom(format!("task id {id} is not an integer")))
        } else if id < 0.0 {
            Err(E::custom(format!(
                "task id {id} out of range: ids are not negative"
            )))
        } else if id >= PAST_U64 {
            Err(E::custom(format!(
                "task id {id} out of range: ids are at most 18446744073709551615"
            )))
        } else {
            Err(E::custom(format!(
                "task id {id} is written with a fraction or an exponent; write ids as plain integers"
            )))
        }
    }
}

/// One task id, checked by [`TaskIdVisitor`].
struct TaskId(u64);

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_u64(TaskIdVisitor).map(TaskId)
    }
}

fn task_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    TaskId::deserialize(deserializer).map(|TaskId(id)| id)
}

fn optional_task_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<TaskId>::deserialize(deserializer)?.map(|TaskId(id)| id))
}

/// A list of task ids; `null` is empty.
fn task_ids<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u64>, D::Error> {
    let ids = Option::<Vec<TaskId>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(ids.into_iter().map(|TaskId(id)| id).collect())
}

/// The answer to a processed `/update` or `/claim`: exactly one of the two keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "WriteResult")]
pub enum WriteResultJson {
    /// Success: adds first, then updates, in request order; a claim's task or none.
    #[schemars(extend("additionalProperties" = false))]
    Tasks {
        /// The written tasks.
        tasks: Vec<TaskJson>,
    },
    /// Refusal: every reason, nothing changed.
    #[schemars(extend("additionalProperties" = false))]
    Errors {
        /// Human-readable reasons naming the list and the id.
        errors: Vec<String>,
    },
}

impl<'de> Deserialize<'de> for WriteResultJson {
    /// One pass over the object's keys: `untagged` would copy the whole answer into a
    /// buffer and try each variant in turn, which was most of a client's parsing
    /// (docs/performance.md, session 37). `tasks` wins if both keys came, as before.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct EitherKey {
            #[serde(default)]
            tasks: Option<Vec<TaskJson>>,
            #[serde(default)]
            errors: Option<Vec<String>>,
        }
        match EitherKey::deserialize(deserializer)? {
            EitherKey {
                tasks: Some(tasks), ..
            } => Ok(Self::Tasks { tasks }),
            EitherKey {
                errors: Some(errors),
                ..
            } => Ok(Self::Errors { errors }),
            _ => Err(serde::de::Error::custom(
                "a write's answer names neither `tasks` nor `errors`",
            )),
        }
    }
}

/// Path of the write of [`UpdateRequestJson`].
pub const UPDATE_PATH: &str = "/update";

/// Path of the write of [`ClaimRequestJson`].
pub const CLAIM_PATH: &str = "/claim";

impl AddJson {
    /// A new task in `group` with an empty payload, available now; the `with_` methods
    /// set the rest.
    pub fn in_group(group: impl Into<String>) -> Self {
        Self {
            group: Some(group.into()),
            ..Self::default()
        }
    }

    /// The same add with payload `data`.
    pub fn with_data(mut self, data: impl Into<String>) -> Self {
        self.data = Some(data.into());
        self
    }
}

impl ChangeJson {
    /// A new version of task `id` with an empty payload, available now (set `data` and
    /// `timespec` for others).
    pub fn of_task(id: u64) -> Self {
        Self {
            id,
            ..Self::default()
        }
    }

    /// The release of claimed task `id`: the same payload `data`, available now, so
    /// owned by no one (for a job, a released attempt: it counts, but never kills it).
    pub fn release(id: u64, data: impl Into<String>) -> Self {
        Self {
            data: Some(data.into()),
            ..Self::of_task(id)
        }
    }

    /// The renewal of claimed task `id`: the same payload `data`, unavailable to others
    /// (so still owned) for `duration_ms` more from now, which the seed spells as a
    /// negative timespec.
    pub fn renewal(id: u64, data: impl Into<String>, duration_ms: i64) -> Self {
        Self {
            data: Some(data.into()),
            timespec: Some(duration_ms.saturating_neg()),
            ..Self::of_task(id)
        }
    }
}

impl UpdateRequestJson {
    /// An update by `client` that changes nothing yet; the `with_` methods add to it.
    pub fn by(client: i64) -> Self {
        Self {
            clientid: client,
            ..Self::default()
        }
    }

    /// The same update, also creating `add`.
    pub fn with_add(mut self, add: AddJson) -> Self {
        self.adds.push(add);
        self
    }

    /// The same update, also replacing a task version as `change` says.
    pub fn with_change(mut self, change: ChangeJson) -> Self {
        self.updates.push(change);
        self
    }

    /// The same update, also deleting the tasks `ids`.
    pub fn with_deletes(mut self, ids: impl IntoIterator<Item = u64>) -> Self {
        self.deletes.extend(ids);
        self
    }

    /// The same update, applied only if the tasks `ids` exist.
    pub fn with_depends(mut self, ids: impl IntoIterator<Item = u64>) -> Self {
        self.depends.extend(ids);
        self
    }
}

impl ClaimRequestJson {
    /// A claim by `client` of the next available task of `group`, for `duration_ms`.
    pub fn new(client: i64, group: impl Into<String>, duration_ms: i64) -> Self {
        Self {
            clientid: client,
            group: group.into(),
            duration: duration_ms,
            ..Self::default()
        }
    }

    /// The same claim, of up to `count` tasks.
    pub fn with_count(mut self, count: u32) -> Self {
        self.count = Some(count);
        self
    }

    /// How many tasks the claim may take, checked: 1 when `count` is absent.
    pub fn checked_count(&self) -> Result<u32, String> {
        let count = self.count.unwrap_or(1);
        check_claim_count(count)
            .map(|()| count)
            .map_err(|refusal| refusal.to_string())
    }
}

/// A worker's write with the path it goes to, so that a client cannot send an update
/// to `/claim`. Serialises as the body alone.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum WriteRequestJson {
    /// `POST /update`.
    Update(UpdateRequestJson),
    /// `POST /claim`.
    Claim(ClaimRequestJson),
    /// `POST /finish`.
    Finish(crate::job::FinishRequestJson),
    /// `POST /finish/many`.
    FinishMany(crate::job::FinishManyRequestJson),
    /// `POST /fail`.
    Fail(crate::job::FailRequestJson),
    /// `POST /cancel`.
    Cancel(crate::job::KeysRequestJson),
    /// `POST /retry`.
    Retry(crate::job::KeysRequestJson),
}

impl WriteRequestJson {
    /// The path the body is posted to.
    pub fn path(&self) -> &'static str {
        match self {
            Self::Update(_) => UPDATE_PATH,
            Self::Claim(_) => CLAIM_PATH,
            Self::Finish(_) => crate::job::FINISH_PATH,
            Self::FinishMany(_) => crate::job::FINISH_MANY_PATH,
            Self::Fail(_) => crate::job::FAIL_PATH,
            Self::Cancel(_) => crate::job::CANCEL_PATH,
            Self::Retry(_) => crate::job::RETRY_PATH,
        }
    }

    /// How long the node may wait before it answers (a blocking claim's `wait_ms`):
    /// a client's deadline for the call is this plus its usual one.
    pub fn wait(&self) -> std::time::Duration {
        match self {
            Self::Claim(claim) => std::time::Duration::from_millis(claim.wait_ms.unwrap_or(0)),
            _ => std::time::Duration::ZERO,
        }
    }

    /// The client that writes.
    pub fn client_id(&self) -> i64 {
        match self {
            Self::Update(update) => update.clientid,
            Self::Claim(claim) => claim.clientid,
            Self::Finish(finish) => finish.clientid,
            Self::FinishMany(many) => many.clientid,
            Self::Fail(fail) => fail.clientid,
            Self::Cancel(keys) | Self::Retry(keys) => keys.clientid,
        }
    }

    /// The request id the write carries, if any.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::Update(update) => update.requestid.as_deref(),
            Self::Claim(claim) => claim.requestid.as_deref(),
            Self::Finish(finish) => finish.requestid.as_deref(),
            Self::FinishMany(many) => many.requestid.as_deref(),
            Self::Fail(fail) => fail.requestid.as_deref(),
            Self::Cancel(keys) | Self::Retry(keys) => keys.requestid.as_deref(),
        }
    }

    /// The same request under `request_id` (`None`: without one).
    pub fn with_request_id(mut self, request_id: impl Into<Option<String>>) -> Self {
        let slot = match &mut self {
            Self::Update(update) => &mut update.requestid,
            Self::Claim(claim) => &mut claim.requestid,
            Self::Finish(finish) => &mut finish.requestid,
            Self::FinishMany(many) => &mut many.requestid,
            Self::Fail(fail) => &mut fail.requestid,
            Self::Cancel(keys) | Self::Retry(keys) => &mut keys.requestid,
        };
        *slot = request_id.into();
        self
    }
}

impl From<UpdateRequestJson> for WriteRequestJson {
    fn from(update: UpdateRequestJson) -> Self {
        Self::Update(update)
    }
}

impl From<crate::job::FinishRequestJson> for WriteRequestJson {
    fn from(finish: crate::job::FinishRequestJson) -> Self {
        Self::Finish(finish)
    }
}

impl From<crate::job::FinishManyRequestJson> for WriteRequestJson {
    fn from(many: crate::job::FinishManyRequestJson) -> Self {
        Self::FinishMany(many)
    }
}

impl From<ClaimRequestJson> for WriteRequestJson {
    fn from(claim: ClaimRequestJson) -> Self {
        Self::Claim(claim)
    }
}

/// The body of every non-200 answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorJson {
    /// What happened and what to do.
    pub error: String,
}

/// Checks a request id: at most [`REQUEST_ID_BYTES_MAX`] bytes.
pub fn check_request_id(request_id: &str) -> Result<(), String> {
    if request_id.len() > REQUEST_ID_BYTES_MAX {
        return Err(format!(
            "requestid is {} bytes long; use at most {REQUEST_ID_BYTES_MAX}",
            request_id.len()
        ));
    }
    Ok(())
}

/// Parses the seed's boolean spellings for `owned` (0, 1, yes, no, true, false) in any
/// letter case; empty means absent (`None`).
pub fn parse_owned(value: &str) -> Result<Option<bool>, String> {
    match value.to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "1" | "yes" | "true" => Ok(Some(true)),
        "0" | "no" | "false" => Ok(Some(false)),
        _ => Err(format!(
            "owned={value:?} is not one of 0, 1, yes, no, true, false"
        )),
    }
}

/// Whether `text` is a plain decimal number: digits only, no sign.
fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Parses `limit`: a non-negative integer; `0` and empty mean no limit (`None`), as in
/// the original service, and so does a number too large to matter.
pub fn parse_limit(value: &str) -> Result<Option<usize>, String> {
    if value.is_empty() {
        return Ok(None);
    }
    if !all_digits(value) {
        return Err(format!("limit={value:?} is not a non-negative integer"));
    }
    let limit = value.parse::<usize>().unwrap_or(usize::MAX);
    Ok((limit > 0).then_some(limit))
}

/// Parses a task id from a path: digits only.
pub fn parse_id(text: &str) -> Result<u64, String> {
    all_digits(text)
        .then(|| text.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| format!("{text:?} is not a numeric task id"))
}

/// Parses a comma-separated id list from a `/tasks/<id>,<id>` path.
pub fn parse_id_list(list: &str) -> Result<Vec<u64>, String> {
    list.split(',')
        .map(|part| parse_id(part).map_err(|e| format!("{e} (in /tasks/{list})")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_update_example_parses() {
        let body = r#"{"clientid": 1643,
           "adds": [{"group": "map", "data": "/path/to/file:1024:2048"},
                    {"group": "map", "data": "/path/to/file:2048:3096", "id": 77}],
           "updates": [{"id": 14, "data": "some data for this task", "timespec": -60000}],
           "deletes": [16, 18, 20],
           "depends": [12, 13]}"#;
        let update: UpdateRequestJson = serde_json::from_str(body).expect("parses");
        assert_eq!(update.clientid, 1643);
        assert_eq!(update.adds.len(), 2);
        assert_eq!(update.adds[1].group.as_deref(), Some("map"));
        assert_eq!(update.updates[0].timespec, Some(-60000));
        assert_eq!(update.deletes, [16, 18, 20]);
        assert_eq!(update.depends, [12, 13]);
    }

    #[test]
    fn only_a_claim_waits() {
        let update = serde_json::from_str::<UpdateRequestJson>(r#"{"clientid": 1, "wait_ms": 5}"#);
        let error = update.expect_err("an update has no wait").to_string();
        assert!(error.contains("unknown field `wait_ms`"), "{error}");
        let claim: ClaimRequestJson =
            serde_json::from_str(r#"{"clientid": 1, "group": "g", "duration": 5, "wait_ms": 5}"#)
                .expect("a claim waits");
        assert_eq!(claim.wait_ms, Some(5));
    }

    #[test]
    fn nulls_are_missing_values() {
        let body = r#"{"clientid": 1, "adds": [{"group": "g", "data": null, "timespec": null}],
                       "updates": null, "deletes": null, "depends": null}"#;
        let update: UpdateRequestJson = serde_json::from_str(body).expect("parses");
        assert_eq!(update.adds[0].data, None);
        assert!(update.updates.is_empty());
    }

    #[test]
    fn malformed_requests_are_rejected() {
        for body in [
            r#"{"adds": []}"#,
            r#"{"clientid": "7"}"#,
            r#"{"clientid": 1.5}"#,
            r#"{"clientid": 1, "bogus": 1}"#,
            r#"{"clientid": 1, "updates": [{"id": 1, "group": 5}]}"#,
            r#"{"clientid": 1, "deletes": ["x"]}"#,
            r#"{"clientid": 1, "deletes": [-1]}"#,
            "not json",
        ] {
            assert!(
                serde_json::from_str::<UpdateRequestJson>(body).is_err(),
                "{body}"
            );
        }
        for body in [
            r#"{"clientid": 1, "group": "g"}"#,
            r#"{"clientid": 1, "group": "g", "duration": "5"}"#,
            r#"{"clientid": 1, "group": "g", "duration": 5, "extra": true}"#,
        ] {
            assert!(
                serde_json::from_str::<ClaimRequestJson>(body).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn a_task_sent_back_as_read_is_accepted_when_typed_right() {
        let body = r#"{"clientid": 1,
            "adds": [{"id": 5, "group": "g", "data": "d", "timespec": 0, "ownerid": 9}],
            "updates": [{"id": 6, "group": "g", "data": "d", "timespec": 0, "ownerid": 9}]}"#;
        let update: UpdateRequestJson = serde_json::from_str(body).expect("parses");
        assert_eq!(update.adds[0].ignored_id, Some(5));
        assert_eq!(update.updates[0].id, 6);
        // A job as GET answers it, sent back as an update (a renewal) or an add.
        let job = r#"{"id": 6, "group": "g", "data": "d", "timespec": 0, "ownerid": 9,
            "key": "k", "priority": 3, "attempt": 2}"#;
        let body = format!(r#"{{"clientid": 1, "adds": [{job}], "updates": [{job}]}}"#);
        let update: UpdateRequestJson = serde_json::from_str(&body).expect("parses");
        assert_eq!(update.updates[0].ignored_key.as_deref(), Some("k"));
        assert_eq!(update.adds[0].key.as_deref(), Some("k"));
        assert_eq!(update.adds[0].priority, Some(3));
        for body in [
            r#"{"clientid": 1, "adds": [{"group": "g", "id": "5"}]}"#,
            r#"{"clientid": 1, "adds": [{"group": "g", "id": [[[]]]}]}"#,
            r#"{"clientid": 1, "adds": [{"group": "g", "ownerid": "9"}]}"#,
            r#"{"clientid": 1, "updates": [{"id": 6, "group": 7}]}"#,
            r#"{"clientid": 1, "updates": [{"id": 6, "ownerid": 1.5}]}"#,
            r#"{"clientid": 1, "updates": [{"id": 6, "key": 7}]}"#,
            r#"{"clientid": 1, "updates": [{"id": 6, "attempt": -1}]}"#,
            r#"{"clientid": 1, "adds": [{"group": "g", "attempt": "1"}]}"#,
        ] {
            assert!(
                serde_json::from_str::<UpdateRequestJson>(body).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn an_id_above_the_range_says_so() {
        for body in [
            r#"{"clientid": 1, "deletes": [18446744073709551616]}"#,
            r#"{"clientid": 1, "depends": [1e30]}"#,
            r#"{"clientid": 1, "updates": [{"id": 18446744073709551616}]}"#,
            r#"{"clientid": 1, "adds": [{"group": "g", "id": 18446744073709551616}]}"#,
        ] {
            let error = serde_json::from_str::<UpdateRequestJson>(body)
                .expect_err(body)
                .to_string();
            assert!(error.contains("out of range"), "{body}: {error}");
            assert!(!error.contains("floating point"), "{body}: {error}");
        }
        let max = r#"{"clientid": 1, "deletes": [18446744073709551615]}"#;
        let update: UpdateRequestJson = serde_json::from_str(max).expect("the largest id");
        assert_eq!(update.deletes, [u64::MAX]);
    }

    #[test]
    fn an_id_written_as_a_float_says_so() {
        for (body, says) in [
            (
                r#"{"clientid": 1, "deletes": [1.0]}"#,
                "fraction or an exponent",
            ),
            (
                r#"{"clientid": 1, "deletes": [1e3]}"#,
                "fraction or an exponent",
            ),
            (r#"{"clientid": 1, "deletes": [0.5]}"#, "not an integer"),
            (r#"{"clientid": 1, "deletes": [-2.0]}"#, "not negative"),
        ] {
            let error = serde_json::from_str::<UpdateRequestJson>(body)
                .expect_err(body)
                .to_string();
            assert!(error.contains(says), "{body}: {error}");
            assert!(!error.contains("at most"), "{body}: {error}");
        }
    }

    #[test]
    fn results_have_exactly_one_key() {
        let tasks = WriteResultJson::Tasks { tasks: vec![] };
        assert_eq!(
            serde_json::to_string(&tasks).expect("json"),
            r#"{"tasks":[]}"#
        );
        let errors = WriteResultJson::Errors {
            errors: vec!["deletes: task 987 does not exist".into()],
        };
        assert_eq!(
            serde_json::to_string(&errors).expect("json"),
            r#"{"errors":["deletes: task 987 does not exist"]}"#
        );
        let back: WriteResultJson = serde_json::from_str(r#"{"errors":["x"]}"#).expect("parses");
        assert_eq!(
            back,
            WriteResultJson::Errors {
                errors: vec!["x".into()]
            }
        );
    }

    #[test]
    fn results_parse_from_either_key_and_nothing_else() {
        let task = r#"{"id":3,"group":"g","data":"d","timespec":5,"ownerid":7}"#;
        let parse = |body: &str| serde_json::from_str::<WriteResultJson>(body);
        let tasks = parse(&format!(r#"{{"tasks":[{task}],"other":1}}"#)).expect("parses");
        assert!(
            matches!(&tasks, WriteResultJson::Tasks { tasks } if tasks.len() == 1 && tasks[0].id == 3)
        );
        assert_eq!(
            parse(r#"{"tasks":null,"errors":["no"]}"#).expect("parses"),
            WriteResultJson::Errors {
                errors: vec!["no".into()]
            }
        );
        // Both keys: the tasks, as the untagged form read it.
        assert!(matches!(
            parse(r#"{"errors":["no"],"tasks":[]}"#).expect("parses"),
            WriteResultJson::Tasks { .. }
        ));
        for bad in [
            r#"{}"#,
            r#"{"tasks":null}"#,
            r#"{"tasks":[1]}"#,
            r#"[]"#,
            r#""x""#,
        ] {
            let error = parse(bad).expect_err(bad).to_string();
            assert!(!error.is_empty(), "{bad}");
        }
        assert!(
            parse("{}")
                .expect_err("no key")
                .to_string()
                .contains("neither `tasks` nor `errors`")
        );
    }

    #[test]
    fn built_requests_serialise_as_the_seed_spells_them() {
        let update = UpdateRequestJson::by(7)
            .with_add(AddJson::in_group("g").with_data("x"))
            .with_change(ChangeJson::renewal(3, "y", 500))
            .with_deletes([4])
            .with_depends([5]);
        let request = WriteRequestJson::from(update).with_request_id("w7-r1".to_string());
        let json = serde_json::to_string(&request).expect("json");
        assert_eq!(
            json,
            r#"{"clientid":7,"adds":[{"group":"g","data":"x"}],"updates":[{"id":3,"data":"y","timespec":-500}],"deletes":[4],"depends":[5],"requestid":"w7-r1"}"#
        );
        let back: UpdateRequestJson = serde_json::from_str(&json).expect("parses");
        assert_eq!(WriteRequestJson::from(back), request);

        let claim = WriteRequestJson::from(ClaimRequestJson::new(7, "g", 1000))
            .with_request_id("r".to_string())
            .with_request_id(None);
        let json = serde_json::to_string(&claim).expect("json");
        assert_eq!(
            json, r#"{"clientid":7,"group":"g","duration":1000,"depends":[]}"#,
            "no request id is absent, not null"
        );
        assert_eq!(
            WriteRequestJson::from(UpdateRequestJson::by(1)).path(),
            "/update"
        );
        assert_eq!(
            WriteRequestJson::from(ClaimRequestJson::new(1, "g", 1)).path(),
            "/claim"
        );
    }

    #[test]
    fn query_values() {
        for (value, owned) in [
            ("1", true),
            ("yes", true),
            ("true", true),
            ("0", false),
            ("no", false),
            ("false", false),
        ] {
            assert_eq!(parse_owned(value), Ok(Some(owned)));
        }
        assert!(parse_owned("maybe").is_err());
        assert_eq!(parse_owned("TRUE"), Ok(Some(true)), "any letter case");
        assert_eq!(parse_owned("No"), Ok(Some(false)));
        assert_eq!(parse_owned(""), Ok(None), "empty is absent");
        assert!(parse_limit("+5").is_err());
        assert!(parse_id("+7").is_err());
        assert_eq!(parse_id("523623"), Ok(523623));
        assert_eq!(parse_limit("10"), Ok(Some(10)));
        assert_eq!(parse_limit("0"), Ok(None), "0 is no limit");
        assert_eq!(parse_limit(""), Ok(None), "empty is no limit");
        assert_eq!(parse_limit("99999999999999999999999"), Ok(Some(usize::MAX)));
        assert!(parse_limit("-1").is_err());
        assert!(parse_limit("1.5").is_err());
        assert_eq!(parse_id_list("1,2,3"), Ok(vec![1, 2, 3]));
        assert!(parse_id_list("1,x").is_err());
        assert!(parse_id_list("").is_err());
    }
}
