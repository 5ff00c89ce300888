//! [`WorkerClient`]: the typed client of the worker and job API, for programs that
//! add, claim and finish tasks. Every write goes to the leader when it is known
//! (learned from `GET /cluster`, with the members the client was not given), else to the
//! nodes in turn, under one request id until its answer is definite, so a write applies
//! exactly once however often it is retried; reads and waits go to any node.
//!
//! ```no_run
//! # async fn example() -> Result<(), rpc::worker_client::WorkerError> {
//! use std::time::Duration;
//! use rpc::worker_client::WorkerClient;
//!
//! let client = WorkerClient::new(["127.0.0.1:7001", "127.0.0.1:7002"], 7)?;
//! client.add("mail", "to=42").await?;
//! // Wait up to 30 s for a task, hold it for a minute.
//! if let Some(task) = client
//!     .claim_waiting("mail", Duration::from_secs(60), Duration::from_secs(30))
//!     .await?
//! {
//!     // ... do the work, passing task.id downstream as the fence ...
//!     client.finish(task.id, Some(serde_json::json!({"sent": true}))).await?;
//! }
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::admin::ClusterStatusJson;
use crate::client::ClientError;
use crate::client::HeaderName;
use crate::client::HeaderValue;
use crate::client::HttpClient;
use crate::client::HttpMethod as Method;
use crate::client::address_problem;
use crate::client::node_address;
use crate::client::percent_encode;
use crate::job::FailRequestJson;
use crate::job::FinishItemJson;
use crate::job::FinishManyRequestJson;
use crate::job::FinishRequestJson;
use crate::job::JOBS_WAIT_PATH;
use crate::job::JobJson;
use crate::job::JobWaitJson;
use crate::job::JobWaitRequestJson;
use crate::job::KeysRequestJson;
use crate::job::SettingsChangeJson;
use crate::job::SettingsJson;
use crate::job::WAIT_QUERY_BYTES_MAX;
use crate::job::WAIT_QUERY_BYTES_MAX_HTTP1;
use crate::job::jobs_wait_path;
use crate::retry::Unanswered;
use crate::retry::write_once;
use crate::watch::WAIT_MS_MAX;
use crate::watch::WatchGoneJson;
use crate::watch::WatchPageJson;
use crate::worker::AddJson;
use crate::worker::ChangeJson;
use crate::worker::ClaimRequestJson;
use crate::worker::TaskJson;
use crate::worker::UpdateRequestJson;
use crate::worker::WriteRequestJson;
use crate::worker::WriteResultJson;
use hyper::StatusCode;

/// Deadline of one call (a waiting call gets its wait on top). A write or read takes
/// milliseconds; one that takes seconds met a frozen or cut-off node, and the next node
/// (which relays to a new leader, elected in about a second) should be tried while a
/// lease of a few seconds still holds.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest wait for one node's `GET /cluster` when looking for the leader: any node
/// answers it from memory, so one that takes longer is paused or overloaded, and a
/// client whose leader froze must not wait out a whole call on it before it asks the
/// others (a new leader is elected in about a second).
pub const LEADER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// While a blocking call waits at a node, how often the client checks (with a
/// `GET /cluster` of at most [`LEADER_LOOKUP_TIMEOUT`]) that the node still answers: a
/// node that froze (SIGSTOP, a stalled host) would otherwise hold the call for its
/// whole wait, while a new leader elsewhere has work. A call that returns sooner
/// checks nothing, so a busy worker never does.
pub const WAIT_PROBE_EVERY: Duration = Duration::from_secs(2);

/// How often a client that writes through a relay, because the leader did not answer
/// it, looks again whether the leader does.
pub const RELAY_RECHECK_EVERY: Duration = Duration::from_secs(10);

/// Why a waiting call was cut short: see [`WAIT_PROBE_EVERY`].
fn silent_while_waiting(addr: &str) -> String {
    format!("{addr} stopped answering while the call waited there")
}

