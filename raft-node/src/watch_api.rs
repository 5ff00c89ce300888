//! `GET /watch` (issue 13): a group's changes after a revision, as a JSON page (long
//! poll with `wait_ms`) or, with `Accept: text/event-stream`, as server-sent events
//! that run until the client leaves or the node stops. Served by any node from its own
//! applied state, never relayed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::header::ACCEPT;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::response::sse::Event;
use axum::response::sse::Sse;
use axum::routing::get;
use rpc::watch::WATCH_PAGE_DEFAULT;
use rpc::watch::WATCH_PAGE_MAX;
use rpc::watch::WATCH_PATH;
use rpc::watch::WatchEventJson;
use rpc::watch::WatchGoneJson;
use rpc::watch::WatchPageJson;

use crate::http::ApiError;
use crate::node::SharedNode;
use crate::relay::Incoming;
use crate::service::WatchRequest;
use crate::service::auth::Caller;
use crate::service::auth::HeldToken;
use crate::waiting::feed::FeedPage;
use crate::waiting::feed::Forgotten;
use crate::worker_api::limit_param;
use crate::worker_api::query_params;
use crate::worker_api::wait_param;

/// How long one wait of an event stream lasts before it sends a keep-alive comment.
const STREAM_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How long a node that has not applied a stream's token (the leader vouched for it)
/// waits for it before it answers 503: a stream is served only while the node can see
/// its token revoked.
const STREAM_TOKEN_WAIT: Duration = Duration::from_secs(1);

/// The watch routes.
pub fn routes() -> Router<SharedNode> {
    Router::new().route(WATCH_PATH, get(get_watch))
}

fn watch_request(params: &HashMap<String, String>) -> Result<WatchRequest, ApiError> {
    let group = match params.get("group") {
        Some(group) if !group.is_empty() => group.clone(),
        _ => return Err(ApiError::bad_request("query parameter group is required")),
    };
    let after = match params.get("after").filter(|v| !v.is_empty()) {
        None => None,
        Some(value) => Some(value.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "after {value:?} is not a revision (a log index, a whole number from 0)"
            ))
        })?),
    };
    let limit = limit_param(params)?.unwrap_or(WATCH_PAGE_DEFAULT);
    if !(1..=WATCH_PAGE_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is more than {WATCH_PAGE_MAX}, the most one page holds (0 or none: \
             {WATCH_PAGE_DEFAULT})"
        )));
    }
    Ok(WatchRequest {
        group,
        after,
        limit,
        wait: wait_param(params)?,
    })
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

fn gone(forgotten: &Forgotten) -> WatchGoneJson {
    let why = if forgotten.ahead {
        "the revision asked for is ahead of this node's log (one from before a restore, or \
         from a node this one has not caught up with)"
            .to_string()
    } else {
        format!(
            "this node keeps changes after revision {} only",
            forgotten.oldest
        )
    };
    WatchGoneJson {
        error: format!(
            "{why}; re-read the group, then watch after revision {}",
            forgotten.revision
        ),
        revision: forgotten.revision,
        oldest: forgotten.oldest,
    }
}

fn page_json(node: u64, group: &str, page: FeedPage) -> WatchPageJson {
    WatchPageJson {
        node,
        group: group.to_string(),
        revision: page.revision,
        changes: page.changes.iter().map(|c| (**c).clone()).collect(),
    }
}

