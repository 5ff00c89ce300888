//! Raft between nodes over HTTP: versioned bincode bodies (store-sm's codec) posted to
//! the peer's Raft listener, every call bounded by a deadline.
//!
//! Deadlines: AppendEntries and votes get [`RaftTiming::rpc_timeout`] (ten heartbeats,
//! far above the worst fsync seen here, 8 ms, plus a round trip) rather than openraft's
//! per-RPC `soft_ttl`, which is one heartbeat and collapses when a follower's fsync is
//! slow; a whole snapshot gets [`RaftTiming::snapshot_timeout`].

use std::future::Future;
use std::future::Ready;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::Stream;
use futures_util::StreamExt;
use futures_util::stream::Chain;
use futures_util::stream::Once;
use futures_util::stream::Peekable;
use hyper::Method;
use hyper::header::CONTENT_TYPE;
use hyper::header::HeaderName;
use hyper::header::HeaderValue;
use openraft::OptionalSend;
use openraft::base::BoxFuture;
use openraft::base::BoxStream;
use openraft::error::NetworkError;
use openraft::error::RPCError;
use openraft::error::RaftError;
use openraft::error::ReplicationClosed;
use openraft::error::StreamingError;
use openraft::error::Unreachable;
use openraft::network::RPCOption;
use openraft::network::RaftNetworkFactory;
use openraft::network::stream_append_sequential;
use openraft::network::v2::RaftNetworkV2;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::StreamAppendResult;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::TransferLeaderResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use rpc::client::ClientError;
use rpc::client::HttpClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use store_sm::codec::decode_value;
use store_sm::codec::encode_value;
use store_sm::log_stats::LatencyHistogram;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;
use store_sm::raft_types::RotaSnapshot;
use store_sm::raft_types::RotaVote;
use store_sm::raft_types::SnapshotData;
use store_sm::snapshot_data::SnapshotSpool;

use crate::append_stream;
use crate::append_stream::Exchange;
use crate::clock::LogClock;
use crate::config::RaftTiming;
use crate::log_forms::FORM_BEFORE_HEADER;
use crate::log_forms::PeerLogForms;
use crate::types::NodeTypes;

/// Paths of the Raft endpoints on a node's Raft listener.
pub mod paths {
    /// AppendEntries.
    pub const APPEND: &str = "/raft/append";
    /// RequestVote.
    pub const VOTE: &str = "/raft/vote";
    /// Pre-vote.
    pub const PRE_VOTE: &str = "/raft/pre-vote";
    /// Whole snapshot.
    pub const SNAPSHOT: &str = "/raft/snapshot";
    /// Leadership transfer.
    pub const TRANSFER_LEADER: &str = "/raft/transfer-leader";
    /// The node's estimate of log time, which a new leader may catch up to.
    pub const CLOCK_ESTIMATE: &str = "/raft/clock-estimate";
    /// Tells a node it was removed from the cluster (it hears of it no other way).
    pub const REMOVED: &str = "/raft/removed";
    /// The replication exchange (see `crate::append_stream`).
    pub const APPEND_STREAM: &str = "/raft/append-stream";
}

/// The media type of Raft bodies.
pub const RAFT_CONTENT_TYPE: &str = "application/x-rota-raft";

/// The header of an append that carries the sender's log time: a follower moves its
/// clock forward to it (never back) once the append is accepted, so that its time is the
/// leader's even when no command was stamped lately (an idle cluster, a node that caught
/// up on old entries), and a follower that becomes leader continues from it.
pub const RAFT_LOG_TIME_HEADER: &str = "x-rota-log-time";

/// The header of a Raft answer that names the newest log entry form its sender reads
/// (see `crate::log_forms`).
pub const LOG_FORMS_HEADER: &str = "x-rota-log-forms";

/// The form a Raft answer's headers announce: [`FORM_BEFORE_HEADER`] without the header
/// or with one that is not a number.
pub fn announced_forms(headers: &hyper::HeaderMap) -> u32 {
    headers
        .get(LOG_FORMS_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or(FORM_BEFORE_HEADER)
}

/// The forms a Raft answer says its node reads: any answer names them, a refusal too
/// (an older build refusing an entry it cannot read, which sends no header: form 1, as
/// does one without the message's path, 404). Not a 421, which comes from another node
/// at that address, nor a 5xx without the header, which may come from a layer before
/// the node's own (a connection limit) or from something in between.
pub fn forms_answered(response: &rpc::client::HttpResponse) -> Option<u32> {
    let status = response.status.as_u16();
    let named = response.headers.contains_key(LOG_FORMS_HEADER);
    if status == 421 || (status >= 500 && !named) {
        return None;
    }
    Some(announced_forms(&response.headers))
}

/// The header naming the node a Raft message is for. A receiver with another id refuses
/// the message: otherwise a member registered at another member's Raft address (a
/// typo in `add-learner`) would be answered for by that node, and count twice toward
/// every majority.
pub const RAFT_TARGET_HEADER: &str = "x-rota-raft-target";

/// What precedes a snapshot's bytes on the wire.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct SnapshotHead {
    /// The sender's vote.
    pub vote: RotaVote,
    /// Metadata of the snapshot.
    pub meta: store_sm::raft_types::RotaSnapshotMeta,
}

/// Largest encoded [`SnapshotHead`] a receiver accepts (a vote and a membership).
pub const SNAPSHOT_HEAD_BYTES_MAX: usize = 16 * 1024 * 1024;

