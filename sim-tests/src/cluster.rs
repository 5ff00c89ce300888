//! `SimCluster`: real nodes on simulated hosts, each with a memory disk kept outside the
//! host so that it survives kill and restart.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use madsim::runtime::Handle;
use madsim::runtime::NodeHandle;
use raft_node::clock::WallClock;
use raft_node::config::Flags;
use raft_node::config::NodeConfig;
use raft_node::storage::NodeSnapshots;
use rpc::admin::ClusterStatusJson;
use rpc::admin::StateHashJson;
use rpc::auth::BOOTSTRAP_PATH;
use rpc::auth::BootstrapJson;
use rpc::auth::NewTokenJson;
use rpc::auth::TokenAddJson;
use rpc::client::HttpClient;
use store_sm::memory::MemDisk;
use store_sm::raft_types::SyncMode;

/// Port of every node's worker and admin API.
pub const API_PORT: u16 = 7001;
/// Port of every node's Raft listener.
pub const RAFT_PORT: u16 = 8001;
/// Deadline of one call from the harness.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A node's wall clock: the simulator's clock plus a per-node offset, so tests can skew
/// one node's clock without touching the others.
#[derive(Clone, Default)]
pub struct SkewedClock {
    offset_ms: Arc<AtomicI64>,
}

impl SkewedClock {
    /// Moves this clock by `delta_ms` (forward or back).
    pub fn jump(&self, delta_ms: i64) {
        self.offset_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl WallClock for SkewedClock {
    fn now_ms(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        now + self.offset_ms.load(Ordering::SeqCst)
    }
}

/// One simulated member.
pub struct SimNode {
    /// Node id.
    pub id: u64,
    /// Its address on the simulated network.
    pub ip: IpAddr,
    /// Its disk, outside the host: it outlives kills and restarts.
    pub disk: MemDisk,
    /// Its wall clock's skew.
    pub clock: SkewedClock,
    host: NodeHandle,
}

impl SimNode {
    /// `ip:port` of the worker API.
    pub fn api_addr(&self) -> String {
        SocketAddr::new(self.ip, API_PORT).to_string()
    }
}

/// A cluster of simulated nodes formed from a static member list, plus a client host.
pub struct SimCluster {
    handle: Handle,
    /// The members by id.
    pub nodes: BTreeMap<u64, SimNode>,
    client: NodeHandle,
    /// Links cut by [`SimCluster::cut`], as (from, to) node ids, to heal later.
    cut_links: std::sync::Mutex<std::collections::BTreeSet<(u64, u64)>>,
    /// The admin token the harness's own calls carry, once [`SimCluster::bootstrap`] made it.
    admin_token: std::sync::OnceLock<String>,
}

/// The bearer tokens of a simulated cluster, as [`SimCluster::bootstrap`] made them.
#[derive(Clone, Debug)]
pub struct SimTokens {
    /// The first admin token.
    pub admin: String,
    /// A worker token limited to the group prefixes [`WORKER_GROUP_PREFIXES`].
    pub worker: String,
    /// A reader token.
    pub reader: String,
}

/// The group prefixes of the workers' token: every group the workloads use, and no more.
pub const WORKER_GROUP_PREFIXES: [&str; 2] = ["g", crate::JOB_GROUP];

fn node_ip(id: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, id as u8))
}

/// `id=api/raft` of node `id`, as `--initial-cluster` and the admin API name members.
pub fn member_spec(id: u64) -> String {
    let ip = node_ip(id);
    format!("{id}={ip}:{API_PORT}/{ip}:{RAFT_PORT}")
}

