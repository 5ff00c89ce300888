//! The `rota-node` daemon: configuration, openraft wiring and its HTTP transport, the
//! request path (leader forwarding, linearizable reads, log-time stamping), the axum
//! routers, and graceful shutdown.
//!
//! Batching: handlers call `Raft::client_write` concurrently and nothing between them
//! and openraft serialises them; openraft hands every entry that queued meanwhile to
//! one log append, which the RocksDB store writes and syncs once.

pub mod admin_api;
pub mod api_error;
pub mod append_stream;
pub mod auth_api;
pub mod clock;
pub mod config;
pub mod connection;
pub mod http;
pub mod hyper_errors;
pub mod idle;
pub mod job_api;
pub mod json;
pub mod log_forms;
pub mod metrics;
pub mod network;
pub mod node;
pub mod openapi;
pub mod raft_api;
pub mod random;
pub mod rate_limit;
pub mod relay;
pub mod runtime;
pub mod service;
pub mod snapshot_keeper;
pub mod storage;
pub mod time_keeper;
pub mod tls;
pub mod types;
pub mod ui;
pub mod waiting;
pub mod watch_api;
pub mod worker_api;

use std::io;
use std::sync::Arc;

use crate::network::ReplicationStats;
use axum::Router;
use openraft::storage::RaftLogStorage;
use rpc::client::HttpClient;
use store_sm::log_stats::LogStats;
use store_sm::machine::LogTime;
use store_sm::state_machine::TaskStateMachine;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::LogClock;
use crate::clock::WallClock;
use crate::config::NodeConfig;
use crate::connection::ListenerRules;
use crate::log_forms::PeerLogForms;
use crate::network::Network;
use crate::node::Node;
use crate::node::NodeStorage;
use crate::node::SharedNode;
use crate::storage::NodeSnapshots;
use crate::types::NodeRaft;
use crate::types::NodeTypes;
use crate::waiting::Observer;
use crate::waiting::claims::ClaimQueues;
use crate::waiting::feed::ChangeFeed;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory or its stores could not be opened.
    #[error("opening storage in {dir}: {source}")]
    Storage {
        /// The data directory.
        dir: String,
        /// The cause.
        source: io::Error,
    },
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}; is another process using the port?")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: io::Error,
    },
    /// openraft refused the configuration or failed to start.
    #[error("starting Raft: {0}")]
    Raft(String),
    /// The TLS files could not be used.
    #[error("TLS: {0}")]
    Tls(String),
}

impl StartError {
    /// Whether a setting is wrong (exit status 2, which the systemd unit does not
    /// restart on): TLS files that are missing or do not hold a certificate and key,
    /// like an invalid flag, stay wrong until someone fixes them.
    pub fn is_invalid_setting(&self) -> bool {
        matches!(self, StartError::Tls(_))
    }
}

/// openraft's configuration from ours.
pub fn raft_config(config: &NodeConfig) -> Result<openraft::Config, StartError> {
    let timing = &config.timing;
    openraft::Config {
        cluster_name: "rota".into(),
        heartbeat_interval: timing.heartbeat.as_millis() as u64,
        election_timeout_min: timing.election_min.as_millis() as u64,
        election_timeout_max: timing.election_max.as_millis() as u64,
        install_snapshot_timeout: timing.snapshot_timeout.as_millis() as u64,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
        max_in_snapshot_log_to_keep: config.logs_kept_after_snapshot,
        // A node cut off from the others campaigns at every election timeout; without a
        // pre-vote each campaign raises its term, and once it is back that term deposes
        // the healthy leader and leaves the cluster leaderless for another election.
        // With it, a node raises its term only when a majority would vote for it. Every
        // build answers the pre-vote RPC (`/raft/pre-vote`).
        enable_pre_vote: Some(true),
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Raft(e.to_string()))
}

/// A started node and what it takes to stop it.
pub struct RunningNode {
    /// The node.
    pub node: SharedNode,
    /// Its TLS configurations, to reload on SIGHUP; `None` with `--tls=off`.
    pub tls: Option<Arc<tls::NodeTls>>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    /// Ends once Raft has shut down.
    log_time: JoinHandle<()>,
}

impl RunningNode {
    /// Stops serving, then stops Raft.
    pub async fn shutdown(self) {
        // Waiters first: the servers wait for every open request before they stop.
        self.node.waiters.stop();
        let _ = self.shutdown.send(true);
        for server in self.servers {
            let _ = server.await;
        }
        if let Err(e) = self.node.raft.shutdown().await {
            tracing::warn!(error = %e, "Raft did not shut down cleanly");
        }
        let _ = self.log_time.await;
    }
}

