//! The Raft listener's endpoints: the receiving side of [`crate::network`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::HeaderName;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::post;
use futures_util::StreamExt;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::StreamAppendError;
use openraft::raft::StreamAppendResult;
use serde::Serialize;
use serde::de::DeserializeOwned;
use store_sm::codec::decode_value;
use store_sm::codec::encode_value;
use store_sm::machine::LogTime;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaSnapshot;

use crate::append_stream::AnswerFrame;
use crate::append_stream::AppendFrame;
use crate::append_stream::FOLLOWER_IDLE_MAX;
use crate::append_stream::FrameReader;
use crate::append_stream::frame;
use crate::http::ApiError;
use crate::http::BODY_READ_TIMEOUT;
use crate::http::read_body;
use crate::http::stream_body;
use crate::log_forms::announced_form;
use crate::network::LOG_FORMS_HEADER;
use crate::network::RAFT_CONTENT_TYPE;
use crate::network::RAFT_LOG_TIME_HEADER;
use crate::network::RAFT_TARGET_HEADER;
use crate::network::SNAPSHOT_HEAD_BYTES_MAX;
use crate::network::SnapshotReceiver;
use crate::network::paths;
use crate::node::SharedNode;
use crate::types::NodeTypes;

/// Largest Raft message other than a snapshot, which streams to disk bounded by
/// `--snapshot-max-bytes` instead.
pub const RAFT_BODY_BYTES_MAX: usize = 1024 * 1024 * 1024;

/// The Raft routes.
pub fn routes() -> Router<SharedNode> {
    Router::new()
        .route(paths::APPEND, post(append))
        .route(paths::APPEND_STREAM, post(append_stream))
        .route(paths::VOTE, post(vote))
        .route(paths::PRE_VOTE, post(pre_vote))
        .route(paths::SNAPSHOT, post(snapshot))
        .route(paths::TRANSFER_LEADER, post(transfer_leader))
        .route(paths::CLOCK_ESTIMATE, post(clock_estimate))
        .route(paths::REMOVED, post(removed))
}

/// Adds this build's [`LOG_FORMS_HEADER`] to a Raft answer.
pub async fn announce_forms(mut response: Response) -> Response {
    response.headers_mut().insert(
        HeaderName::from_static(LOG_FORMS_HEADER),
        HeaderValue::from(announced_form()),
    );
    response
}

/// Refuses a message for another node (see [`RAFT_TARGET_HEADER`]). One without the
/// header comes from a build before it and is taken, so that a rolling upgrade works.
fn check_target(node: &SharedNode, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(RAFT_TARGET_HEADER) else {
        return Ok(());
    };
    let target = value
        .to_str()
        .ok()
        .and_then(|text| text.parse::<NodeId>().ok());
    match target {
        Some(id) if id == node.id() => Ok(()),
        Some(id) => Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this Raft listener is node {}'s, not node {id}'s: the cluster has the wrong \
                 Raft address for node {id}; remove it (rota cluster remove --id {id}) and add \
                 it again with its own address",
                node.id()
            ),
        )),
        None => Err(ApiError::bad_request(format!(
            "{RAFT_TARGET_HEADER} is not a node id"
        ))),
    }
}

