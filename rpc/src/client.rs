//! A small HTTP/1.1 client over hyper's connection API with a per-address pool.
//!
//! It is deliberately built on `http1::handshake` over a plain TCP stream rather than on
//! a pooled client that owns its executor and timer: the same code then runs under the
//! simulator, where the stream is simulated. Every call carries a deadline, because
//! hyper without a timer enforces none.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::Full;
use http_body_util::Limited;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::Method;
use hyper::Request;
use hyper::StatusCode;
use hyper::body::Frame;
use hyper::header::HeaderMap;
pub use hyper::header::HeaderName;
pub use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;

use crate::worker::ErrorJson;

/// Re-exported so callers can build requests without depending on hyper themselves.
pub use hyper::Method as HttpMethod;

/// Idle connections kept per address; more are closed after use.
pub const IDLE_PER_ADDRESS_MAX: usize = 32;

/// Requests a node serves at once on one HTTP/2 connection; a client's further requests
/// on it wait on the client's side. It bounds what one connection may hold, as one
/// request does for an HTTP/1.1 connection: at most this many bodies of the body limit.
/// The node's HTTP/2 server sets it (raft-node's `http.rs`), its rate limit counts up to
/// it, and clients that share connections among many callers size their groups by it.
pub const HTTP2_STREAMS_MAX: u32 = 128;

/// Largest response body read by default.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Why a call failed. Only [`ClientError::Status`] proves the server answered.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No TCP connection could be made.
    #[error(
        "cannot connect to {addr}: {source}; check that the node runs and the address is right"
    )]
    Connect {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The deadline passed; the request may or may not have taken effect.
    #[error("{addr} did not answer within {after:?}")]
    Timeout {
        /// The address.
        addr: String,
        /// The deadline.
        after: Duration,
    },
    /// The HTTP exchange failed.
    #[error("HTTP exchange with {addr} failed: {message}")]
    Http {
        /// The address.
        addr: String,
        /// The cause.
        message: String,
    },
    /// The node answered a request in plain HTTP with bytes that are not HTTP: most
    /// likely it serves TLS. Sending again cannot help.
    #[error(
        "HTTP exchange with {addr} failed: {message}; is the node serving TLS? then pass \
         --ca FILE (or set ROTA_CA) with the cluster's CA certificate"
    )]
    NotHttp {
        /// The address.
        addr: String,
        /// What could not be parsed.
        message: String,
    },
    /// The server answered with a non-success status.
    #[error("{addr} answered {status}: {message}")]
    Status {
        /// The address.
        addr: String,
        /// The status.
        status: StatusCode,
        /// The server's `error` message, or the body.
        message: String,
    },
    /// The body could not be encoded or decoded.
    #[error("{addr}: bad body: {message}")]
    Body {
        /// The address.
        addr: String,
        /// The cause.
        message: String,
    },
}

/// A response read whole.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// The outcome of [`HttpClient::download`].
#[derive(Debug)]
pub struct Download {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Bytes handed to the sink.
    pub bytes: u64,
    /// The body of a non-success answer (an error message); empty otherwise.
    pub error_body: Bytes,
}

/// `attempt`'s outcome, or a timeout of `addr` after `timeout`.
async fn within<T>(
    addr: &str,
    timeout: Duration,
    attempt: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| ClientError::Timeout {
            addr: addr.to_string(),
            after: timeout,
        })?
}

/// Largest error message [`HttpClient::download`] and [`HttpClient::open_duplex`] read.
const ERROR_BODY_BYTES_MAX: usize = 64 * 1024;

/// A non-success answer's body (its error message), read whole up to
/// [`ERROR_BODY_BYTES_MAX`].
async fn error_body(body: hyper::body::Incoming, addr: &str) -> Result<Bytes, ClientError> {
    Ok(Limited::new(body, ERROR_BODY_BYTES_MAX)
        .collect()
        .await
        .map_err(|e| ClientError::Http {
            addr: addr.to_string(),
            message: e.to_string(),
        })?
        .to_bytes())
}

