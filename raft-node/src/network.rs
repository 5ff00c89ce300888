//! Raft between nodes over HTTP: versioned bincode bodies (store-sm's codec) posted to
//! the peer's Raft listener, every call bounded by a deadline.
//!
//! Deadlines: AppendEntries and votes get [`RaftTiming::rpc_timeout`] (ten heartbeats,
//! far above the worst fsync seen here, 8 ms, plus a round trip) rather than openraft's
//! per-RPC `soft_ttl`, which is one heartbeat and collapses when a follower's fsync is
//! slow; a whole snapshot gets [`RaftTiming::snapshot_timeout`].

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use hyper::header::CONTENT_TYPE;
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
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;
use store_sm::raft_types::RotaSnapshot;
use store_sm::raft_types::RotaVote;
use store_sm::raft_types::SnapshotBytes;

use crate::config::RaftTiming;
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
}

/// The media type of Raft bodies.
pub const RAFT_CONTENT_TYPE: &str = "application/x-rota-raft";

/// What precedes a snapshot's bytes on the wire.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct SnapshotHead {
    /// The sender's vote.
    pub vote: RotaVote,
    /// Metadata of the snapshot.
    pub meta: store_sm::raft_types::RotaSnapshotMeta,
}

/// Size of the chunks a snapshot is streamed in.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

/// A snapshot transfer's body as chunks, without copying the snapshot: the head's
/// length (u32 LE), the head (a codec value), then the snapshot bytes.
pub fn snapshot_chunks(head: &SnapshotHead, data: &SnapshotBytes) -> std::io::Result<Vec<Bytes>> {
    let head = encode_value(head)?;
    let head_len =
        u32::try_from(head.len()).map_err(|_| std::io::Error::other("snapshot head too large"))?;
    let mut first = head_len.to_le_bytes().to_vec();
    first.extend_from_slice(&head);
    let data = Bytes::from_owner(data.clone());
    let mut chunks = vec![Bytes::from(first)];
    let mut offset = 0;
    while offset < data.len() {
        let end = (offset + SNAPSHOT_CHUNK_BYTES).min(data.len());
        chunks.push(data.slice(offset..end));
        offset = end;
    }
    Ok(chunks)
}

/// Splits a body made by [`snapshot_chunks`].
pub fn parse_snapshot_body(body: &[u8]) -> std::io::Result<(SnapshotHead, SnapshotBytes)> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let len_bytes: [u8; 4] = body
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| invalid("snapshot body shorter than its head length"))?;
    let head_end = 4 + u32::from_le_bytes(len_bytes) as usize;
    let head_bytes = body
        .get(4..head_end)
        .ok_or_else(|| invalid("snapshot body shorter than its head"))?;
    let head: SnapshotHead = decode_value(head_bytes, "snapshot head")?;
    Ok((head, SnapshotBytes::from(&body[head_end..])))
}

/// Creates a [`PeerClient`] per target; shares one connection pool.
#[derive(Clone, Debug)]
pub struct Network {
    client: HttpClient,
    timing: RaftTiming,
}

impl Network {
    /// A network using `client`'s pool.
    pub fn new(client: HttpClient, timing: RaftTiming) -> Self {
        Self { client, timing }
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
}

/// A transport failure: unreachable peers get openraft's backoff, the rest are retried.
fn transport_error(e: ClientError) -> RPCError<NodeTypes> {
    match e {
        ClientError::Connect { .. } => RPCError::Unreachable(Unreachable::new(&e)),
        other => RPCError::Network(NetworkError::new(&other)),
    }
}

impl PeerClient {
    /// A client of node `target`'s Raft listener at `addr`.
    pub fn to(target: NodeId, addr: String, client: HttpClient, timing: RaftTiming) -> Self {
        Self {
            target,
            addr,
            client,
            timing,
        }
    }

    /// The peer's estimate of log time (see `crate::clock`), within one RPC deadline.
    pub async fn clock_estimate(&self) -> Result<store_sm::machine::LogTime, ClientError> {
        self.call(paths::CLOCK_ESTIMATE, &(), self.timing.rpc_timeout)
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
        let header = (CONTENT_TYPE, HeaderValue::from_static(RAFT_CONTENT_TYPE));
        let response = self
            .client
            .send_chunks(&self.addr, Method::POST, path, &[header], chunks, timeout)
            .await?
            .success(&self.addr)?;
        decode_value(&response.body, path).map_err(|e| ClientError::Body {
            addr: self.addr.clone(),
            message: e.to_string(),
        })
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
    type SnapshotData = SnapshotBytes;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<NodeTypes>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeTypes>, RPCError<NodeTypes>> {
        self.rpc(paths::APPEND, &rpc).await
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
        let chunks = snapshot_chunks(&head, &snapshot.snapshot)
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let send = self.call_chunks::<Result<SnapshotResponse<NodeTypes>, String>>(
            paths::SNAPSHOT,
            &chunks,
            self.timing.snapshot_timeout,
        );
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => match result {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(remote)) => Err(StreamingError::Network(NetworkError::new(&std::io::Error::other(remote)))),
                Err(e @ ClientError::Connect { .. }) => Err(StreamingError::Unreachable(Unreachable::new(&e))),
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

    use super::*;

    #[test]
    fn a_snapshot_streams_in_chunks_and_reassembles() {
        let data: SnapshotBytes = (0..(2 * SNAPSHOT_CHUNK_BYTES + 17))
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let head = SnapshotHead {
            vote: RotaVote::new_committed(3, 1),
            meta: RotaSnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
            },
        };
        let chunks = snapshot_chunks(&head, &data).expect("chunks");
        assert_eq!(chunks.len(), 1 + 3, "head, then the data in 1 MiB chunks");
        let body: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let (back, back_data) = parse_snapshot_body(&body).expect("parses");
        assert_eq!(back.vote, head.vote);
        assert_eq!(back_data, data);
        assert!(parse_snapshot_body(&body[..3]).is_err());
    }
}