async fn get_watch(State(node): State<SharedNode>, incoming: Incoming) -> Response {
    let params = match query_params(Some(incoming.query())) {
        Ok(params) => params,
        Err(e) => return e.into_response(),
    };
    let mut request = match watch_request(&params) {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    if let Err(refused) = incoming.caller.check_group(&request.group) {
        return ApiError::from(refused).into_response();
    }
    if wants_event_stream(&incoming.headers) {
        // A reconnect repeats the URL it first opened, `after` included, and adds the id
        // of the last event it got: that id is where it resumes.
        match last_event_id(&incoming.headers) {
            Ok(Some(after)) => request.after = Some(after),
            Ok(None) => {}
            Err(e) => return e.into_response(),
        }
        let id = node.id();
        let Some(held) = node
            .holds_token_within(&incoming.caller, STREAM_TOKEN_WAIT)
            .await
        else {
            return ApiError::unavailable(
                "this node has not applied the token yet; open the stream again shortly",
            )
            .into_response();
        };
        let mut response = stream(node, request, incoming.caller.clone(), held).into_response();
        // Which node serves the stream: its changes are what that node applied.
        response
            .headers_mut()
            .insert("x-rota-node", axum::http::HeaderValue::from(id));
        return response;
    }
    let held = node.holds_token(&incoming.caller);
    let page = node.watch(&request).await;
    // The token may have been revoked while the watch waited.
    if let Err(e) = node.still_authorized(&incoming.caller, held) {
        return ApiError::from(e).into_response();
    }
    match page {
        Ok(Ok(page)) => Json(page_json(node.id(), &request.group, page)).into_response(),
        Ok(Err(forgotten)) => (StatusCode::GONE, Json(gone(&forgotten))).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// The revision a reconnecting event stream resumes after. The ids this node sends are
/// revisions, so anything else is a client's mistake: resuming from now instead would
/// silently skip the changes it missed. An empty id is none (the SSE rule for a reset).
fn last_event_id(headers: &axum::http::HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("\u{fffd}").trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        ApiError::bad_request(format!(
            "Last-Event-ID {text:?} is not a revision (the ids of this stream are whole numbers); \
             reconnect with the id of the last event received, or with after=REVISION"
        ))
    })
}

/// What the event stream does next.
enum Next {
    /// Wait for changes after this revision.
    After(u64),
    /// The stream has ended.
    Done,
}

/// The event stream: each change is an event named by its kind with the change as
/// JSON; the last event of each revision carries that revision as its id, so a client
/// that reconnects with `Last-Event-ID` resumes after whole revisions. A forgotten
/// revision ends the stream with a `gone` event; the node stopping ends it quietly; the
/// caller's token revoked ends it with an `error` event.
fn stream(
    node: SharedNode,
    request: WatchRequest,
    caller: Caller,
    held: HeldToken,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let start = request.after.unwrap_or_else(|| node.feed.revision());
    let events = futures_util::stream::unfold(
        (node, request, Next::After(start)),
        move |(node, mut request, next)| {
            let caller = caller.clone();
            async move {
                let Next::After(after) = next else {
                    return None;
                };
                request.after = Some(after);
                request.wait = STREAM_KEEP_ALIVE;
                let page = node.watch(&request).await;
                let page = node.still_authorized(&caller, held).and(page);
                let (events, next) = match page {
                    Ok(Ok(page)) if page.changes.is_empty() => {
                        let next = if node.waiters.is_stopping() {
                            Next::Done
                        } else {
                            Next::After(page.revision)
                        };
                        (vec![Event::default().comment("keep-alive")], next)
                    }
                    Ok(Ok(page)) => {
                        let revision = page.revision;
                        (change_events(&page.changes), Next::After(revision))
                    }
                    Ok(Err(forgotten)) => {
                        let data = serde_json::to_string(&gone(&forgotten)).unwrap_or_default();
                        (vec![Event::default().event("gone").data(data)], Next::Done)
                    }
                    Err(e) => {
                        let data = serde_json::json!({ "error": e.to_string() }).to_string();
                        (vec![Event::default().event("error").data(data)], Next::Done)
                    }
                };
                let items = futures_util::stream::iter(events.into_iter().map(Ok));
                Some((items, (node, request, next)))
            }
        },
    );
    Sse::new(futures_util::StreamExt::flatten(events))
}

fn change_events(changes: &[std::sync::Arc<WatchEventJson>]) -> Vec<Event> {
    changes
        .iter()
        .enumerate()
        .map(|(i, change)| {
            let kind = match **change {
                WatchEventJson::Task { .. } => "task",
                WatchEventJson::Removed { .. } => "removed",
                WatchEventJson::Job { .. } => "job",
                WatchEventJson::JobDropped { .. } => "job_dropped",
                WatchEventJson::Settings { .. } => "settings",
            };
            let data = serde_json::to_string(&**change).unwrap_or_default();
            let event = Event::default().event(kind).data(data);
            let last_of_revision = changes
                .get(i + 1)
                .is_none_or(|next| next.revision() != change.revision());
            if last_of_revision {
                event.id(change.revision().to_string())
            } else {
                event
            }
        })
        .collect()
}
