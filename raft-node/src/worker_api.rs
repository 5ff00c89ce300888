//! The worker API (SPEC section 2): the seed's endpoints, fields and answers.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::extract::RawQuery;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::http::HeaderMap;
use axum::http::Uri;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use rpc::worker::ClaimRequestJson;
use rpc::worker::TaskJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteResultJson;
use rpc::worker::check_request_id;
use rpc::worker::parse_id_list;
use rpc::worker::parse_limit;
use rpc::worker::parse_owned;
use serde::de::DeserializeOwned;
use store_sm::machine::AddTask;
use store_sm::machine::ClaimRequest;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::Task;
use store_sm::machine::UpdateRequest;
use store_sm::machine::UpdateTask;

use crate::http::ApiError;
use crate::http::read_body;
use crate::node::SharedNode;
use crate::node::WriteTarget;
use crate::node::is_forwarded;

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

fn task_json(task: &Task) -> TaskJson {
    TaskJson {
        id: task.id,
        group: task.group.to_string(),
        data: task.data.clone(),
        timespec: task.available_at.as_millis(),
        ownerid: task.owner,
    }
}

fn outcome_json(outcome: &Outcome) -> WriteResultJson {
    match outcome {
        Outcome::Tasks(tasks) => WriteResultJson::Tasks {
            tasks: tasks.iter().map(task_json).collect(),
        },
        Outcome::Refused(refusals) => WriteResultJson::Errors {
            errors: refusals.iter().map(ToString::to_string).collect(),
        },
    }
}

/// Query parameters, percent-decoded, each at most once.
fn query_params(query: Option<&str>) -> Result<HashMap<String, String>, ApiError> {
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
fn path_segment(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(segment)| segment)
        .map_err(|e| ApiError::bad_request(format!("bad path: {e}")))
}

/// Whether the read asked for `?consistency=stale`.
fn wants_stale(params: &HashMap<String, String>) -> Result<bool, ApiError> {
    match params.get("consistency").map(String::as_str) {
        None | Some("linearizable") => Ok(false),
        Some("stale") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "consistency={other:?} is not one of linearizable, stale"
        ))),
    }
}

async fn get_groups(
    State(node): State<SharedNode>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let params = query_params(query.as_deref())?;
    let (state, _) = match node
        .read_or_forward(wants_stale(&params)?, &headers, &uri)
        .await?
    {
        Ok(local) => local,
        Err(forwarded) => return Ok(forwarded),
    };
    let groups: Vec<String> = state
        .machine
        .groups()
        .iter()
        .map(|g| g.to_string())
        .collect();
    Ok(Json(groups).into_response())
}

fn parse_task_id(text: &str) -> Result<u64, ApiError> {
    rpc::worker::parse_id(text).map_err(ApiError::bad_request)
}

async fn get_task(
    State(node): State<SharedNode>,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let id = parse_task_id(&path_segment(id)?)?;
    let params = query_params(query.as_deref())?;
    let (state, _) = match node
        .read_or_forward(wants_stale(&params)?, &headers, &uri)
        .await?
    {
        Ok(local) => local,
        Err(forwarded) => return Ok(forwarded),
    };
    match state.machine.task(id) {
        Some(task) => Ok(Json(task_json(task)).into_response()),
        None => Err(ApiError::not_found(format!(
            "task {id} does not exist (it may have been updated, claimed or deleted)"
        ))),
    }
}

async fn get_tasks(
    State(node): State<SharedNode>,
    ids: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let ids = parse_id_list(&path_segment(ids)?).map_err(ApiError::bad_request)?;
    if ids.len() > TASK_IDS_MAX {
        return Err(ApiError::bad_request(format!(
            "{} ids asked for; ask for at most {TASK_IDS_MAX} at a time",
            ids.len()
        )));
    }
    let params = query_params(query.as_deref())?;
    let (state, _) = match node
        .read_or_forward(wants_stale(&params)?, &headers, &uri)
        .await?
    {
        Ok(local) => local,
        Err(forwarded) => return Ok(forwarded),
    };
    let tasks: Vec<Option<TaskJson>> = ids
        .iter()
        .map(|id| state.machine.task(*id).map(task_json))
        .collect();
    Ok(Json(tasks).into_response())
}

