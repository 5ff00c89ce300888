//! Serving an axum router over HTTP/1.1 with hyper's connection API, and the JSON error
//! answers every endpoint shares.
//!
//! The accept loop uses hyper directly (not `axum::serve`) so the same code can accept on
//! a simulated listener. Limits that hyper would otherwise not enforce: how long a
//! client may take to send a request's headers (which also bounds an idle keep-alive
//! connection) and its body, and how many connections a node and one peer address may
//! hold open.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rpc::client::HTTP2_STREAMS_MAX;
use rpc::worker::ErrorJson;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::sync::watch;

pub use crate::api_error::ApiError;
use crate::config::ConnectionLimits;
use crate::connection::ConnectionRules;
use crate::connection::ConnectionService;
use crate::connection::ListenerRules;
use crate::hyper_errors::JsonErrorIo;
use crate::idle::Activity;
use crate::tls::Listener;
use crate::tls::NodeTls;
use crate::tls::PeerCertificate;

/// Deadline for a client to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Deadline for a client to send the body of a worker or admin request (at most the
/// body limit, 1 MiB by default); a body still arriving then gets 408 and the
/// connection closes.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may go without a request in progress (HTTP/1.1 keep-alive or
/// HTTP/2 alike, and one that never says which it speaks) before the node closes it.
pub const CONNECTION_IDLE_TIMEOUT: Duration = HEADER_READ_TIMEOUT;

/// Looks at a connection's requests per [`CONNECTION_IDLE_TIMEOUT`]: it is closed after
/// this many quiet looks in a row, so between the timeout and a quarter more after its
/// last request.
const IDLE_LOOKS: u32 = 4;

/// After answering 413 early, how much more of the body the node reads and throws away,
/// so that a client that sends its whole body before reading (Python's `urllib`, for
/// one) reads the answer instead of a reset connection. A larger body is not waited for.
pub const LINGER_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// How long one lingering read may take.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections lingering at once on one node; beyond this, an oversized body's
/// connection is closed at once, so that lingering never starves the workers.
pub const LINGERING_MAX: usize = 32;

/// Counts open connections against [`ConnectionLimits`].
struct ConnectionGate {
    limits: ConnectionLimits,
    open: Mutex<HashMap<IpAddr, usize>>,
    total: Mutex<usize>,
}

/// One admitted connection; dropping it frees its place.
struct Admitted {
    gate: Arc<ConnectionGate>,
    peer: IpAddr,
}

impl ConnectionGate {
    fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::new(HashMap::new()),
            total: Mutex::new(0),
        })
    }

    /// A place for a connection from `peer`, or why there is none.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, String> {
        let mut total = self.total.lock().unwrap_or_else(|p| p.into_inner());
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if *total >= self.limits.total {
            return Err(format!(
                "this node holds its limit of {} connections; retry shortly or use another node",
                self.limits.total
            ));
        }
        let from_peer = open.entry(peer).or_default();
        if *from_peer >= self.limits.per_peer {
            return Err(format!(
                "{peer} holds its limit of {} connections to this node; reuse connections or close idle ones",
                self.limits.per_peer
            ));
        }
        *from_peer += 1;
        *total += 1;
        Ok(Admitted {
            gate: Arc::clone(self),
            peer,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut total = self.gate.total.lock().unwrap_or_else(|p| p.into_inner());
        let mut open = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        *total = total.saturating_sub(1);
        if let Some(from_peer) = open.get_mut(&self.peer) {
            *from_peer -= 1;
            if *from_peer == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// Answers a connection over the limits with a 503 and closes it, without waiting long
/// for a client that does not read.
async fn refuse_connection(mut stream: TcpStream, reason: String) {
    let body = serde_json::to_string(&ErrorJson { error: reason }).unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
}

/// TLS for a listener: the node's configurations and which listener this is.
pub type ListenerTls = Option<(Arc<NodeTls>, Listener)>;

/// Serves `router` on `listener` until `shutdown` turns true, holding at most `limits`
/// connections open, over TLS when `tls` is given (a client that does not finish its
/// handshake within [`HEADER_READ_TIMEOUT`] is cut off), and holding every request to
/// `rules` before routing it: each connection sending at most so many requests a second,
/// and each HTTP/1.1 request carrying exactly one Host header (RFC 9112, section 3.2) if
/// asked.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
    limits: ConnectionLimits,
    tls: ListenerTls,
    rules: ListenerRules,
) {
    let gate = ConnectionGate::new(limits);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let admitted = match gate.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(reason) => {
                tracing::debug!(%peer, %reason, "connection refused");
                if tls.is_none() {
                    tokio::spawn(refuse_connection(stream, reason));
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let rules = ConnectionRules::for_connection(&rules);
        let router = router.clone();
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _admitted = admitted;
            let Some((tls, listener)) = tls else {
                serve_connection(stream, router, rules, shutdown, peer).await;
                return;
            };
            let acceptor = tls.acceptor(listener);
            let stream =
                match tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake not finished in time");
                        return;
                    }
                };
            let certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| Arc::new(cert.clone().into_owned()));
            let rules = ConnectionRules {
                peer_certificate: Some(PeerCertificate(certificate)),
                ..rules
            };
            serve_connection(stream, router, rules, shutdown, peer).await;
        });
    }
}

