//! The job API (SPEC section 4, issue 12): finish, fail, cancel and retry as writes
//! through the log like `/update`, job records by key or by state, group settings. The
//! same relay, request ids and answer shapes as the worker API.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::Path;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use rpc::job::CANCEL_PATH;
use rpc::job::FAIL_PATH;
use rpc::job::FINISH_MANY_PATH;
use rpc::job::FINISH_PATH;
use rpc::job::FailRequestJson;
use rpc::job::FinishManyRequestJson;
use rpc::job::FinishRequestJson;
use rpc::job::GroupStatsJson;
use rpc::job::JOBS_PAGE_DEFAULT;
use rpc::job::JOBS_PAGE_MAX;
use rpc::job::JOBS_WAIT_PATH;
use rpc::job::JobJson;
use rpc::job::JobPageJson;
use rpc::job::JobWaitJson;
use rpc::job::JobWaitRequestJson;
use rpc::job::KeysRequestJson;
use rpc::job::RETRY_PATH;
use rpc::job::SettingsChangeJson;
use rpc::job::WAIT_KEYS_MAX;
use rpc::job::check_fail;
use rpc::job::check_key;
use rpc::job::check_keys_request;
use rpc::job::check_settings_change;
use rpc::job::factor_milli;
use rpc::job::finish_items;
use rpc::job::result_text;
use rpc::watch::check_wait_ms;
use store_sm::machine::Backoff;
use store_sm::machine::CancelRequest;
use store_sm::machine::ClaimManyRequest;
use store_sm::machine::ClaimRequest;
use store_sm::machine::FailRequest;
use store_sm::machine::FinishAndClaimRequest;
use store_sm::machine::FinishItem;
use store_sm::machine::FinishManyRequest;
use store_sm::machine::FinishRequest;
use store_sm::machine::JobState;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::RetryRequest;
use store_sm::machine::SettingsChange;
use store_sm::machine::SettingsRequest;
use store_sm::machine::TaskId;

use crate::http::ApiError;
use crate::json::job_json;
use crate::json::settings_json;
use crate::node::SharedNode;
use crate::relay::Incoming;
use crate::relay::respond;
use crate::service::Consistency;
use crate::worker_api::check_claim_duration;
use crate::worker_api::consistency;
use crate::worker_api::limit_param;
use crate::worker_api::parse_json;
use crate::worker_api::path_segment;
use crate::worker_api::query_params;
use crate::worker_api::read;
use crate::worker_api::request_id;
use crate::worker_api::wait_param;
use crate::worker_api::write;

/// The job API routes.
pub fn routes() -> Router<SharedNode> {
    Router::new()
        .route(FINISH_PATH, post(post_finish))
        .route(FINISH_MANY_PATH, post(post_finish_many))
        .route(FAIL_PATH, post(post_fail))
        .route(CANCEL_PATH, post(post_cancel))
        .route(RETRY_PATH, post(post_retry))
        .route("/job", get(get_job))
        .route("/jobs", get(get_jobs))
        .route(JOBS_WAIT_PATH, get(get_jobs_wait).post(post_jobs_wait))
        .route("/dead", get(get_dead))
        .route(
            "/groups/{group}/settings",
            get(get_settings).put(put_settings),
        )
        .route("/groups/{group}/stats", get(get_stats))
}

