//! `rota-node` configuration: flags, `ROTA_*` environment and an optional TOML file
//! (in that order of precedence), validated once at start into a [`NodeConfig`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;
use store_sm::machine::constants::CLAIM_DURATION_MS_MAX;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaNode;
use store_sm::raft_types::SyncMode;

use crate::service::auth::AuthMode;
use crate::tls::TlsFiles;

pub use rpc::worker::CLAIM_DURATION_MAX_MS_DEFAULT;

/// Waiting requests (blocking claims, waits for outcomes, watches) a node holds by
/// default.
pub const MAX_WAITERS_DEFAULT: usize = 10_000;

/// Most waiting requests a node may be configured to hold.
pub const MAX_WAITERS_MAX: usize = 1_000_000;
/// Default request body limit: 1 MiB.
pub const BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// Default most connections a listener holds open.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;
/// Default most connections one peer address holds open to a listener.
pub const CONNECTIONS_PER_PEER_MAX_DEFAULT: usize = 1024;

/// Default requests a second one API connection may send: far above what one worker's
/// connection sends (a few hundred), low enough that one runaway client cannot take a
/// node's whole capacity.
pub const RATE_LIMIT_PER_CONNECTION_DEFAULT: u32 = 5_000;
/// Default requests a second one token may send to one node.
pub const RATE_LIMIT_PER_TOKEN_DEFAULT: u32 = 50_000;

/// Default entries between snapshots (etcd's default `--snapshot-count` too). Each
/// snapshot costs what the state holds, each entry replayed at a restart a few
/// microseconds: at 50 000, a busy node with 100 000 remembered outcomes spent about 5%
/// of its CPU building snapshots (docs/performance.md, session 14).
pub const SNAPSHOT_EVERY_ENTRIES_DEFAULT: u64 = 100_000;
/// Default entries kept behind a snapshot, so slow followers catch up from the log.
pub const LOGS_KEPT_AFTER_SNAPSHOT_DEFAULT: u64 = 10_000;

/// What went wrong with the configuration, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required setting is missing.
    #[error("{0} is required: pass --{0} or set ROTA_{1}")]
    Missing(&'static str, String),
    /// A setting has a value that cannot work.
    #[error("--{name}: {problem}")]
    Invalid {
        /// The flag.
        name: &'static str,
        /// What is wrong and what to do.
        problem: String,
    },
    /// The TOML file could not be read or parsed.
    #[error("config file {path}: {problem}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

/// How logs are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Durability mode as a flag value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncFlag {
    /// fsync the log before acknowledging (default).
    Always,
    /// Acknowledge on majority receipt; the OS flushes.
    Never,
}