async fn decode<T: DeserializeOwned>(
    node: &SharedNode,
    headers: &HeaderMap,
    body: Body,
    what: &str,
) -> Result<T, ApiError> {
    check_target(node, headers)?;
    let bytes = read_body(headers, body, RAFT_BODY_BYTES_MAX, BODY_READ_TIMEOUT).await?;
    decode_value(&bytes, what).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn encode<T: Serialize>(value: &T) -> Response {
    match encode_value(value) {
        Ok(bytes) => ([(CONTENT_TYPE, RAFT_CONTENT_TYPE)], bytes).into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

async fn append(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = decode(&node, &headers, body, "append entries").await?;
    let answer = node.raft.append_entries(request).await;
    // The sender's log time, once this node took it as its leader (a stale leader's
    // append is answered HigherVote, and its time is not followed).
    let accepted = answer
        .as_ref()
        .is_ok_and(|response| !matches!(response, AppendEntriesResponse::HigherVote(_)));
    if accepted
        && let Some(time) = headers
            .get(RAFT_LOG_TIME_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse::<i64>().ok())
    {
        node.clock.advance_to(LogTime::from_millis(time));
    }
    Ok(encode(&answer))
}

/// Whether the leader that sent an append is this node's leader now (a stale leader's
/// append is answered HigherVote), so that its log time is followed.
fn leader_accepted(answer: &StreamAppendResult<NodeTypes>) -> bool {
    !matches!(answer, Err(StreamAppendError::HigherVote(_)))
}

/// The follower's side of a replication exchange (see [`crate::append_stream`]): the
/// appends in the request's body go to Raft as they arrive, and each one's result goes
/// back in the answer's body, in order.
async fn append_stream(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_target(&node, &headers)?;
    // The log time of each append given to Raft and not yet answered, oldest first.
    let times: Arc<Mutex<VecDeque<i64>>> = Arc::default();
    // Why this node stopped reading appends, for the leader's log.
    let refusal: Arc<Mutex<Option<String>>> = Arc::default();
    let appends = {
        let times = Arc::clone(&times);
        let refusal = Arc::clone(&refusal);
        let reader = FrameReader::new(body);
        futures_util::stream::unfold(reader, move |mut reader| {
            let times = Arc::clone(&times);
            let refusal = Arc::clone(&refusal);
            async move {
                let read = tokio::time::timeout(FOLLOWER_IDLE_MAX, reader.next()).await;
                let bytes = match read {
                    Ok(Ok(Some(bytes))) => bytes,
                    // The leader ended the exchange, or went quiet for too long.
                    Ok(Ok(None)) | Err(_) => return None,
                    Ok(Err(e)) => {
                        *lock(&refusal) = Some(e);
                        return None;
                    }
                };
                match decode_value::<AppendFrame>(&bytes, "append") {
                    Ok((time, append)) => {
                        lock(&times).push_back(time);
                        Some((append, reader))
                    }
                    Err(e) => {
                        *lock(&refusal) = Some(format!("cannot read an append: {e}"));
                        None
                    }
                }
            }
        })
    };
    let clock = Arc::clone(&node.clock);
    let answers = node.raft.stream_append(appends).map(move |answer| {
        let time = lock(&times).pop_front();
        let answer: AnswerFrame = match answer {
            Ok(result) => {
                if leader_accepted(&result)
                    && let Some(time) = time
                {
                    clock.advance_to(LogTime::from_millis(time));
                }
                Ok(result)
            }
            Err(fatal) => Err(format!("its Raft stopped: {fatal}")),
        };
        frame(&answer)
    });
    let last_word = futures_util::stream::once(async move {
        let why = lock(&refusal).take();
        why.map(|why| frame(&AnswerFrame::Err(why)))
    })
    .filter_map(std::future::ready);
    let body = Body::from_stream(answers.chain(last_word));
    Ok(([(CONTENT_TYPE, RAFT_CONTENT_TYPE)], body).into_response())
}

/// `mutex`'s value; one poisoned by a panic elsewhere is still the latest.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn vote(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = decode(&node, &headers, body, "vote").await?;
    Ok(encode(&node.raft.vote(request).await))
}

async fn pre_vote(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = decode(&node, &headers, body, "pre-vote").await?;
    Ok(encode(&node.raft.pre_vote(request).await))
}

async fn snapshot(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_target(&node, &headers)?;
    let deadline = node.config.timing.snapshot_timeout;
    let limit = node.config.snapshot_max_bytes + 4 + SNAPSHOT_HEAD_BYTES_MAX as u64;
    let spool = node
        .snapshot_spool()
        .map_err(|e| ApiError::internal(format!("cannot spool a snapshot: {e}")))?;
    let mut receiver = SnapshotReceiver::new(spool);
    let received = stream_body(&headers, body, limit, deadline, |piece| {
        receiver.push(&piece).map_err(snapshot_refused)
    })
    .await
    .and_then(|()| receiver.finish().map_err(snapshot_refused));
    let (head, data) = received.inspect_err(|e| {
        // The leader retries every second; an operator must see why this node lags.
        tracing::warn!(status = %e.status, error = %e.message, "refused a snapshot from the leader");
    })?;
    let snapshot = RotaSnapshot {
        meta: head.meta,
        snapshot: data,
    };
    let result = node
        .raft
        .install_full_snapshot(head.vote, snapshot)
        .await
        .map_err(|e| e.to_string());
    Ok(encode(&result))
}

/// 413 for a snapshot over `--snapshot-max-bytes`, 400 for a malformed one, 500 for a
/// spool that cannot be written.
pub fn snapshot_refused(e: std::io::Error) -> ApiError {
    match e.kind() {
        std::io::ErrorKind::FileTooLarge => {
            ApiError::new(axum::http::StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
        }
        std::io::ErrorKind::InvalidData => ApiError::bad_request(e.to_string()),
        _ => ApiError::internal(format!("cannot spool a snapshot: {e}")),
    }
}

async fn transfer_leader(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = decode(&node, &headers, body, "transfer leader").await?;
    let result = node
        .raft
        .handle_transfer_leader(request)
        .await
        .map_err(|e| e.to_string());
    Ok(encode(&result))
}

async fn clock_estimate(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let () = decode(&node, &headers, body, "clock estimate").await?;
    Ok(encode(&node.clock.estimate()))
}

/// The leader removed this node: from now on it says so and serves nothing. The target
/// header names this node, and node ids are never reused, so a notice is never stale.
async fn removed(
    State(node): State<SharedNode>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let members: Vec<String> = decode(&node, &headers, body, "removal notice").await?;
    node.mark_removed(members);
    Ok(encode(&()))
}
