//! The worker API (SPEC section 2): the seed's endpoints, fields and answers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::Path;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use rpc::job::OnConflictJson;
use rpc::job::check_add_job;
use rpc::watch::check_wait_ms;
use rpc::watch::parse_wait_ms;
use rpc::worker::ChangeJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::TaskJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::check_request_id;
use rpc::worker::parse_id_list;
use rpc::worker::parse_limit;
use rpc::worker::parse_owned;
use serde::de::DeserializeOwned;
use store_sm::machine::AddJob;
use store_sm::machine::AddTask;
use store_sm::machine::ClaimManyRequest;
use store_sm::machine::ClaimRequest;
use store_sm::machine::ClientId;
use store_sm::machine::LogTime;
use store_sm::machine::OnConflict;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::UpdateRequest;
use store_sm::machine::UpdateTask;
use store_sm::machine::constants::REQUEST_ID_BYTES_MAX;
use store_sm::machine::fits_seed_encoding;

use crate::http::ApiError;
use crate::json::outcome_json;
use crate::json::task_json;
use crate::node::SharedNode;
use crate::relay::IDEMPOTENCY_KEY_HEADER;
use crate::relay::Incoming;
use crate::relay::respond;
use crate::service::Consistency;
use crate::service::ReadView;
use crate::service::ServiceError;

/// Most ids one `/tasks/...` request may name.
pub const TASK_IDS_MAX: usize = store_sm::machine::constants::REQUEST_ITEMS_MAX;

/// The worker API routes.
pub fn routes() -> Router<SharedNode> {
    Router::new()
        .route("/groups", get(get_groups))
        .route("/task/{id}", get(get_task))
        .route("/tasks/{ids}", get(get_tasks))
        .route("/group/{name}", get(get_group))
        .route("/update", post(post_update))
        .route("/claim", post(post_claim))
}

/// Query parameters, percent-decoded, each at most once.
pub(crate) fn query_params(query: Option<&str>) -> Result<HashMap<String, String>, ApiError> {
    let mut params = HashMap::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if params.insert(key.to_string(), value.to_string()).is_some() {
            return Err(ApiError::bad_request(format!(
                "query parameter {key} is given twice"
            )));
        }
    }
    Ok(params)
}

/// A path segment, or a JSON 400 when it is not valid percent-encoded UTF-8.
pub(crate) fn path_segment(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(segment)| segment)
        .map_err(|e| ApiError::bad_request(format!("bad path: {e}")))
}

/// The consistency a read asked for with `?consistency=`.
/// The `limit` query parameter: `None` when absent, empty or 0 (the seed's "no limit").
pub(crate) fn limit_param(params: &HashMap<String, String>) -> Result<Option<usize>, ApiError> {
    match params.get("limit") {
        Some(value) => parse_limit(value).map_err(ApiError::bad_request),
        None => Ok(None),
    }
}

/// The optional wait of a request, `wait_ms` in its query; none: do not wait.
pub(crate) fn wait_param(params: &HashMap<String, String>) -> Result<Duration, ApiError> {
    match params.get("wait_ms").filter(|v| !v.is_empty()) {
        None => Ok(Duration::ZERO),
        Some(value) => parse_wait_ms(value)
            .map(Duration::from_millis)
            .map_err(ApiError::bad_request),
    }
}

pub(crate) fn consistency(params: &HashMap<String, String>) -> Result<Consistency, ApiError> {
    Ok(Consistency::parse(
        params.get("consistency").map(String::as_str),
    )?)
}

/// Serves a read whose query checked out: takes a view at `consistency` (relaying to the
/// leader when only the leader can serve it) and answers with `answer` of the view.
pub(crate) async fn read(
    node: &SharedNode,
    incoming: Incoming,
    consistency: Consistency,
    answer: impl FnOnce(ReadView) -> Result<Response, ApiError>,
) -> Response {
    let view = node.read(consistency).await;
    respond(node, incoming, view, |view| {
        answer(view).unwrap_or_else(IntoResponse::into_response)
    })
    .await
}

