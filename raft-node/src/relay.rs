//! The one way a request reaches the leader from another node: the request as it came,
//! relayed once.
//!
//! Every endpoint reads its request into an [`Incoming`], calls the service, and answers
//! through [`respond`]: a [`ServiceError::NotLeader`] becomes a relay of the same method,
//! path, headers and body bytes to the leader, marked so that the leader never relays it
//! again. A write whose client sent no request id gets one here, in an
//! `Idempotency-Key` header, so that the relay's own retries apply once.

use std::time::Duration;

use axum::extract::FromRequest;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::http::HeaderName;
use axum::http::HeaderValue;
use axum::http::Method;
use axum::http::Uri;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use bytes::Bytes;

use crate::http::ApiError;
use crate::http::BODY_READ_TIMEOUT;
use crate::http::read_body;
use crate::node::FORWARD_TIMEOUT;
use crate::node::Node;
use crate::node::SharedNode;
use crate::service::ServiceError;
use crate::service::auth::Caller;

/// Header a node adds when it relays a request, so the receiver never relays it again.
pub const FORWARDED_HEADER: &str = "x-rota-forwarded-by";

/// Refuses a [`FORWARDED_HEADER`] that no node sent: a node puts its own id there, once,
/// and never relays to itself. A client that sends one of its own (a proxy copying
/// headers, a guess) would otherwise never be relayed to the leader and get 503s for
/// as long as it retried. Checked with the token, before anything reads the header.
pub(crate) fn check_forwarded_by(headers: &HeaderMap, own_id: u64) -> Result<(), ApiError> {
    let mut values = headers.get_all(FORWARDED_HEADER).iter();
    let Some(first) = values.next() else {
        return Ok(());
    };
    let from_a_node = first
        .to_str()
        .is_ok_and(|text| text.parse::<u64>().is_ok_and(|id| id > 0 && id != own_id));
    if from_a_node && values.next().is_none() {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "the {FORWARDED_HEADER} header is for the nodes' own relays (once, naming the \
         relaying node's id); leave it out"
    )))
}

/// The header that carries a write's request id beside (or instead of) `requestid`.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Whether a request header belongs to the request rather than to the connection it
/// came on (those, and `Expect`, which this node already answered, are never relayed).
fn is_end_to_end(name: &HeaderName) -> bool {
    let hop_by_hop = [
        header::CONNECTION,
        header::HOST,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::EXPECT,
        header::PROXY_AUTHORIZATION,
    ];
    !hop_by_hop.contains(name) && name.as_str() != "keep-alive"
}

/// A request as it came, body read (within the node's body limit), kept so it can be
/// relayed to the leader unchanged.
pub struct Incoming {
    /// Its method.
    pub method: Method,
    /// Its path and query.
    pub uri: Uri,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    /// Whether a relay must add a request id (a write whose client sent none).
    needs_request_id: bool,
    /// How long a relay of this request may take (longer for one that waits).
    relay_timeout: Duration,
    /// Who sent it, as the token check found.
    pub caller: Caller,
}

impl FromRequest<SharedNode> for Incoming {
    type Rejection = ApiError;

    async fn from_request(request: Request, node: &SharedNode) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        // Fail closed: a route without the token check answers nothing.
        let caller =
            parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
                ApiError::internal("this route skipped the token check; report this")
            })?;
        let limit = node.config.body_bytes_max;
        let body = read_body(&parts.headers, body, limit, BODY_READ_TIMEOUT).await?;
        Ok(Self {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
            needs_request_id: false,
            relay_timeout: FORWARD_TIMEOUT,
            caller,
        })
    }
}

impl Incoming {
    /// Whether another node already relayed this request (it is never relayed twice).
    pub fn is_forwarded(&self) -> bool {
        self.headers.contains_key(FORWARDED_HEADER)
    }

    /// Lets a relay of this request take `wait` longer: the request waits that long at
    /// the leader before it answers.
    pub fn waiting(mut self, wait: Duration) -> Self {
        self.relay_timeout = FORWARD_TIMEOUT + wait;
        self
    }

    /// This blocking claim with `left` of its wait to go, for a relay to the new leader
    /// once this node stopped leading mid-wait: the request waits at most its `wait_ms`
    /// in all, not that again on top of what it waited here. The claim's fingerprint
    /// leaves its wait out, so a retry under the same request id still matches.
    pub fn with_wait_left(mut self, left: Duration) -> Self {
        let Ok(serde_json::Value::Object(mut body)) =
            serde_json::from_slice::<serde_json::Value>(&self.body)
        else {
            return self;
        };
        let left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        body.insert("wait_ms".into(), left_ms.into());
        if let Ok(bytes) = serde_json::to_vec(&body) {
            self.body = Bytes::from(bytes);
            self.relay_timeout = FORWARD_TIMEOUT + left;
        }
        self
    }

    /// Marks this request as a write that carries `request_id` (or none): a relay of a
    /// write without one adds one.
    pub fn write_with(mut self, request_id: Option<&str>) -> Self {
        self.needs_request_id = request_id.is_none();
        self
    }