/// A snapshot transfer's body, a chunk at a time as it is sent: the head's length (u32
/// LE), the head (a codec value), then the snapshot's bytes, read from wherever they are
/// (a file on disk, in the daemon) only as the body reaches them.
pub fn snapshot_body(
    head: &SnapshotHead,
    data: &SnapshotData,
) -> std::io::Result<impl Iterator<Item = std::io::Result<Bytes>> + Send + Sync + 'static> {
    let head = encode_value(head)?;
    let head_len =
        u32::try_from(head.len()).map_err(|_| std::io::Error::other("snapshot head too large"))?;
    let mut first = head_len.to_le_bytes().to_vec();
    first.extend_from_slice(&head);
    Ok(std::iter::once(Ok(Bytes::from(first))).chain(data.chunks()))
}

/// Takes a body made by [`snapshot_body`] apart as it arrives: the head into memory, the
/// snapshot's bytes into a spool (a file, in the daemon).
pub struct SnapshotReceiver {
    head: Vec<u8>,
    head_len: Option<usize>,
    spool: SnapshotSpool,
}

impl SnapshotReceiver {
    /// A receiver writing the snapshot's bytes to `spool`.
    pub fn new(spool: SnapshotSpool) -> Self {
        Self {
            head: Vec::new(),
            head_len: None,
            spool,
        }
    }

    /// Takes the next piece of the body.
    pub fn push(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        if self.head_len.is_none() {
            let take = (4 - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if let Ok(len_bytes) = <[u8; 4]>::try_from(self.head.as_slice()) {
                let len = u32::from_le_bytes(len_bytes) as usize;
                if len > SNAPSHOT_HEAD_BYTES_MAX {
                    return Err(invalid(format!(
                        "snapshot head of {len} bytes is over the {SNAPSHOT_HEAD_BYTES_MAX} limit"
                    )));
                }
                self.head.clear();
                self.head_len = Some(len);
            }
        }
        if let Some(len) = self.head_len {
            let take = (len - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if !bytes.is_empty() {
            self.spool.write(bytes)?;
        }
        Ok(())
    }

    /// The head and the snapshot, once the whole body arrived.
    pub fn finish(self) -> std::io::Result<(SnapshotHead, SnapshotData)> {
        match self.head_len {
            Some(len) if self.head.len() == len => {
                let head: SnapshotHead = decode_value(&self.head, "snapshot head")?;
                Ok((head, self.spool.finish()?))
            }
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "snapshot body shorter than its head",
            )),
        }
    }
}

/// The answers of a replication exchange, in the order of its appends.
type AnswerStream<'s> = BoxStream<'s, Result<StreamAppendResult<NodeTypes>, RPCError<NodeTypes>>>;

/// What a leader's replication measures, for `GET /metrics`.
#[derive(Debug, Default)]
pub struct ReplicationStats {
    /// Appends with entries, from send to answer.
    pub append_latency: LatencyHistogram,
    /// Replication streams opened with followers (see `crate::append_stream`).
    pub streams_opened: AtomicU64,
}

/// Creates a [`PeerClient`] per target; shares one connection pool.
#[derive(Clone, Debug)]
pub struct Network {
    client: HttpClient,
    timing: RaftTiming,
    clock: Arc<LogClock>,
    replication: Arc<ReplicationStats>,
    peer_forms: Arc<PeerLogForms>,
}

impl Network {
    /// A network using `client`'s pool, sending `clock`'s time with every append,
    /// measuring replication in `replication` (each append with entries from send to
    /// answer, the streams opened), and
    /// noting in `peer_forms` the log forms each peer answers with.
    pub fn new(
        client: HttpClient,
        timing: RaftTiming,
        clock: Arc<LogClock>,
        replication: Arc<ReplicationStats>,
        peer_forms: Arc<PeerLogForms>,
    ) -> Self {
        Self {
            client,
            timing,
            clock,
            replication,
            peer_forms,
        }
    }
}

impl RaftNetworkFactory<NodeTypes> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &RotaNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.raft_addr.clone(),
            client: self.client.clone(),
            timing: self.timing.clone(),
            clock: Arc::clone(&self.clock),
            replication: Some(Arc::clone(&self.replication)),
            peer_forms: Some(Arc::clone(&self.peer_forms)),
            plain_appends_until: None,
        }
    }
}

/// Raft RPCs to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    addr: String,
    client: HttpClient,
    timing: RaftTiming,
    clock: Arc<LogClock>,
    /// Where replication is measured; `None` for a client that sends no appends.
    replication: Option<Arc<ReplicationStats>>,
    /// Where the peer's log forms are noted; `None` outside replication.
    peer_forms: Option<Arc<PeerLogForms>>,
    /// Until when appends go one request each, the peer having no append stream.
    plain_appends_until: Option<tokio::time::Instant>,
}

/// A transport failure: peers that cannot take the message get openraft's backoff, the
/// rest are retried at once.
fn transport_error(e: ClientError) -> RPCError<NodeTypes> {
    if backs_off(&e) {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

/// Whether a failed call should wait out openraft's backoff before the next: no
/// connection, or a peer that refused the message itself (another node listens at that
/// address, an older build cannot read the entries, a body over its limit). Retried at once, such a
/// peer costs the leader a warning and a request per append, about ten a second.
fn backs_off(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } => true,
        // Refusals that the same message meets again at once; not a 408 or a 429, which
        // pass.
        ClientError::Status { status, .. } => {
            matches!(status.as_u16(), 400 | 403 | 404 | 413 | 421)
        }
        _ => false,
    }
}

impl PeerClient {
    /// A client of node `target`'s Raft listener at `addr`.
    pub fn to(
        target: NodeId,
        addr: String,
        client: HttpClient,
        timing: RaftTiming,
        clock: Arc<LogClock>,
    ) -> Self {
        Self {
            target,
            addr,
            client,
            timing,
            clock,
            replication: None,
            peer_forms: None,
            plain_appends_until: None,
        }
    }