async fn post_finish(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: FinishRequestJson = parse_json(&incoming.body, FINISH_PATH)?;
    let result = json
        .result
        .as_ref()
        .map(result_text)
        .transpose()
        .map_err(ApiError::bad_request)?;
    let request_id = request_id(&incoming, json.requestid)?;
    let finish = FinishRequest {
        client: json.clientid,
        id: json.id,
        result,
    };
    let request = match json.next {
        None => Request::Finish(finish),
        Some(next) => {
            check_claim_duration(&node, "next.duration", next.duration)?;
            let count = next.checked_count().map_err(|refusal| {
                // The machine's text names a claim's `count`; here it is `next.count`.
                let text = refusal.to_string();
                let text = text.strip_prefix("claim: ").unwrap_or(&text);
                ApiError::bad_request(format!("next.{text}"))
            })?;
            if next.group.is_empty() {
                return Err(ApiError::bad_request(
                    "next.group is missing or empty; name the group to claim the next task from",
                ));
            }
            incoming.caller.check_group(&next.group)?;
            Request::FinishAndClaim(FinishAndClaimRequest {
                next: ClaimManyRequest {
                    claim: ClaimRequest {
                        client: finish.client,
                        group: next.group,
                        duration_ms: next.duration,
                        depends: Vec::new(),
                    },
                    count,
                },
                finish,
            })
        }
    };
    Ok(write(&node, incoming, request, request_id).await)
}

async fn post_finish_many(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: FinishManyRequestJson = parse_json(&incoming.body, FINISH_MANY_PATH)?;
    let finishes: Vec<FinishItem> = finish_items(&json)
        .map_err(ApiError::bad_request)?
        .into_iter()
        .map(|(id, result)| FinishItem { id, result })
        .collect();
    let request_id = request_id(&incoming, json.requestid)?;
    // One task is logged as the single finish it is, the entry POST /finish makes.
    let request = match <[FinishItem; 1]>::try_from(finishes) {
        Ok([only]) => Request::Finish(FinishRequest {
            client: json.clientid,
            id: only.id,
            result: only.result,
        }),
        Err(finishes) => Request::FinishMany(FinishManyRequest {
            client: json.clientid,
            finishes,
        }),
    };
    Ok(write(&node, incoming, request, request_id).await)
}

async fn post_fail(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: FailRequestJson = parse_json(&incoming.body, FAIL_PATH)?;
    check_fail(&json).map_err(ApiError::bad_request)?;
    let request_id = request_id(&incoming, json.requestid)?;
    let request = Request::Fail(FailRequest {
        client: json.clientid,
        id: json.id,
        error: json.error,
        retry_in_ms: json.retry_in_ms,
    });
    Ok(write(&node, incoming, request, request_id).await)
}

async fn post_cancel(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: KeysRequestJson = parse_json(&incoming.body, CANCEL_PATH)?;
    check_keys_request(&json).map_err(ApiError::bad_request)?;
    let request_id = request_id(&incoming, json.requestid)?;
    let request = Request::Cancel(CancelRequest {
        client: json.clientid,
        group: json.group,
        keys: json.keys,
    });
    Ok(write(&node, incoming, request, request_id).await)
}

async fn post_retry(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: KeysRequestJson = parse_json(&incoming.body, RETRY_PATH)?;
    check_keys_request(&json).map_err(ApiError::bad_request)?;
    let request_id = request_id(&incoming, json.requestid)?;
    let request = Request::Retry(RetryRequest {
        client: json.clientid,
        group: json.group,
        keys: json.keys,
    });
    Ok(write(&node, incoming, request, request_id).await)
}

/// A required, non-empty query parameter.
fn required<'a>(params: &'a HashMap<String, String>, name: &str) -> Result<&'a str, ApiError> {
    match params.get(name).map(String::as_str) {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(ApiError::bad_request(format!(
            "query parameter {name} is required"
        ))),
    }
}

/// The `id` query parameter of `GET /job`, if given.
fn job_id_param(params: &HashMap<String, String>) -> Result<Option<TaskId>, ApiError> {
    let Some(value) = params.get("id") else {
        return Ok(None);
    };
    if params.contains_key("group") || params.contains_key("key") {
        return Err(ApiError::bad_request(
            "name a job either by id or by group and key, not both",
        ));
    }
    // Parsed as a task id in a path is: digits only, so `+5` is no id here either.
    match rpc::worker::parse_id(value) {
        Ok(id) if id > 0 => Ok(Some(id)),
        _ => Err(ApiError::bad_request(format!(
            "query parameter id is a job's id, a positive integer (the record's id, or its live task's id); got {value:?}"
        ))),
    }
}