/// Node `id`'s configuration; with no `members` it starts empty, to be added later.
fn config(id: u64, members: &[u64]) -> NodeConfig {
    let initial = (!members.is_empty()).then(|| {
        members
            .iter()
            .map(|&m| member_spec(m))
            .collect::<Vec<_>>()
            .join(",")
    });
    let ip = node_ip(id);
    let flags = Flags {
        id: Some(id),
        data_dir: Some(format!("/sim/node-{id}").into()),
        listen_api: Some(SocketAddr::new(ip, API_PORT)),
        listen_raft: Some(SocketAddr::new(ip, RAFT_PORT)),
        initial_cluster: initial,
        snapshot_every_entries: Some(200),
        logs_kept_after_snapshot: Some(50),
        // Tokens are checked as in production; TLS is off: the simulated network has no
        // eavesdropper, and the handshakes would only slow every run.
        auth: Some(raft_node::config::AuthFlag::Tokens),
        tls: Some(raft_node::config::TlsFlag::Off),
        rate_limit_per_connection: Some(0),
        rate_limit_per_token: Some(0),
        ..Flags::default()
    };
    NodeConfig::validate(flags).unwrap_or_else(|e| panic!("simulated node {id}: {e}"))
}

impl SimCluster {
    /// Starts `n` nodes (ids 1..=n) forming one cluster, and a client host.
    pub fn start(n: u64) -> Self {
        Self::start_with_spares(n, 0)
    }

    /// Starts `n` nodes (ids 1..=n), makes their first tokens and waits until they all
    /// name one leader, each within 10 s of simulated time: the cluster, its tokens and
    /// its leader. Panics, saying which step, if one does not happen in time.
    pub async fn start_serving(n: u64) -> (Self, SimTokens, u64) {
        let cluster = Self::start(n);
        let tokens = cluster
            .bootstrap(Duration::from_secs(10))
            .await
            .expect("the first admin token within 10 s");
        let members: Vec<u64> = (1..=n).collect();
        let leader = cluster
            .wait_leader(&members, Duration::from_secs(10))
            .await
            .expect("a leader within 10 s");
        (cluster, tokens, leader)
    }