    /// The peer's estimate of log time (see `crate::clock`), within one RPC deadline.
    pub async fn clock_estimate(&self) -> Result<store_sm::machine::LogTime, ClientError> {
        self.call(paths::CLOCK_ESTIMATE, &(), self.timing.rpc_timeout)
            .await
    }

    /// The newest log entry form the target announces, from its answer to a harmless
    /// message (a request for its clock estimate; see [`forms_answered`]).
    pub async fn announced_log_form(&self) -> Result<u32, ClientError> {
        let body = encode_value(&()).map_err(|e| ClientError::Body {
            addr: self.addr.clone(),
            message: e.to_string(),
        })?;
        let response = self
            .client
            .send_chunks(
                &self.addr,
                Method::POST,
                paths::CLOCK_ESTIMATE,
                &self.headers(),
                &[Bytes::from(body)],
                self.timing.rpc_timeout,
            )
            .await?;
        forms_answered(&response).ok_or_else(|| ClientError::Status {
            addr: self.addr.clone(),
            status: response.status,
            message: "the answer names no log entry form of this node".into(),
        })
    }

    /// Tells the target it was removed from the cluster, whose members serve at
    /// `members` (API addresses).
    pub async fn tell_removed(&self, members: &[String]) -> Result<(), ClientError> {
        self.call(paths::REMOVED, &members, self.timing.rpc_timeout)
            .await
    }

    async fn call<Req, Resp>(
        &self,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, ClientError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let body = encode_value(request).map_err(|e| ClientError::Body {
            addr: self.addr.clone(),
            message: e.to_string(),
        })?;
        self.call_chunks(path, &[Bytes::from(body)], timeout).await
    }

    async fn call_chunks<Resp: DeserializeOwned>(
        &self,
        path: &str,
        chunks: &[Bytes],
        timeout: Duration,
    ) -> Result<Resp, ClientError> {
        // An append, many a second, also carries this node's log time: no allocation.
        let base = self.headers();
        let with_time;
        let headers: &[(HeaderName, HeaderValue)] = if path == paths::APPEND {
            let [content, target] = base;
            let time = HeaderValue::from(self.clock.now().as_millis());
            with_time = [
                content,
                target,
                (HeaderName::from_static(RAFT_LOG_TIME_HEADER), time),
            ];
            &with_time
        } else {
            &base
        };
        let response = self
            .client
            .send_chunks(&self.addr, Method::POST, path, headers, chunks, timeout)
            .await;
        self.answer(response, path)
    }

    /// A Raft message's headers: its body's type and the node it is for.
    fn headers(&self) -> [(HeaderName, HeaderValue); 2] {
        [
            (CONTENT_TYPE, HeaderValue::from_static(RAFT_CONTENT_TYPE)),
            (
                HeaderName::from_static(RAFT_TARGET_HEADER),
                HeaderValue::from(self.target),
            ),
        ]
    }

    /// Notes the log forms a peer's answer names, or that it did not answer.
    fn note_forms(&self, response: Result<&rpc::client::HttpResponse, ()>) {
        let Some(forms) = &self.peer_forms else {
            return;
        };
        match response.ok().and_then(forms_answered) {
            Some(announced) => forms.heard(self.target, announced),
            None => forms.unanswered(self.target),
        }
    }

    /// A peer's answer to a call on `path`, decoded; a failure status is an error.
    fn answer<Resp: DeserializeOwned>(
        &self,
        response: Result<rpc::client::HttpResponse, ClientError>,
        path: &str,
    ) -> Result<Resp, ClientError> {
        self.note_forms(response.as_ref().map_err(|_| ()));
        let response = response?;
        let response = response.success(&self.addr)?;
        decode_value(&response.body, path).map_err(|e| ClientError::Body {
            addr: self.addr.clone(),
            message: e.to_string(),
        })
    }

    async fn call_stream<Resp: DeserializeOwned>(
        &self,
        path: &str,
        source: rpc::client::ChunkSource<'_>,
        timeout: Duration,
    ) -> Result<Resp, ClientError> {
        let headers = self.headers();
        let response = self
            .client
            .send_stream(&self.addr, Method::POST, path, &headers, source, timeout)
            .await;
        self.answer(response, path)
    }

    async fn rpc<Req, Resp>(&self, path: &str, request: &Req) -> Result<Resp, RPCError<NodeTypes>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let result: Result<Resp, RaftError<NodeTypes>> = self
            .call(path, request, self.timing.rpc_timeout)
            .await
            .map_err(transport_error)?;
        // A remote RaftError without an API error is Fatal: the peer has stopped.
        result.map_err(|e| {
            RPCError::Network(NetworkError::new(&std::io::Error::other(format!(
                "node {} failed: {e}",
                self.target
            ))))
        })
    }
}

/// The appends openraft hands [`PeerClient::stream_append`], the first one put back in
/// front of the rest.
type Appends<S> = Chain<Once<Ready<AppendEntriesRequest<NodeTypes>>>, Peekable<S>>;

/// `first`, then the rest of `input`.
fn with_first<S: Stream<Item = AppendEntriesRequest<NodeTypes>>>(
    first: AppendEntriesRequest<NodeTypes>,
    input: Peekable<S>,
) -> Appends<S> {
    futures_util::stream::once(std::future::ready(first)).chain(input)
}

/// How one call of [`PeerClient::stream_append`] sends its appends.
enum Link<'s, S: Stream<Item = AppendEntriesRequest<NodeTypes>> + Unpin> {
    /// Nothing sent yet.
    Start {
        client: &'s mut PeerClient,
        input: Peekable<S>,
        option: RPCOption,
    },
    /// One request per append: a lone append (a heartbeat, a probe), or a peer without
    /// the exchange.
    Plain(AnswerStream<'s>),
    /// The appends in one exchange.
    Streamed(Box<Exchange<Peekable<S>>>),
    /// The exchange could not be opened.
    Failed(RPCError<NodeTypes>),
    Ended,
}

