//! Status and admin endpoints (SPEC section 3).

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use openraft::ChangeMembers;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::ClientWriteError;
use openraft::error::InitializeError;
use openraft::error::RaftError;
use openraft::vote::RaftLeaderId;
use rpc::admin::AddLearnerJson;
use rpc::admin::BACKUP_HASH_HEADER;
use rpc::admin::BACKUP_INDEX_HEADER;
use rpc::admin::ClusterStatusJson;
use rpc::admin::InitRequestJson;
use rpc::admin::NodeIdJson;
use rpc::admin::NodeStatusJson;
use rpc::admin::ProbeJson;
use rpc::admin::RESTORE_BYTES_MAX;
use rpc::admin::StateHashJson;
use serde::de::DeserializeOwned;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;

use crate::http::ApiError;
use crate::http::read_body;
use crate::node::SharedNode;
use crate::node::is_forwarded;

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

fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// This node's view of the cluster.
pub fn cluster_status(node: &SharedNode) -> ClusterStatusJson {
    let metrics = node.raft.metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership();
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let learners: Vec<NodeId> = membership.learner_ids().collect();
    let retired = node.state.read(|s| {
        s.machine
            .members_ever()
            .filter(|id| membership.get_node(id).is_none())
            .collect()
    });
    let membership_index = metrics.membership_config.log_id().map(|id| id.index());
    let committed = metrics.local_committed.map(|id| id.index());
    let last_log = metrics.last_log_index.unwrap_or(0);
    let nodes = membership
        .nodes()
        .map(|(id, addrs)| {
            let role = if Some(*id) == metrics.current_leader {
                "leader"
            } else if *id == metrics.id {
                role_name(metrics.state)
            } else if voters.contains(id) {
                "follower"
            } else {
                "learner"
            };
            let lag = metrics.replication.as_ref().and_then(|replication| {
                let matched = replication.get(id)?;
                Some(last_log.saturating_sub(matched.as_ref().map_or(0, |m| m.index())))
            });
            NodeStatusJson {
                id: *id,
                api_addr: addrs.api_addr.clone(),
                raft_addr: addrs.raft_addr.clone(),
                role: role.to_string(),
                lag,
            }
        })
        .collect();
    ClusterStatusJson {
        id: metrics.id,
        leader: metrics.current_leader,
        term: metrics.current_term,
        commit_index: metrics.local_committed.map(|id| id.index()),
        applied_index: metrics.last_applied.map(|id| id.index()),
        snapshot_index: metrics.snapshot.map(|id| id.index()),
        purged_index: metrics.purged.map(|id| id.index()),
        applied_time_ms: node.state.read(|s| s.machine.log_time().as_millis()),
        voters,
        learners,
        retired,
        membership_index,
        membership_committed: membership_index <= committed,
        joint: membership.get_joint_config().len() > 1,
        nodes,
    }
}

async fn get_cluster(State(node): State<SharedNode>) -> Json<ClusterStatusJson> {
    Json(cluster_status(&node))
}

/// O(tasks): for tests and operators comparing replicas, not for monitoring loops.
async fn get_state_hash(State(node): State<SharedNode>) -> Json<StateHashJson> {
    let state = node.state.snapshot();
    Json(StateHashJson {
        applied_index: state.applied.map(|id| id.index()),
        state_hash: state.state_hash().to_string(),
        tasks: state.machine.task_count() as u64,
    })
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

async fn post_init(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, node.config.body_bytes_max).await?;
    let request: InitRequestJson = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid /admin/init body: {e}")))?;
    let members: BTreeMap<NodeId, RotaNode> = request
        .members
        .into_iter()
        .map(|m| {
            (
                m.id,
                RotaNode {
                    api_addr: m.api_addr,
                    raft_addr: m.raft_addr,
                },
            )
        })
        .collect();
    initialize(&node, members).await?;
    Ok(Json(cluster_status(&node)).into_response())
}

/// Forms a cluster with `members` as its voters; this node must be one of them.
pub async fn initialize(
    node: &SharedNode,
    members: BTreeMap<NodeId, RotaNode>,
) -> Result<(), ApiError> {
    if !members.contains_key(&node.id()) {
        return Err(ApiError::bad_request(format!(
            "the members do not include this node ({}); send init to a node you list",
            node.id()
        )));
    }
    match node.raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("this node already belongs to a cluster ({e}); nothing to do"),
        )),
        Err(e) => Err(ApiError::internal(format!("initialising failed: {e}"))),
    }
}

async fn admin_body<T: DeserializeOwned>(
    node: &SharedNode,
    headers: &HeaderMap,
    body: Body,
    path: &str,
) -> Result<(T, bytes::Bytes), ApiError> {
    let bytes = read_body(headers, body, node.config.body_bytes_max).await?;
    let request = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid {path} body: {e}")))?;
    Ok((request, bytes))
}