/// How a `GET /job` names its job.
enum JobName {
    Id(TaskId),
    Key { group: String, key: String },
}

/// `GET /job?group=G&key=K` or `GET /job?id=N`: a job's record, by key or by id.
async fn get_job(State(node): State<SharedNode>, incoming: Incoming) -> Result<Response, ApiError> {
    let params = query_params(Some(incoming.query()))?;
    let name = match job_id_param(&params)? {
        Some(id) => JobName::Id(id),
        None if !params.contains_key("group") && !params.contains_key("key") => {
            return Err(ApiError::bad_request(
                "name a job with the query parameters group and key, or with id",
            ));
        }
        None => {
            let group = required(&params, "group")?.to_string();
            incoming.caller.check_group(&group)?;
            let key = required(&params, "key")?.to_string();
            check_key("key", &key).map_err(ApiError::bad_request)?;
            JobName::Key { group, key }
        }
    };
    let wait = wait_param(&params)?;
    let consistency = consistency(&params)?;
    let (group, key, run, by_id) = match name {
        JobName::Key { group, key } => (group, key, None, None),
        JobName::Id(id) => {
            let view = match node.read(consistency).await {
                Ok(view) => view,
                Err(e) => {
                    let never: Result<Infallible, _> = Err(e);
                    let incoming = incoming.waiting(wait);
                    return Ok(respond(&node, incoming, never, |never| match never {}).await);
                }
            };
            let machine = view.state.machine.as_of(view.now);
            // A token that does not cover the job's group learns nothing of it.
            let record = machine
                .job_by_id(id)
                .filter(|record| incoming.caller.check_group(&record.group).is_ok())
                .ok_or_else(|| no_job_with_id(id))?;
            if wait.is_zero() {
                return Ok(Json(job_json(&machine, record)).into_response());
            }
            let (group, key) = (record.group.to_string(), record.key.to_string());
            (group, key, Some(record.run), Some(id))
        }
    };
    let held = node.holds_token(&incoming.caller);
    let view = node
        .wait_job_run(&group, &key, run, consistency, wait)
        .await;
    // The token may have been revoked while the request waited.
    node.still_authorized(&incoming.caller, held)?;
    Ok(respond(&node, incoming.waiting(wait), view, |view| {
        let machine = &view.state.machine.as_of(view.now);
        match (machine.job(&group, &key), by_id) {
            (Some(record), _) => Json(job_json(machine, record)).into_response(),
            (None, Some(id)) => no_job_with_id(id).into_response(),
            (None, None) => ApiError::not_found(format!(
                "no job with key {key:?} in group {group:?} (never added, or its record passed the group's retention)"
            ))
            .into_response(),
        }
    })
    .await)
}

/// The 404 of `GET /job?id=` for an id that names no job (or one outside the caller's
/// groups).
fn no_job_with_id(id: TaskId) -> ApiError {
    ApiError::not_found(format!(
        "no job with id {id}: name a job by its id (the record's id: the task id its run \
         began with) or by its live task's id (a task without a key is no job); an id \
         names its job until the job's next run or the group's retention, so read older \
         runs by group and key"
    ))
}

/// What a `/jobs/wait` asks, from its query (`GET`) or its body (`POST`).
struct JobWait {
    group: String,
    keys: Vec<String>,
    wait: Duration,
    consistency: Consistency,
}

/// `GET /jobs/wait?group=G&key=A&key=B&wait_ms=`: the named jobs once all finished.
async fn get_jobs_wait(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let mut group = None;
    let mut keys: Vec<String> = Vec::new();
    let mut rest = Vec::new();
    for (name, value) in form_urlencoded::parse(incoming.query().as_bytes()) {
        match &*name {
            "key" => keys.push(value.into_owned()),
            "group" if group.is_none() => group = Some(value.into_owned()),
            "group" => {
                return Err(ApiError::bad_request(
                    "query parameter group is given twice; wait on one group per request",
                ));
            }
            _ => rest.push((name.into_owned(), value.into_owned())),
        }
    }
    let mut params = HashMap::new();
    for (name, value) in rest {
        if params.insert(name.clone(), value).is_some() {
            return Err(ApiError::bad_request(format!(
                "query parameter {name} is given twice"
            )));
        }
    }
    let group = group
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("query parameter group is required (once)"))?;
    let asked = JobWait {
        group,
        keys,
        wait: wait_param(&params)?,
        consistency: consistency(&params)?,
    };
    jobs_wait(node, incoming, asked, "each as key=K").await
}