async fn get_group(
    State(node): State<SharedNode>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let name = path_segment(name)?;
    let params = query_params(query.as_deref())?;
    let limit = params
        .get("limit")
        .map(|v| parse_limit(v))
        .transpose()
        .map_err(ApiError::bad_request)?;
    let owned = params
        .get("owned")
        .map(|v| parse_owned(v))
        .transpose()
        .map_err(ApiError::bad_request)?
        .unwrap_or(false);
    let (state, now) = match node
        .read_or_forward(wants_stale(&params)?, &headers, &uri)
        .await?
    {
        Ok(local) => local,
        Err(forwarded) => return Ok(forwarded),
    };
    let tasks: Vec<TaskJson> = state
        .machine
        .iter_group(&name, owned, now)
        .take(limit.unwrap_or(usize::MAX))
        .map(task_json)
        .collect();
    Ok(Json(tasks).into_response())
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8], endpoint: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid {endpoint} body: {e}")))
}

/// The request id from the `Idempotency-Key` header and the body, which must agree.
fn request_id(headers: &HeaderMap, in_body: Option<String>) -> Result<Option<String>, ApiError> {
    let in_header = match headers.get("idempotency-key") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key is not visible ASCII"))?
                .to_string(),
        ),
    };
    let id = match (in_header, in_body) {
        (Some(h), Some(b)) if h != b => {
            return Err(ApiError::bad_request(format!(
                "Idempotency-Key {h:?} and requestid {b:?} differ; send one, or the same in both"
            )));
        }
        (h, b) => h.or(b),
    };
    if let Some(id) = &id {
        check_request_id(id).map_err(ApiError::bad_request)?;
    }
    Ok(id)
}

fn update_request(json: UpdateRequestJson) -> Request {
    Request::Update(UpdateRequest {
        client: json.clientid,
        adds: json
            .adds
            .into_iter()
            .map(|add| AddTask {
                group: add.group.unwrap_or_default(),
                data: add.data.unwrap_or_default(),
                timespec: add.timespec,
            })
            .collect(),
        updates: json
            .updates
            .into_iter()
            .map(|change| UpdateTask {
                id: change.id,
                data: change.data.unwrap_or_default(),
                timespec: change.timespec,
            })
            .collect(),
        deletes: json.deletes,
        depends: json.depends,
    })
}

/// Applies a write here or relays it to the leader. A relayed write always carries a
/// request id (this node makes one up if the client sent none), so that the relay's own
/// retries apply once.
async fn write(
    node: &SharedNode,
    request: Request,
    request_id: Option<String>,
    headers: &HeaderMap,
    path: &str,
    forward_body: impl FnOnce(String) -> Result<Vec<u8>, ApiError>,
) -> Result<Response, ApiError> {
    match node
        .write(request, request_id.clone(), is_forwarded(headers))
        .await?
    {
        WriteTarget::Applied(outcome) => Ok(Json(outcome_json(&outcome)).into_response()),
        WriteTarget::Forward(addr) => {
            let body = forward_body(request_id.unwrap_or_else(|| node.new_request_id()))?;
            Ok(node.forward_post_json(&addr, path, body.into()).await)
        }
    }
}

async fn post_update(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, node.config.body_bytes_max).await?;
    let mut json: UpdateRequestJson = parse_json(&bytes, "/update")?;
    let request_id = request_id(&headers, json.requestid.take())?;
    let request = update_request(json.clone());
    write(&node, request, request_id, &headers, "/update", move |id| {
        json.requestid = Some(id);
        serde_json::to_vec(&json).map_err(|e| ApiError::internal(e.to_string()))
    })
    .await
}

async fn post_claim(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, node.config.body_bytes_max).await?;
    let mut json: ClaimRequestJson = parse_json(&bytes, "/claim")?;
    let max = node.config.claim_duration_max_ms;
    if json.duration <= 0 || json.duration > max {
        return Err(ApiError::bad_request(format!(
            "duration {} is not between 1 and {max} milliseconds",
            json.duration
        )));
    }
    let request_id = request_id(&headers, json.requestid.take())?;
    let request = Request::Claim(ClaimRequest {
        client: json.clientid,
        group: json.group.clone(),
        duration_ms: json.duration,
        depends: json.depends.clone(),
    });
    write(&node, request, request_id, &headers, "/claim", move |id| {
        json.requestid = Some(id);
        serde_json::to_vec(&json).map_err(|e| ApiError::internal(e.to_string()))
    })
    .await
}