/// Runs a membership change on the leader: here if this node leads, else relayed once.
async fn membership_change(
    node: &SharedNode,
    headers: &HeaderMap,
    path: &str,
    body: bytes::Bytes,
    change: Result<
        (),
        RaftError<crate::types::NodeTypes, ClientWriteError<crate::types::NodeTypes>>,
    >,
) -> Result<Response, ApiError> {
    match change {
        Ok(()) => Ok(Json(cluster_status(node)).into_response()),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
            let leader = node.route_to_leader(&forward, is_forwarded(headers))?;
            Ok(node.forward_post_json(&leader, path, body).await)
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("membership change refused: {e}"),
        )),
        Err(e) => Err(ApiError::unavailable(format!(
            "membership change failed: {e}; retry"
        ))),
    }
}

async fn post_add_learner(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let path = "/admin/add-learner";
    let (request, bytes): (AddLearnerJson, _) = admin_body(&node, &headers, body, path).await?;
    let addrs = RotaNode {
        api_addr: request.api_addr,
        raft_addr: request.raft_addr,
    };
    check_new_learner(&node, request.id, &addrs)?;
    // Not blocking: the caller watches the learner's lag in /cluster and promotes it later.
    let change = node
        .raft
        .add_learner(request.id, addrs, false)
        .await
        .map(|_| ());
    membership_change(&node, &headers, path, bytes, change).await
}

/// Refuses a learner id that is taken or was ever taken: an id names one data directory
/// for the life of the cluster, and a reused id could vote with another node's history.
/// Re-adding a current learner with the same addresses is a retry and passes.
fn check_new_learner(node: &SharedNode, id: NodeId, addrs: &RotaNode) -> Result<(), ApiError> {
    let conflict = |message: String| Err(ApiError::new(StatusCode::CONFLICT, message));
    if id == 0 {
        return Err(ApiError::bad_request("node ids start at 1"));
    }
    let status = cluster_status(node);
    if status.voters.contains(&id) {
        return conflict(format!("node {id} is already a voter; nothing to add"));
    }
    if let Some(current) = status.nodes.iter().find(|n| n.id == id) {
        if current.api_addr == addrs.api_addr && current.raft_addr == addrs.raft_addr {
            return Ok(());
        }
        return conflict(format!(
            "node {id} is already a learner at {}/{}; remove it first or choose a new id",
            current.api_addr, current.raft_addr
        ));
    }
    if status.retired.contains(&id) {
        return conflict(format!(
            "node id {id} was a member before and ids are never reused; start the new node with a new --id and an empty data directory"
        ));
    }
    Ok(())
}

async fn post_promote(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let path = "/admin/promote";
    let (request, bytes): (NodeIdJson, _) = admin_body(&node, &headers, body, path).await?;
    let change = node
        .raft
        .change_membership(ChangeMembers::AddVoterIds([request.id].into()), true)
        .await
        .map(|_| ());
    membership_change(&node, &headers, path, bytes, change).await
}

async fn post_remove(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let path = "/admin/remove";
    let (request, bytes): (NodeIdJson, _) = admin_body(&node, &headers, body, path).await?;
    let is_voter = cluster_status(&node).voters.contains(&request.id);
    let change = if is_voter {
        // retain = false: the removed voter leaves the membership entirely.
        node.raft
            .change_membership(ChangeMembers::RemoveVoters([request.id].into()), false)
            .await
    } else {
        node.raft
            .change_membership(ChangeMembers::RemoveNodes([request.id].into()), false)
            .await
    };
    membership_change(&node, &headers, path, bytes, change.map(|_| ())).await
}

async fn post_transfer_leader(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let path = "/admin/transfer-leader";
    let (request, bytes): (NodeIdJson, _) = admin_body(&node, &headers, body, path).await?;
    let status = cluster_status(&node);
    if !status.voters.contains(&request.id) {
        return Err(ApiError::bad_request(format!(
            "node {} is not a voter; leadership can only go to a voter",
            request.id
        )));
    }
    // Only the leader can hand leadership over: relay once if this node does not lead.
    if status.leader != Some(node.id()) {
        let leader = status
            .leader
            .and_then(|id| node.member_api_addr(id))
            .filter(|_| !is_forwarded(&headers))
            .ok_or_else(|| ApiError::unavailable("no leader is known; retry shortly"))?;
        return Ok(node.forward_post_json(&leader, path, bytes).await);
    }
    node.raft
        .trigger()
        .transfer_leader(request.id)
        .await
        .map_err(|e| ApiError::unavailable(format!("this node has stopped ({e})")))?;
    Ok(Json(cluster_status(&node)).into_response())
}