    /// The query string, empty if none.
    pub fn query(&self) -> &str {
        self.uri.query().unwrap_or_default()
    }
}

/// Answers a request: `ok` of the service's result, a relay to the leader when this
/// node does not lead (once: a relayed request that meets another non-leader gets a 503),
/// or the error's own answer.
pub async fn respond<T>(
    node: &Node,
    incoming: Incoming,
    result: Result<T, ServiceError>,
    ok: impl FnOnce(T) -> Response,
) -> Response {
    match result {
        Ok(value) => ok(value),
        Err(ServiceError::NotLeader { leader_api }) if !incoming.is_forwarded() => {
            // Boxed: a relay is an HTTP exchange, a future of some KiB that would
            // otherwise be part of every request's future and be copied with it, on a
            // leader that never relays.
            Box::pin(relay(node, &leader_api, incoming)).await
        }
        Err(ServiceError::NotLeader { .. }) => {
            ApiError::unavailable(crate::service::LEADERSHIP_MOVING).into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// Sends `incoming` to the leader at `leader_api` and returns its answer as is.
async fn relay(node: &Node, leader_api: &str, incoming: Incoming) -> Response {
    let mut headers: Vec<(HeaderName, HeaderValue)> = incoming
        .headers
        .iter()
        .filter(|(name, _)| is_end_to_end(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    headers.push((
        HeaderName::from_static(FORWARDED_HEADER),
        HeaderValue::from(node.id()),
    ));
    if incoming.needs_request_id {
        let request_id = HeaderValue::try_from(node.new_request_id());
        match request_id {
            Ok(value) => headers.push((HeaderName::from_static(IDEMPOTENCY_KEY_HEADER), value)),
            Err(e) => return ApiError::internal(format!("request id: {e}")).into_response(),
        }
    }
    let path_and_query = incoming.uri.path_and_query().map_or("/", |p| p.as_str());
    let send = node.client.send(
        leader_api,
        incoming.method,
        path_and_query,
        &headers,
        incoming.body,
        incoming.relay_timeout,
    );
    // Only a request that waits at the leader (a blocking claim, a wait for jobs) has
    // its relay deadline stretched.
    let sent = if incoming.relay_timeout > FORWARD_TIMEOUT {
        // A leader that froze (or lost its quorum) answers nothing until the relay's
        // deadline, the wait's length and more, while a new leader already serves; the
        // client is told to retry once this node has known of that new leader for a
        // moment (see `leader_moved_from`).
        tokio::select! {
            biased;
            sent = send => sent,
            () = leader_moved_from(node, leader_api) => {
                return ApiError::unavailable(
                    "the leader changed while this waiting request was relayed to it; retry (with the same requestid for writes)",
                )
                .into_response();
            }
            // As this node's own waits are answered when it stops, so are those it
            // relays: its client hears at once, not when the connection is cut.
            () = stopping(node) => {
                return ApiError::unavailable(
                    "this node is stopping; retry on another node (with the same requestid for writes)",
                )
                .into_response();
            }
        }
    } else {
        send.await
    };
    match sent {
        Ok(answer) => {
            let mut response = (answer.status, answer.body).into_response();
            for (name, value) in &answer.headers {
                let relayed = name == header::CONTENT_TYPE
                    || name == header::RETRY_AFTER
                    || name == header::WWW_AUTHENTICATE
                    || name.as_str().starts_with("x-rota-");
                if relayed {
                    response.headers_mut().insert(name.clone(), value.clone());
                }
            }
            response
        }
        Err(e) => ApiError::unavailable(format!(
            "forwarding to the leader failed ({e}); retry (with the same requestid for writes)"
        ))
        .into_response(),
    }
}

/// Resolves once this node starts to stop.
async fn stopping(node: &Node) {
    let stopped = node.waiters.stopped();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    if !node.waiters.is_stopping() {
        stopped.await;
    }
}

/// How often a waiting relay looks whether the leader it relays to is still the one
/// this node knows. Polled rather than woken: the metrics' watch wakes its waiters in
/// an order the simulation cannot replay.
const LEADER_POLL: Duration = Duration::from_millis(100);

/// How long another leader must have been known before a waiting relay gives up on the
/// old one: a leader that stepped down in good order answers its relayed waits within
/// that time (possibly with a task it claimed for them), and only a frozen one does not.
const LEADER_MOVED_GRACE: Duration = Duration::from_secs(1);

/// Resolves once this node has known of a leader other than the one at `leader_api`
/// (itself included) for [`LEADER_MOVED_GRACE`]; never while it knows of none (an
/// election under way).
async fn leader_moved_from(node: &Node, leader_api: &str) {
    let mut moved_for = Duration::ZERO;
    loop {
        tokio::time::sleep(LEADER_POLL).await;
        let moved = node
            .leader_id()
            .and_then(|id| node.member_api_addr(id))
            .is_some_and(|api| api != leader_api);
        moved_for = if moved {
            moved_for + LEADER_POLL
        } else {
            Duration::ZERO
        };
        if moved_for >= LEADER_MOVED_GRACE {
            return;
        }
    }
}
