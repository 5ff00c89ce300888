//! One running node: its Raft instance, state reader, log clock and HTTP client. What
//! the node does for a request lives in [`crate::service`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use rpc::client::HttpClient;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;
use store_sm::snapshot_data::SnapshotSpool;
use store_sm::state_machine::StateReader;

use crate::clock::LogClock;
use crate::config::NodeConfig;
use crate::log_forms::PeerLogForms;
use crate::metrics::requests::HttpMetrics;
use crate::network::PeerClient;
use crate::service::group_commit::GroupCommit;
use crate::storage::NodeSnapshots;
use crate::types::NodeRaft;
use crate::waiting::Observer;
use crate::waiting::Waiters;
use crate::waiting::claims::ClaimQueues;
use crate::waiting::claims::InFlight;
use crate::waiting::feed::ChangeFeed;

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
    /// The clock that stamps commands when this node leads (shared with the Raft network,
    /// which sends its time with every append).
    pub clock: Arc<LogClock>,
    /// Pooled HTTP client for forwarding.
    pub client: HttpClient,
    /// Request counts and latencies per endpoint.
    pub http_metrics: Arc<HttpMetrics>,
    /// The log store's write counters, when the store keeps them.
    pub log_stats: Option<std::sync::Arc<store_sm::log_stats::LogStats>>,
    /// Round trips of the appends with entries this node sent while leading.
    pub replication: Arc<crate::network::ReplicationStats>,
    /// The log entry forms each peer reads, as it last answered this node.
    pub peer_forms: Arc<PeerLogForms>,
    /// Held while the recorded log form is raised or a learner added, so that neither
    /// misses the other (see `Node::record_log_form`).
    pub log_form_change: tokio::sync::Mutex<()>,
    /// Every change this node applied, recently, by group; wakes waiters.
    pub feed: Arc<ChangeFeed>,
    /// The waiting requests this node holds.
    pub waiters: Arc<Waiters>,
    /// The blocking claims waiting on this node (the leader), by group.
    pub claims: Arc<ClaimQueues>,
    /// Blocking claims' proposals under a request id that have not finished.
    pub claims_in_flight: InFlight,
    /// The writes waiting to share a log entry (see `service::group_commit`).
    pub group_commit: Arc<GroupCommit>,
    /// Each token's request rate on this node.
    pub token_limits: crate::rate_limit::TokenLimits,
    /// The term and last log index this node's storage held when it started: a leader
    /// that restarted without losing its leadership serves linearizable reads only once
    /// it applied that far (see `Node::read`).
    pub log_at_start: (u64, Option<u64>),
    /// Where the node keeps its snapshot; snapshots arriving are spooled beside it.
    pub snapshots: NodeSnapshots,
    request_nonce: u64,
    request_counter: AtomicU64,
    /// The members' API addresses, once the leader told this node it was removed: a
    /// removed follower never receives the configuration without it.
    removed_notice: std::sync::OnceLock<Vec<String>>,
    /// The latest term in which this node, leading, settled its log clock with a
    /// majority (see `time_keeper::catch_up`); 0 before any. It stamps no command before.
    pub clock_settled_term: AtomicU64,
}

/// What a node reads of its storage besides Raft's own use of it.
pub struct NodeStorage {
    /// The log store's write counters, when the store keeps them.
    pub log_stats: Option<std::sync::Arc<store_sm::log_stats::LogStats>>,
    /// The snapshot store (snapshots arriving are spooled beside it).
    pub snapshots: NodeSnapshots,
}

/// A node shared by all handlers.
pub type SharedNode = Arc<Node>;

impl Node {
    /// Assembles a node from its parts.
    pub fn new(
        config: NodeConfig,
        raft: NodeRaft,
        state: StateReader,
        clock: Arc<LogClock>,
        client: HttpClient,
        storage: NodeStorage,
        observer: &Observer,
    ) -> Self {
        let NodeStorage {
            log_stats,
            snapshots,
        } = storage;
        Self {
            snapshots,
            log_at_start: (0, None),
            claims: Arc::clone(&observer.claims),
            claims_in_flight: InFlight::default(),
            group_commit: Arc::new(GroupCommit::new(config.body_bytes_max)),
            token_limits: crate::rate_limit::TokenLimits::new(config.rate_limit_per_token),
            waiters: Arc::new(Waiters::new(config.max_waiters)),
            feed: Arc::clone(&observer.feed),
            config,
            raft,
            state,
            clock,
            client,
            http_metrics: Arc::default(),
            log_stats,
            replication: Arc::default(),
            peer_forms: Arc::default(),
            log_form_change: tokio::sync::Mutex::new(()),
            request_nonce: u64::from_le_bytes(crate::random::random_bytes()),
            request_counter: AtomicU64::new(0),
            removed_notice: std::sync::OnceLock::new(),
            clock_settled_term: AtomicU64::new(0),
        }
    }

    /// A spool for a snapshot arriving from a leader or a restore, bounded by
    /// `--snapshot-max-bytes`: a file beside the node's snapshot, or memory in simulation.
    pub fn snapshot_spool(&self) -> std::io::Result<SnapshotSpool> {
        self.snapshots.spool(self.config.snapshot_max_bytes)
    }

    /// Records that the leader removed this node from the cluster of `members` (their
    /// API addresses); from then on it serves nothing (see `Node::check_member`).
    pub fn mark_removed(&self, members: Vec<String>) {
        if self.removed_notice.set(members).is_ok() {
            tracing::warn!(
                "the leader removed this node from the cluster; it serves no requests now"
            );
        }
    }

    /// The members' API addresses if the leader told this node it was removed.
    pub fn removed_notice(&self) -> Option<&[String]> {
        self.removed_notice.get().map(Vec::as_slice)
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

    /// Member `id`'s addresses, from the current membership.
    fn member(&self, id: NodeId) -> Option<RotaNode> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        metrics
            .membership_config
            .membership()
            .get_node(&id)
            .cloned()
    }

    /// The API address of member `id`, from the current membership.
    pub fn member_api_addr(&self, id: NodeId) -> Option<String> {
        self.member(id).map(|node| node.api_addr)
    }

    /// The Raft address of member `id`, from the current membership.
    pub fn member_raft_addr(&self, id: NodeId) -> Option<String> {
        self.member(id).map(|node| node.raft_addr)
    }

    /// A client of the Raft listener of node `id` at `raft_addr`, for the messages this
    /// node sends outside openraft's replication.
    pub fn peer(&self, id: NodeId, raft_addr: String) -> PeerClient {
        PeerClient::to(
            id,
            raft_addr,
            self.client.clone(),
            self.config.timing.clone(),
            Arc::clone(&self.clock),
        )
    }

    /// The log entry form every member is recorded to read, as this node applied it
    /// (0 before one is; see `crate::log_forms`).
    pub fn recorded_log_form(&self) -> u32 {
        self.state.read(|s| s.machine.log_form())
    }

    /// The leader this node knows of, if any.
    pub fn leader_id(&self) -> Option<NodeId> {
        self.raft.metrics().borrow_watched().current_leader
    }
}