/// `POST /jobs/wait` with `{"group", "keys", "wait_ms", "consistency"}`: the same read
/// as the GET, for more keys than a URL holds.
async fn post_jobs_wait(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: JobWaitRequestJson = parse_json(&incoming.body, JOBS_WAIT_PATH)?;
    if json.group.is_empty() {
        return Err(ApiError::bad_request(
            "group is required; name the jobs' group",
        ));
    }
    let wait_ms = json.wait_ms.unwrap_or(0);
    check_wait_ms(wait_ms).map_err(ApiError::bad_request)?;
    let asked = JobWait {
        group: json.group,
        keys: json.keys,
        wait: Duration::from_millis(wait_ms),
        consistency: Consistency::parse(json.consistency.as_deref())?,
    };
    jobs_wait(node, incoming, asked, "in keys").await
}

/// Answers a `/jobs/wait` once every named job has finished, or at its deadline.
async fn jobs_wait(
    node: SharedNode,
    incoming: Incoming,
    asked: JobWait,
    how: &str,
) -> Result<Response, ApiError> {
    let JobWait {
        group,
        keys,
        wait,
        consistency,
    } = asked;
    incoming.caller.check_group(&group)?;
    if keys.is_empty() || keys.len() > WAIT_KEYS_MAX {
        return Err(ApiError::bad_request(format!(
            "name 1 to {WAIT_KEYS_MAX} jobs, {how}; {} given",
            keys.len()
        )));
    }
    for key in &keys {
        check_key("key", key).map_err(ApiError::bad_request)?;
    }
    let held = node.holds_token(&incoming.caller);
    let view = node.wait_jobs(&group, &keys, consistency, wait).await;
    node.still_authorized(&incoming.caller, held)?;
    Ok(respond(&node, incoming.waiting(wait), view, |view| {
        let machine = &view.state.machine.as_of(view.now);
        let mut answer = JobWaitJson {
            finished: true,
            jobs: Vec::with_capacity(keys.len()),
            missing: Vec::new(),
        };
        for key in &keys {
            match machine.job(&group, key) {
                Some(record) => {
                    answer.finished &= record.state.has_ended();
                    answer.jobs.push(job_json(machine, record));
                }
                None => {
                    answer.finished = false;
                    answer.missing.push(key.clone());
                }
            }
        }
        Json(answer).into_response()
    })
    .await)
}

async fn get_jobs(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let params = query_params(Some(incoming.query()))?;
    let state = match params.get("state").map(String::as_str) {
        None | Some("") => None,
        Some(name) => Some(JobState::parse(name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "state {name:?} is not one of waiting, running, failed, succeeded, dead, cancelled"
            ))
        })?),
    };
    page(node, incoming, params, state).await
}

async fn get_dead(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let params = query_params(Some(incoming.query()))?;
    if params.contains_key("state") {
        return Err(ApiError::bad_request(
            "/dead lists dead jobs only; use /jobs?state= for others",
        ));
    }
    page(node, incoming, params, Some(JobState::Dead)).await
}