impl HttpResponse {
    /// The body as JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self, addr: &str) -> Result<T, ClientError> {
        serde_json::from_slice(&self.body).map_err(|e| ClientError::Body {
            addr: addr.to_string(),
            message: e.to_string(),
        })
    }

    /// `Ok(self)` on 2xx, otherwise [`ClientError::Status`] with the server's message.
    pub fn success(self, addr: &str) -> Result<Self, ClientError> {
        if self.status.is_success() {
            return Ok(self);
        }
        let message = serde_json::from_slice::<ErrorJson>(&self.body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&self.body).into_owned());
        Err(ClientError::Status {
            addr: addr.to_string(),
            status: self.status,
            message,
        })
    }
}

/// A connection ready to send requests.
enum Sender {
    /// HTTP/1.1: one request at a time; pooled while idle.
    One(hyper::client::conn::http1::SendRequest<RequestBody>),
    /// HTTP/2: any number of requests at once; one per address, shared. The token tells
    /// this connection from a later one to the same address.
    Two(
        hyper::client::conn::http2::SendRequest<RequestBody>,
        Arc<()>,
    ),
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::One(_) => "Sender::One",
            Self::Two(..) => "Sender::Two",
        })
    }
}

impl Sender {
    /// Another handle on the same HTTP/2 connection, for another caller; `None` for an
    /// HTTP/1.1 connection, which serves one caller at a time.
    fn another_handle(&self) -> Option<Sender> {
        match self {
            Self::One(_) => None,
            Self::Two(sender, token) => Some(Self::Two(sender.clone(), Arc::clone(token))),
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Self::One(sender) => sender.is_ready(),
            Self::Two(sender, _) => sender.is_ready(),
        }
    }

    async fn send(
        &mut self,
        request: Request<RequestBody>,
    ) -> hyper::Result<hyper::Response<hyper::body::Incoming>> {
        match self {
            Self::One(sender) => {
                sender.ready().await?;
                sender.send_request(request).await
            }
            Self::Two(sender, _) => {
                sender.ready().await?;
                sender.send_request(request).await
            }
        }
    }
}

/// hyper's executor on the workspace's tasks (real tokio, or the simulator's; hyper-util's
/// `TokioExecutor` reaches for real tokio), for HTTP/2's background work and streams.
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskExecutor;

impl<F> hyper::rt::Executor<F> for TaskExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(future);
    }
}

/// A request body: one buffer (sent with a length) or a stream of chunks.
type RequestBody = BoxBody<Bytes, std::io::Error>;

fn request_body(chunks: &[Bytes]) -> RequestBody {
    match chunks {
        [one] => Full::new(one.clone())
            .map_err(|never| match never {})
            .boxed(),
        many => {
            let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = many
                .iter()
                .map(|chunk| Ok(Frame::data(chunk.clone())))
                .collect();
            StreamBody::new(futures_util::stream::iter(frames)).boxed()
        }
    }
}

/// A request body of the chunks sent on a channel, ending when its sender is dropped.
struct ChannelBody(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// An exchange opened by [`HttpClient::open_duplex`]: the answer's head, and its body
/// still arriving.
#[derive(Debug)]
pub struct Duplex {
    /// The answer's headers.
    pub headers: HeaderMap,
    /// The answer's body, read frame by frame as it arrives.
    pub body: DuplexBody,
}

/// The body of a [`Duplex`] answer; it holds the exchange's connection, which ends when
/// the body is dropped.
#[derive(Debug)]
pub struct DuplexBody {
    body: hyper::body::Incoming,
    _connection: Sender,
}

impl hyper::body::Body for DuplexBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }
}

/// Makes a request body of chunks read as the body is sent; see [`HttpClient::send_stream`].
pub type ChunkSource<'a> =
    &'a (dyn Fn() -> Box<dyn Iterator<Item = std::io::Result<Bytes>> + Send + Sync> + Sync);