async fn get_groups(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let params = query_params(Some(incoming.query()))?;
    let caller = incoming.caller.clone();
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        let groups: Vec<String> = view
            .state
            .machine
            .groups()
            .iter()
            .filter(|g| caller.covers(g))
            .map(|g| g.to_string())
            .collect();
        Ok(Json(groups).into_response())
    })
    .await)
}

fn parse_task_id(text: &str) -> Result<u64, ApiError> {
    rpc::worker::parse_id(text).map_err(ApiError::bad_request)
}

async fn get_task(
    State(node): State<SharedNode>,
    id: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let id = parse_task_id(&path_segment(id)?)?;
    let params = query_params(Some(incoming.query()))?;
    let caller = incoming.caller.clone();
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        // A task of a group outside the token's groups is not there for its bearer.
        match view
            .state
            .machine
            .task(id)
            .filter(|t| caller.covers(&t.group))
        {
            Some(task) => Ok(Json(task_json(task)).into_response()),
            None => Err(ApiError::not_found(format!(
                "task {id} does not exist (it may have been updated, claimed or deleted)"
            ))),
        }
    })
    .await)
}

async fn get_tasks(
    State(node): State<SharedNode>,
    ids: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let ids = parse_id_list(&path_segment(ids)?).map_err(ApiError::bad_request)?;
    if ids.len() > TASK_IDS_MAX {
        return Err(ApiError::bad_request(format!(
            "{} ids asked for; ask for at most {TASK_IDS_MAX} at a time",
            ids.len()
        )));
    }
    let params = query_params(Some(incoming.query()))?;
    let caller = incoming.caller.clone();
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        let tasks: Vec<Option<TaskJson>> = ids
            .iter()
            .map(|id| {
                let task = view.state.machine.task(*id);
                task.filter(|t| caller.covers(&t.group)).map(task_json)
            })
            .collect();
        Ok(Json(tasks).into_response())
    })
    .await)
}

async fn get_group(
    State(node): State<SharedNode>,
    name: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let name = path_segment(name)?;
    incoming.caller.check_group(&name)?;
    let params = query_params(Some(incoming.query()))?;
    let limit = limit_param(&params)?;
    let owned = params
        .get("owned")
        .map(|v| parse_owned(v))
        .transpose()
        .map_err(ApiError::bad_request)?
        .flatten()
        .unwrap_or(false);
    let after = params
        .get("after")
        .map(|cursor| parse_group_cursor(cursor))
        .transpose()
        .map_err(ApiError::bad_request)?;
    Ok(read(&node, incoming, consistency(&params)?, |view| {
        let tasks: Vec<TaskJson> = view
            .state
            .machine
            .iter_group_after(&name, owned, view.now, after)
            .take(limit.unwrap_or(usize::MAX))
            .map(task_json)
            .collect();
        Ok(Json(tasks).into_response())
    })
    .await)
}

/// A `GET /group` cursor, `AVAILABLE_MS:ID`: the `timespec` and `id` of the last task of
/// the previous page.
fn parse_group_cursor(cursor: &str) -> Result<(LogTime, u64), String> {
    let bad = || {
        format!(
            "after: {cursor:?} is not a cursor; give the last task's timespec and id as TIMESPEC:ID"
        )
    };
    let (at, id) = cursor.split_once(':').ok_or_else(bad)?;
    let at: i64 = at.parse().map_err(|_| bad())?;
    let id: u64 = id.parse().map_err(|_| bad())?;
    Ok((LogTime::from_millis(at), id))
}

/// A request body, which is always a JSON object. (serde would also take a struct as an
/// array of its fields in order, a form no client means to send.)
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8], endpoint: &str) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(ApiError::bad_request(format!(
            "invalid {endpoint} body: send a JSON object ({{...}})"
        )));
    }
    serde_json::from_slice(bytes).map_err(|_| {
        // Parsed again to name the field that went wrong (`adds[0].max_attempts: ...`):
        // tracking the path costs every request, so only a request that failed pays it.
        let mut parser = serde_json::Deserializer::from_slice(bytes);
        let error = match serde_path_to_error::deserialize::<_, T>(&mut parser) {
            Err(e) if e.path().iter().next().is_some() => e.to_string(),
            Err(e) => e.into_inner().to_string(),
            Ok(_) => "it did not parse".to_string(),
        };
        ApiError::bad_request(format!("invalid {endpoint} body: {error}"))
    })
}

