//! Raft between nodes over HTTP: versioned bincode bodies (store-sm's codec) posted to
//! the peer's Raft listener, every call bounded by a deadline.
//!
//! Deadlines: AppendEntries and votes get [`RaftTiming::rpc_timeout`] (ten heartbeats,
//! far above the worst fsync seen here, 8 ms, plus a round trip) rather than openraft's
//! per-RPC `soft_ttl`, which is one heartbeat and collapses when a follower's fsync is
//! slow; a whole snapshot gets [`RaftTiming::snapshot_timeout`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use hyper::header::CONTENT_TYPE;
use hyper::header::HeaderName;
use hyper::header::HeaderValue;
use openraft::error::NetworkError;
use openraft::error::RPCError;
use openraft::error::RaftError;
use openraft::error::ReplicationClosed;
use openraft::error::StreamingError;
use openraft::error::Unreachable;
use openraft::network::RPCOption;
use openraft::network::RaftNetworkFactory;
use openraft::network::v2::RaftNetworkV2;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
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

/// Creates a [`PeerClient`] per target; shares one connection pool.
#[derive(Clone, Debug)]
pub struct Network {
    client: HttpClient,
    timing: RaftTiming,
    clock: Arc<LogClock>,
    append_latency: Arc<LatencyHistogram>,
    peer_forms: Arc<PeerLogForms>,
}

impl Network {
    /// A network using `client`'s pool, sending `clock`'s time with every append,
    /// timing, in `append_latency`, each append with entries from send to answer, and
    /// noting in `peer_forms` the log forms each peer answers with.
    pub fn new(
        client: HttpClient,
        timing: RaftTiming,
        clock: Arc<LogClock>,
        append_latency: Arc<LatencyHistogram>,
        peer_forms: Arc<PeerLogForms>,
    ) -> Self {
        Self {
            client,
            timing,
            clock,
            append_latency,
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
            append_latency: Some(Arc::clone(&self.append_latency)),
            peer_forms: Some(Arc::clone(&self.peer_forms)),
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
    /// Where appends with entries are timed; `None` for a client that sends no appends.
    append_latency: Option<Arc<LatencyHistogram>>,
    /// Where the peer's log forms are noted; `None` outside replication.
    peer_forms: Option<Arc<PeerLogForms>>,
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
            append_latency: None,
            peer_forms: None,
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

    /// A peer's answer to a call on `path`, decoded; a failure status is an error.
    fn answer<Resp: DeserializeOwned>(
        &self,
        response: Result<rpc::client::HttpResponse, ClientError>,
        path: &str,
    ) -> Result<Resp, ClientError> {
        let response = response.inspect_err(|_| {
            if let Some(forms) = &self.peer_forms {
                forms.unanswered(self.target);
            }
        })?;
        if let Some(forms) = &self.peer_forms {
            match forms_answered(&response) {
                Some(announced) => forms.heard(self.target, announced),
                None => forms.unanswered(self.target),
            }
        }
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
            .append_latency
            .as_ref()
            .filter(|_| !rpc.entries.is_empty());
        let started = std::time::Instant::now();
        let answer = self.rpc(paths::APPEND, &rpc).await;
        if let Some(histogram) = timed
            && answer.is_ok()
        {
            histogram.record(started.elapsed());
        }
        answer
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
    use store_sm::raft_types::RotaSnapshotMeta;
    use store_sm::snapshot_data::SNAPSHOT_CHUNK_BYTES;

    use super::*;

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