/// The pooled client; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct HttpClient {
    idle: Arc<Mutex<HashMap<String, Vec<Sender>>>>,
    /// `Authorization` sent with every request that does not set its own.
    authorization: Option<HeaderValue>,
    /// TLS for every connection, when the nodes serve it.
    tls: Option<Arc<crate::tls::ClientTls>>,
    /// Whether to speak HTTP/2 (prior knowledge): one connection per address carries
    /// every concurrent request.
    http2: bool,
    /// Per address, held while an HTTP/2 connection to it is made, so that callers
    /// arriving together share one connection instead of each making their own (one
    /// entry per address ever dialled: a cluster's nodes).
    dialing: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// Given `https://` addresses: without TLS set up, it connects nowhere rather than
    /// send requests (and their token) in plain HTTP.
    https: bool,
}

impl HttpClient {
    /// A client with an empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// This client, sending `token` as a bearer token with every request (`None`: no
    /// token); refused if the token cannot be a header value.
    pub fn with_token(mut self, token: Option<&str>) -> Result<Self, String> {
        self.authorization = match token.map(str::trim).filter(|t| !t.is_empty()) {
            None => None,
            Some(token) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| "the token has characters a header cannot carry".to_string())?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(self)
    }

    /// This client, speaking TLS with `tls` on every connection (`None`: plain HTTP).
    pub fn with_tls(mut self, tls: Option<Arc<crate::tls::ClientTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// This client, told that its addresses were given as `https://` URLs: until TLS is
    /// set up ([`HttpClient::with_tls`]) it refuses to connect (see
    /// [`HttpClient::plain_http_refused`]).
    pub fn for_https(mut self, https: bool) -> Self {
        self.https = https;
        self
    }

    /// Whether [`HttpClient::for_https`] said its addresses are `https://` URLs.
    pub fn is_for_https(&self) -> bool {
        self.https
    }

    /// Why this client connects nowhere, if it was given `https://` addresses and no
    /// TLS: sending again cannot help.
    pub fn plain_http_refused(&self, addr: &str) -> Option<ClientError> {
        (self.https && self.tls.is_none()).then(|| ClientError::Connect {
            addr: addr.to_string(),
            source: std::io::Error::other(
                "the address is an https:// URL but this client has no TLS set up: give it \
                 the cluster's CA certificate (with_tls, --ca or ROTA_CA); requests and \
                 their token are not sent in plain HTTP",
            ),
        })
    }

    /// This client, speaking HTTP/2 to every node (one shared connection per address)
    /// instead of HTTP/1.1 (a connection per request in flight).
    pub fn with_http2(mut self, http2: bool) -> Self {
        self.http2 = http2;
        self
    }

    /// Whether this client speaks HTTP/2 (else HTTP/1.1).
    pub fn speaks_http2(&self) -> bool {
        self.http2
    }

    /// Adds this client's `Authorization` to `builder` unless `headers` set one.
    fn authorize(
        &self,
        builder: hyper::http::request::Builder,
        headers: &[(HeaderName, HeaderValue)],
    ) -> hyper::http::request::Builder {
        match &self.authorization {
            Some(value)
                if !headers
                    .iter()
                    .any(|(name, _)| name == hyper::header::AUTHORIZATION) =>
            {
                builder.header(hyper::header::AUTHORIZATION, value.clone())
            }
            _ => builder,
        }
    }

    fn take_idle(&self, addr: &str) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let senders = idle.get_mut(addr)?;
        while let Some(sender) = senders.pop() {
            if !sender.is_ready() {
                continue;
            }
            if let Some(handle) = sender.another_handle() {
                // Shared, not taken: it stays for every other caller.
                senders.push(sender);
                return Some(handle);
            }
            return Some(sender);
        }
        None
    }