/// Command-line flags; every one can also come from `ROTA_<NAME>` or the TOML file.
#[derive(Clone, Debug, Default, Parser, Deserialize)]
#[command(
    name = "rota-node",
    version,
    about = "A Rota node: one member of a replicated task store.",
    after_help = "Example (three nodes on one machine, same --initial-cluster on each):\n  \
        rota-node --id 1 --data-dir /var/lib/rota/1 --listen-api 127.0.0.1:7001 --listen-raft 127.0.0.1:7101 \\\n    \
        --initial-cluster 1=127.0.0.1:7001/127.0.0.1:7101,2=127.0.0.1:7002/127.0.0.1:7102,3=127.0.0.1:7003/127.0.0.1:7103"
)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Flags {
    /// TOML file with any of these settings (kebab-case keys); flags and environment win.
    #[arg(long, env = "ROTA_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// This node's id: a positive integer, unique, never reused.
    #[arg(long, env = "ROTA_ID")]
    pub id: Option<NodeId>,
    /// Directory for the Raft log and snapshots.
    #[arg(long, env = "ROTA_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address the worker and admin API listens on.
    #[arg(long, env = "ROTA_LISTEN_API")]
    pub listen_api: Option<SocketAddr>,
    /// Address Raft traffic from other nodes arrives on.
    #[arg(long, env = "ROTA_LISTEN_RAFT")]
    pub listen_raft: Option<SocketAddr>,
    /// Address workers and other nodes use to reach the API (default: --listen-api).
    #[arg(long, env = "ROTA_ADVERTISE_API")]
    pub advertise_api: Option<String>,
    /// Address other nodes use for Raft (default: --listen-raft).
    #[arg(long, env = "ROTA_ADVERTISE_RAFT")]
    pub advertise_raft: Option<String>,
    /// Initial voters, the same on every node: ID=API_ADDR/RAFT_ADDR,... The node with
    /// the lowest id initialises the cluster; ignored once the data directory holds one.
    #[arg(long, env = "ROTA_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// `always`: fsync before acknowledging; `never`: leave flushing to the OS.
    #[arg(long, env = "ROTA_SYNC", value_enum)]
    pub sync: Option<SyncFlag>,
    /// Log output format.
    #[arg(long, env = "ROTA_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, env = "ROTA_BODY_BYTES_MAX")]
    pub body_bytes_max: Option<usize>,
    /// Longest claim `duration` accepted, in milliseconds; at most a year.
    #[arg(long, env = "ROTA_CLAIM_DURATION_MAX_MS")]
    pub claim_duration_max_ms: Option<i64>,
    /// Most connections each listener holds open; more get 503 and are closed.
    #[arg(long, env = "ROTA_CONNECTIONS_MAX")]
    pub connections_max: Option<usize>,
    /// Most connections one peer IP address holds open to each listener.
    #[arg(long, env = "ROTA_CONNECTIONS_PER_PEER_MAX")]
    pub connections_per_peer_max: Option<usize>,
    /// Writes applied between snapshots: log entries, each write of a shared entry
    /// counted (group commit).
    #[arg(long, env = "ROTA_SNAPSHOT_EVERY_ENTRIES")]
    pub snapshot_every_entries: Option<u64>,
    /// Entries kept in the log behind a snapshot; a follower further behind gets the
    /// snapshot instead.
    #[arg(long, env = "ROTA_LOGS_KEPT_AFTER_SNAPSHOT")]
    pub logs_kept_after_snapshot: Option<u64>,
    /// Most waiting requests (blocking claims, waits for outcomes, watches) held at once;
    /// more get 503 with Retry-After.
    #[arg(long, env = "ROTA_MAX_WAITERS")]
    pub max_waiters: Option<usize>,
    /// Largest snapshot, in bytes, this node accepts from a leader or as a backup to
    /// restore (one limit for both, so a restored backup always reaches the followers);
    /// give every node the same value.
    #[arg(long, env = "ROTA_SNAPSHOT_MAX_BYTES")]
    pub snapshot_max_bytes: Option<u64>,
    /// Let the dashboard at /ui retry, cancel, pause and resume (it is read-only
    /// otherwise, until the API has authentication).
    #[arg(long, env = "ROTA_UI_ACTIONS", num_args = 0..=1, default_missing_value = "true")]
    pub ui_actions: Option<bool>,
    /// `tokens` (the default): every request but probes needs a bearer token (make the
    /// first with `rota cluster init`); `off`: anyone who reaches the port may do
    /// anything, for a trusted network or a laptop only.
    #[arg(long, env = "ROTA_AUTH", value_enum)]
    pub auth: Option<AuthFlag>,
    /// Serve /metrics without a token (for a scraper on a trusted network).
    #[arg(long, env = "ROTA_METRICS_OPEN", num_args = 0..=1, default_missing_value = "true")]
    pub metrics_open: Option<bool>,
    /// `on` (the default): both listeners speak TLS and nodes prove who they are with
    /// certificates (--tls-cert, --tls-key, --tls-ca); `off`: plain HTTP, for a trusted
    /// network only.
    #[arg(long, env = "ROTA_TLS", value_enum)]
    pub tls: Option<TlsFlag>,
    /// This node's certificate chain (PEM), signed by the cluster's CA and naming
    /// rota-node-<ID> and the host names clients dial (`rota cert node` makes one).
    #[arg(long, env = "ROTA_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = "ROTA_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate bundle (PEM).
    #[arg(long, env = "ROTA_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Requests a second one API connection may send for each request it had in progress
    /// at once over the last 10 s (at most 128 counted; bursts of as many); more get 429.
    /// 0: no limit.
    #[arg(long, env = "ROTA_RATE_LIMIT_PER_CONNECTION")]
    pub rate_limit_per_connection: Option<u32>,
    /// Requests a second one token may send to this node; more get 429. 0: no limit.
    #[arg(long, env = "ROTA_RATE_LIMIT_PER_TOKEN")]
    pub rate_limit_per_token: Option<u32>,
}

