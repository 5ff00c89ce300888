//! Status and admin endpoints (SPEC section 3): thin adapters over the service layer.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::HeaderName;
use axum::http::StatusCode;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use rpc::admin::AddLearnerJson;
use rpc::admin::BACKUP_HASH_HEADER;
use rpc::admin::BACKUP_INDEX_HEADER;
use rpc::admin::ClusterStatusJson;
use rpc::admin::InitRequestJson;
use rpc::admin::NodeIdJson;
use rpc::admin::ProbeJson;
use rpc::admin::RESTORE_MEMBERS_HEADER;
use rpc::admin::StateHashJson;
use rpc::admin::check_members;
use serde::de::DeserializeOwned;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;

use crate::http::ApiError;
use crate::http::stream_body;
use crate::node::SharedNode;
use crate::raft_api::snapshot_refused;
use crate::relay::Incoming;
use crate::relay::respond;
use crate::service::Backup;
use crate::service::ServiceError;

/// The status and admin routes.
pub fn routes() -> Router<SharedNode> {
    Router::new()
        .route("/cluster", get(get_cluster))
        .route("/health", get(get_health))
        .route("/ready", get(get_ready))
        .route("/admin/init", post(post_init))
        .route("/admin/state-hash", get(get_state_hash))
        .route("/admin/add-learner", post(post_add_learner))
        .route("/admin/promote", post(post_promote))
        .route("/admin/remove", post(post_remove))
        .route("/admin/transfer-leader", post(post_transfer_leader))
        .route("/admin/snapshot", post(post_snapshot))
        .route("/admin/backup", get(get_backup))
        .route("/admin/restore", post(post_restore))
}

async fn get_cluster(State(node): State<SharedNode>) -> Json<ClusterStatusJson> {
    Json(node.cluster_status())
}

async fn get_state_hash(State(node): State<SharedNode>) -> Result<Json<StateHashJson>, ApiError> {
    Ok(Json(node.state_hash().await?))
}

async fn get_health() -> Json<ProbeJson> {
    Json(ProbeJson {
        status: "ok".into(),
    })
}

async fn get_ready(State(node): State<SharedNode>) -> Response {
    match node.readiness() {
        Ok(()) => Json(ProbeJson {
            status: "ok".into(),
        })
        .into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(ProbeJson { status: reason }),
        )
            .into_response(),
    }
}

/// An admin request's JSON body.
fn admin_body<T: DeserializeOwned>(incoming: &Incoming) -> Result<T, ApiError> {
    crate::worker_api::parse_json(&incoming.body, incoming.uri.path())
}

/// The answer to a change that succeeded: the cluster as this node now sees it.
async fn answer_change(
    node: &SharedNode,
    incoming: Incoming,
    changed: Result<(), ServiceError>,
) -> Response {
    respond(node, incoming, changed, |()| {
        Json(node.cluster_status()).into_response()
    })
    .await
}

/// Members as the API lists them, keyed by id, once checked (`rpc::admin::check_members`).
fn member_map(request: InitRequestJson) -> Result<BTreeMap<NodeId, RotaNode>, ApiError> {
    if request.members.is_empty() {
        return Err(ApiError::bad_request("no members: list at least one node"));
    }
    check_members(&request.members).map_err(ApiError::bad_request)?;
    Ok(request
        .members
        .into_iter()
        .map(|m| {
            let addrs = RotaNode {
                api_addr: m.api_addr,
                raft_addr: m.raft_addr,
            };
            (m.id, addrs)
        })
        .collect())
}

async fn post_init(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let members = member_map(admin_body(&incoming)?)?;
    node.initialize(members).await?;
    Ok(Json(node.cluster_status()).into_response())
}

async fn post_add_learner(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let request: AddLearnerJson = admin_body(&incoming)?;
    let addrs = RotaNode {
        api_addr: request.api_addr,
        raft_addr: request.raft_addr,
    };
    let changed = node.add_learner(request.id, addrs).await;
    Ok(answer_change(&node, incoming, changed).await)
}

async fn post_promote(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let request: NodeIdJson = admin_body(&incoming)?;
    let changed = node.promote(request.id).await;
    Ok(answer_change(&node, incoming, changed).await)
}

async fn post_remove(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let request: NodeIdJson = admin_body(&incoming)?;
    let changed = node.remove(request.id).await;
    Ok(answer_change(&node, incoming, changed).await)
}

async fn post_transfer_leader(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let request: NodeIdJson = admin_body(&incoming)?;
    let changed = node.transfer_leader(request.id).await;
    Ok(answer_change(&node, incoming, changed).await)
}

async fn post_snapshot(State(node): State<SharedNode>) -> Result<Response, ApiError> {
    node.snapshot().await?;
    Ok(Json(node.cluster_status()).into_response())
}

/// How long a restore's upload may take: a backup may be gigabytes.
const RESTORE_READ_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The backup's body is the snapshot format of `store_sm::snapshot` (checksummed); the
/// headers give its index and state hash.
async fn get_backup(State(node): State<SharedNode>, incoming: Incoming) -> Response {
    let backup = node.backup().await;
    respond(&node, incoming, backup, |backup: Backup| {
        (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (
                    HeaderName::from_static(BACKUP_INDEX_HEADER),
                    backup.applied_index.to_string(),
                ),
                (
                    HeaderName::from_static(BACKUP_HASH_HEADER),
                    backup.state_hash,
                ),
            ],
            backup.bytes,
        )
            .into_response()
    })
    .await
}

/// Starts a new cluster from a backup on this empty node; the new cluster's members come
/// in the `x-rota-restore-members` header, the backup in the body (up to
/// `--snapshot-max-bytes`, the limit followers apply to the snapshot it becomes),
/// spooled to disk as it arrives. Never relayed: it is meant for this node.
async fn post_restore(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let members = restore_members(&headers)?;
    // Refused before reading what may be gigabytes of body.
    node.check_restore(&members)?;
    let mut spool = node
        .snapshot_spool()
        .map_err(|e| ApiError::internal(format!("cannot spool the backup: {e}")))?;
    let limit = node.config.snapshot_max_bytes;
    stream_body(&headers, body, limit, RESTORE_READ_TIMEOUT, |piece| {
        spool.write(&piece).map_err(snapshot_refused)
    })
    .await?;
    let backup = spool.finish().map_err(snapshot_refused)?;
    Ok(Json(node.restore(members, backup).await?).into_response())
}

/// The new cluster's members from the restore header.
fn restore_members(headers: &HeaderMap) -> Result<BTreeMap<NodeId, RotaNode>, ApiError> {
    let header = headers.get(RESTORE_MEMBERS_HEADER).ok_or_else(|| {
        ApiError::bad_request(format!(
            "missing the {RESTORE_MEMBERS_HEADER} header: the new cluster's members as {{\"members\": [...]}}"
        ))
    })?;
    let request: InitRequestJson = serde_json::from_slice(header.as_bytes()).map_err(|e| {
        ApiError::bad_request(format!("invalid {RESTORE_MEMBERS_HEADER} header: {e}"))
    })?;
    member_map(request)
}