/// A page of a group's job records from `after`, at most `limit` (100 by default, 1000
/// at most).
async fn page(
    node: SharedNode,
    incoming: Incoming,
    params: HashMap<String, String>,
    state: Option<JobState>,
) -> Result<Response, ApiError> {
    let group = required(&params, "group")?.to_string();
    incoming.caller.check_group(&group)?;
    let after = params.get("after").filter(|a| !a.is_empty()).cloned();
    let limit = limit_param(&params)?.unwrap_or(JOBS_PAGE_DEFAULT);
    if limit > JOBS_PAGE_MAX {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is above {JOBS_PAGE_MAX}; page with after= instead"
        )));
    }
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        let machine = &view.state.machine.as_of(view.now);
        let mut records = machine.jobs(&group, state, after.as_deref());
        let jobs: Vec<JobJson> = records
            .by_ref()
            .take(limit)
            .map(|record| job_json(machine, record))
            .collect();
        let next = match records.next() {
            Some(_) => jobs.last().map(|job| job.key.clone()),
            None => None,
        };
        Ok(Json(JobPageJson { jobs, next }).into_response())
    })
    .await)
}

async fn get_settings(
    State(node): State<SharedNode>,
    group: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let group = path_segment(group)?;
    incoming.caller.check_group(&group)?;
    let params = query_params(Some(incoming.query()))?;
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        let machine = &view.state.machine.as_of(view.now);
        let settings = machine.group_settings(&group);
        let running = machine.running_in_group(&group);
        Ok(Json(settings_json(&group, &settings, running)).into_response())
    })
    .await)
}

/// The dashboard's figures for a group. O(tasks + jobs of the group): a look, not a
/// hot path.
async fn get_stats(
    State(node): State<SharedNode>,
    group: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let group = path_segment(group)?;
    incoming.caller.check_group(&group)?;
    let params = query_params(Some(incoming.query()))?;
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        let machine = &view.state.machine;
        let tasks = machine.group_len(&group) as u64;
        let available = machine.iter_group(&group, false, view.now).count() as u64;
        let records = machine.as_of(view.now);
        let jobs = JobState::ALL
            .iter()
            .map(|&state| {
                let count = records.jobs(&group, Some(state), None).count() as u64;
                (state.as_str().to_string(), count)
            })
            .collect();
        Ok(Json(GroupStatsJson {
            group: group.clone(),
            tasks,
            available,
            owned: tasks.saturating_sub(available),
            jobs,
        })
        .into_response())
    })
    .await)
}

async fn put_settings(
    State(node): State<SharedNode>,
    group: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let group = path_segment(group)?;
    if group.is_empty() {
        return Err(ApiError::bad_request("the group in the path is empty"));
    }
    let json: SettingsChangeJson = parse_json(&incoming.body, "/groups/{group}/settings")?;
    check_settings_change(&json).map_err(ApiError::bad_request)?;
    let request_id = request_id(&incoming, json.requestid.clone())?;
    let backoff = match json.backoff {
        Some(backoff) => Some(Backoff {
            base_ms: backoff.base_ms,
            factor_milli: factor_milli(backoff.factor).map_err(ApiError::bad_request)?,
            max_ms: backoff.max_ms,
        }),
        None => None,
    };
    let count = |value: Option<i64>| value.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
    let request = Request::Settings(SettingsRequest {
        client: json.clientid,
        group: group.clone(),
        change: SettingsChange {
            max_running: count(json.max_running),
            paused: json.paused,
            max_attempts: count(json.max_attempts),
            backoff,
            retention_ms: json.retention_ms,
        },
    });
    let incoming = incoming.write_with(request_id.as_deref());
    let outcome = node.write(request, request_id).await;
    Ok(
        respond(&node, incoming, outcome, |outcome| match &*outcome {
            // The running count is not part of the outcome: read as of the change, which
            // this node (the leader) has applied when the write returns.
            Outcome::Settings(settings) => {
                let running = node.state.read(|s| s.machine.running_in_group(&group));
                Json(settings_json(&group, settings, running)).into_response()
            }
            Outcome::Refused(refusals) => {
                let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
                ApiError::bad_request(reasons.join("; ")).into_response()
            }
            Outcome::Tasks(_) | Outcome::Token(_) | Outcome::Batch(_) => {
                ApiError::internal("a settings change answered something else; report this")
                    .into_response()
            }
        })
        .await,
    )
}