/// Builds a snapshot of this node's state machine now (and lets openraft purge the log
/// behind it).
async fn post_snapshot(State(node): State<SharedNode>) -> Result<Response, ApiError> {
    node.raft
        .trigger()
        .snapshot()
        .await
        .map_err(|e| ApiError::unavailable(format!("this node has stopped ({e})")))?;
    Ok(Json(cluster_status(&node)).into_response())
}

/// A consistent snapshot of the whole store, as of a linearizable read: it holds every
/// write acknowledged before the request. The body is the snapshot format of
/// `store_sm::snapshot` (checksummed); the headers give its index and state hash.
async fn get_backup(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let state = match node.read_or_forward(false, &headers, &uri).await? {
        Ok((state, _)) => state,
        Err(forwarded) => return Ok(forwarded),
    };
    let (bytes, hash) = store_sm::snapshot::encode_snapshot_with_hash(&state.machine);
    let index = state.applied.map_or(0, |id| id.index());
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/octet-stream".to_string(),
            ),
            (
                axum::http::HeaderName::from_static(BACKUP_INDEX_HEADER),
                index.to_string(),
            ),
            (
                axum::http::HeaderName::from_static(BACKUP_HASH_HEADER),
                hash.to_string(),
            ),
        ],
        bytes,
    )
        .into_response())
}

/// The node id in the log id of a restored snapshot. Real nodes start at 1, so no real
/// leader ever had this id, and every election after the restore outranks it.
const RESTORE_LEADER: NodeId = 0;

/// Starts a new cluster from a backup: installs the backup on this empty node as a
/// snapshot at log index 1 whose membership is the members listed in the
/// `x-rota-restore-members` header. This node then elects itself and replicates the
/// snapshot to the other members, which must be running and empty too.
async fn post_restore(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let members = restore_members(&node, &headers)?;
    {
        let watch = node.raft.metrics();
        let metrics = watch.borrow_watched();
        let empty = metrics
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_none()
            && metrics.last_log_index.is_none()
            && metrics.last_applied.is_none();
        if !empty {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "this node already holds a cluster's state; restore into newly started nodes with empty data directories",
            ));
        }
    }
    let bytes = read_body(&headers, body, RESTORE_BYTES_MAX).await?;
    let (machine, state_hash) = store_sm::snapshot::decode_snapshot_with_hash(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a usable backup: {e}")))?;
    let voters: std::collections::BTreeSet<NodeId> = members.keys().copied().collect();
    let log_id = openraft::LogId::new(
        openraft::impls::leader_id_adv::LeaderId::new(1, RESTORE_LEADER),
        1,
    );
    let membership = openraft::Membership::new(vec![voters], members)
        .map_err(|e| ApiError::bad_request(format!("invalid members: {e}")))?;
    let snapshot = store_sm::raft_types::RotaSnapshot {
        meta: store_sm::raft_types::RotaSnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: store_sm::raft_types::RotaStoredMembership::new(
                Some(log_id),
                membership,
            ),
        },
        snapshot: std::sync::Arc::from(&bytes[..]),
    };
    node.raft
        .install_full_snapshot(openraft::Vote::new_committed(1, RESTORE_LEADER), snapshot)
        .await
        .map_err(|e| ApiError::internal(format!("installing the backup failed: {e}")))?;
    tracing::info!(%state_hash, tasks = machine.task_count(), "restored from a backup");
    Ok(Json(rpc::admin::RestoreJson {
        applied_index: log_id.index(),
        state_hash: state_hash.to_string(),
        tasks: machine.task_count() as u64,
    })
    .into_response())
}

/// The new cluster's members from the restore header; this node must be one of them.
fn restore_members(
    node: &SharedNode,
    headers: &HeaderMap,
) -> Result<BTreeMap<NodeId, RotaNode>, ApiError> {
    let header = headers
        .get(rpc::admin::RESTORE_MEMBERS_HEADER)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "missing the {} header: the new cluster's members as {{\"members\": [...]}}",
                rpc::admin::RESTORE_MEMBERS_HEADER
            ))
        })?;
    let request: InitRequestJson = serde_json::from_slice(header.as_bytes()).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid {} header: {e}",
            rpc::admin::RESTORE_MEMBERS_HEADER
        ))
    })?;
    let members: BTreeMap<NodeId, RotaNode> = request
        .members
        .into_iter()
        .map(|m| {
            let addrs = RotaNode {
                api_addr: m.api_addr,
                raft_addr: m.raft_addr,
            };
            (m.id, addrs)
        })
        .collect();
    if members.contains_key(&0) {
        return Err(ApiError::bad_request("node ids start at 1"));
    }
    if !members.contains_key(&node.id()) {
        return Err(ApiError::bad_request(format!(
            "the members do not include this node ({}); send the restore to a node you list",
            node.id()
        )));
    }
    Ok(members)
}
