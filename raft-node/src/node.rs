//! One running node: its Raft instance, state reader, log clock and HTTP client, and the
//! request path every endpoint uses (writes through the leader, linearizable reads,
//! forwarding from followers).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::http::HeaderName;
use axum::http::HeaderValue;
use axum::http::Method;
use axum::http::Uri;
use axum::response::IntoResponse;
use axum::response::Response;
use bytes::Bytes;
use openraft::ReadPolicy;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::ClientWriteError;
use openraft::error::ForwardToLeader;
use openraft::error::LinearizableReadError;
use openraft::error::RaftError;
use rpc::client::HttpClient;
use store_sm::machine::Command;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::raft_types::NodeId;
use store_sm::state_machine::AppliedState;
use store_sm::state_machine::StateReader;

use crate::clock::LogClock;
use crate::config::NodeConfig;
use crate::http::ApiError;
use crate::types::NodeRaft;
use crate::types::NodeTypes;

/// A ready node has applied all but at most this many of the entries it knows are
/// committed: a node replaying its log after a restart is far behind, a busy one only a
/// few entries.
pub const READY_APPLY_LAG_MAX: u64 = 100;

/// Header a node adds when it forwards a request, so the receiver never forwards again.
pub const FORWARDED_HEADER: &str = "x-rota-forwarded-by";

/// How long a forwarded request or a linearizable read may take.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a request handler needs.
pub struct Node {
    /// Validated configuration.
    pub config: NodeConfig,
    /// The Raft instance.
    pub raft: NodeRaft,
    /// The applied state, for queries.
    pub state: StateReader,
    /// The clock that stamps commands when this node leads.
    pub clock: LogClock,
    /// Pooled HTTP client for forwarding.
    pub client: HttpClient,
    /// Request counts and latencies per endpoint.
    pub http_metrics: crate::metrics::HttpMetrics,
    /// The log store's write counters, when the store keeps them.
    pub log_stats: Option<std::sync::Arc<store_sm::log_stats::LogStats>>,
    request_nonce: u64,
    request_counter: AtomicU64,
}

/// Whether another node already relayed this request (it is never relayed twice).
pub fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_HEADER)
}

/// A node shared by all handlers.
pub type SharedNode = Arc<Node>;

/// Where a read may be served.
pub enum ReadTarget {
    /// Here, from this applied state, judging ownership at this log time.
    Local(Box<AppliedState>, LogTime),
    /// At the leader, whose API address this is.
    Forward(String),
}

/// Where a write went.
pub enum WriteTarget {
    /// Applied here (this node leads) with this outcome.
    Applied(Arc<Outcome>),
    /// Must go to the leader, whose API address this is.
    Forward(String),
}