/// Serves HTTP/1.1 on one accepted connection until it ends or `shutdown` turns true.
async fn serve_connection<S>(
    stream: S,
    router: Router,
    rules: ConnectionRules,
    mut shutdown: watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let activity = Activity::new();
    let service = ConnectionService::new(
        TowerToHyperService::new(router),
        Arc::clone(&activity),
        rules,
    );
    let mut builder = hyper_util::server::conn::auto::Builder::new(rpc::client::TaskExecutor);
    builder
        .http1()
        .timer(crate::runtime::HyperTimer)
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    builder
        .http2()
        .timer(crate::runtime::HyperTimer)
        .max_concurrent_streams(HTTP2_STREAMS_MAX);
    let connection = builder.serve_connection(TokioIo::new(JsonErrorIo::new(stream)), service);
    tokio::pin!(connection);
    let mut last = activity.look();
    let mut quiet_looks = 0;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep(CONNECTION_IDLE_TIMEOUT / IDLE_LOOKS) => {
                let now = activity.look();
                quiet_looks = if now.quiet_since(last) { quiet_looks + 1 } else { 0 };
                last = now;
                if quiet_looks >= IDLE_LOOKS {
                    tracing::debug!(%peer, "closing an idle connection");
                    break;
                }
            }
        }
    }
    connection.as_mut().graceful_shutdown();
    // An HTTP/2 peer must answer the closing ping before the connection ends; one that
    // never does is cut off.
    let _ = tokio::time::timeout(CONNECTION_IDLE_TIMEOUT, connection).await;
}

/// Reads a request body of at most `limit` bytes within `deadline`.
///
/// A body over the limit gets 413, decided from `Content-Length` before reading when the
/// client sends one; the rest of such a body is read and thrown away first (see
/// [`LINGER_BYTES_MAX`]), unless the client asked `Expect: 100-continue`, in which case
/// it has sent nothing yet and the 413 goes out at once. A body still arriving at the
/// deadline gets 408.
pub async fn read_body(
    headers: &axum::http::HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, ApiError> {
    let mut chunks: Vec<Bytes> = Vec::new();
    stream_body(headers, body, limit as u64, deadline, |data| {
        chunks.push(data);
        Ok(())
    })
    .await?;
    Ok(concat(chunks))
}

/// Like [`read_body`], handing each piece of the body to `consume` as it arrives rather
/// than gathering it, for bodies too large to hold (snapshots, backups). An error from
/// `consume` ends the read with that error; one with status 413 is answered like a body
/// over `limit`.
pub async fn stream_body(
    headers: &axum::http::HeaderMap,
    mut body: Body,
    limit: u64,
    deadline: Duration,
    mut consume: impl FnMut(Bytes) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {limit} bytes; split the request"),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        if !expects_continue(headers) {
            linger(body, declared).await;
        }
        return Err(too_large());
    }
    let mut read = 0u64;
    let collect = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            })?;
            if let Ok(data) = frame.into_data() {
                read += data.len() as u64;
                if read > limit {
                    return Ok(Err(too_large()));
                }
                if let Err(e) = consume(data) {
                    return Ok(Err(e));
                }
            }
        }
        Ok(Ok(()))
    };
    match tokio::time::timeout(deadline, collect).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s; send the whole body at once",
                deadline.as_secs()
            ),
        )),
        Ok(Err(e)) => Err(e),
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(refused))) => {
            // Read and drop what is left, so the client sees the answer (see `linger`).
            if refused.status == StatusCode::PAYLOAD_TOO_LARGE {
                linger(body, None).await;
            }
            Err(refused)
        }
    }
}

/// The chunks of a body as one buffer (without a copy when there is one chunk).
fn concat(mut chunks: Vec<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => chunks.concat().into(),
    }
}

/// Whether the client waits for `100 Continue` before it sends the body.
fn expects_continue(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
}

/// Lingering reads running now, across the node's listeners.
static LINGERING: Semaphore = Semaphore::const_new(LINGERING_MAX);

/// Reads and throws away up to [`LINGER_BYTES_MAX`] more of `body` within
/// [`LINGER_TIMEOUT`], when no more than [`LINGERING_MAX`] others do; `declared` is the
/// body's announced length, if any (a larger one is not waited for).
async fn linger(mut body: Body, declared: Option<u64>) {
    if declared.is_some_and(|len| len > LINGER_BYTES_MAX) {
        return;
    }
    let Ok(_permit) = LINGERING.try_acquire() else {
        return;
    };
    let drain = async {
        let mut thrown_away = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                thrown_away += data.len() as u64;
                if thrown_away > LINGER_BYTES_MAX {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIMEOUT, drain).await;
}

/// The answer to paths no route has.
pub async fn not_found_fallback(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "no such endpoint: {}; the worker API is GET /groups, GET /task/{{id}}, GET /tasks/{{ids}}, GET /group/{{name}}, POST /update and POST /claim; GET /openapi.json lists every endpoint",
        uri.path()
    ))
}

/// The answer to a known path with the wrong method.
pub async fn method_not_allowed_fallback(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}