/// How long a write is retried before the client gives up on a definite answer.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// How long a client that found a finish with `next` not taken sends finish and claim
/// apart before it tries `next` again (a rolling upgrade may have completed).
pub const NEXT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Pause between two attempts, so that a cluster electing a leader is not flooded.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why a call did not give what was asked.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The cluster processed the write and refused it; nothing changed.
    #[error("refused by the cluster: {}", .0.join("; "))]
    Refused(Vec<String>),
    /// A node rejected the request as malformed (4xx); sending it again cannot help.
    #[error("{0}")]
    Rejected(ClientError),
    /// What the call names does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The watch asked for changes older than the node keeps (410): re-read the group
    /// and watch from the revision given.
    #[error("{}", .0.error)]
    Forgotten(WatchGoneJson),
    /// No node gave a definite answer in time. For a write, it may or may not have
    /// applied: send it again with the same request id ([`WorkerClient::write_as`]).
    #[error("{}", no_definite_answer(*waited, request_id.as_deref(), last_error))]
    Unavailable {
        /// How long the client tried.
        waited: Duration,
        /// The write's request id, if it was a write.
        request_id: Option<String>,
        /// The last failure seen.
        last_error: String,
    },
    /// The client was built without a node.
    #[error("give at least one node address")]
    NoNodes,
    /// A node address given is not `host:port`, `http://host:port` or
    /// `https://host:port`.
    #[error("node address {url:?}: {problem}")]
    BadAddress {
        /// The address as given.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// [`WorkerError::Unavailable`]'s message: a write's request id is what makes sending it
/// again safe, so it is named plainly.
fn no_definite_answer(waited: Duration, request_id: Option<&str>, last_error: &str) -> String {
    match request_id {
        Some(id) => format!(
            "no definite answer after {waited:.1?} (the write may or may not have applied; \
             sent again under request id {id:?} by the same client it applies once): {last_error}"
        ),
        None => format!("no definite answer after {waited:.1?}: {last_error}"),
    }
}

/// What one attempt at one node came to.
enum Attempt<T> {
    /// A definite answer.
    Done(Result<T, WorkerError>),
    /// Nothing known: try another node.
    Retry(String),
    /// The node does not speak HTTP to this client: try another node, but when none
    /// of a round's does, the call ends with this error at once.
    NotHttp(ClientError),
    /// The node did not take the call and asks to be called again after `pause` (a 429):
    /// another node would relay to the same leader, so wait and ask this one again.
    SlowDown { error: String, pause: Duration },
}

impl<T> From<Unanswered> for Attempt<T> {
    fn from(unanswered: Unanswered) -> Self {
        match unanswered {
            Unanswered::Unknown(error) => Attempt::Retry(error),
            Unanswered::NotHttp(error) => Attempt::NotHttp(error),
            Unanswered::SlowDown { error, pause } => Attempt::SlowDown { error, pause },
        }
    }
}

/// Most nodes a client keeps, given and learned.
pub const NODES_KNOWN_MAX: usize = 64;

/// The nodes a client calls: those it was given first, then members it learned of.
#[derive(Debug)]
struct NodeList {
    addrs: Vec<String>,
    /// How many of `addrs`, from the start, were given (the rest were learned).
    given: usize,
    /// Index in `addrs` of the node to try first: the leader when known.
    preferred: usize,
}

impl NodeList {
    fn is_given(&self, addr: &str) -> bool {
        self.addrs[..self.given].iter().any(|a| a == addr)
    }

    /// Replaces the learned nodes with the members of `status` that were not given
    /// (a removed member is forgotten), keeping the preferred node where it still is.
    fn learn(&mut self, status: &ClusterStatusJson) {
        let preferred = self.addrs.get(self.preferred).cloned();
        self.addrs.truncate(self.given);
        for node in &status.nodes {
            let addr = node_address(&node.api_addr);
            if !addr.is_empty()
                && address_problem(&addr).is_none()
                && !self.addrs.contains(&addr)
                && self.addrs.len() < NODES_KNOWN_MAX
            {
                self.addrs.push(addr);
            }
        }
        self.preferred = preferred
            .and_then(|p| self.addrs.iter().position(|a| *a == p))
            .unwrap_or(0);
    }
}

/// The typed worker client. See the module documentation. Cheap to share behind an
/// `Arc`: every method takes `&self`.
#[derive(Debug)]
pub struct WorkerClient {
    http: HttpClient,
    /// The nodes calls go to, and which first.
    nodes: Mutex<NodeList>,
    /// Leader lookups asked for: one before the first write, one more each time a
    /// call leaves the preferred node for another that answers.
    lookups_wanted: AtomicU64,
    /// The value of `lookups_wanted` that the last lookup answered (a lookup asked for
    /// while one runs is not lost).
    lookups_done: AtomicU64,
    /// Held while this client asks who leads, so that writes wait for the answer
    /// (up to [`LEADER_LOOKUP_TIMEOUT`]) instead of going to the node preferred before.
    leader_lookup: tokio::sync::Mutex<()>,
    /// A node a call left for another that answered, and when to look at it again.
    /// Named leader by a lookup, it is preferred only once it answers the client
    /// itself, so that a client cut off from the leader alone writes through a relay,
    /// and looks again every [`RELAY_RECHECK_EVERY`].
    doubted: Mutex<Option<(String, tokio::time::Instant)>>,
    client_id: i64,
    id_prefix: String,
    sent: AtomicU64,
    call_timeout: Duration,
    give_up_after: Duration,
    /// Spread mode: never ask who leads; after a failure, start at the next node.
    spread: bool,
    /// Attempts that failed and were tried again.
    retries: AtomicU64,
    /// When a node last refused a finish with `next` (see
    /// [`WorkerClient::finish_and_claim`]).
    next_refused_at: Mutex<Option<tokio::time::Instant>>,
    /// When each node last answered a waiting call's probe, by address.
    probes_heard: Mutex<HashMap<String, tokio::time::Instant>>,
}

impl WorkerClient {
    /// A client of the nodes at `urls` (`host:port`, `http://` optional) that writes as
    /// client `client_id`.
    pub fn new(
        urls: impl IntoIterator<Item = impl AsRef<str>>,
        client_id: i64,
    ) -> Result<Self, WorkerError> {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_string()).collect();
        let https = urls.iter().any(|u| u.trim().starts_with("https://"));
        let mut addrs = Vec::with_capacity(urls.len());
        for url in &urls {
            let addr = node_address(url);
            if addr.is_empty() {
                continue;
            }
            if let Some(problem) = address_problem(&addr) {
                return Err(WorkerError::BadAddress {
                    url: url.clone(),
                    problem,
                });
            }
            addrs.push(addr);
        }
        if addrs.is_empty() {
            return Err(WorkerError::NoNodes);
        }
        // Unique across processes and restarts, so that no two clients' request ids meet.
        let nonce = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        Ok(Self {
            http: HttpClient::new().for_https(https),
            nodes: Mutex::new(NodeList {
                given: addrs.len(),
                addrs,
                preferred: 0,
            }),
            lookups_wanted: AtomicU64::new(1),
            lookups_done: AtomicU64::new(0),
            leader_lookup: tokio::sync::Mutex::new(()),
            doubted: Mutex::new(None),
            client_id,
            id_prefix: format!("c{client_id}-{nonce:x}"),
            sent: AtomicU64::new(0),
            call_timeout: CALL_TIMEOUT,
            give_up_after: GIVE_UP_AFTER,
            spread: false,
            retries: AtomicU64::new(0),
            next_refused_at: Mutex::new(None),
            probes_heard: Mutex::new(HashMap::new()),
        })
    }

    /// The same client, sending `token` as a bearer token with every request (`None`:
    /// none).
    pub fn with_token(mut self, token: Option<&str>) -> Result<Self, WorkerError> {
        self.http = self.http.with_token(token).map_err(|message| {
            WorkerError::Rejected(ClientError::Body {
                addr: String::new(),
                message,
            })
        })?;
        Ok(self)
    }

    /// The same client, speaking TLS with `tls` (`None`: plain HTTP).
    pub fn with_tls(mut self, tls: Option<std::sync::Arc<crate::tls::ClientTls>>) -> Self {
        self.http = self.http.with_tls(tls);
        self
    }

    /// The same client, speaking HTTP/2 (one connection per node carries every request
    /// in flight) instead of HTTP/1.1 (a connection per request in flight).
    pub fn with_http2(mut self, http2: bool) -> Self {
        self.http = self.http.with_http2(http2);
        self
    }

    /// The same client, sending over `other`'s connections (and its token, TLS and HTTP
    /// version): many clients in one process then share one HTTP/2 connection per node.
    /// A node serves a bounded number of one connection's requests at once (the rest
    /// wait in the client; docs/operations.md), so keep long blocking claims of many
    /// workers on connections of their own.
    pub fn sharing_connections_of(mut self, other: &WorkerClient) -> Self {
        // Given https:// addresses, it stays unwilling to speak plain HTTP.
        let https = self.http.is_for_https() || other.http.is_for_https();
        self.http = other.http.clone().for_https(https);
        self
    }

    /// The same client, but one that never asks who leads: it starts at node `first`
    /// (modulo their number) and moves on to the next node after a failure. Test
    /// workloads use it to send through every node, relays included, as clients that
    /// know nothing of the cluster do.
    pub fn spread_from(mut self, first: usize) -> Self {
        self.spread = true;
        self.lookups_done = AtomicU64::new(self.lookups_wanted.load(Ordering::SeqCst));
        let nodes = self.nodes.get_mut().unwrap_or_else(|p| p.into_inner());
        nodes.preferred = first % nodes.addrs.len();
        self
    }

    /// Attempts that failed (no answer, a 5xx, a 429) and were tried again, over the
    /// client's life.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The node calls go to first now.
    pub fn current_node(&self) -> String {
        self.order().swap_remove(0)
    }

    /// Starts the next calls at the node after the current one.
    pub fn next_node(&self) {
        let mut nodes = self.nodes();
        nodes.preferred = (nodes.preferred + 1) % nodes.addrs.len();
    }

    /// The same client with other deadlines: `call_timeout` per call, `give_up_after`
    /// for all the retries of one write or read.
    pub fn with_timeouts(mut self, call_timeout: Duration, give_up_after: Duration) -> Self {
        self.call_timeout = call_timeout;
        self.give_up_after = give_up_after;
        self
    }

    /// The deadline of one call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The client id this client writes as.
    pub fn client_id(&self) -> i64 {
        self.client_id
    }

    /// A request id no other write of any client will use.
    pub fn next_request_id(&self) -> String {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        // Joined, not formatted: one per write (see `HttpClient::uri`).
        let mut number = itoa::Buffer::new();
        [self.id_prefix.as_str(), "-", number.format(n)].concat()
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, NodeList> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn doubted(&self) -> std::sync::MutexGuard<'_, Option<(String, tokio::time::Instant)>> {
        self.doubted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts an attempt that failed at a node; a spread client moves on from it.
    fn attempt_failed(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        if self.spread {
            self.next_node();
        }
    }

    /// Whether the next write should ask who leads first.
    fn lookup_due(&self) -> bool {
        self.lookups_done.load(Ordering::SeqCst) != self.lookups_wanted.load(Ordering::SeqCst)
            || self
                .doubted()
                .as_ref()
                .is_some_and(|(_, at)| tokio::time::Instant::now() >= *at)
    }

    /// The nodes to try, the preferred one first.
    fn order(&self) -> Vec<String> {
        let nodes = self.nodes();
        let (addrs, first) = (&nodes.addrs, nodes.preferred);
        (0..addrs.len())
            .map(|i| addrs[(first + i) % addrs.len()].clone())
            .collect()
    }

    fn prefer(&self, addr: &str) {
        let mut nodes = self.nodes();
        if let Some(i) = nodes.addrs.iter().position(|a| a == addr) {
            nodes.preferred = i;
        }
    }

    /// Every node this client may call now: those it was given, then the other members
    /// it learned of from `GET /cluster`.
    pub fn known_nodes(&self) -> Vec<String> {
        self.nodes().addrs.clone()
    }

    /// Asks the nodes who leads and sends writes there first from now on; the leader's
    /// address, if one is known and answers. Members the client was not given are
    /// learned on the way, so that it outlives the nodes it was given (a member it
    /// learned is preferred only once it has answered itself: the address a node
    /// advertises may not be reachable from here).
    pub async fn find_leader(&self) -> Option<String> {
        self.look_for_leader(None).await
    }

    /// As [`WorkerClient::find_leader`], but a leader at `doubted` (a node that just
    /// failed a call) is preferred only once it answers, even if it was given.
    async fn look_for_leader(&self, doubted: Option<&str>) -> Option<String> {
        // Leaders that did not answer this lookup: each costs a lookup timeout, so one
        // that every node names is asked once, not once per node.
        let mut silent: Vec<String> = Vec::new();
        for addr in self.order() {
            if silent.contains(&addr) {
                continue;
            }
            let Some(status) = self.cluster_status(&addr).await else {
                continue;
            };
            self.nodes().learn(&status);
            let Some(leader) = status
                .leader
                .and_then(|id| status.nodes.iter().find(|n| n.id == id))
                .map(|n| node_address(&n.api_addr))
            else {
                continue;
            };
            let trusted = self.nodes().is_given(&leader) && doubted != Some(leader.as_str());
            if leader == addr || trusted {
                self.prefer(&leader);
                return Some(leader);
            }
            if silent.contains(&leader) {
                continue;
            }
            if self.cluster_status(&leader).await.is_some() {
                self.prefer(&leader);
                return Some(leader);
            }
            silent.push(leader);
        }
        None
    }

    /// Asks who leads unless another call of this client is asking already; then it
    /// waits for that answer, since a write sent meanwhile would go to the node
    /// preferred before, perhaps a follower that relays every write. It waits at most
    /// [`LEADER_LOOKUP_TIMEOUT`] for that: a lookup that asks silent nodes takes longer,
    /// and the write then goes where the client writes now.
    async fn ask_who_leads(&self) {
        let Ok(_asking) =
            tokio::time::timeout(LEADER_LOOKUP_TIMEOUT, self.leader_lookup.lock()).await
        else {
            return;
        };
        if !self.lookup_due() {
            return;
        }
        let wanted = self.lookups_wanted.load(Ordering::SeqCst);
        let doubted = self.doubted().as_ref().map(|(addr, _)| addr.clone());
        let found = self.look_for_leader(doubted.as_deref()).await;
        *self.doubted() = match (found, doubted) {
            // No leader that answers: keep writing through the relay, and look again.
            (None, Some(addr)) => Some((addr, tokio::time::Instant::now() + RELAY_RECHECK_EVERY)),
            _ => None,
        };
        self.lookups_done.store(wanted, Ordering::SeqCst);
    }

    /// The answer of `exchange` with the node at `addr`, or `None` if the node stops
    /// answering while the exchange waits there (only a call with a `wait` is watched).
    async fn unless_silent<T>(
        &self,
        addr: &str,
        wait: Duration,
        exchange: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        if wait.is_zero() {
            return Some(exchange.await);
        }
        // Boxed: the probe is a request of its own, and every call's future would
        // otherwise carry room for it although most calls never wait.
        let silent = Box::pin(self.until_silent(addr));
        tokio::select! {
            biased;
            answer = exchange => Some(answer),
            () = silent => None,
        }
    }

    /// Resolves once the node at `addr` leaves a `GET /cluster` unanswered, asked every
    /// [`WAIT_PROBE_EVERY`].
    async fn until_silent(&self, addr: &str) {
        loop {
            tokio::time::sleep(WAIT_PROBE_EVERY).await;
            if !self.still_answers(addr).await {
                return;
            }
        }
    }

    /// Whether the node at `addr` answered a `GET /cluster` within [`WAIT_PROBE_EVERY`]:
    /// this call's, or one another waiting call of this client made meanwhile, so that
    /// many calls waiting at one node cost one probe. Any HTTP answer counts (a 429, 401
    /// or 503 comes from a node that is not frozen); only no answer in time is silence.
    async fn still_answers(&self, addr: &str) -> bool {
        let heard_lately = |heard: &HashMap<String, tokio::time::Instant>| {
            heard
                .get(addr)
                .is_some_and(|at| at.elapsed() < WAIT_PROBE_EVERY)
        };
        if heard_lately(&self.probes_heard.lock().unwrap_or_else(|e| e.into_inner())) {
            return true;
        }
        let timeout = self.call_timeout.min(LEADER_LOOKUP_TIMEOUT);
        if self.http.get(addr, "/cluster", timeout).await.is_err() {
            return false;
        }
        let mut heard = self.probes_heard.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded by the nodes a client keeps, but addresses come and go: forget the old.
        if heard.len() >= NODES_KNOWN_MAX {
            heard.retain(|_, at| at.elapsed() < WAIT_PROBE_EVERY);
        }
        heard.insert(addr.to_string(), tokio::time::Instant::now());
        true
    }

    /// `GET /cluster` of the node at `addr`, if it answers within
    /// [`LEADER_LOOKUP_TIMEOUT`].
    async fn cluster_status(&self, addr: &str) -> Option<ClusterStatusJson> {
        let timeout = self.call_timeout.min(LEADER_LOOKUP_TIMEOUT);
        let response = self.http.get(addr, "/cluster", timeout).await.ok()?;
        response.json::<ClusterStatusJson>(addr).ok()
    }

    /// Calls `attempt` on the nodes in turn (the preferred one first) until one gives a
    /// definite answer, `wait` plus the give-up time has passed, or `give_up` (asked
    /// before every attempt) says to stop. A node that answers 429 is asked again after
    /// its `Retry-After` instead of the next node.
    async fn retry<T, F, Fut>(
        &self,
        wait: Duration,
        request_id: Option<&str>,
        give_up: &(dyn Fn() -> bool + Sync),
        attempt: F,
    ) -> Result<T, WorkerError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let started = Instant::now();
        // Asked only of a client given https:// addresses: naming the node costs a list.
        if self.http.is_for_https()
            && let Some(refused) = self.http.plain_http_refused(&self.current_node())
        {
            return Err(WorkerError::Rejected(refused));
        }
        let deadline = self.give_up_after.saturating_add(wait);
        let mut last_error = String::from("not tried");
        loop {
            let order = self.order();
            let mut next = 0;
            // The first of this round's nodes that did not speak HTTP, and how many.
            let (mut not_http, mut not_http_count) = (None, 0);
            while let Some(addr) = order.get(next) {
                if give_up() {
                    return Err(WorkerError::Unavailable {
                        waited: started.elapsed(),
                        request_id: request_id.map(str::to_string),
                        last_error: format!("given up; last failure: {last_error}"),
                    });
                }
                let mut pause = RETRY_PAUSE;
                match attempt(addr.clone()).await {
                    Attempt::Done(answer) => {
                        // The preferred node failed and this one answered, perhaps by
                        // relaying to a leader elsewhere: call it first for now, and ask
                        // who leads before the next write, so that writes do not stay
                        // on a relay. Unless the preference moved while this call was
                        // under way: then a newer call already did.
                        if answer.is_ok()
                            && next > 0
                            && !self.spread
                            && order.first() == Some(&self.current_node())
                        {
                            self.prefer(addr);
                            *self.doubted() = Some((order[0].clone(), tokio::time::Instant::now()));
                            self.lookups_wanted.fetch_add(1, Ordering::SeqCst);
                        }
                        return answer;
                    }
                    Attempt::Retry(error) => {
                        self.attempt_failed();
                        last_error = format!("{addr}: {error}");
                        next += 1;
                    }
                    Attempt::NotHttp(error) => {
                        self.attempt_failed();
                        last_error = error.to_string();
                        not_http_count += 1;
                        not_http.get_or_insert(error);
                        next += 1;
                        // Waiting will not change how this node answers.
                        pause = Duration::ZERO;
                    }
                    // The same node again, after the pause it asked for (cut short at
                    // the deadline, for one last try); which node comes first is
                    // unchanged, since this one is up.
                    Attempt::SlowDown {
                        error,
                        pause: asked,
                    } => {
                        self.retries.fetch_add(1, Ordering::Relaxed);
                        last_error = format!("{addr}: {error}");
                        let left = deadline.saturating_sub(started.elapsed());
                        pause = asked.max(RETRY_PAUSE).min(left);
                    }
                }
                let waited = started.elapsed();
                if waited >= deadline {
                    return Err(WorkerError::Unavailable {
                        waited,
                        request_id: request_id.map(str::to_string),
                        last_error,
                    });
                }
                tokio::time::sleep(pause).await;
            }
            // No node speaks HTTP to this client (a cluster serving TLS, and no CA given):
            // rounds more cannot help.
            if not_http_count == order.len()
                && let Some(error) = not_http
            {
                return Err(WorkerError::Rejected(error));
            }
            // Leadership may have moved: ask before the next round. (Boxed, as below.)
            if !self.spread {
                Box::pin(self.find_leader()).await;
            }
        }
    }

    /// Sends `request` under a fresh request id; the task versions it wrote.
    pub async fn write(
        &self,
        request: impl Into<WriteRequestJson>,
    ) -> Result<Vec<TaskJson>, WorkerError> {
        self.write_as(request, self.next_request_id()).await
    }

    /// Sends `request` under `request_id` until its answer is definite: the same id
    /// always gets the first outcome, so a write retried this way applies once.
    pub async fn write_as(
        &self,
        request: impl Into<WriteRequestJson>,
        request_id: String,
    ) -> Result<Vec<TaskJson>, WorkerError> {
        self.write_until(request, request_id, &|| false).await
    }

    /// As [`WorkerClient::write_as`], but `give_up` is asked before each attempt: once it
    /// says to stop, the write ends [`WorkerError::Unavailable`] (it may or may not have
    /// applied).
    pub async fn write_until(
        &self,
        request: impl Into<WriteRequestJson>,
        request_id: String,
        give_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<TaskJson>, WorkerError> {
        if !self.spread && self.lookup_due() {
            // Boxed: asking the nodes who leads is a future of several KiB, which would
            // otherwise be part of every write's and copied with it, for a question
            // asked seldom.
            Box::pin(self.ask_who_leads()).await;
        }
        let request = request.into().with_request_id(request_id.clone());
        let timeout = self.call_timeout + request.wait();
        let request = &request;
        self.retry(
            request.wait(),
            Some(&request_id),
            give_up,
            |addr| async move {
                // Under the same request id elsewhere, a waiting claim cut short is safe
                // to send again: it applies once.
                let sent = write_once(&self.http, &addr, request, timeout);
                let Some(answer) = self.unless_silent(&addr, request.wait(), sent).await else {
                    return Attempt::Retry(silent_while_waiting(&addr));
                };
                match answer {
                    Ok(Ok(WriteResultJson::Tasks { tasks })) => Attempt::Done(Ok(tasks)),
                    Ok(Ok(WriteResultJson::Errors { errors })) => {
                        Attempt::Done(Err(WorkerError::Refused(errors)))
                    }
                    Ok(Err(rejected)) => Attempt::Done(Err(WorkerError::Rejected(rejected))),
                    Err(unanswered) => unanswered.into(),
                }
            },
        )
        .await
    }

    /// GETs `path` from any node; `wait` is how long the node may wait before it answers.
    async fn read<T: DeserializeOwned>(
        &self,
        path: &str,
        wait: Duration,
    ) -> Result<T, WorkerError> {
        self.call(Method::GET, path, None, wait).await
    }

    /// Sends `method path` (with a JSON `body`) to the nodes in turn until one answers
    /// definitely: a 2xx parsed as `T`, a 404, 410 or other 4xx as its error. For
    /// idempotent calls only (reads, settings), since a retry may repeat one.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        wait: Duration,
    ) -> Result<T, WorkerError> {
        let timeout = self.call_timeout + wait;
        let headers = match body {
            Some(_) => vec![(
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            )],
            None => Vec::new(),
        };
        let body = bytes::Bytes::from(body.unwrap_or_default());
        let (method, headers, body) = (&method, &headers, &body);
        self.retry(wait, None, &|| false, |addr| async move {
            let sent = self
                .http
                .send(&addr, method.clone(), path, headers, body.clone(), timeout);
            let Some(sent) = self.unless_silent(&addr, wait, sent).await else {
                return Attempt::Retry(silent_while_waiting(&addr));
            };
            let response = match sent {
                Ok(response) => response,
                Err(e) => return Unanswered::from_error(e).into(),
            };
            match response.status.as_u16() {
                200..=299 => match response.json::<T>(&addr) {
                    Ok(value) => Attempt::Done(Ok(value)),
                    Err(e) => Attempt::Retry(e.to_string()),
                },
                404 => Attempt::Done(Err(WorkerError::NotFound(
                    String::from_utf8_lossy(&response.body).into_owned(),
                ))),
                410 => match response.json::<WatchGoneJson>(&addr) {
                    Ok(gone) => Attempt::Done(Err(WorkerError::Forgotten(gone))),
                    Err(e) => Attempt::Retry(e.to_string()),
                },
                // Not taken (too slow a body, too many requests): safe to send again.
                408 | 429 => Unanswered::from_status(&response).into(),
                400..=499 => match response.success(&addr) {
                    Err(e) => Attempt::Done(Err(WorkerError::Rejected(e))),
                    Ok(_) => Attempt::Retry("a 4xx that is not an error".into()),
                },
                _ => Unanswered::from_status(&response).into(),
            }
        })
        .await
    }

    fn first(mut tasks: Vec<TaskJson>, what: &str) -> Result<TaskJson, WorkerError> {
        if tasks.is_empty() {
            return Err(WorkerError::Refused(vec![format!(
                "the cluster answered no task for {what}"
            )]));
        }
        Ok(tasks.swap_remove(0))
    }

    /// Adds a task with `data` to `group`, available now.
    pub async fn add(&self, group: &str, data: &str) -> Result<TaskJson, WorkerError> {
        self.add_task(AddJson::in_group(group).with_data(data))
            .await
    }

    /// Adds one task or job (key, `after`, priority... in `add`).
    pub async fn add_task(&self, add: AddJson) -> Result<TaskJson, WorkerError> {
        let tasks = self
            .write(UpdateRequestJson::by(self.client_id).with_add(add))
            .await?;
        Self::first(tasks, "an add")
    }

    /// Claims `group`'s next available task for `lease`; `None` if there is none.
    pub async fn claim(
        &self,
        group: &str,
        lease: Duration,
    ) -> Result<Option<TaskJson>, WorkerError> {
        self.claim_waiting(group, lease, Duration::ZERO).await
    }

    /// As [`WorkerClient::claim`], waiting up to `wait` (at most a minute) for a task when
    /// none is available; waiting writes nothing to the log.
    pub async fn claim_waiting(
        &self,
        group: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<Option<TaskJson>, WorkerError> {
        let claim = self.claim_request(group, lease, wait);
        Ok(self.write(claim).await?.into_iter().next())
    }

    /// A claim by this client of `group`'s next task for `lease`, waiting up to `wait`
    /// (at most a minute) when none is available.
    fn claim_request(&self, group: &str, lease: Duration, wait: Duration) -> ClaimRequestJson {
        let wait_ms = (wait.as_millis() as u64).min(WAIT_MS_MAX);
        ClaimRequestJson {
            wait_ms: (wait_ms > 0).then_some(wait_ms),
            ..ClaimRequestJson::new(self.client_id, group, lease.as_millis() as i64)
        }
    }

    /// Claims up to `count` (1 to 1 000) of `group`'s available tasks for `lease` in one
    /// request, waiting up to `wait` for the first when none is available; each task
    /// claimed is its own version with its own fence. Empty if none came in time.
    pub async fn claim_many(
        &self,
        group: &str,
        lease: Duration,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<TaskJson>, WorkerError> {
        let claim = self.claim_request(group, lease, wait).with_count(count);
        self.write(claim).await
    }

    /// Renews an owned task for `lease` from now, keeping its data; the new version,
    /// whose id is the fence from now on.
    pub async fn renew(&self, task: &TaskJson, lease: Duration) -> Result<TaskJson, WorkerError> {
        self.renew_as(task, lease, self.next_request_id()).await
    }

    /// As [`WorkerClient::renew`] under `request_id`: a renewal whose outcome is unknown
    /// must be sent again under the same id (and for the same version), or a renewal
    /// that did apply makes the retry look refused.
    pub async fn renew_as(
        &self,
        task: &TaskJson,
        lease: Duration,
        request_id: String,
    ) -> Result<TaskJson, WorkerError> {
        let change = ChangeJson::renewal(task.id, task.data.clone(), lease.as_millis() as i64);
        let update = UpdateRequestJson::by(self.client_id).with_change(change);
        let tasks = self.write_as(update, request_id).await?;
        Self::first(tasks, "a renewal")
    }

    /// Gives an owned task back: available to any claim at once, with its data.
    pub async fn release(&self, task: &TaskJson) -> Result<(), WorkerError> {
        let change = ChangeJson::release(task.id, task.data.clone());
        self.write(UpdateRequestJson::by(self.client_id).with_change(change))
            .await
            .map(drop)
    }

    /// Deletes task version `id` (owned by this client, or available).
    pub async fn delete(&self, id: u64) -> Result<(), WorkerError> {
        self.write(UpdateRequestJson::by(self.client_id).with_deletes([id]))
            .await
            .map(drop)
    }

    /// Ends the claim of version `id` with success and an optional JSON result.
    pub async fn finish(&self, id: u64, result: Option<Value>) -> Result<(), WorkerError> {
        let finish = FinishRequestJson {
            clientid: self.client_id,
            id,
            result,
            requestid: None,
            next: None,
        };
        self.write(finish).await.map(drop)
    }

    /// Ends the claim of task version `id` with success and, in the same command, claims
    /// up to `count` of `group`'s next tasks for `lease`: a worker's cycle in one commit.
    /// The claimed tasks (empty when none is claimable: this claim never waits); a
    /// refusal ([`WorkerError::Refused`]) means neither part applied.
    ///
    /// A cluster that takes no finish with `next` yet (a rolling upgrade: see
    /// [`crate::job::next_not_taken`]) gets the finish and then a claim, two writes; the
    /// client remembers that for [`NEXT_RETRY_AFTER`] before it asks with `next` again.
    pub async fn finish_and_claim(
        &self,
        id: u64,
        result: Option<Value>,
        group: &str,
        lease: Duration,
        count: u32,
    ) -> Result<Vec<TaskJson>, WorkerError> {
        // Built per send: the common case sends one, with `next`.
        let finish = |with_next: bool| FinishRequestJson {
            clientid: self.client_id,
            id,
            result: result.clone(),
            requestid: None,
            next: with_next.then(|| crate::job::NextClaimJson {
                group: group.to_string(),
                duration: lease.as_millis() as i64,
                count: (count != 1).then_some(count),
            }),
        };
        // Nothing was written under an id whose finish with `next` was not taken, so
        // the finish alone goes under the same id.
        let request_id = self.next_request_id();
        let sent_next = !self.next_refused_lately();
        if sent_next {
            match self.write_as(finish(true), request_id.clone()).await {
                Err(WorkerError::Rejected(ClientError::Status {
                    status, message, ..
                })) if crate::job::next_not_taken(status.as_u16(), &message) => {
                    self.note_next_refused();
                }
                answer => return answer,
            }
        }
        match self.write_as(finish(false), request_id.clone()).await {
            Ok(_) => {}
            // The id names a finish with next after all: one sent earlier in this call
            // that was still on its way into the log when a leader refused its retry.
            // Asked again with next, the cluster answers its first outcome.
            Err(WorkerError::Rejected(ClientError::Status { status, .. }))
                if sent_next && status.as_u16() == 422 =>
            {
                return self.write_as(finish(true), request_id).await;
            }
            Err(e) => return Err(e),
        }
        // The finish applied: a claim that fails now is no task claimed, not a failed
        // finish; the caller claims as usual.
        Ok(self
            .claim_many(group, lease, count, Duration::ZERO)
            .await
            .unwrap_or_default())
    }

    /// Whether a node refused a finish with `next` less than [`NEXT_RETRY_AFTER`] ago.
    fn next_refused_lately(&self) -> bool {
        let refused = self
            .next_refused_at
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        refused.is_some_and(|at| at.elapsed() < NEXT_RETRY_AFTER)
    }

    fn note_next_refused(&self) {
        *self
            .next_refused_at
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// Ends the claims of several task versions with success, each with its result, in
    /// one request: all of them or none. A refusal ([`WorkerError::Refused`]) names
    /// each task that cannot be finished (lease lost, cancelled); send the rest again.
    pub async fn finish_many(&self, finishes: &[(u64, Option<Value>)]) -> Result<(), WorkerError> {
        let many = FinishManyRequestJson {
            clientid: self.client_id,
            finishes: finishes
                .iter()
                .map(|(id, result)| FinishItemJson {
                    id: *id,
                    result: result.clone(),
                })
                .collect(),
            requestid: None,
        };
        self.write(many).await.map(drop)
    }

    /// Ends the claim of version `id` with an error: retried after the group's back-off
    /// (or `retry_in`), dead after its last attempt. The retry's new version, if any.
    pub async fn fail(
        &self,
        id: u64,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<Option<TaskJson>, WorkerError> {
        let fail = FailRequestJson {
            clientid: self.client_id,
            id,
            error: error.to_string(),
            retry_in_ms: retry_in.map(|d| d.as_millis() as i64),
            requestid: None,
        };
        Ok(self
            .write(WriteRequestJson::Fail(fail))
            .await?
            .into_iter()
            .next())
    }

    /// Cancels the jobs `keys` of `group`.
    pub async fn cancel(&self, group: &str, keys: &[&str]) -> Result<(), WorkerError> {
        let cancel = KeysRequestJson {
            clientid: self.client_id,
            group: group.to_string(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            requestid: None,
        };
        self.write(WriteRequestJson::Cancel(cancel)).await.map(drop)
    }

    /// The tasks of `group` (only those owned now, with `owned`), read linearizably, or
    /// from the node's own state with `stale` (faster, possibly behind).
    pub async fn group_tasks(
        &self,
        group: &str,
        owned: bool,
        stale: bool,
    ) -> Result<Vec<TaskJson>, WorkerError> {
        let mut query = Vec::new();
        if owned {
            query.push("owned=1");
        }
        if stale {
            query.push("consistency=stale");
        }
        let path = format!("/group/{}?{}", percent_encode(group), query.join("&"));
        self.read(&path, Duration::ZERO).await
    }

    /// Changes `group`'s job settings as `change` says (give it a request id: a retry
    /// then applies once); the settings afterwards.
    pub async fn change_settings(
        &self,
        group: &str,
        change: &SettingsChangeJson,
    ) -> Result<SettingsJson, WorkerError> {
        let body = serde_json::to_vec(change)
            .map_err(|e| WorkerError::Refused(vec![format!("encoding the settings: {e}")]))?;
        let path = format!("/groups/{}/settings", percent_encode(group));
        self.call(Method::PUT, &path, Some(body), Duration::ZERO)
            .await
    }

    /// The record of job `key` in `group`.
    pub async fn job(&self, group: &str, key: &str) -> Result<JobJson, WorkerError> {
        let path = format!(
            "/job?group={}&key={}",
            percent_encode(group),
            percent_encode(key)
        );
        self.read(&path, Duration::ZERO).await
    }

    /// The record of the job with id `id`: the task id its add answered (until its next
    /// run), or its live task's id. `NotFound` if no job has that id.
    pub async fn job_by_id(&self, id: u64) -> Result<JobJson, WorkerError> {
        self.read(&format!("/job?id={id}"), Duration::ZERO).await
    }

    /// The records of the jobs `keys` of `group` once all have finished, or as they are
    /// after `wait` (at most a minute).
    pub async fn wait_jobs(
        &self,
        group: &str,
        keys: &[&str],
        wait: Duration,
    ) -> Result<JobWaitJson, WorkerError> {
        let wait_ms = (wait.as_millis() as u64).min(WAIT_MS_MAX);
        let wait = Duration::from_millis(wait_ms);
        if let Some(path) = jobs_wait_path(group, keys, wait_ms, WAIT_QUERY_BYTES_MAX) {
            return self.read(&path, wait).await;
        }
        let body = JobWaitRequestJson {
            group: group.to_string(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            wait_ms: Some(wait_ms),
            consistency: None,
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| WorkerError::Refused(vec![format!("encoding the wait: {e}")]))?;
        match self
            .call(Method::POST, JOBS_WAIT_PATH, Some(body), wait)
            .await
        {
            // A build before the POST: the GET, if it takes one this long.
            Err(
                rejected @ WorkerError::Rejected(ClientError::Status {
                    status: StatusCode::METHOD_NOT_ALLOWED,
                    ..
                }),
            ) => match jobs_wait_path(group, keys, wait_ms, WAIT_QUERY_BYTES_MAX_HTTP1) {
                Some(path) if !self.http.speaks_http2() => self.read(&path, wait).await,
                _ => Err(rejected),
            },
            answer => answer,
        }
    }

    /// The changes of `group` after revision `after` (default: from now), waiting up to
    /// `wait` for the first. [`WorkerError::Forgotten`] when the node no longer keeps
    /// them.
    pub async fn watch(
        &self,
        group: &str,
        after: Option<u64>,
        wait: Duration,
    ) -> Result<WatchPageJson, WorkerError> {
        let wait_ms = (wait.as_millis() as u64).min(WAIT_MS_MAX);
        let after = after.map(|a| format!("&after={a}")).unwrap_or_default();
        let path = format!(
            "/watch?group={}{after}&wait_ms={wait_ms}",
            percent_encode(group)
        );
        self.read(&path, Duration::from_millis(wait_ms)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn no_definite_answer_names_the_request_id_plainly() {
        let write = WorkerError::Unavailable {
            waited: Duration::from_millis(5_080),
            request_id: Some("r-1".into()),
            last_error: "refused".into(),
        };
        let text = write.to_string();
        assert!(text.starts_with("no definite answer after 5.1s"), "{text}");
        assert!(
            text.contains("request id \"r-1\"") && !text.contains("Some("),
            "{text}"
        );
        let read = WorkerError::Unavailable {
            waited: Duration::from_secs(2),
            request_id: None,
            last_error: "refused".into(),
        };
        assert_eq!(read.to_string(), "no definite answer after 2.0s: refused");
    }

    #[test]
    fn addresses_are_normalised_and_request_ids_unique() {
        let client = WorkerClient::new(["http://127.0.0.1:1/", " 127.0.0.1:2 "], 3).expect("ok");
        assert_eq!(client.known_nodes(), vec!["127.0.0.1:1", "127.0.0.1:2"]);
        let (a, b) = (client.next_request_id(), client.next_request_id());
        assert_ne!(a, b);
        assert!(a.starts_with("c3-") && a.len() <= 64, "{a}");
        assert!(matches!(
            WorkerClient::new(Vec::<String>::new(), 1),
            Err(WorkerError::NoNodes)
        ));
        let bad = WorkerClient::new(["127.0.0.1:1", "ftp://h:1"], 1);
        assert!(
            matches!(&bad, Err(WorkerError::BadAddress { url, .. }) if url == "ftp://h:1"),
            "{bad:?}"
        );
        client.prefer("127.0.0.1:2");
        assert_eq!(client.order(), vec!["127.0.0.1:2", "127.0.0.1:1"]);
    }

    fn status(addrs: &[&str]) -> ClusterStatusJson {
        let nodes = addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| crate::admin::NodeStatusJson {
                id: i as u64 + 1,
                api_addr: addr.to_string(),
                raft_addr: String::new(),
                role: "follower".into(),
                lag: None,
            })
            .collect();
        ClusterStatusJson {
            id: 1,
            leader: Some(1),
            term: 1,
            commit_index: None,
            applied_index: None,
            snapshot_index: None,
            purged_index: None,
            applied_time_ms: 0,
            voters: Vec::new(),
            learners: Vec::new(),
            retired: Vec::new(),
            membership_index: None,
            membership_committed: true,
            joint: false,
            removed: false,
            log_form: 0,
            nodes,
        }
    }

    #[test]
    fn members_not_given_are_learned_after_the_given_and_forgotten_once_removed() {
        let client = WorkerClient::new(["b:2"], 1).expect("ok");
        client
            .nodes()
            .learn(&status(&["a:1", "http://b:2/", "c:3"]));
        assert_eq!(client.known_nodes(), ["b:2", "a:1", "c:3"]);
        client.prefer("c:3");
        client.nodes().learn(&status(&["c:3", "b:2"]));
        assert_eq!(client.order(), ["c:3", "b:2"], "a:1 was removed");
        client.nodes().learn(&status(&["a:1"]));
        assert_eq!(client.order(), ["b:2", "a:1"], "given nodes stay");
        let many: Vec<String> = (0..100).map(|i| format!("n{i}:1")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        client.nodes().learn(&status(&many));
        assert_eq!(client.known_nodes().len(), NODES_KNOWN_MAX);
    }

    #[test]
    fn a_spread_client_starts_where_told_and_moves_on() {
        let addrs = ["a:1", "b:2", "c:3"];
        let client = WorkerClient::new(addrs, 1).expect("ok").spread_from(4);
        assert_eq!(client.current_node(), "b:2");
        client.next_node();
        assert_eq!(client.order(), vec!["c:3", "a:1", "b:2"]);
        client.next_node();
        assert_eq!(client.current_node(), "a:1");
        assert_eq!(client.retries(), 0);
    }

    #[tokio::test]
    async fn a_write_given_up_on_is_unavailable_with_its_request_id() {
        // Nothing listens on port 1: every attempt fails at once.
        let client = WorkerClient::new(["127.0.0.1:1"], 1)
            .expect("ok")
            .spread_from(0)
            .with_timeouts(Duration::from_millis(200), Duration::MAX);
        let tries = AtomicU64::new(0);
        let update = crate::worker::UpdateRequestJson::by(1);
        let answer = client
            .write_until(update, "r-1".into(), &|| {
                tries.fetch_add(1, Ordering::SeqCst) >= 3
            })
            .await;
        match answer {
            Err(WorkerError::Unavailable { request_id, .. }) => {
                assert_eq!(request_id.as_deref(), Some("r-1"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            client.retries(),
            3,
            "three attempts failed before the give-up"
        );
    }

    /// A node that answers every POST as `answer` says (given how many POSTs came
    /// before), a GET with `get` if given, and 404 otherwise (so no leader is learned);
    /// counts the POSTs.
    struct ScriptedNode {
        addr: String,
        posts: Arc<AtomicU64>,
    }

    impl ScriptedNode {
        async fn start(answer: fn(u64) -> &'static str) -> Self {
            Self::start_with(answer, None).await
        }

        async fn start_with(answer: fn(u64) -> &'static str, get: Option<Arc<str>>) -> Self {
            use tokio::io::AsyncReadExt;
            use tokio::io::AsyncWriteExt;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr").to_string();
            let posts = Arc::new(AtomicU64::new(0));
            let counted = posts.clone();
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let counted = counted.clone();
                    let get = get.clone();
                    tokio::spawn(async move {
                        let mut buffer = Vec::new();
                        loop {
                            let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n")
                            else {
                                let mut chunk = [0u8; 4096];
                                match stream.read(&mut chunk).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                                }
                                continue;
                            };
                            let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
                            let length: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map_or(0, |v| v.trim().parse().expect("length"));
                            if buffer.len() < head_end + 4 + length {
                                let mut chunk = [0u8; 4096];
                                match stream.read(&mut chunk).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                                }
                                continue;
                            }
                            buffer.drain(..head_end + 4 + length);
                            let response = match &get {
                                _ if head.starts_with("post") => {
                                    answer(counted.fetch_add(1, Ordering::SeqCst))
                                }
                                Some(get) => get,
                                None => "HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}",
                            };
                            if stream.write_all(response.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
            Self { addr, posts }
        }

        fn posts(&self) -> u64 {
            self.posts.load(Ordering::SeqCst)
        }
    }

    const TASKS: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"tasks\":[]}";
    const SLOW_DOWN_NOW: &str = "HTTP/1.1 429 Too Many Requests\r\nretry-after: 0\r\ncontent-length: 26\r\n\r\n{\"error\":\"rate limit hit\"}";
    const SLOW_DOWN_1S: &str = "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 26\r\n\r\n{\"error\":\"rate limit hit\"}";

    /// A listener that accepts connections and never answers; counts them.
    async fn silent_node() -> (String, Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn a_long_wait_for_jobs_falls_back_to_the_get_of_a_build_before_the_post() {
        const NOT_ALLOWED: &str = "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\ncontent-length: 32\r\n\r\n{\"error\":\"method not allowed\"}  ";
        let body = r#"{"finished":false,"jobs":[],"missing":["k"]}"#;
        let get: Arc<str> = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into();
        let node = ScriptedNode::start_with(|_| NOT_ALLOWED, Some(get)).await;
        let client = WorkerClient::new([node.addr.as_str()], 1).expect("ok");
        // About 10 KiB of query: past the GET's 8 KiB, within an older node's 60 KiB.
        let keys: Vec<String> = (0..100)
            .map(|n| format!("{n:03}{}", "k".repeat(100)))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let waited = client
            .wait_jobs("g", &refs, Duration::ZERO)
            .await
            .expect("the GET after the 405");
        assert_eq!((waited.finished, waited.missing.len()), (false, 1));
        assert_eq!(node.posts(), 1, "the POST first");

        // Too long for any GET: the 405 stands.
        let keys: Vec<String> = (0..300)
            .map(|n| format!("{n:03}{}", "k".repeat(250)))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let refused = client.wait_jobs("g", &refs, Duration::ZERO).await;
        assert!(
            matches!(&refused, Err(WorkerError::Rejected(ClientError::Status { status, .. })) if status.as_u16() == 405),
            "{refused:?}"
        );
        assert_eq!(node.posts(), 2);
    }

    #[tokio::test]
    async fn a_learned_leader_out_of_reach_is_asked_once_per_lookup() {
        let (silent, accepted) = silent_node().await;
        let get = cluster_answer(&status(&[silent.as_str()]));
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(ScriptedNode::start_with(|_| TASKS, Some(get.clone())).await);
        }
        let client = WorkerClient::new(nodes.iter().map(|n| n.addr.as_str()), 1).expect("ok");
        assert_eq!(
            client.find_leader().await,
            None,
            "the leader never answered"
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "every node named it; it was asked once"
        );
        assert!(
            client.known_nodes().contains(&silent),
            "still a member to try"
        );
    }

    const UNAVAILABLE: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}";

    /// `status` as a node's answer to `GET /cluster`.
    fn cluster_answer(status: &ClusterStatusJson) -> Arc<str> {
        let body = serde_json::to_string(status).expect("json");
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into()
    }

    /// A leader that answers POSTs as `answer` says (and `GET /cluster` without naming
    /// anyone), and a follower that answers every POST, as its relay would, and names
    /// the leader.
    async fn leader_and_follower(answer: fn(u64) -> &'static str) -> (ScriptedNode, ScriptedNode) {
        let mut unnamed = status(&[]);
        unnamed.leader = None;
        let leader = ScriptedNode::start_with(answer, Some(cluster_answer(&unnamed))).await;
        let get = cluster_answer(&status(&[leader.addr.as_str()]));
        let follower = ScriptedNode::start_with(|_| TASKS, Some(get)).await;
        (leader, follower)
    }

    #[tokio::test]
    async fn writes_sent_while_the_client_asks_who_leads_wait_and_go_to_the_leader() {
        let (leader, follower) = leader_and_follower(|_| TASKS).await;
        let client =
            WorkerClient::new([follower.addr.as_str(), leader.addr.as_str()], 1).expect("ok");
        let update = || crate::worker::UpdateRequestJson::by(1);
        let (a, b, c) = tokio::join!(
            client.write(update()),
            client.write(update()),
            client.write(update())
        );
        for answer in [a, b, c] {
            answer.expect("written");
        }
        assert_eq!(
            (leader.posts(), follower.posts()),
            (3, 0),
            "none went to the follower listed first"
        );
        client.write(update()).await.expect("written");
        assert_eq!((leader.posts(), follower.posts()), (4, 0));
    }

    #[tokio::test]
    async fn a_write_another_node_answered_asks_who_leads_before_the_next() {
        fn first_unavailable(n: u64) -> &'static str {
            if n == 0 { UNAVAILABLE } else { TASKS }
        }
        let (leader, follower) = leader_and_follower(first_unavailable).await;
        let client =
            WorkerClient::new([leader.addr.as_str(), follower.addr.as_str()], 1).expect("ok");
        let update = || crate::worker::UpdateRequestJson::by(1);
        client
            .write(update())
            .await
            .expect("answered by the follower");
        assert_eq!((leader.posts(), follower.posts()), (1, 1));
        client
            .write(update())
            .await
            .expect("answered by the leader");
        client
            .write(update())
            .await
            .expect("answered by the leader");
        assert_eq!(
            (leader.posts(), follower.posts()),
            (3, 1),
            "back to the leader, which the follower names, rather than staying on the relay"
        );
    }

    #[tokio::test]
    async fn a_client_cut_off_from_the_leader_alone_writes_through_a_relay() {
        let (leader, accepted) = silent_node().await;
        let get = cluster_answer(&status(&[leader.as_str()]));
        let follower = ScriptedNode::start_with(|_| TASKS, Some(get)).await;
        let client = WorkerClient::new([leader.as_str(), follower.addr.as_str()], 1)
            .expect("ok")
            .with_timeouts(Duration::from_millis(300), Duration::from_secs(30));
        let update = || crate::worker::UpdateRequestJson::by(1);
        for _ in 0..2 {
            client
                .write(update())
                .await
                .expect("relayed by the follower");
        }
        let tried = accepted.load(Ordering::SeqCst);
        client
            .write(update())
            .await
            .expect("relayed by the follower");
        assert_eq!(follower.posts(), 3);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            tried,
            "once it did not answer, the leader is not tried first again"
        );
        // Some time later the client looks again: still silent, so the relay stays.
        client.doubted().as_mut().expect("doubted").1 = tokio::time::Instant::now();
        client
            .write(update())
            .await
            .expect("relayed by the follower");
        assert_eq!(follower.posts(), 4);
        assert_eq!(accepted.load(Ordering::SeqCst), tried + 1, "looked at once");
        assert!(
            !client.lookup_due(),
            "and not again before {RELAY_RECHECK_EVERY:?}"
        );
    }

    #[tokio::test]
    async fn a_cluster_that_speaks_no_http_to_the_client_is_refused_after_one_round() {
        use crate::client::tests::tls_only_node;
        let nodes = [tls_only_node().await, tls_only_node().await];
        let client = WorkerClient::new(&nodes, 1)
            .expect("ok")
            .with_timeouts(Duration::from_secs(1), Duration::from_secs(60));
        client.lookups_done.store(1, Ordering::SeqCst);
        let update = crate::worker::UpdateRequestJson::by(1);
        let refused = client.write(update).await;
        let Err(WorkerError::Rejected(error)) = &refused else {
            panic!("{refused:?}");
        };
        assert!(
            error.to_string().contains("is the node serving TLS"),
            "{error}"
        );
        assert_eq!(client.retries(), 2, "each node once");
        let read = client.job("g", "k").await;
        assert!(matches!(read, Err(WorkerError::Rejected(_))), "{read:?}");
    }

    #[tokio::test]
    async fn a_blocking_claim_leaves_a_node_that_stops_answering() {
        let (frozen, accepted) = silent_node().await;
        let other = ScriptedNode::start(|_| TASKS).await;
        let client = WorkerClient::new([frozen.as_str(), other.addr.as_str()], 1).expect("ok");
        let started = tokio::time::Instant::now();
        let claimed = client
            .claim_waiting("g", Duration::from_secs(30), Duration::from_secs(20))
            .await
            .expect("answered by the other node");
        assert!(claimed.is_none());
        assert_eq!(other.posts(), 1, "the claim went on to the other node");
        assert!(
            accepted.load(Ordering::SeqCst) >= 2,
            "sent to the frozen node first"
        );
        // A leader lookup (1 s on the frozen node), a probe period, a probe (1 s): not
        // the 20 s wait plus a call timeout.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    /// A finish with next refused (409) although an earlier send of it was on its way
    /// into the log: the finish alone under that id is a reused id (422), and the client
    /// asks again with next, which the cluster answers with the first outcome. A 409
    /// is remembered: the next call sends the finish alone at once.
    #[tokio::test]
    async fn a_finish_alone_refused_as_a_reused_id_asks_again_with_next() {
        fn answer(n: u64) -> &'static str {
            match n {
                0 => concat!(
                    "HTTP/1.1 409 Conflict\r\ncontent-length: 56\r\n\r\n",
                    "{\"error\":\"this cluster cannot log a finish with `next`\"}"
                ),
                1 => {
                    "HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: 18\r\n\r\n{\"error\":\"reused\"}"
                }
                _ => TASKS,
            }
        }
        let node = ScriptedNode::start(answer).await;
        let client = WorkerClient::new([node.addr.as_str()], 1).expect("ok");
        client.lookups_done.store(1, Ordering::SeqCst);
        let lease = Duration::from_secs(1);
        let tasks = client
            .finish_and_claim(5, None, "g", lease, 1)
            .await
            .expect("answered with the first outcome");
        assert!(tasks.is_empty());
        assert_eq!(node.posts(), 3, "with next, alone, with next again");
        assert!(client.next_refused_lately());
        // Remembered: the finish alone, then the claim.
        client
            .finish_and_claim(6, None, "g", lease, 1)
            .await
            .expect("finished");
        assert_eq!(node.posts(), 5);
    }

    /// A node that answers a waiting call's probe with an error (busy, unauthorised,
    /// stopping) is not frozen: the call keeps waiting there. Only no answer is silence.
    #[tokio::test]
    async fn a_probe_answered_with_an_error_is_not_silence() {
        const UNAVAILABLE: &str =
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 16\r\n\r\n{\"error\":\"busy\"}";
        let busy = ScriptedNode::start_with(|_| TASKS, Some(UNAVAILABLE.into())).await;
        let (frozen, _) = silent_node().await;
        let client = WorkerClient::new([busy.addr.as_str()], 1).expect("ok");
        let heard_at = || {
            let heard = client.probes_heard.lock().expect("lock");
            heard.get(&busy.addr).copied()
        };
        assert!(client.still_answers(&busy.addr).await);
        assert!(!client.still_answers(&frozen).await);
        // Heard lately: another waiting call's probe is not sent again.
        let heard = heard_at();
        assert!(heard.is_some_and(|at| at.elapsed() < WAIT_PROBE_EVERY));
        assert!(client.still_answers(&busy.addr).await);
        assert_eq!(heard_at(), heard, "answered from the last probe, none sent");
    }

    #[tokio::test]
    async fn https_addresses_without_tls_send_nothing_in_plain_http() {
        let node = ScriptedNode::start(|_| TASKS).await;
        let client = WorkerClient::new([format!("https://{}", node.addr)], 1)
            .expect("ok")
            .with_token(Some("rota_0123456789abcdef_secret"))
            .expect("a token");
        let refused = client
            .write(UpdateRequestJson::by(1))
            .await
            .expect_err("refused");
        assert!(
            matches!(&refused, WorkerError::Rejected(ClientError::Connect { .. })),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("no TLS set up"), "{refused}");
        assert_eq!(node.posts(), 0, "nothing reached the node");
        // The same address without the scheme is plain HTTP, as asked.
        let plain = WorkerClient::new([node.addr.as_str()], 1).expect("ok");
        plain
            .write(UpdateRequestJson::by(1))
            .await
            .expect("written");
        assert_eq!(node.posts(), 1);
    }

    #[tokio::test]
    async fn a_renewal_turned_away_with_401_loses_the_lease_at_once() {
        const REVOKED: &str = "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: 27\r\n\r\n{\"error\":\"unknown token x\"}";
        let node = ScriptedNode::start(|_| REVOKED).await;
        let client = Arc::new(WorkerClient::new([node.addr.as_str()], 1).expect("ok"));
        let task = TaskJson {
            id: 7,
            group: "g".into(),
            data: String::new(),
            timespec: 0,
            ownerid: 1,
            key: None,
            priority: 0,
            attempt: 0,
        };
        // Renewed after a third of the lease; without this rule the renewal would be
        // sent again until the lease ran out, and reported as `Expired`.
        let lease = crate::lease::Lease::hold(
            client,
            task,
            Duration::from_secs(3),
            tokio::time::Instant::now(),
        );
        let lost = tokio::time::timeout(Duration::from_secs(20), lease.lost())
            .await
            .expect("the lease ends");
        let crate::lease::LeaseLost::Refused(reasons) = lost else {
            panic!("{lost:?}");
        };
        assert!(reasons.join(" ").contains("unknown token x"), "{reasons:?}");
        assert_eq!(node.posts(), 1, "a 401 is not sent again");
    }

    #[tokio::test]
    async fn a_node_that_answers_429_is_asked_again_and_stays_first() {
        let busy = ScriptedNode::start(|n| if n < 2 { SLOW_DOWN_NOW } else { TASKS }).await;
        let other = ScriptedNode::start(|_| TASKS).await;
        let client = WorkerClient::new([busy.addr.as_str(), other.addr.as_str()], 1).expect("ok");
        let tasks = client
            .write(UpdateRequestJson::by(1))
            .await
            .expect("written");
        assert!(tasks.is_empty());
        assert_eq!(busy.posts(), 3, "two 429s, then the write");
        assert_eq!(other.posts(), 0, "a 429 is not a reason to go elsewhere");
        assert_eq!(client.retries(), 2);
        assert_eq!(client.current_node(), busy.addr);
    }

    #[tokio::test]
    async fn a_429_pause_is_its_retry_after_cut_at_the_deadline() {
        let busy = ScriptedNode::start(|_| SLOW_DOWN_1S).await;
        let other = ScriptedNode::start(|_| TASKS).await;
        let client = WorkerClient::new([busy.addr.as_str(), other.addr.as_str()], 1)
            .expect("ok")
            .with_timeouts(Duration::from_secs(5), Duration::from_millis(1500));
        let started = Instant::now();
        match client.write(UpdateRequestJson::by(1)).await {
            Err(WorkerError::Unavailable { last_error, .. }) => {
                assert!(last_error.contains("429"), "{last_error}");
                assert!(last_error.contains(&busy.addr), "{last_error}");
            }
            other => panic!("{other:?}"),
        }
        // Asked at once, after the 1 s it said, and once more at the deadline (1.5 s).
        assert_eq!(busy.posts(), 3);
        assert_eq!(other.posts(), 0);
        assert!(started.elapsed() >= Duration::from_millis(1500));
    }
}