/// The router of the worker and admin API.
pub fn api_router(node: SharedNode) -> Router {
    worker_api::routes()
        .merge(job_api::routes())
        .merge(watch_api::routes())
        .merge(admin_api::routes())
        .merge(auth_api::routes())
        .merge(ui::routes())
        .route("/metrics", axum::routing::get(metrics::get_metrics))
        .route("/openapi.json", axum::routing::get(openapi::get_openapi))
        .fallback(http::not_found_fallback)
        .method_not_allowed_fallback(http::method_not_allowed_fallback)
        .layer(auth_api::TokenCheckLayer::new(node.clone()))
        .layer(metrics::TrackLayer::new(node.http_metrics.clone()))
        .with_state(node)
}

/// The router of the Raft listener.
pub fn raft_router(node: SharedNode) -> Router {
    raft_api::routes()
        .fallback(http::not_found_fallback)
        .method_not_allowed_fallback(http::method_not_allowed_fallback)
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            tls::require_member,
        ))
        .layer(axum::middleware::map_response(raft_api::announce_forms))
        .with_state(node)
}

async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Opens storage in the data directory (RocksDB and a snapshot directory) and starts
/// the node on it with the system clock: the daemon's entry point.
#[cfg(feature = "rocksdb")]
pub async fn start(config: NodeConfig) -> Result<RunningNode, StartError> {
    let storage_error = |source| StartError::Storage {
        dir: config.data_dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&config.data_dir).map_err(storage_error)?;
    let log_store =
        store_sm::rocks::RocksLogStore::open(&config.data_dir.join("raft-log"), config.sync)
            .map_err(storage_error)?;
    // Only now, holding the data directory's lock, is this process the one that serves
    // it: tools (`rota dev down`) find it through this file however it was started.
    write_pid_file(&config.data_dir).map_err(storage_error)?;
    let log_stats = log_store.stats();
    let inline_appends = log_store.inline_appends();
    let snapshots = store_sm::snapshot_dir::SnapshotDir::open(config.data_dir.join("snapshots"))
        .map_err(storage_error)?;
    let running = start_on(
        config,
        log_store,
        NodeSnapshots::Dir(snapshots),
        Some(log_stats),
        clock::SystemClock,
    )
    .await?;
    tokio::spawn(inline_appends_unless_leading(
        running.node.raft.server_metrics(),
        inline_appends,
    ));
    Ok(running)
}

/// Runs until Raft shuts down: lets the log store write appends on the node's thread
/// while this node does not lead (see `store_sm::rocks`), since a follower answers an
/// append only once it is durable, while a leader sends its entries on meanwhile.
#[cfg(feature = "rocksdb")]
async fn inline_appends_unless_leading(
    mut server: openraft::type_config::alias::WatchReceiverOf<
        NodeTypes,
        openraft::metrics::RaftServerMetrics<NodeTypes>,
    >,
    inline: Arc<std::sync::atomic::AtomicBool>,
) {
    use openraft::async_runtime::WatchReceiver;
    loop {
        let leading = server.borrow_watched().state == openraft::ServerState::Leader;
        inline.store(!leading, std::sync::atomic::Ordering::Relaxed);
        if server.changed().await.is_err() {
            return;
        }
    }
}

/// The file in a data directory that names the process serving it.
pub const PID_FILE: &str = "rota-node.pid";

/// Writes this process's id to the data directory's [`PID_FILE`], whole or not at all.
#[cfg(feature = "rocksdb")]
fn write_pid_file(data_dir: &std::path::Path) -> std::io::Result<()> {
    let partial = data_dir.join(format!("{PID_FILE}.partial"));
    std::fs::write(&partial, format!("{}\n", std::process::id()))?;
    std::fs::rename(&partial, data_dir.join(PID_FILE))
}

/// The term of the stored vote and the last index of the stored log.
async fn log_at_start<L: RaftLogStorage<NodeTypes>>(
    log_store: &mut L,
) -> Result<(u64, Option<u64>), StartError> {
    let failed = |e: std::io::Error| StartError::Raft(format!("reading the log: {e}"));
    let mut reader = log_store.get_log_reader().await;
    let term = openraft::storage::RaftLogReader::read_vote(&mut reader)
        .await
        .map_err(failed)?
        .map_or(0, |vote| vote.leader_id().term);
    let last = log_store.get_log_state().await.map_err(failed)?.last_log_id;
    Ok((term, last.map(|id| id.index())))
}