/// The `Idempotency-Key` header: absent, or given once in printable ASCII within the
/// request id limit. Twice is refused rather than one picked, since a client that sends
/// two keys cannot know which one a retry must repeat.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "Idempotency-Key is given more than once; send one key per request",
            ));
        }
        (Some(value), None) => value,
    };
    let key = value.to_str().map_err(|_| {
        ApiError::bad_request(
            "Idempotency-Key is not printable ASCII (0x20 to 0x7E, or tab); send such an id in the body's requestid instead",
        )
    })?;
    if key.len() > REQUEST_ID_BYTES_MAX {
        return Err(ApiError::bad_request(format!(
            "Idempotency-Key is {} bytes long; use at most {REQUEST_ID_BYTES_MAX}",
            key.len()
        )));
    }
    Ok(Some(key.to_string()))
}

/// The request id from the `Idempotency-Key` header and the body's `requestid`, which
/// must be equal when both are given: a retry is matched on one id, and two that differ
/// leave it unknown which one the client will repeat.
pub(crate) fn request_id(
    incoming: &Incoming,
    in_body: Option<String>,
) -> Result<Option<String>, ApiError> {
    let in_header = idempotency_key(&incoming.headers)?;
    if let Some(id) = &in_body {
        check_request_id(id).map_err(ApiError::bad_request)?;
    }
    match (in_header, in_body) {
        (Some(h), Some(b)) if h != b => Err(ApiError::bad_request(format!(
            "Idempotency-Key {h:?} and requestid {b:?} differ; send one, or the same in both"
        ))),
        (h, b) => Ok(h.or(b)),
    }
}

/// The command of an update. One without job fields is logged in the encoding builds
/// before the job layer read, so a cluster in the middle of a rolling upgrade keeps
/// applying seed traffic.
fn update_request(json: UpdateRequestJson) -> Result<Request, ApiError> {
    for (index, add) in json.adds.iter().enumerate() {
        check_add_job(index, add).map_err(ApiError::bad_request)?;
    }
    let update = job_update_request(json);
    Ok(if fits_seed_encoding(&update) {
        Request::LegacyUpdate(update)
    } else {
        Request::Update(update)
    })
}

fn update_task(change: ChangeJson) -> UpdateTask {
    UpdateTask {
        id: change.id,
        data: change.data.unwrap_or_default(),
        timespec: change.timespec,
    }
}

fn job_update_request(json: UpdateRequestJson) -> UpdateRequest {
    UpdateRequest {
        client: json.clientid,
        adds: json
            .adds
            .into_iter()
            .map(|add| AddTask {
                group: add.group.unwrap_or_default(),
                data: add.data.unwrap_or_default(),
                timespec: add.timespec,
                job: AddJob {
                    key: add.key,
                    on_conflict: match add.on_conflict {
                        None | Some(OnConflictJson::Refuse) => OnConflict::Refuse,
                        Some(OnConflictJson::Keep) => OnConflict::Keep,
                        Some(OnConflictJson::Resubmit) => OnConflict::Resubmit,
                    },
                    after: add.after,
                    priority: add.priority.unwrap_or(0),
                    max_attempts: add.max_attempts,
                    every_ms: add.every_ms,
                },
            })
            .collect(),
        updates: json.updates.into_iter().map(update_task).collect(),
        deletes: json.deletes,
        depends: json.depends,
    }
}

/// A write's outcome as the seed answers it to client `asker`: `{"tasks":[...]}` or
/// `{"errors":[...]}`.
fn outcome_response(asker: ClientId) -> impl FnOnce(Arc<Outcome>) -> Response {
    move |outcome| Json(outcome_json(&outcome, asker)).into_response()
}

/// Applies a write, or relays it to the leader with its request id (one the relay makes
/// up if the client sent none, so that the relay's own retries apply once).
pub(crate) async fn write(
    node: &SharedNode,
    incoming: Incoming,
    request: Request,
    request_id: Option<String>,
) -> Response {
    let asker = request.client();
    let request = incoming.caller.limit(request);
    let incoming = incoming.write_with(request_id.as_deref());
    let outcome = node.write(request, request_id).await;
    respond(node, incoming, outcome, outcome_response(asker)).await
}