    fn put_idle(&self, addr: &str, sender: Sender) {
        if let Sender::Two(..) = sender {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let senders = idle.entry(addr.to_string()).or_default();
        if senders.len() < IDLE_PER_ADDRESS_MAX {
            senders.push(sender);
        }
    }

    /// Drops the shared HTTP/2 connection to `addr` that failed (`token`), so that the
    /// next caller makes a new one; a newer connection another caller made meanwhile
    /// stays.
    fn forget_shared(&self, addr: &str, token: Option<&Arc<()>>) {
        let Some(token) = token else {
            return;
        };
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let failed = idle.get(addr).is_some_and(|senders| {
            senders
                .iter()
                .any(|s| matches!(s, Sender::Two(_, t) if Arc::ptr_eq(t, token)))
        });
        if failed {
            idle.remove(addr);
        }
    }

    /// A connection to `addr`: for HTTP/2 the shared one if another caller made it
    /// meanwhile, else a new one.
    async fn shared_or_new(&self, addr: &str) -> Result<Sender, ClientError> {
        if !self.http2 {
            return self.connect(addr).await;
        }
        let lock = {
            let mut dialing = self.dialing.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(dialing.entry(addr.to_string()).or_default())
        };
        let _dialing = lock.lock().await;
        if let Some(shared) = self.take_idle(addr) {
            return Ok(shared);
        }
        let sender = self.connect(addr).await?;
        self.share(addr, &sender);
        Ok(sender)
    }

    /// The request target: the path for HTTP/1.1, the whole URI for HTTP/2, whose
    /// requests must name their scheme and authority.
    fn uri(&self, addr: &str, path_and_query: &str) -> String {
        let scheme = match (self.http2, self.tls.is_some()) {
            (false, _) => return path_and_query.to_string(),
            (true, false) => "http://",
            (true, true) => "https://",
        };
        // Joined, not formatted: this runs for every request, and `format!` cost a
        // client 2% of its instructions here (docs/performance.md, session 37).
        [scheme, addr, path_and_query].concat()
    }

    /// Shares a new HTTP/2 connection with every later caller, in place of a closed one
    /// (a download's connection of its own is not shared).
    fn share(&self, addr: &str, sender: &Sender) {
        if let Some(handle) = sender.another_handle() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.insert(addr.to_string(), vec![handle]);
        }
    }