/// Starts Raft on the given storage and both listeners, and forms the cluster if this
/// node is the one that initialises the static member list. The daemon and the
/// simulation both start nodes here; only storage and the wall clock differ.
pub async fn start_on<L: RaftLogStorage<NodeTypes>>(
    config: NodeConfig,
    mut log_store: L,
    snapshots: NodeSnapshots,
    log_stats: Option<Arc<LogStats>>,
    wall: impl WallClock,
) -> Result<RunningNode, StartError> {
    let notes = snapshots.clone();
    let mut state_machine =
        TaskStateMachine::open(snapshots).map_err(|source| StartError::Storage {
            dir: config.data_dir.display().to_string(),
            source,
        })?;
    let observer = Arc::new(Observer {
        feed: Arc::new(ChangeFeed::default()),
        claims: Arc::new(ClaimQueues::default()),
    });
    state_machine.observe(observer.clone());
    let state = state_machine.reader();

    let node_tls = match &config.tls {
        Some(files) => {
            Some(tls::NodeTls::load(files.clone()).map_err(|e| StartError::Tls(e.to_string()))?)
        }
        None => None,
    };
    let api_listener = bind(config.listen_api).await?;
    let raft_listener = bind(config.listen_raft).await?;

    let client = HttpClient::new().with_tls(node_tls.as_ref().map(|t| t.client()));
    // What the log held before Raft starts on it: see `Node::log_at_start`.
    let log_at_start = log_at_start(&mut log_store).await?;
    let clock = Arc::new(LogClock::new(wall));
    let replication = Arc::new(ReplicationStats::default());
    let peer_forms = Arc::new(PeerLogForms::default());
    let network = Network::new(
        client.clone(),
        config.timing.clone(),
        Arc::clone(&clock),
        Arc::clone(&replication),
        Arc::clone(&peer_forms),
    );
    let raft = NodeRaft::new(
        config.id,
        Arc::new(raft_config(&config)?),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| StartError::Raft(e.to_string()))?;

    // A restarted node takes its time from what it applied, not from its wall clock,
    // which may have jumped while it was down; only a new cluster starts from the wall.
    let applied_at = state.read(|s| s.machine.log_time());
    if applied_at > LogTime::EPOCH {
        clock.follow(applied_at);
    }
    if let Some(record) = time_keeper::load_record(&notes) {
        clock.resume_from(record);
    }
    let mut node = Node::new(
        config,
        raft,
        state,
        clock,
        client,
        NodeStorage {
            log_stats,
            snapshots: notes.clone(),
        },
        &observer,
    );
    node.log_at_start = log_at_start;
    node.replication = replication;
    node.peer_forms = peer_forms;
    let node = Arc::new(node);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let servers = vec![
        tokio::spawn(http::serve(
            api_listener,
            api_router(node.clone()),
            shutdown_rx.clone(),
            node.config.connection_limits,
            node_tls.clone().map(|t| (t, tls::Listener::Api)),
            ListenerRules {
                requests_per_connection: node.config.rate_limit_per_connection,
                require_host: true,
                metrics: Some(node.http_metrics.clone()),
            },
        )),
        tokio::spawn(http::serve(
            raft_listener,
            raft_router(node.clone()),
            shutdown_rx,
            node.config.connection_limits,
            node_tls.clone().map(|t| (t, tls::Listener::Raft)),
            // Nodes are few and trusted, and replication must never be held back.
            ListenerRules::default(),
        )),
    ];
    let log_time = tokio::spawn(time_keeper::keep_log_time(node.clone(), notes));
    tokio::spawn(log_forms::keep_form_recorded(node.clone()));
    tokio::spawn(snapshot_keeper::snapshot_every_writes(node.clone()));
    bootstrap(&node).await;
    tracing::info!(
        id = node.id(),
        api = %node.config.advertise.api_addr,
        raft = %node.config.advertise.raft_addr,
        sync = ?node.config.sync,
        auth = ?node.config.auth,
        tls = node.config.tls.is_some(),
        "node started"
    );
    if node.config.tls.is_none() {
        tracing::warn!(
            "TLS is off (--tls=off): requests, tokens and Raft traffic cross the network in clear text, and any host that reaches the Raft port can pose as a member; use it on a trusted network only"
        );
    }
    if node.config.auth == service::auth::AuthMode::Off {
        tracing::warn!(
            "authentication is off (--auth=off): anyone who reaches this node's API port can read, change or delete every task and change the cluster; use it on a trusted network only"
        );
    }
    Ok(RunningNode {
        node,
        tls: node_tls,
        shutdown,
        servers,
        log_time,
    })
}

/// Static formation: the lowest id in the initial member list initialises, once. The
/// flags stay harmless afterwards: an initialised node is never initialised again.
async fn bootstrap(node: &SharedNode) {
    let members = &node.config.initial_cluster;
    if members.keys().next() != Some(&node.id()) {
        return;
    }
    match node.raft.is_initialized().await {
        Ok(true) => {}
        Ok(false) => match node.initialize(members.clone()).await {
            Ok(()) => {
                tracing::info!(members = ?members.keys().collect::<Vec<_>>(), "cluster initialised")
            }
            Err(e) => tracing::warn!(error = %e, "initialising the cluster failed"),
        },
        Err(e) => tracing::error!(error = %e, "cannot tell whether the node is initialised"),
    }
}