/// Whether the listeners speak TLS, as a flag value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsFlag {
    /// TLS with certificates (default).
    On,
    /// Plain HTTP.
    Off,
}

/// Whether requests need tokens, as a flag value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthFlag {
    /// Bearer tokens with roles (default).
    Tokens,
    /// No authentication.
    Off,
}

impl Flags {
    /// Fills settings missing here from `other`.
    fn or(self, other: Flags) -> Flags {
        Flags {
            config: self.config.or(other.config),
            id: self.id.or(other.id),
            data_dir: self.data_dir.or(other.data_dir),
            listen_api: self.listen_api.or(other.listen_api),
            listen_raft: self.listen_raft.or(other.listen_raft),
            advertise_api: self.advertise_api.or(other.advertise_api),
            advertise_raft: self.advertise_raft.or(other.advertise_raft),
            initial_cluster: self.initial_cluster.or(other.initial_cluster),
            sync: self.sync.or(other.sync),
            log_format: self.log_format.or(other.log_format),
            body_bytes_max: self.body_bytes_max.or(other.body_bytes_max),
            claim_duration_max_ms: self.claim_duration_max_ms.or(other.claim_duration_max_ms),
            connections_max: self.connections_max.or(other.connections_max),
            connections_per_peer_max: self
                .connections_per_peer_max
                .or(other.connections_per_peer_max),
            snapshot_every_entries: self.snapshot_every_entries.or(other.snapshot_every_entries),
            logs_kept_after_snapshot: self
                .logs_kept_after_snapshot
                .or(other.logs_kept_after_snapshot),
            max_waiters: self.max_waiters.or(other.max_waiters),
            snapshot_max_bytes: self.snapshot_max_bytes.or(other.snapshot_max_bytes),
            ui_actions: self.ui_actions.or(other.ui_actions),
            auth: self.auth.or(other.auth),
            metrics_open: self.metrics_open.or(other.metrics_open),
            tls: self.tls.or(other.tls),
            tls_cert: self.tls_cert.or(other.tls_cert),
            tls_key: self.tls_key.or(other.tls_key),
            tls_ca: self.tls_ca.or(other.tls_ca),
            rate_limit_per_connection: self
                .rate_limit_per_connection
                .or(other.rate_limit_per_connection),
            rate_limit_per_token: self.rate_limit_per_token.or(other.rate_limit_per_token),
        }
    }
}

/// Raft timing, chosen for the worst fsync seen on these machines (8 ms) plus loopback
/// or LAN round trips: every RPC gets several heartbeats of budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftTiming {
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Election timeout range.
    pub election_min: Duration,
    /// Election timeout range.
    pub election_max: Duration,
    /// Deadline of one AppendEntries or vote RPC.
    pub rpc_timeout: Duration,
    /// Deadline of one whole snapshot transfer.
    pub snapshot_timeout: Duration,
}

impl Default for RaftTiming {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            // Three heartbeats at least: a follower tolerates two lost or slow ones
            // before it campaigns, and a leader's death is noticed within 0.6 s.
            election_min: Duration::from_millis(300),
            election_max: Duration::from_millis(600),
            rpc_timeout: Duration::from_millis(1000),
            snapshot_timeout: Duration::from_secs(300),
        }
    }
}