impl<'s, S> Link<'s, S>
where
    S: Stream<Item = AppendEntriesRequest<NodeTypes>> + OptionalSend + Unpin + 'static,
{
    /// The next answer, and the link that gives the ones after it.
    async fn next(
        mut self,
    ) -> Option<(
        Result<StreamAppendResult<NodeTypes>, RPCError<NodeTypes>>,
        Self,
    )> {
        loop {
            self = match self {
                Link::Start {
                    client,
                    mut input,
                    option,
                } => {
                    let first = input.next().await?;
                    client.link_for(first, input, option).await
                }
                Link::Plain(mut answers) => {
                    let answer = answers.next().await?;
                    return Some((answer, Link::Plain(answers)));
                }
                Link::Streamed(mut exchange) => {
                    let answer = exchange.next_answer().await?;
                    return Some((answer, Link::Streamed(exchange)));
                }
                Link::Failed(e) => return Some((Err(e), Link::Ended)),
                Link::Ended => return None,
            };
        }
    }
}

impl PeerClient {
    /// How to send `first` and the rest of `input`: in one exchange, unless `first` is
    /// alone (a heartbeat or a probe: one request, no exchange to open) or the peer has
    /// none.
    async fn link_for<'s, S>(
        &'s mut self,
        first: AppendEntriesRequest<NodeTypes>,
        mut input: Peekable<S>,
        option: RPCOption,
    ) -> Link<'s, S>
    where
        S: Stream<Item = AppendEntriesRequest<NodeTypes>> + OptionalSend + Unpin + 'static,
    {
        let alone = matches!(
            std::pin::Pin::new(&mut input).peek().now_or_never(),
            Some(None)
        );
        let plain = self
            .plain_appends_until
            .is_some_and(|until| tokio::time::Instant::now() < until);
        if alone || plain {
            return self.plain(with_first(first, input), option).await;
        }
        let (body, to_send) = tokio::sync::mpsc::unbounded_channel();
        // The first append goes in the request's body before its answer's head comes:
        // the follower reads it as soon as it takes the exchange, a round trip sooner.
        // A follower without the exchange never reads it, and the plain requests below
        // send it again; after any other failure openraft sends it again, and a follower
        // that had read it meanwhile takes it twice, as Raft allows.
        let mut sent = append_stream::Unanswered::default();
        if let Err(e) = append_stream::send_append(&body, &mut sent, &self.clock, &first) {
            return Link::Failed(RPCError::Network(NetworkError::new(&e)));
        }
        let opened = self
            .client
            .open_duplex(
                &self.addr,
                paths::APPEND_STREAM,
                &self.headers(),
                to_send,
                self.timing.rpc_timeout,
            )
            .await;
        let duplex = match opened {
            Ok(Ok(duplex)) => duplex,
            Ok(Err(refusal)) if refusal.status != hyper::StatusCode::NOT_FOUND => {
                self.note_forms(Ok(&refusal));
                return Link::Failed(match refusal.success(&self.addr) {
                    Err(e) => transport_error(e),
                    Ok(_) => RPCError::Network(NetworkError::new(&std::io::Error::other(
                        "the peer refused the replication stream",
                    ))),
                });
            }
            Err(e @ (ClientError::Connect { .. } | ClientError::Timeout { .. })) => {
                self.note_forms(Err(()));
                return Link::Failed(transport_error(e));
            }
            // No such path, or no HTTP/2 at all (builds before 0b089a3 spoke HTTP/1.1
            // only on the Raft listener): an older build.
            Ok(Err(refusal)) => {
                let why = format!("it answered {}", refusal.status);
                return self
                    .without_exchange(why, with_first(first, input), option)
                    .await;
            }
            Err(e) => {
                return self
                    .without_exchange(e.to_string(), with_first(first, input), option)
                    .await;
            }
        };
        if let Some(forms) = &self.peer_forms {
            forms.heard(self.target, announced_forms(&duplex.headers));
        }
        if let Some(replication) = &self.replication {
            replication.streams_opened.fetch_add(1, Ordering::Relaxed);
        }
        Link::Streamed(Box::new(Exchange::new(
            self.target,
            input,
            append_stream::Opened {
                body,
                answers: duplex.body,
                sent,
            },
            self.timing.rpc_timeout,
            Arc::clone(&self.clock),
            self.replication.clone(),
        )))
    }

    /// `input` sent one request per append, and so for [`append_stream::PLAIN_APPENDS_FOR`]:
    /// the peer cannot take the exchange (`why`). The first append went in the refused
    /// request's body, unread; the plain requests send it and tell what the peer is.
    async fn without_exchange<'s, S>(
        &'s mut self,
        why: String,
        input: Appends<S>,
        option: RPCOption,
    ) -> Link<'s, S>
    where
        S: Stream<Item = AppendEntriesRequest<NodeTypes>> + OptionalSend + Unpin + 'static,
    {
        tracing::info!(
            target = self.target,
            %why,
            "the peer takes no replication stream (an older build?): one request per append"
        );
        self.plain_appends_until =
            Some(tokio::time::Instant::now() + append_stream::PLAIN_APPENDS_FOR);
        self.plain(input, option).await
    }

    /// `input` sent one request per append.
    async fn plain<'s, S>(&'s mut self, input: Appends<S>, option: RPCOption) -> Link<'s, S>
    where
        S: Stream<Item = AppendEntriesRequest<NodeTypes>> + OptionalSend + Unpin + 'static,
    {
        match stream_append_sequential(self, input, option).await {
            Ok(answers) => Link::Plain(answers),
            Err(e) => Link::Failed(e),
        }
    }
}