/// Refuses a claim's lease (`field`) outside 1 ms to the node's configured maximum.
pub(crate) fn check_claim_duration(
    node: &SharedNode,
    field: &str,
    duration: i64,
) -> Result<(), ApiError> {
    let max = node.config.claim_duration_max_ms;
    if duration <= 0 || duration > max {
        return Err(ApiError::bad_request(format!(
            "{field} {duration} is not between 1 and {max} milliseconds"
        )));
    }
    Ok(())
}

async fn post_update(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: UpdateRequestJson = parse_json(&incoming.body, "/update")?;
    let request_id = request_id(&incoming, json.requestid.clone())?;
    let request = update_request(json)?;
    Ok(write(&node, incoming, request, request_id).await)
}

async fn post_claim(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: ClaimRequestJson = parse_json(&incoming.body, "/claim")?;
    check_claim_duration(&node, "duration", json.duration)?;
    let wait_ms = json.wait_ms.unwrap_or(0);
    check_wait_ms(wait_ms).map_err(ApiError::bad_request)?;
    let count = json.checked_count().map_err(ApiError::bad_request)?;
    incoming.caller.check_group(&json.group)?;
    let request_id = request_id(&incoming, json.requestid)?;
    let claim = ClaimManyRequest {
        claim: ClaimRequest {
            client: json.clientid,
            group: json.group,
            duration_ms: json.duration,
            depends: json.depends,
        },
        count,
    };
    if wait_ms == 0 {
        let request = claim.to_request(false);
        return Ok(write(&node, incoming, request, request_id).await);
    }
    Ok(Box::pin(claim_waiting(&node, incoming, claim, request_id, wait_ms)).await)
}

/// A claim that waits up to `wait_ms` for a task. Boxed by its caller: its future is
/// larger than a plain claim's, which would otherwise carry it (and copy it) too.
async fn claim_waiting(
    node: &SharedNode,
    incoming: Incoming,
    claim: ClaimManyRequest,
    request_id: Option<String>,
    wait_ms: u64,
) -> Response {
    let wait = Duration::from_millis(wait_ms);
    let caller = incoming.caller.clone();
    let incoming = incoming.waiting(wait).write_with(request_id.as_deref());
    let asker = claim.claim.client;
    let started = tokio::time::Instant::now();
    let led = node.leading_term().is_some();
    let outcome = node.claim_waiting(claim, request_id, wait, &caller).await;
    // Stepped down mid-wait: the new leader gets what is left of the wait, not all of it
    // (at least a millisecond: a claim that does not wait is another request, whose
    // empty answer its request id would keep). A follower relays the body as it came.
    let incoming = match &outcome {
        Err(ServiceError::NotLeader { .. }) if led => {
            let left = wait.saturating_sub(started.elapsed());
            incoming.with_wait_left(left.max(Duration::from_millis(1)))
        }
        _ => incoming,
    };
    respond(node, incoming, outcome, outcome_response(asker)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_of_the_wrong_type_names_the_field() {
        let body = br#"{"clientid": 1, "adds": [{"group": "g", "data": "", "max_attempts": -1}]}"#;
        let error = parse_json::<UpdateRequestJson>(body, "/update").expect_err("refused");
        let message = error.message;
        assert!(
            message.contains("invalid /update body: adds[0].max_attempts: "),
            "{message}"
        );
        assert!(message.contains("expected u32"), "{message}");
        // Broken JSON says where it broke.
        let error =
            parse_json::<UpdateRequestJson>(b"{\"clientid\": ", "/update").expect_err("refused");
        assert!(
            error
                .message
                .contains("invalid /update body: clientid: EOF while parsing"),
            "{}",
            error.message
        );
        let parsed: UpdateRequestJson =
            parse_json(br#"{"clientid": 1}"#, "/update").expect("a good body parses");
        assert_eq!(parsed.clientid, 1);
    }
}