    async fn connect(&self, addr: &str) -> Result<Sender, ClientError> {
        if let Some(refused) = self.plain_http_refused(addr) {
            return Err(refused);
        }
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        // Small request/response pairs: waiting to coalesce only adds latency.
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => self.handshake(addr, stream).await,
            Some(tls) => {
                let name = crate::tls::server_name(addr).map_err(|e| ClientError::Connect {
                    addr: addr.to_string(),
                    source: std::io::Error::other(e.to_string()),
                })?;
                let stream = tls.connector().connect(name, stream).await.map_err(|e| {
                    ClientError::Connect {
                        addr: addr.to_string(),
                        source: std::io::Error::other(format!(
                            "TLS handshake: {e}; check --ca (ROTA_CA) and that the node serves TLS"
                        )),
                    }
                })?;
                self.handshake(addr, stream).await
            }
        }
    }

    /// An HTTP/1.1 or HTTP/2 connection over `stream`, its driver spawned.
    async fn handshake<S>(&self, addr: &str, stream: S) -> Result<Sender, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let http_error = |e: hyper::Error| ClientError::Http {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let io = TokioIo::new(stream);
        let sender = if self.http2 {
            let (sender, connection) = hyper::client::conn::http2::handshake(TaskExecutor, io)
                .await
                .map_err(http_error)?;
            // Ends when the peer closes or every sender is dropped.
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Sender::Two(sender, Arc::new(()))
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(http_error)?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Sender::One(sender)
        };
        Ok(sender)
    }

    async fn exchange(
        &self,
        addr: &str,
        mut sender: Sender,
        request: Request<RequestBody>,
        body_max: usize,
    ) -> Result<HttpResponse, ClientError> {
        let http_error = |e: &dyn std::fmt::Display| ClientError::Http {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let response = sender.send(request).await.map_err(|e| {
            // A TLS port answers a request in plain HTTP with bytes hyper cannot parse
            // ("invalid HTTP version parsed").
            if self.tls.is_none() && e.is_parse() {
                ClientError::NotHttp {
                    addr: addr.to_string(),
                    message: e.to_string(),
                }
            } else {
                http_error(&e)
            }
        })?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, body_max)
            .collect()
            .await
            .map_err(|e| http_error(&e))?
            .to_bytes();
        self.put_idle(addr, sender);
        Ok(HttpResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Sends one request and reads the whole response within `timeout`.
    ///
    /// A pooled connection that the peer closed meanwhile is retried once on a fresh
    /// connection; callers whose requests must not apply twice send a request id.
    pub async fn send(
        &self,
        addr: &str,
        method: Method,
        path_and_query: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        timeout: Duration,
    ) -> Result<HttpResponse, ClientError> {
        self.send_chunks(addr, method, path_and_query, headers, &[body], timeout)
            .await
    }

    /// Like [`Self::send`], with the body streamed chunk by chunk (chunked transfer
    /// encoding), so a large body is never copied into one buffer.
    pub async fn send_chunks(
        &self,
        addr: &str,
        method: Method,
        path_and_query: &str,
        headers: &[(HeaderName, HeaderValue)],
        chunks: &[Bytes],
        timeout: Duration,
    ) -> Result<HttpResponse, ClientError> {
        let body = || request_body(chunks);
        self.send_body(addr, method, path_and_query, headers, &body, timeout)
            .await
    }

    /// `GET path_and_query` from `addr` on a fresh connection, handing the body to `sink`
    /// piece by piece as it arrives, so a download of any size (a backup) never sits
    /// whole in memory; more than `body_max` bytes is an error. A non-success answer is
    /// an error message: it comes back whole in [`Download::error_body`] and `sink` sees
    /// nothing. `timeout` bounds the whole download.
    pub async fn download(
        &self,
        addr: &str,
        path_and_query: &str,
        timeout: Duration,
        body_max: u64,
        sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send),
    ) -> Result<Download, ClientError> {
        let http_error = |e: &dyn std::fmt::Display| ClientError::Http {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let attempt = async {
            let mut sender = self.connect(addr).await?;
            let builder = Request::builder()
                .method(Method::GET)
                .uri(self.uri(addr, path_and_query))
                .header(hyper::header::HOST, addr);
            let request = self
                .authorize(builder, &[])
                .body(request_body(&[Bytes::new()]))
                .map_err(|e| http_error(&e))?;
            let response = sender.send(request).await.map_err(|e| http_error(&e))?;
            let (parts, mut body) = response.into_parts();
            if !parts.status.is_success() {
                let error_body = error_body(body, addr).await?;
                return Ok(Download {
                    status: parts.status,
                    headers: parts.headers,
                    bytes: 0,
                    error_body,
                });
            }
            let mut bytes = 0u64;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| http_error(&e))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                bytes += data.len() as u64;
                if bytes > body_max {
                    return Err(http_error(&format!(
                        "the answer is larger than {body_max} bytes"
                    )));
                }
                sink(&data).map_err(|e| ClientError::Body {
                    addr: addr.to_string(),
                    message: format!("storing the answer: {e}"),
                })?;
            }
            Ok(Download {
                status: parts.status,
                headers: parts.headers,
                bytes,
                error_body: Bytes::new(),
            })
        };
        within(addr, timeout, attempt).await
    }

    /// Opens a request whose body and answer both stream at once, on an HTTP/2
    /// connection of its own (whatever this client speaks otherwise): a long-lived
    /// exchange, such as Raft replication, where each side sends as it goes. The body is
    /// whatever arrives on `body` until its sender is dropped. Returns once the answer's
    /// head arrives, within `timeout`: `Ok(Err(answer))` is a non-success answer, read
    /// whole (at most 64 KiB). The connection ends with the exchange.
    pub async fn open_duplex(
        &self,
        addr: &str,
        path_and_query: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
        timeout: Duration,
    ) -> Result<Result<Duplex, HttpResponse>, ClientError> {
        let http_error = |e: &dyn std::fmt::Display| ClientError::Http {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let attempt = async {
            let two = self.clone().with_http2(true);
            let mut sender = two.connect(addr).await?;
            let mut builder = Request::builder()
                .method(Method::POST)
                .uri(two.uri(addr, path_and_query))
                .header(hyper::header::HOST, addr);
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            let request = self
                .authorize(builder, headers)
                .body(ChannelBody(body).boxed())
                .map_err(|e| http_error(&e))?;
            let response = sender.send(request).await.map_err(|e| http_error(&e))?;
            let (parts, body) = response.into_parts();
            if !parts.status.is_success() {
                let error_body = error_body(body, addr).await?;
                return Ok(Err(HttpResponse {
                    status: parts.status,
                    headers: parts.headers,
                    body: error_body,
                }));
            }
            Ok(Ok(Duplex {
                headers: parts.headers,
                body: DuplexBody {
                    body,
                    _connection: sender,
                },
            }))
        };
        within(addr, timeout, attempt).await
    }

    /// Like [`Self::send_chunks`], with each chunk made only when the body reaches it
    /// (read from a file, say), so not even the chunks are all in memory at once.
    /// `source` is called again if a pooled connection fails before the request is sent.
    /// A chunk that fails to read ends the request with a body error.
    pub async fn send_stream(
        &self,
        addr: &str,
        method: Method,
        path_and_query: &str,
        headers: &[(HeaderName, HeaderValue)],
        source: ChunkSource<'_>,
        timeout: Duration,
    ) -> Result<HttpResponse, ClientError> {
        let body = || -> RequestBody {
            let frames = source().map(|chunk| chunk.map(Frame::data));
            StreamBody::new(futures_util::stream::iter(frames)).boxed()
        };
        self.send_body(addr, method, path_and_query, headers, &body, timeout)
            .await
    }

    async fn send_body(
        &self,
        addr: &str,
        method: Method,
        path_and_query: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: &(dyn Fn() -> RequestBody + Sync),
        timeout: Duration,
    ) -> Result<HttpResponse, ClientError> {
        let build = || {
            let mut builder = Request::builder()
                .method(method.clone())
                .uri(self.uri(addr, path_and_query));
            // HTTP/2 names the host in the URI (`:authority`): a Host header beside it
            // is redundant (RFC 9113, 8.3.1) and costs both ends a header per request.
            if !self.http2 {
                builder = builder.header(hyper::header::HOST, addr);
            }
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            self.authorize(builder, headers)
                .body(body())
                .map_err(|e| ClientError::Body {
                    addr: addr.to_string(),
                    message: e.to_string(),
                })
        };
        // The shared HTTP/2 connection in use, to forget if it fails or hangs.
        let in_use: Mutex<Option<Arc<()>>> = Mutex::new(None);
        let using = |sender: &Sender| {
            if let Sender::Two(_, token) = sender {
                *in_use.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(token));
            }
        };
        let attempt = async {
            if let Some(sender) = self.take_idle(addr) {
                using(&sender);
                match self
                    .exchange(addr, sender, build()?, RESPONSE_BYTES_MAX)
                    .await
                {
                    Ok(response) => return Ok(response),
                    Err(ClientError::Http { .. } | ClientError::NotHttp { .. }) => {
                        let failed = in_use.lock().unwrap_or_else(|p| p.into_inner()).take();
                        self.forget_shared(addr, failed.as_ref());
                    }
                    Err(other) => return Err(other),
                }
            }
            // Boxed: dialing (TCP, TLS, the HTTP handshake) is a future of several KiB,
            // which would otherwise be part of this one and be copied with it on every
            // request, although a request seldom dials.
            let sender = Box::pin(self.shared_or_new(addr)).await?;
            using(&sender);
            self.exchange(addr, sender, build()?, RESPONSE_BYTES_MAX)
                .await
        };
        // Boxed: the attempt holds hyper's request future, and every caller's future
        // (the retries, the waits, the worker's loop) would otherwise hold it too and copy
        // its kilobytes at each await on the way down.
        let result = Box::pin(within(addr, timeout, attempt)).await;
        if let Err(ClientError::Timeout { .. }) = result {
            // The peer may be gone without a word (a partition): the next call dials anew
            // rather than queueing behind a connection that answers nothing.
            let hung = in_use.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.forget_shared(addr, hung.as_ref());
        }
        result
    }

    /// `GET path` within `timeout`.
    pub async fn get(
        &self,
        addr: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<HttpResponse, ClientError> {
        self.send(addr, Method::GET, path, &[], Bytes::new(), timeout)
            .await
    }

    /// `POST path` with a JSON body within `timeout`.
    pub async fn post_json<T: Serialize>(
        &self,
        addr: &str,
        path: &str,
        body: &T,
        timeout: Duration,
    ) -> Result<HttpResponse, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Body {
            addr: addr.to_string(),
            message: e.to_string(),
        })?;
        let content_type = (
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        self.send(
            addr,
            Method::POST,
            path,
            &[content_type],
            bytes.into(),
            timeout,
        )
        .await
    }
}