impl RaftNetworkV2<NodeTypes> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<NodeTypes>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeTypes>, RPCError<NodeTypes>> {
        // Entry-less appends (heartbeats, a new commit index) carry nothing to commit:
        // the histogram is the replication leg of a write's latency.
        let timed = self
            .replication
            .as_ref()
            .filter(|_| !rpc.entries.is_empty());
        let started = std::time::Instant::now();
        let answer = self.rpc(paths::APPEND, &rpc).await;
        if let Some(replication) = timed
            && answer.is_ok()
        {
            replication.append_latency.record(started.elapsed());
        }
        answer
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<AnswerStream<'s>, RPCError<NodeTypes>>>
    where
        S: Stream<Item = AppendEntriesRequest<NodeTypes>> + OptionalSend + Unpin + 'static,
    {
        // Nothing is read from `input` here but in the answers' stream, which openraft
        // polls only while its replication still runs: read here, an append could be
        // built after this node lost the leadership, from the new leader's log.
        let start = Link::Start {
            client: self,
            input: input.peekable(),
            option,
        };
        let answers: AnswerStream<'s> = Box::pin(futures_util::stream::unfold(start, Link::next));
        Box::pin(std::future::ready(Ok(answers)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeTypes>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeTypes>, RPCError<NodeTypes>> {
        self.rpc(paths::VOTE, &rpc).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<NodeTypes>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeTypes>, RPCError<NodeTypes>> {
        self.rpc(paths::PRE_VOTE, &rpc).await
    }

    async fn full_snapshot(
        &mut self,
        vote: RotaVote,
        snapshot: RotaSnapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeTypes>, StreamingError<NodeTypes>> {
        let head = SnapshotHead {
            vote,
            meta: snapshot.meta,
        };
        // Fails early if the head cannot be encoded; the body is made again per attempt.
        drop(
            snapshot_body(&head, &snapshot.snapshot)
                .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?,
        );
        let data = snapshot.snapshot;
        let source = move || -> Box<dyn Iterator<Item = std::io::Result<Bytes>> + Send + Sync> {
            match snapshot_body(&head, &data) {
                Ok(body) => Box::new(body),
                Err(e) => Box::new(std::iter::once(Err(e))),
            }
        };
        let send = self.call_stream::<Result<SnapshotResponse<NodeTypes>, String>>(
            paths::SNAPSHOT,
            &source,
            self.timing.snapshot_timeout,
        );
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => match result {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(remote)) => Err(StreamingError::Network(NetworkError::new(&std::io::Error::other(remote)))),
                Err(e) if backs_off(&e) => Err(StreamingError::Unreachable(Unreachable::new(&e))),
                Err(e) => Err(StreamingError::Network(NetworkError::new(&e))),
            },
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<NodeTypes>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<NodeTypes>, RPCError<NodeTypes>> {
        let result: Result<TransferLeaderResponse<NodeTypes>, String> = self
            .call(paths::TRANSFER_LEADER, &req, self.timing.rpc_timeout)
            .await
            .map_err(transport_error)?;
        result.map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))
    }
}

#[cfg(test)]
mod tests {
    use openraft::vote::RaftLeaderIdExt;
    use store_sm::raft_types::RotaEntry;
    use store_sm::raft_types::RotaLeaderId;
    use store_sm::raft_types::RotaLogId;
    use store_sm::raft_types::RotaSnapshotMeta;
    use store_sm::snapshot_data::SNAPSHOT_CHUNK_BYTES;

    use super::*;

    /// A Raft listener of a build before the replication stream: it answers every
    /// append with success, and 404 to anything else. Counts both. `http1_only`: a build
    /// before HTTP/2 on the Raft listener, which cannot even read the exchange's request.
    async fn older_build_listener(http1_only: bool) -> (String, Arc<AtomicU64>, Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("an address").to_string();
        let appends = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&appends);
        let missing = Arc::clone(&refused);
        let router = axum::Router::new()
            .route(
                paths::APPEND,
                axum::routing::post(move || {
                    counted.fetch_add(1, Ordering::Relaxed);
                    let answer: Result<AppendEntriesResponse<NodeTypes>, RaftError<NodeTypes>> =
                        Ok(AppendEntriesResponse::Success);
                    std::future::ready(encode_value(&answer).expect("encode"))
                }),
            )
            .fallback(move || {
                missing.fetch_add(1, Ordering::Relaxed);
                std::future::ready(hyper::StatusCode::NOT_FOUND)
            });
        if http1_only {
            let unreadable = Arc::clone(&refused);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let service = hyper_util::service::TowerToHyperService::new(router.clone());
                    let refused = Arc::clone(&unreadable);
                    tokio::spawn(async move {
                        let served = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                        if served.is_err() {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            return (addr, appends, refused);
        }
        serve(listener, router);
        (addr, appends, refused)
    }

    /// Serves `router` on `listener` as a Raft listener does (HTTP/1.1 and HTTP/2) until
    /// the test's runtime ends.
    fn serve(listener: tokio::net::TcpListener, router: axum::Router) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        std::mem::forget(stop);
        tokio::spawn(crate::http::serve(
            listener,
            router,
            stopped,
            crate::config::ConnectionLimits {
                total: 16,
                per_peer: 16,
            },
            None,
            crate::connection::ListenerRules::default(),
        ));
    }

    /// A follower's exchange that answers the request's head only once the first append
    /// arrived, then answers each append with its commit index (appends sent in order
    /// carry 1, 2, 3...), or a refusal if one comes out of order.
    async fn head_after_first_append(body: axum::body::Body) -> axum::response::Response {
        let mut appends = append_stream::FrameReader::new(body);
        let first = appends.next().await;
        let answer = |bytes: Bytes, expected: u64| {
            let (_, append): append_stream::AppendFrame =
                decode_value(&bytes, "append").expect("an append");
            let index = append.leader_commit.map(|id| id.index());
            let answer: append_stream::AnswerFrame = match index {
                Some(index) if index == expected => Ok(Ok(append.leader_commit)),
                other => Err(format!("append {expected} came as {other:?}")),
            };
            append_stream::frame(&answer)
        };
        let first = first.ok().flatten().map(|bytes| answer(bytes, 1));
        let rest =
            futures_util::stream::unfold((appends, 2), move |(mut appends, next)| async move {
                match appends.next().await {
                    Ok(Some(bytes)) => Some((answer(bytes, next), (appends, next + 1))),
                    _ => None,
                }
            });
        let answers = futures_util::stream::iter(first).chain(rest);
        axum::response::IntoResponse::into_response(axum::body::Body::from_stream(answers))
    }

    /// An append committing up to index `index`; the first carries an entry.
    fn numbered_append(index: u64) -> AppendEntriesRequest<NodeTypes> {
        let log_id = RotaLogId::new(RotaLeaderId::new_committed(1, 1), index);
        AppendEntriesRequest {
            leader_commit: Some(log_id),
            entries: if index == 1 {
                vec![RotaEntry {
                    log_id,
                    payload: openraft::EntryPayload::Blank,
                }]
            } else {
                Vec::new()
            },
            ..heartbeat()
        }
    }

    #[tokio::test]
    async fn the_first_append_goes_with_the_request_before_the_answers_head() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("an address").to_string();
        serve(
            listener,
            axum::Router::new().route(
                paths::APPEND_STREAM,
                axum::routing::post(head_after_first_append),
            ),
        );
        let replication = Arc::new(ReplicationStats::default());
        let mut client = client_of_node_2(addr, &replication).await;
        let appends_in = futures_util::stream::iter((1..=3).map(numbered_append));
        let answers = answers_of(&mut client, appends_in).await;
        let committed: Vec<_> = answers
            .iter()
            .map(|a| match a {
                Ok(Ok(Some(id))) => Some(id.index()),
                _ => None,
            })
            .collect();
        assert_eq!(
            committed,
            [Some(1), Some(2), Some(3)],
            "once each, in order: {answers:?}"
        );
        assert_eq!(replication.streams_opened.load(Ordering::Relaxed), 1);
        assert_eq!(
            replication.append_latency.snapshot().count,
            1,
            "the one append with entries is timed once"
        );
    }

    /// What a follower's exchange received: each append's previous index, its entries'
    /// indexes and its commit index.
    type Received = Arc<std::sync::Mutex<Vec<(Option<u64>, Vec<u64>, Option<u64>)>>>;

    /// A follower at a new address that records every append of an exchange in
    /// `received` and answers it with success up to its last entry.
    async fn recording_follower() -> (String, Received) {
        recording_follower_of(usize::MAX, Arc::default()).await
    }

    /// [`recording_follower`] that ends each exchange after `appends_max` appends, once
    /// `end` is notified.
    async fn recording_follower_of(
        appends_max: usize,
        end: Arc<tokio::sync::Notify>,
    ) -> (String, Received) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("an address").to_string();
        let received = Received::default();
        let seen = Arc::clone(&received);
        let exchange = move |body: axum::body::Body| {
            let seen = Arc::clone(&seen);
            async move {
                let answers = futures_util::stream::unfold(
                    append_stream::FrameReader::new(body),
                    move |mut appends| {
                        let (seen, end) = (Arc::clone(&seen), Arc::clone(&end));
                        async move {
                            if seen.lock().expect("the record").len() >= appends_max {
                                end.notified().await;
                                return None;
                            }
                            let bytes = appends.next().await.ok().flatten()?;
                            let (_, append): append_stream::AppendFrame =
                                decode_value(&bytes, "append").expect("an append");
                            let last = append.entries.last().map(|e| e.log_id);
                            seen.lock().expect("the record").push((
                                append.prev_log_id.map(|id| id.index()),
                                append.entries.iter().map(|e| e.log_id.index()).collect(),
                                append.leader_commit.map(|id| id.index()),
                            ));
                            let answer: append_stream::AnswerFrame =
                                Ok(Ok(last.or(append.prev_log_id)));
                            Some((append_stream::frame(&answer), appends))
                        }
                    },
                );
                axum::response::IntoResponse::into_response(axum::body::Body::from_stream(answers))
            }
        };
        serve(
            listener,
            axum::Router::new().route(paths::APPEND_STREAM, axum::routing::post(exchange)),
        );
        (addr, received)
    }

    fn log_id(index: u64) -> RotaLogId {
        RotaLogId::new(RotaLeaderId::new_committed(1, 1), index)
    }

    /// An append of entry `entry` (or none) after index `prev`, committing up to `commit`.
    fn append_of(
        prev: Option<u64>,
        entry: Option<u64>,
        commit: Option<u64>,
    ) -> AppendEntriesRequest<NodeTypes> {
        AppendEntriesRequest {
            prev_log_id: prev.map(log_id),
            leader_commit: commit.map(log_id),
            entries: entry
                .map(|index| RotaEntry {
                    log_id: log_id(index),
                    payload: openraft::EntryPayload::Blank,
                })
                .into_iter()
                .collect(),
            ..heartbeat()
        }
    }

    #[tokio::test]
    async fn a_follower_that_ends_the_exchange_while_a_commit_index_is_held_fails_it() {
        let end = Arc::new(tokio::sync::Notify::new());
        let (addr, _) = recording_follower_of(1, Arc::clone(&end)).await;
        let replication = Arc::new(ReplicationStats::default());
        let mut client = client_of_node_2(addr, &replication).await;
        let (more, input, pulled) = appends_to_send();
        more.send(append_of(None, Some(1), None)).expect("send");
        let mut answers = client
            .stream_append(input, RPCOption::new(Duration::from_secs(1)))
            .await
            .expect("a stream");
        let within = Duration::from_secs(10);
        let first = tokio::time::timeout(within, answers.next()).await;
        assert!(
            matches!(first, Ok(Some(Ok(Ok(Some(_)))))),
            "the entry: {first:?}"
        );
        more.send(append_of(Some(1), None, Some(1))).expect("send");
        let end_once_held = async {
            while pulled.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
            // The commit index is held now: the follower ends the exchange meanwhile. (If
            // the hold ended first on a slow machine, the append went unanswered: an
            // error too.)
            end.notify_one();
        };
        let (second, ()) = tokio::time::timeout(within, async {
            futures_util::join!(answers.next(), end_once_held)
        })
        .await
        .expect("the end within 10 s");
        assert!(
            matches!(second, Some(Err(_))),
            "the exchange fails rather than ending with the commit index unsent: {second:?}"
        );
    }

    /// The appends a test hands an exchange, as openraft's request stream would.
    type AppendsIn = std::pin::Pin<Box<dyn Stream<Item = AppendEntriesRequest<NodeTypes>> + Send>>;

    /// Appends as openraft hands them over: what the sender sends, while it is open;
    /// the counter says how many the exchange took.
    fn appends_to_send() -> (
        tokio::sync::mpsc::UnboundedSender<AppendEntriesRequest<NodeTypes>>,
        AppendsIn,
        Arc<AtomicU64>,
    ) {
        let (more, appends) = tokio::sync::mpsc::unbounded_channel();
        let pulled = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&pulled);
        let input = futures_util::stream::unfold(appends, move |mut appends| {
            let counted = Arc::clone(&counted);
            async move {
                let append = appends.recv().await?;
                counted.fetch_add(1, Ordering::SeqCst);
                Some((append, appends))
            }
        });
        (more, Box::pin(input), pulled)
    }

    /// Every answer `client` gets to the appends `input` yields, within 10 s.
    async fn answers_of<S>(
        client: &mut PeerClient,
        input: S,
    ) -> Vec<Result<StreamAppendResult<NodeTypes>, RPCError<NodeTypes>>>
    where
        S: Stream<Item = AppendEntriesRequest<NodeTypes>> + Send + Unpin + 'static,
    {
        tokio::time::timeout(Duration::from_secs(10), async {
            client
                .stream_append(input, RPCOption::new(Duration::from_secs(1)))
                .await
                .expect("a stream")
                .collect()
                .await
        })
        .await
        .expect("the answers within 10 s")
    }

    /// Drives one exchange with the follower at `addr` over the appends `input` yields;
    /// answers the indexes the follower acknowledged.
    async fn exchange_over<S>(addr: String, input: S) -> Vec<Option<u64>>
    where
        S: Stream<Item = AppendEntriesRequest<NodeTypes>> + Send + Unpin + 'static,
    {
        let replication = Arc::new(ReplicationStats::default());
        let mut client = client_of_node_2(addr, &replication).await;
        answers_of(&mut client, input)
            .await
            .into_iter()
            .map(|answer| match answer {
                Ok(Ok(matching)) => matching.map(|id| id.index()),
                other => panic!("an append failed: {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_new_commit_index_rides_with_the_next_entries_when_they_come_in_time() {
        let (addr, received) = recording_follower().await;
        let appends = vec![
            append_of(None, Some(1), None),
            append_of(Some(1), None, Some(1)),
            append_of(Some(1), Some(2), Some(1)),
        ];
        let acknowledged = exchange_over(addr, futures_util::stream::iter(appends)).await;
        assert_eq!(acknowledged, [Some(1), Some(2)]);
        assert_eq!(
            *received.lock().expect("the record"),
            [(None, vec![1], None), (Some(1), vec![2], Some(1))],
            "the append that only told commit 1 never went: the next one carried it"
        );
    }

    #[tokio::test]
    async fn a_new_commit_index_goes_alone_once_the_hold_ends_or_the_appends_do() {
        let (addr, received) = recording_follower().await;
        let (more, input, _) = appends_to_send();
        let driving = tokio::spawn(exchange_over(addr, input));
        more.send(append_of(None, Some(1), None)).expect("send");
        more.send(append_of(Some(1), None, Some(1))).expect("send");
        // Nothing else comes: the held append goes when its hold ends, with the
        // exchange still open.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while received.lock().expect("the record").len() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the held append never went"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // One held when openraft ends the appends goes before the exchange ends.
        more.send(append_of(Some(1), Some(2), Some(1)))
            .expect("send");
        more.send(append_of(Some(2), None, Some(2))).expect("send");
        drop(more);
        let acknowledged = driving.await.expect("the exchange");
        assert_eq!(acknowledged, [Some(1), Some(1), Some(2), Some(2)]);
        assert_eq!(
            *received.lock().expect("the record"),
            [
                (None, vec![1], None),
                (Some(1), vec![], Some(1)),
                (Some(1), vec![2], Some(1)),
                (Some(2), vec![], Some(2)),
            ]
        );
    }

    /// A leader's client of node 2 at `addr`, timing its appends in `replication`.
    async fn client_of_node_2(addr: String, replication: &Arc<ReplicationStats>) -> PeerClient {
        Network::new(
            HttpClient::new(),
            RaftTiming::default(),
            Arc::new(LogClock::new(crate::clock::SystemClock)),
            Arc::clone(replication),
            Arc::new(PeerLogForms::default()),
        )
        .new_client(
            2,
            &RotaNode {
                api_addr: addr.clone(),
                raft_addr: addr,
            },
        )
        .await
    }

    fn heartbeat() -> AppendEntriesRequest<NodeTypes> {
        AppendEntriesRequest {
            vote: RotaVote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_peer_without_the_replication_stream_gets_one_request_per_append() {
        for http1_only in [false, true] {
            peer_of_an_older_build_gets_one_request_per_append(http1_only).await;
        }
    }

    async fn peer_of_an_older_build_gets_one_request_per_append(http1_only: bool) {
        let (addr, appends, refused) = older_build_listener(http1_only).await;
        let replication = Arc::new(ReplicationStats::default());
        let mut client = client_of_node_2(addr, &replication).await;
        for round in 1..=2u64 {
            let appends_in =
                futures_util::stream::iter(vec![heartbeat(), heartbeat(), heartbeat()]);
            let answers: Vec<_> = client
                .stream_append(appends_in, RPCOption::new(Duration::from_secs(1)))
                .await
                .expect("a stream")
                .collect()
                .await;
            assert_eq!(answers.len(), 3, "round {round}: {answers:?}");
            assert!(
                answers.iter().all(|a| matches!(a, Ok(Ok(None)))),
                "round {round}: {answers:?}"
            );
            assert_eq!(appends.load(Ordering::Relaxed), 3 * round);
            // Asked once; the second round remembers the answer.
            assert_eq!(
                refused.load(Ordering::Relaxed),
                1,
                "round {round}, HTTP/1.1 only: {http1_only}"
            );
        }
        assert_eq!(replication.streams_opened.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn peers_that_cannot_take_a_message_get_the_backoff() {
        let status = |code: u16| ClientError::Status {
            addr: "a:1".into(),
            status: hyper::StatusCode::from_u16(code).expect("a status"),
            message: "m".into(),
        };
        assert!(
            backs_off(&status(400)),
            "another node, or an unreadable entry"
        );
        assert!(backs_off(&status(421)), "a message for another node");
        for passing in [408, 429, 503] {
            assert!(
                !backs_off(&status(passing)),
                "{passing}: tried again at once"
            );
        }
        let refused = ClientError::Connect {
            addr: "a:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(backs_off(&refused));
        let slow = ClientError::Timeout {
            addr: "a:1".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert!(!backs_off(&slow));
    }

    #[test]
    fn an_answer_without_the_forms_header_is_an_older_build() {
        let mut headers = hyper::HeaderMap::new();
        assert_eq!(announced_forms(&headers), FORM_BEFORE_HEADER);
        let read = crate::log_forms::LOG_FORMS_READ;
        headers.insert(LOG_FORMS_HEADER, HeaderValue::from(read));
        assert_eq!(announced_forms(&headers), read);
        headers.insert(LOG_FORMS_HEADER, HeaderValue::from_static("x"));
        assert_eq!(announced_forms(&headers), FORM_BEFORE_HEADER);
    }

    #[test]
    fn forms_come_from_the_node_itself_not_from_another_or_a_layer_before_it() {
        let answer = |code: u16, forms: Option<u32>| {
            let mut headers = hyper::HeaderMap::new();
            if let Some(forms) = forms {
                headers.insert(LOG_FORMS_HEADER, HeaderValue::from(forms));
            }
            rpc::client::HttpResponse {
                status: hyper::StatusCode::from_u16(code).expect("a status"),
                headers,
                body: Bytes::new(),
            }
        };
        assert_eq!(forms_answered(&answer(200, Some(3))), Some(3));
        assert_eq!(forms_answered(&answer(200, None)), Some(FORM_BEFORE_HEADER));
        assert_eq!(
            forms_answered(&answer(400, None)),
            Some(FORM_BEFORE_HEADER),
            "an older build refusing an entry"
        );
        assert_eq!(forms_answered(&answer(404, None)), Some(FORM_BEFORE_HEADER));
        assert_eq!(forms_answered(&answer(503, Some(3))), Some(3));
        assert_eq!(forms_answered(&answer(421, Some(3))), None, "another node");
        assert_eq!(
            forms_answered(&answer(503, None)),
            None,
            "a layer before it"
        );
    }

    #[test]
    fn a_snapshot_streams_in_chunks_and_reassembles_piece_by_piece() {
        let bytes: Vec<u8> = (0..(2 * SNAPSHOT_CHUNK_BYTES + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let data = SnapshotData::from(bytes.clone());
        let head = SnapshotHead {
            vote: RotaVote::new_committed(3, 1),
            meta: RotaSnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
            },
        };
        let chunks: Vec<Bytes> = snapshot_body(&head, &data)
            .expect("body")
            .collect::<std::io::Result<_>>()
            .expect("chunks");
        assert_eq!(chunks.len(), 1 + 3, "head, then the data in 1 MiB chunks");
        let body: Vec<u8> = chunks.concat();
        // Arrives in pieces that split the head's length and the head itself.
        let mut receiver = SnapshotReceiver::new(SnapshotSpool::in_memory(u64::MAX));
        for piece in body.chunks(3).take(10).chain(body[30..].chunks(70_001)) {
            receiver.push(piece).expect("push");
        }
        let (back, back_data) = receiver.finish().expect("finish");
        assert_eq!(back.vote, head.vote);
        assert_eq!(&*back_data.load().expect("load"), &bytes[..]);

        let mut short = SnapshotReceiver::new(SnapshotSpool::in_memory(u64::MAX));
        short.push(&body[..6]).expect("push");
        assert!(
            short.finish().is_err(),
            "a body cut inside its head is refused"
        );
        let mut limited = SnapshotReceiver::new(SnapshotSpool::in_memory(1000));
        let err = limited.push(&body[..5000]).expect_err("over the limit");
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
    }
}