impl Node {
    /// Assembles a node from its parts.
    pub fn new(
        config: NodeConfig,
        raft: NodeRaft,
        state: StateReader,
        clock: LogClock,
        client: HttpClient,
        log_stats: Option<std::sync::Arc<store_sm::log_stats::LogStats>>,
    ) -> Self {
        Self {
            config,
            raft,
            state,
            clock,
            client,
            http_metrics: crate::metrics::HttpMetrics::default(),
            log_stats,
            request_nonce: rand::random(),
            request_counter: AtomicU64::new(0),
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// A request id no other write of this node, before or after a restart, will use.
    pub fn new_request_id(&self) -> String {
        let n = self.request_counter.fetch_add(1, Ordering::Relaxed);
        format!("n{}-{:016x}-{n}", self.id(), self.request_nonce)
    }

    /// The API address of the leader, if one is known and it is not this node.
    fn leader_api_addr(&self, forward: &ForwardToLeader<NodeTypes>) -> Option<String> {
        match (&forward.leader_node, forward.leader_id) {
            (Some(node), _) => Some(node.api_addr.clone()),
            (None, Some(id)) => self.member_api_addr(id),
            (None, None) => None,
        }
    }

    /// The API address of member `id`, from the current membership.
    pub fn member_api_addr(&self, id: NodeId) -> Option<String> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        metrics
            .membership_config
            .membership()
            .get_node(&id)
            .map(|node| node.api_addr.clone())
    }

    /// Proposes `request` through Raft, stamped with this node's log clock.
    pub async fn write(
        &self,
        request: Request,
        request_id: Option<String>,
        forwarded: bool,
    ) -> Result<WriteTarget, ApiError> {
        let command = Command {
            stamp: self.clock.now(),
            request_id,
            request,
        };
        // A leader that lost its quorum normally refuses at once (its lease lapsed); the
        // deadline covers the rest, where the outcome is unknown.
        let written = tokio::time::timeout(FORWARD_TIMEOUT, self.raft.client_write(command))
            .await
            .map_err(|_| {
                ApiError::unavailable(
                    "the write was not committed in time; its outcome is unknown: retry with the same requestid",
                )
            })?;
        match written {
            Ok(response) => Ok(WriteTarget::Applied(response.data)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => self
                .route_to_leader(&forward, forwarded)
                .map(WriteTarget::Forward),
            Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_))) => {
                Err(ApiError::unavailable(
                    "leadership changed while the write was in flight; its outcome is unknown: retry with the same requestid",
                ))
            }
            Err(RaftError::APIError(other)) => Err(ApiError::internal(format!(
                "write refused by Raft: {other}"
            ))),
            Err(RaftError::Fatal(fatal)) => Err(ApiError::unavailable(format!(
                "this node has stopped ({fatal}); use another node"
            ))),
        }
    }

    /// The leader's API address to relay a request to, unless this request was relayed
    /// already or names this node as leader.
    pub(crate) fn route_to_leader(
        &self,
        forward: &ForwardToLeader<NodeTypes>,
        forwarded: bool,
    ) -> Result<String, ApiError> {
        match self.leader_api_addr(forward) {
            Some(addr) if !forwarded && forward.leader_id != Some(self.id()) => Ok(addr),
            Some(_) => Err(ApiError::unavailable(
                "leadership is moving; retry shortly (with the same requestid for writes)",
            )),
            None => Err(ApiError::unavailable(
                "no leader is known or its lease has lapsed; retry shortly",
            )),
        }
    }

    /// Decides where a read is served. Stale reads are local; linearizable reads are
    /// local on a leader that confirmed its leadership with a quorum, else forwarded.
    pub async fn read_target(&self, stale: bool, forwarded: bool) -> Result<ReadTarget, ApiError> {
        if stale || self.planted_follower_read() {
            let state = self.state.snapshot();
            let now = state.machine.log_time();
            return Ok(ReadTarget::Local(Box::new(state), now));
        }
        let linearized = tokio::time::timeout(
            FORWARD_TIMEOUT,
            self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        .map_err(|_| {
            ApiError::unavailable("could not confirm leadership with a quorum in time; retry")
        })?;
        match linearized {
            Ok(_) => {
                let state = self.state.snapshot();
                let now = state.machine.log_time().max(self.clock.now());
                Ok(ReadTarget::Local(Box::new(state), now))
            }
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => self
                .route_to_leader(&forward, forwarded)
                .map(ReadTarget::Forward),
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => {
                Err(ApiError::unavailable(format!(
                    "no quorum to confirm a linearizable read ({e}); retry, or read with ?consistency=stale"
                )))
            }
            Err(RaftError::Fatal(fatal)) => Err(ApiError::unavailable(format!(
                "this node has stopped ({fatal}); use another node"
            ))),
        }
    }

    /// Relays a GET to the leader at `addr` and returns its answer as is.
    pub async fn forward_get(&self, addr: &str, path_and_query: &str) -> Response {
        self.relay(addr, Method::GET, path_and_query, None, Bytes::new())
            .await
    }

    /// Relays a POST with a JSON body to the leader at `addr` and returns its answer as is.
    pub async fn forward_post_json(&self, addr: &str, path: &str, body: Bytes) -> Response {
        let json = HeaderValue::from_static("application/json");
        self.relay(addr, Method::POST, path, Some(json), body).await
    }

    /// Where a read runs: here (the state and the log time to judge it at), or, relayed
    /// to the leader, the leader's answer.
    pub async fn read_or_forward(
        &self,
        stale: bool,
        headers: &HeaderMap,
        uri: &Uri,
    ) -> Result<Result<(Box<AppliedState>, LogTime), Response>, ApiError> {
        match self.read_target(stale, is_forwarded(headers)).await? {
            ReadTarget::Local(state, now) => Ok(Ok((state, now))),
            ReadTarget::Forward(addr) => {
                let path = uri.path_and_query().map_or("/", |p| p.as_str());
                Ok(Err(self.forward_get(&addr, path).await))
            }
        }
    }

    async fn relay(
        &self,
        addr: &str,
        method: Method,
        path_and_query: &str,
        content_type: Option<HeaderValue>,
        body: Bytes,
    ) -> Response {
        let mut headers = vec![(
            HeaderName::from_static(FORWARDED_HEADER),
            HeaderValue::from(self.id()),
        )];
        if let Some(content_type) = content_type {
            headers.push((axum::http::header::CONTENT_TYPE, content_type));
        }
        match self
            .client
            .send(
                addr,
                method,
                path_and_query,
                &headers,
                body,
                FORWARD_TIMEOUT,
            )
            .await
        {
            Ok(answer) => {
                let mut response = (answer.status, answer.body).into_response();
                for (name, value) in &answer.headers {
                    let relayed = name == axum::http::header::CONTENT_TYPE
                        || name == axum::http::header::RETRY_AFTER
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

    /// Sets this node's log clock to the time of each entry it applies that another
    /// leader (or this node in an earlier term) stamped (see [`crate::clock`]); ends when
    /// Raft shuts down.
    pub async fn follow_log_time(self: Arc<Self>) {
        let mut metrics = self.raft.metrics();
        let mut seen_applied = None;
        loop {
            let (stamped_here, applied) = {
                let now = metrics.borrow_watched();
                let stamped_here = now.last_applied.is_some_and(|id| {
                    let leader = id.committed_leader_id();
                    now.state == ServerState::Leader
                        && leader.term == now.current_term
                        && leader.node_id == self.config.id
                });
                (stamped_here, now.last_applied)
            };
            if !stamped_here && applied.is_some() && applied != seen_applied {
                let log_time = self.state.read(|s| s.machine.log_time());
                if log_time > LogTime::EPOCH {
                    self.clock.follow(log_time);
                }
            }
            seen_applied = applied;
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Whether the simulation planted "followers answer linearizable reads locally" and
    /// this node follows.
    fn planted_follower_read(&self) -> bool {
        store_sm::planted::is_planted(store_sm::planted::Bug::FollowerRead)
            && self.raft.metrics().borrow_watched().current_leader != Some(self.config.id)
    }

    /// Whether this node has a leader and has applied nearly all it knows is committed
    /// (within [`READY_APPLY_LAG_MAX`] entries, so that readiness does not flap under load
    /// while apply trails commit by a few entries).
    pub fn readiness(&self) -> Result<(), String> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        if metrics.state == ServerState::Shutdown {
            return Err("the node is shutting down".into());
        }
        if metrics.current_leader.is_none() {
            return Err("no leader is known".into());
        }
        let committed = metrics.local_committed.map(|id| id.index());
        let applied = metrics.last_applied.map(|id| id.index());
        let behind = committed.unwrap_or(0).saturating_sub(applied.unwrap_or(0));
        if applied < committed && (applied.is_none() || behind > READY_APPLY_LAG_MAX) {
            return Err(format!(
                "catching up: applied {applied:?} of committed {committed:?}"
            ));
        }
        Ok(())
    }
}