    /// Starts `n` nodes (ids 1..=n) forming one cluster, `spares` empty nodes (ids
    /// n+1..=n+spares) that the admin API can add later, and a client host.
    pub fn start_with_spares(n: u64, spares: u64) -> Self {
        let handle = Handle::current();
        let members: Vec<u64> = (1..=n).collect();
        let mut nodes = BTreeMap::new();
        for id in 1..=n + spares {
            let disk = MemDisk::new();
            let clock = SkewedClock::default();
            let config = config(id, if id <= n { &members } else { &[] });
            let (host_disk, host_clock) = (disk.clone(), clock.clone());
            let host = handle
                .create_node()
                .name(format!("node-{id}"))
                .ip(node_ip(id))
                .init(move || {
                    let (config, disk, clock) =
                        (config.clone(), host_disk.clone(), host_clock.clone());
                    async move {
                        let log = disk.log_store(SyncMode::Always);
                        let snapshots = NodeSnapshots::Memory(disk.snapshots());
                        let running = raft_node::start_on(config, log, snapshots, None, clock)
                            .await
                            .unwrap_or_else(|e| panic!("node {id} does not start: {e}"));
                        // Serve until the host is killed; killing drops this future.
                        std::future::pending::<()>().await;
                        drop(running);
                    }
                })
                .build();
            nodes.insert(
                id,
                SimNode {
                    id,
                    ip: node_ip(id),
                    disk,
                    clock,
                    host,
                },
            );
        }
        let client = handle
            .create_node()
            .name("client")
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)))
            .build();
        Self {
            handle,
            nodes,
            client,
            cut_links: std::sync::Mutex::new(Default::default()),
            admin_token: std::sync::OnceLock::new(),
        }
    }

    /// Makes the cluster's first admin token (asking the members in turn until one
    /// answers, as `rota cluster init` does), then a worker token limited to
    /// [`WORKER_GROUP_PREFIXES`] and a reader token. The harness's own calls carry the
    /// admin token from then on. `None` if no member made it within `within`.
    pub async fn bootstrap(&self, within: Duration) -> Option<SimTokens> {
        let deadline = madsim::time::Instant::now() + within;
        let members: Vec<u64> = self.nodes.keys().copied().collect();
        let admin = 'made: loop {
            for &id in &members {
                if madsim::time::Instant::now() >= deadline {
                    return None;
                }
                let answer = self
                    .post_json(id, BOOTSTRAP_PATH, BootstrapJson::default())
                    .await;
                match answer {
                    Some((200, body)) => {
                        let made: NewTokenJson = serde_json::from_str(&body)
                            .unwrap_or_else(|e| panic!("bootstrap answered {body}: {e}"));
                        break 'made made.bearer;
                    }
                    // A bootstrap that applied but whose answer was lost cannot be
                    // repeated: its secret is gone.
                    Some((409, body)) => panic!("the cluster was bootstrapped already: {body}"),
                    _ => madsim::time::sleep(Duration::from_millis(100)).await,
                }
            }
        };
        let _ = self.admin_token.set(admin.clone());
        let worker = self
            .add_token("sim workers", "worker", &WORKER_GROUP_PREFIXES, deadline)
            .await?;
        let reader = self
            .add_token("sim watchers", "reader", &[], deadline)
            .await?;
        Some(SimTokens {
            admin,
            worker,
            reader,
        })
    }

    /// Adds a token through any member with the admin token until one answers 200; its
    /// bearer form, or `None` at `deadline`.
    async fn add_token(
        &self,
        name: &str,
        role: &str,
        groups: &[&str],
        deadline: madsim::time::Instant,
    ) -> Option<String> {
        let add = TokenAddJson {
            name: name.into(),
            role: role.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let members: Vec<u64> = self.nodes.keys().copied().collect();
        while madsim::time::Instant::now() < deadline {
            for &id in &members {
                if let Some((200, body)) = self.post_json(id, "/admin/tokens", add.clone()).await {
                    let made: NewTokenJson = serde_json::from_str(&body)
                        .unwrap_or_else(|e| panic!("a token add answered {body}: {e}"));
                    return Some(made.bearer);
                }
                madsim::time::sleep(Duration::from_millis(100)).await;
            }
        }
        None
    }

    /// A client of the harness's own: it carries the admin token once there is one.
    fn admin_client(&self) -> HttpClient {
        HttpClient::new()
            .with_token(self.admin_token.get().map(String::as_str))
            .unwrap_or_else(|e| panic!("the admin token: {e}"))
    }

    fn host_id(&self, id: u64) -> madsim::task::NodeId {
        self.nodes[&id].host.id()
    }

    /// Freezes node `id` (its tasks stop; timers of others run on), as SIGSTOP would.
    pub fn pause(&self, id: u64) {
        self.handle.pause(self.host_id(id));
    }

    /// Lets a paused node run again.
    pub fn resume(&self, id: u64) {
        self.handle.resume(self.host_id(id));
    }

    /// Drops every packet from node `from` to node `to` (one way).
    pub fn cut(&self, from: u64, to: u64) {
        madsim::net::NetSim::current().clog_link(self.host_id(from), self.host_id(to));
        self.cut_links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((from, to));
    }

    /// Splits the members into `groups` that cannot reach each other; the client
    /// still reaches everyone.
    pub fn partition(&self, groups: &[Vec<u64>]) {
        for (i, a) in groups.iter().enumerate() {
            for b in groups.iter().skip(i + 1) {
                for &x in a {
                    for &y in b {
                        self.cut(x, y);
                        self.cut(y, x);
                    }
                }
            }
        }
    }

    /// Restores every cut link and a clean network.
    pub fn heal(&self) {
        let net = madsim::net::NetSim::current();
        let links = std::mem::take(&mut *self.cut_links.lock().unwrap_or_else(|p| p.into_inner()));
        for (from, to) in links {
            net.unclog_link(self.host_id(from), self.host_id(to));
        }
        net.update_config(|config| *config = madsim::net::Config::default());
    }

    /// Makes every link lossy and slow: each packet is lost with probability `loss` and
    /// delayed by a time in `latency`.
    pub fn degrade(&self, loss: f64, latency: std::ops::Range<Duration>) {
        madsim::net::NetSim::current().update_config(|config| {
            config.packet_loss_rate = loss;
            config.send_latency = latency;
        });
    }

    /// Moves node `id`'s wall clock by `delta_ms`.
    pub fn skew_clock(&self, id: u64, delta_ms: i64) {
        self.nodes[&id].clock.jump(delta_ms);
    }

    /// The API addresses of every member.
    pub fn api_addrs(&self) -> Vec<String> {
        self.nodes.values().map(SimNode::api_addr).collect()
    }

    /// The client host, where workloads run.
    pub fn client(&self) -> &NodeHandle {
        &self.client
    }

    /// Stops node `id` at once, as `kill -9` would; its disk keeps what was written.
    pub fn kill(&self, id: u64) {
        self.handle.kill(self.nodes[&id].host.id());
    }

    /// Kills node `id` and drops every write its disk had not synced: a power cut.
    pub fn crash(&self, id: u64) {
        self.kill(id);
        self.nodes[&id].disk.crash();
    }

    /// Starts node `id` again from its disk.
    pub fn restart(&self, id: u64) {
        self.handle.restart(self.nodes[&id].host.id());
    }

    /// Runs `f` on the client host and waits for it.
    pub async fn on_client<F, T>(&self, f: F) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.client
            .spawn(f)
            .await
            .unwrap_or_else(|e| panic!("client task failed: {e}"))
    }

    /// `GET path` on node `id` from the client host, parsed as JSON; `None` if the node
    /// does not answer or answers something else.
    pub async fn get_json<T>(&self, id: u64, path: &str) -> Option<T>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let addr = self.nodes[&id].api_addr();
        let path = path.to_string();
        let client = self.admin_client();
        self.on_client(async move {
            let response = client.get(&addr, &path, CALL_TIMEOUT).await.ok()?;
            response.json(&addr).ok()
        })
        .await
    }

    /// `POST path` with `body` (one of rpc's types) as JSON to node `id` from the client
    /// host; the status and the body, or `None` if the node does not answer.
    pub async fn post_json<B>(&self, id: u64, path: &str, body: B) -> Option<(u16, String)>
    where
        B: serde::Serialize + Send + Sync + 'static,
    {
        let addr = self.nodes[&id].api_addr();
        let path = path.to_string();
        let client = self.admin_client();
        self.on_client(async move {
            let response = client
                .post_json(&addr, &path, &body, CALL_TIMEOUT)
                .await
                .ok()?;
            Some((
                response.status.as_u16(),
                String::from_utf8_lossy(&response.body).into_owned(),
            ))
        })
        .await
    }

    /// `/cluster` of node `id`, asked from the client host.
    pub async fn status(&self, id: u64) -> Option<ClusterStatusJson> {
        self.get_json(id, "/cluster").await
    }

    /// `/admin/state-hash` of node `id`.
    pub async fn state_hash(&self, id: u64) -> Option<StateHashJson> {
        self.get_json(id, "/admin/state-hash").await
    }

    /// Waits (in simulated time) until every node in `ids` names the same leader.
    pub async fn wait_leader(&self, ids: &[u64], within: Duration) -> Option<u64> {
        let deadline = madsim::time::Instant::now() + within;
        while madsim::time::Instant::now() < deadline {
            let mut leaders = Vec::new();
            for &id in ids {
                leaders.push(self.status(id).await.and_then(|s| s.leader));
            }
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|l| *l == Some(*leader))
            {
                return Some(*leader);
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// Waits until `ids` report equal applied index and state hash; returns the hash.
    pub async fn wait_converged(&self, ids: &[u64], within: Duration) -> Option<StateHashJson> {
        let deadline = madsim::time::Instant::now() + within;
        while madsim::time::Instant::now() < deadline {
            let mut hashes = Vec::new();
            for &id in ids {
                hashes.push(self.state_hash(id).await);
            }
            if let Some(Some(first)) = hashes.first()
                && hashes.iter().all(|h| h.as_ref() == Some(first))
            {
                return Some(first.clone());
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}