/// How many connections a listener holds open, in all and from one peer address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections on the listener.
    pub total: usize,
    /// Open connections from one IP address.
    pub per_peer: usize,
}

/// The validated configuration of one node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id.
    pub id: NodeId,
    /// Where the Raft log and snapshots live.
    pub data_dir: PathBuf,
    /// API bind address.
    pub listen_api: SocketAddr,
    /// Raft bind address.
    pub listen_raft: SocketAddr,
    /// This node's advertised addresses.
    pub advertise: RotaNode,
    /// Initial voters, if the cluster is formed statically.
    pub initial_cluster: BTreeMap<NodeId, RotaNode>,
    /// Durability mode.
    pub sync: SyncMode,
    /// Log format.
    pub log_format: LogFormat,
    /// Largest request body.
    pub body_bytes_max: usize,
    /// Longest claim.
    pub claim_duration_max_ms: i64,
    /// Connections each listener holds open.
    pub connection_limits: ConnectionLimits,
    /// Entries applied between snapshots.
    pub snapshot_every_entries: u64,
    /// Entries kept behind a snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Most waiting requests held at once.
    pub max_waiters: usize,
    /// Largest snapshot received from a leader or restored from a backup.
    pub snapshot_max_bytes: u64,
    /// Whether the dashboard offers actions (retry, cancel, pause, resume).
    pub ui_actions: bool,
    /// Whether requests need bearer tokens.
    pub auth: AuthMode,
    /// Whether /metrics is served without a token.
    pub metrics_open: bool,
    /// TLS material; `None`: plain HTTP (`--tls=off`).
    pub tls: Option<TlsFiles>,
    /// Requests a second per API connection and request it had in progress at once over
    /// the last 10 s; 0: no limit.
    pub rate_limit_per_connection: u32,
    /// Requests a second per token on this node; 0: no limit.
    pub rate_limit_per_token: u32,
    /// Raft timing.
    pub timing: RaftTiming,
}

impl NodeConfig {
    /// Reads flags and environment (already parsed into `flags`) and the TOML file they
    /// name, then validates the result.
    pub fn load(flags: Flags) -> Result<Self, ConfigError> {
        let merged = match &flags.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                    path: path.clone(),
                    problem: e.to_string(),
                })?;
                let from_file: Flags = toml::from_str(&text).map_err(|e| ConfigError::File {
                    path: path.clone(),
                    problem: e.to_string(),
                })?;
                flags.or(from_file)
            }
            None => flags,
        };
        Self::validate(merged)
    }

    /// Turns merged settings into a configuration, or says what to fix.
    pub fn validate(flags: Flags) -> Result<Self, ConfigError> {
        let id = node_id(flags.id)?;
        let data_dir = flags
            .data_dir
            .ok_or(ConfigError::Missing("data-dir", "DATA_DIR".into()))?;
        let (listen_api, listen_raft) = listeners(flags.listen_api, flags.listen_raft)?;
        let advertise = RotaNode {
            api_addr: advertised("advertise-api", flags.advertise_api, listen_api)?,
            raft_addr: advertised("advertise-raft", flags.advertise_raft, listen_raft)?,
        };
        let initial_cluster = initial_cluster(id, &advertise, flags.initial_cluster.as_deref())?;
        Ok(Self {
            id,
            data_dir,
            listen_api,
            listen_raft,
            advertise,
            initial_cluster,
            sync: match flags.sync {
                Some(SyncFlag::Never) => SyncMode::Never,
                Some(SyncFlag::Always) | None => SyncMode::Always,
            },
            log_format: flags.log_format.unwrap_or_default(),
            body_bytes_max: body_bytes_max(flags.body_bytes_max)?,
            claim_duration_max_ms: claim_duration_max_ms(flags.claim_duration_max_ms)?,
            connection_limits: connection_limits(
                flags.connections_max,
                flags.connections_per_peer_max,
            )?,
            snapshot_every_entries: snapshot_every_entries(flags.snapshot_every_entries)?,
            logs_kept_after_snapshot: flags
                .logs_kept_after_snapshot
                .unwrap_or(LOGS_KEPT_AFTER_SNAPSHOT_DEFAULT),
            max_waiters: max_waiters(flags.max_waiters)?,
            snapshot_max_bytes: snapshot_max_bytes(flags.snapshot_max_bytes)?,
            ui_actions: flags.ui_actions.unwrap_or(false),
            auth: match flags.auth {
                Some(AuthFlag::Off) => AuthMode::Off,
                Some(AuthFlag::Tokens) | None => AuthMode::Tokens,
            },
            metrics_open: flags.metrics_open.unwrap_or(false),
            tls: tls_files(flags.tls, flags.tls_cert, flags.tls_key, flags.tls_ca)?,
            rate_limit_per_connection: flags
                .rate_limit_per_connection
                .unwrap_or(RATE_LIMIT_PER_CONNECTION_DEFAULT),
            rate_limit_per_token: flags
                .rate_limit_per_token
                .unwrap_or(RATE_LIMIT_PER_TOKEN_DEFAULT),
            timing: RaftTiming::default(),
        })
    }
}