/// A node's `host:port` from `host:port` or `http://host:port/`, as users write them.
pub fn node_address(url: &str) -> String {
    url.trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string()
}

/// What is wrong with `addr` (as [`node_address`] gives it), if it is not `host`,
/// `host:port` or `[v6]:port` with a port from 1 to 65535.
pub fn address_problem(addr: &str) -> Option<String> {
    if addr.contains("://") {
        return Some("a node address is host:port, http://host:port or https://host:port".into());
    }
    if addr.contains('/') {
        return Some("a node address has no path".into());
    }
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Some("an IPv6 address opened with [ is not closed with ]".into());
        };
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Some("after [host] comes :port or nothing".into()),
        }
    } else if addr.matches(':').count() > 1 {
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Some("not host:port (an IPv6 address with a port goes in [brackets])".into());
        }
        (addr, None)
    } else {
        match addr.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (addr, None),
        }
    };
    if host.is_empty() {
        return Some("no host".into());
    }
    match port.map(|p| (p, p.parse::<u16>())) {
        Some((p, Ok(0) | Err(_))) => Some(format!("the port {p:?} is not from 1 to 65535")),
        _ => None,
    }
}

/// `text` percent-encoded for a query value or path segment (every byte but the
/// unreserved ones).
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn node_addresses_that_cannot_be_dialled_are_named() {
        for good in ["h", "h:1", "127.0.0.1:7001", "[::1]:7001", "[::1]", "::1"] {
            assert_eq!(address_problem(good), None, "{good}");
        }
        for bad in [
            "ftp://h:1",
            "[::1",
            "[::1]x",
            "h:99999",
            "h:0",
            ":7001",
            "h:7o01",
            "h:1:2",
            "h:",
            "h:1/x",
        ] {
            assert!(address_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(
            address_problem(&node_address("HTTP://h:1")),
            Some("a node address is host:port, http://host:port or https://host:port".into())
        );
    }

    /// A node that answers whatever it is sent as a TLS server answers bytes that are
    /// no handshake: an alert, once the request's first bytes came.
    pub(crate) async fn tls_only_node() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut first = [0u8; 64];
                    let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut first).await;
                    let _ = tokio::io::AsyncWriteExt::write_all(
                        &mut stream,
                        &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32],
                    )
                    .await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn plain_http_to_a_tls_port_says_that_a_ca_may_be_missing() {
        let addr = tls_only_node().await;
        let error = HttpClient::new()
            .get(&addr, "/groups", Duration::from_secs(5))
            .await
            .expect_err("no HTTP answer");
        let message = error.to_string();
        assert!(message.contains("is the node serving TLS"), "{message}");
        assert!(message.contains("--ca"), "{message}");
    }
}