/// The TLS files, all three required unless TLS is turned off by name.
fn tls_files(
    flag: Option<TlsFlag>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<TlsFiles>, ConfigError> {
    let given = [cert.is_some(), key.is_some(), ca.is_some()];
    if flag == Some(TlsFlag::Off) {
        if given.contains(&true) {
            return Err(ConfigError::Invalid {
                name: "tls",
                problem: "off, but --tls-cert, --tls-key or --tls-ca is given: drop them, or drop --tls=off".into(),
            });
        }
        return Ok(None);
    }
    match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
        _ => Err(ConfigError::Invalid {
            name: "tls",
            problem: format!(
                "TLS is on unless turned off: give --tls-cert, --tls-key and --tls-ca (missing: {}; `rota cert` makes them), or --tls=off to serve plain HTTP on a trusted network",
                ["--tls-cert", "--tls-key", "--tls-ca"]
                    .iter()
                    .zip(given)
                    .filter(|(_, given)| !given)
                    .map(|(flag, _)| *flag)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// This node's id: given, and not 0 (which stands for no node).
fn node_id(flag: Option<NodeId>) -> Result<NodeId, ConfigError> {
    let id = flag.ok_or(ConfigError::Missing("id", "ID".into()))?;
    if id == 0 {
        return Err(ConfigError::Invalid {
            name: "id",
            problem: "node ids start at 1".into(),
        });
    }
    Ok(id)
}

/// The API and Raft listen addresses: both given, and not the same.
fn listeners(
    api: Option<SocketAddr>,
    raft: Option<SocketAddr>,
) -> Result<(SocketAddr, SocketAddr), ConfigError> {
    let api = api.ok_or(ConfigError::Missing("listen-api", "LISTEN_API".into()))?;
    let raft = raft.ok_or(ConfigError::Missing("listen-raft", "LISTEN_RAFT".into()))?;
    if api == raft {
        return Err(ConfigError::Invalid {
            name: "listen-raft",
            problem: format!("{raft} is also --listen-api; give Raft its own port"),
        });
    }
    Ok((api, raft))
}

/// The initial voters, if `list` names any: it must name node `id` at the addresses it
/// advertises, or the voters would disagree about who this node is.
fn initial_cluster(
    id: NodeId,
    advertise: &RotaNode,
    list: Option<&str>,
) -> Result<BTreeMap<NodeId, RotaNode>, ConfigError> {
    let voters = match list {
        None | Some("") => BTreeMap::new(),
        Some(list) => parse_initial_cluster(list)?,
    };
    if voters.is_empty() {
        return Ok(voters);
    }
    match voters.get(&id) {
        None => Err(ConfigError::Invalid {
            name: "initial-cluster",
            problem: format!(
                "does not name this node ({id}); list every initial voter, this one included, or leave it empty to join later"
            ),
        }),
        Some(listed) if listed != advertise => Err(ConfigError::Invalid {
            name: "initial-cluster",
            problem: format!(
                "lists node {id} as {}/{}, but it advertises {}/{}; make them agree",
                listed.api_addr, listed.raft_addr, advertise.api_addr, advertise.raft_addr
            ),
        }),
        Some(_) => Ok(voters),
    }
}

/// The request body limit: large enough for any real request.
fn body_bytes_max(flag: Option<usize>) -> Result<usize, ConfigError> {
    let max = flag.unwrap_or(BODY_BYTES_MAX_DEFAULT);
    if max < 1024 {
        return Err(ConfigError::Invalid {
            name: "body-bytes-max",
            problem: format!("{max} bytes is too small for any request; use at least 1024"),
        });
    }
    Ok(max)
}

/// Entries between snapshots: at least one.
fn snapshot_every_entries(flag: Option<u64>) -> Result<u64, ConfigError> {
    let every = flag.unwrap_or(SNAPSHOT_EVERY_ENTRIES_DEFAULT);
    if every == 0 {
        return Err(ConfigError::Invalid {
            name: "snapshot-every-entries",
            problem: "must be at least 1".into(),
        });
    }
    Ok(every)
}

/// The connection limits, each at least 1 and the per-peer one no more than the total.
fn connection_limits(
    total: Option<usize>,
    per_peer: Option<usize>,
) -> Result<ConnectionLimits, ConfigError> {
    let limits = ConnectionLimits {
        total: total.unwrap_or(CONNECTIONS_MAX_DEFAULT),
        per_peer: per_peer.unwrap_or(CONNECTIONS_PER_PEER_MAX_DEFAULT),
    };
    if limits.total == 0 || limits.per_peer == 0 {
        return Err(ConfigError::Invalid {
            name: "connections-max",
            problem: "connection limits must be at least 1".into(),
        });
    }
    if limits.per_peer > limits.total {
        return Err(ConfigError::Invalid {
            name: "connections-per-peer-max",
            problem: format!(
                "{} is above --connections-max ({}); lower it or raise the total",
                limits.per_peer, limits.total
            ),
        });
    }
    Ok(limits)
}

/// Default of `--snapshot-max-bytes`.
pub const SNAPSHOT_MAX_BYTES_DEFAULT: u64 = rpc::admin::RESTORE_BYTES_MAX as u64;

/// Smallest `--snapshot-max-bytes`: an empty store's snapshot is a few hundred bytes.
pub const SNAPSHOT_MAX_BYTES_MIN: u64 = 64 * 1024;

/// The bound on snapshots received or restored: at least [`SNAPSHOT_MAX_BYTES_MIN`].
fn snapshot_max_bytes(flag: Option<u64>) -> Result<u64, ConfigError> {
    let max = flag.unwrap_or(SNAPSHOT_MAX_BYTES_DEFAULT);
    if max < SNAPSHOT_MAX_BYTES_MIN {
        return Err(ConfigError::Invalid {
            name: "snapshot-max-bytes",
            problem: format!("{max} is less than {SNAPSHOT_MAX_BYTES_MIN}"),
        });
    }
    Ok(max)
}

/// The bound on waiting requests: at least one, and few enough to keep in memory.
fn max_waiters(flag: Option<usize>) -> Result<usize, ConfigError> {
    let max = flag.unwrap_or(MAX_WAITERS_DEFAULT);
    if !(1..=MAX_WAITERS_MAX).contains(&max) {
        return Err(ConfigError::Invalid {
            name: "max-waiters",
            problem: format!("{max} is not between 1 and {MAX_WAITERS_MAX}"),
        });
    }
    Ok(max)
}

/// The edge's bound on a claim's duration: positive, and at most the machine's own
/// bound, so that a claim this node accepts is never refused by the machine.
fn claim_duration_max_ms(flag: Option<i64>) -> Result<i64, ConfigError> {
    let max_ms = flag.unwrap_or(CLAIM_DURATION_MAX_MS_DEFAULT);
    if max_ms <= 0 {
        return Err(ConfigError::Invalid {
            name: "claim-duration-max-ms",
            problem: "must be a positive number of milliseconds".into(),
        });
    }
    if max_ms > CLAIM_DURATION_MS_MAX {
        return Err(ConfigError::Invalid {
            name: "claim-duration-max-ms",
            problem: format!(
                "{max_ms} ms is longer than any claim the task machine grants; use at most {CLAIM_DURATION_MS_MAX} (a year)"
            ),
        });
    }
    Ok(max_ms)
}

fn advertised(
    name: &'static str,
    given: Option<String>,
    listen: SocketAddr,
) -> Result<String, ConfigError> {
    match given {
        Some(addr) if addr.contains(':') => Ok(addr),
        Some(addr) => Err(ConfigError::Invalid {
            name,
            problem: format!("{addr:?} is not host:port"),
        }),
        None if listen.ip().is_unspecified() => Err(ConfigError::Invalid {
            name,
            problem: format!(
                "the node listens on {listen}, which other nodes cannot dial; give the address they should use"
            ),
        }),
        None => Ok(listen.to_string()),
    }
}

/// Parses `ID=API_ADDR/RAFT_ADDR,...`.
pub fn parse_initial_cluster(list: &str) -> Result<BTreeMap<NodeId, RotaNode>, ConfigError> {
    let members = rpc::admin::parse_members(list).map_err(|problem| ConfigError::Invalid {
        name: "initial-cluster",
        problem,
    })?;
    Ok(members
        .into_iter()
        .map(|m| {
            let node = RotaNode {
                api_addr: m.api_addr,
                raft_addr: m.raft_addr,
            };
            (m.id, node)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Flags {
        Flags {
            id: Some(1),
            data_dir: Some("/tmp/rota".into()),
            listen_api: Some("127.0.0.1:7001".parse().expect("addr")),
            listen_raft: Some("127.0.0.1:7101".parse().expect("addr")),
            tls: Some(TlsFlag::Off),
            ..Flags::default()
        }
    }

    #[test]
    fn minimal_flags_give_defaults() {
        let config = NodeConfig::validate(flags()).expect("valid");
        assert_eq!(config.advertise.api_addr, "127.0.0.1:7001");
        assert_eq!(config.sync, SyncMode::Always);
        assert_eq!(config.body_bytes_max, BODY_BYTES_MAX_DEFAULT);
        assert!(config.initial_cluster.is_empty());
        assert_eq!(config.auth, AuthMode::Tokens, "tokens unless turned off");
        assert!(!config.metrics_open);
        assert!(config.tls.is_none());
    }

    #[test]
    fn tls_is_on_unless_turned_off_by_name() {
        let message = |f: Flags| NodeConfig::validate(f).expect_err("invalid").to_string();
        let silent = Flags {
            tls: None,
            ..flags()
        };
        let said = message(silent);
        assert!(
            said.contains("--tls-cert, --tls-key, --tls-ca") && said.contains("--tls=off"),
            "{said}"
        );
        let half = Flags {
            tls: Some(TlsFlag::On),
            tls_cert: Some("/n.pem".into()),
            ..flags()
        };
        let said = message(half);
        assert!(said.contains("missing: --tls-key, --tls-ca"), "{said}");
        let contradictory = Flags {
            tls_ca: Some("/ca.pem".into()),
            ..flags()
        };
        assert!(message(contradictory).contains("drop them"));
        let on = NodeConfig::validate(Flags {
            tls: None,
            tls_cert: Some("/n.pem".into()),
            tls_key: Some("/n.key".into()),
            tls_ca: Some("/ca.pem".into()),
            ..flags()
        })
        .expect("valid");
        assert_eq!(
            on.tls.map(|t| t.ca),
            Some(PathBuf::from("/ca.pem")),
            "files are read at start, not here"
        );
    }

    #[test]
    fn errors_say_what_to_fix() {
        let message = |f: Flags| NodeConfig::validate(f).expect_err("invalid").to_string();
        assert_eq!(
            message(Flags {
                id: None,
                ..flags()
            }),
            "id is required: pass --id or set ROTA_ID"
        );
        assert!(
            message(Flags {
                id: Some(0),
                ..flags()
            })
            .contains("start at 1")
        );
        let same_port = Flags {
            listen_raft: flags().listen_api,
            ..flags()
        };
        assert!(message(same_port).contains("give Raft its own port"));
        let unspecified = Flags {
            listen_api: Some("0.0.0.0:7001".parse().expect("addr")),
            ..flags()
        };
        assert!(message(unspecified).contains("advertise-api"));
        let not_listed = Flags {
            initial_cluster: Some("2=127.0.0.1:7002/127.0.0.1:7102".into()),
            ..flags()
        };
        assert!(message(not_listed).contains("does not name this node (1)"));
        let listed_elsewhere = Flags {
            initial_cluster: Some("1=127.0.0.1:9/127.0.0.1:10".into()),
            ..flags()
        };
        assert!(message(listed_elsewhere).contains("make them agree"));
        let tiny_body = Flags {
            body_bytes_max: Some(1023),
            ..flags()
        };
        assert!(message(tiny_body).starts_with("--body-bytes-max:"));
        let never_snapshot = Flags {
            snapshot_every_entries: Some(0),
            ..flags()
        };
        assert!(message(never_snapshot).starts_with("--snapshot-every-entries:"));
        let no_data_dir = Flags {
            data_dir: None,
            ..flags()
        };
        assert!(message(no_data_dir).starts_with("data-dir is required"));
    }

    #[test]
    fn an_initial_cluster_of_separators_alone_is_none() {
        let config = NodeConfig::validate(Flags {
            initial_cluster: Some(" , ".into()),
            ..flags()
        })
        .expect("valid");
        assert!(config.initial_cluster.is_empty());
    }

    #[test]
    fn the_longest_claim_is_bounded_by_the_machine() {
        let with_max = |max_ms| Flags {
            claim_duration_max_ms: Some(max_ms),
            ..flags()
        };
        let config = NodeConfig::validate(with_max(CLAIM_DURATION_MS_MAX)).expect("the bound");
        assert_eq!(config.claim_duration_max_ms, CLAIM_DURATION_MS_MAX);
        let message = NodeConfig::validate(with_max(CLAIM_DURATION_MS_MAX + 1))
            .expect_err("beyond the bound")
            .to_string();
        assert!(
            message.contains("--claim-duration-max-ms")
                && message.contains(&format!("use at most {CLAIM_DURATION_MS_MAX}")),
            "{message}"
        );
    }

    #[test]
    fn initial_cluster_parses_and_rejects_nonsense() {
        let members = parse_initial_cluster("1=a:1/a:2, 2=b:1/b:2").expect("parses");
        assert_eq!(members.len(), 2);
        assert_eq!(members[&2].raft_addr, "b:2");
        for bad in [
            "1=a:1",
            "x=a:1/a:2",
            "0=a:1/a:2",
            "1=a:1/a:2,1=b:1/b:2",
            "1",
        ] {
            assert!(parse_initial_cluster(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_toml_file_fills_what_flags_leave_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rota.toml");
        std::fs::write(
            &path,
            "sync = \"never\"\nid = 9\nclaim-duration-max-ms = 5000\n",
        )
        .expect("writes");
        let config = NodeConfig::load(Flags {
            config: Some(path.clone()),
            ..flags()
        })
        .expect("valid");
        assert_eq!(config.id, 1, "flags win over the file");
        assert_eq!(config.sync, SyncMode::Never);
        assert_eq!(config.claim_duration_max_ms, 5000);
        std::fs::write(&path, "bogus = 1\n").expect("writes");
        let err = NodeConfig::load(Flags {
            config: Some(path),
            ..flags()
        })
        .expect_err("unknown key");
        assert!(err.to_string().contains("bogus"), "{err}");
    }
}
