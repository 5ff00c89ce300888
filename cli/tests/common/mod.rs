//! What the CLI's process tests share.

use std::path::PathBuf;

/// The workspace's `rota-node`, built beside this test by `cargo test --workspace`.
pub fn node_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = dir.join("rota-node");
    assert!(
        binary.is_file(),
        "{} is missing: run the workspace tests (cargo test --workspace) or build -p raft-node first",
        binary.display()
    );
    binary
}

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::Child;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rpc::client::HttpClient;
use rpc::worker::AddJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker_client::WorkerClient;
use rpc::worker_client::WorkerError;

/// Deadline of one HTTP call from a test.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What one `rota` invocation did.
#[derive(Debug)]
#[allow(dead_code, reason = "each test binary reads different fields")]
pub struct Run {
    /// Exit code (-1 if killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `rota args...` without blocking the test's runtime, echoing it as a transcript
/// (`cargo test -- --nocapture` shows it).
#[allow(dead_code, reason = "not every test binary uses it")]
pub async fn rota(args: &[&str]) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(args)
        .env("ROTA_NODE_BIN", node_binary())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("rota runs");
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    println!("$ rota {}\n{}{}", args.join(" "), run.stdout, run.stderr);
    run
}

/// Real `rota-node` processes on loopback, each started without `--initial-cluster`, so
/// the CLI forms and changes the cluster.
#[allow(dead_code, reason = "not every test binary uses it")]
pub struct Fleet {
    dir: tempfile::TempDir,
    nodes: Mutex<BTreeMap<u64, FleetNode>>,
}

/// One node of a [`Fleet`]: its addresses, kept across restarts, and its process.
struct FleetNode {
    api: String,
    raft: String,
    process: Option<Child>,
}

#[allow(dead_code, reason = "not every test binary uses every helper")]
impl Fleet {
    /// An empty fleet; [`Fleet::start`] adds nodes.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
            nodes: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, FleetNode>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A free `127.0.0.1` port as `host:port`, never one this test process handed out before:
/// a port bound and released here may come back from the next bind, and two nodes
/// given one port fail to start (a listener is released before its node binds it).
fn free_port() -> String {
    static HANDED_OUT: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = listener.local_addr().expect("bound");
        if handed_out.insert(addr.port()) {
            return addr.to_string();
        }
    }
}

#[allow(dead_code, reason = "not every test binary uses every helper")]
impl Fleet {
    /// Starts node `id` (on fresh ports the first time, the same ones after) with its own
    /// data directory.
    pub fn start(&self, id: u64) {
        let free = free_port;
        let (api, raft) = {
            let mut nodes = self.lock();
            let node = nodes.entry(id).or_insert_with(|| FleetNode {
                api: free(),
                raft: free(),
                process: None,
            });
            (node.api.clone(), node.raft.clone())
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .expect("log file");
        let mut nodes = self.lock();
        let node = nodes.get_mut(&id).expect("registered above");
        node.process = Some(
            std::process::Command::new(node_binary())
                .args(["--id", &id.to_string()])
                .arg("--data-dir")
                .arg(self.dir.path().join(format!("node-{id}")))
                .args(["--listen-api", &api, "--listen-raft", &raft])
                .args(["--snapshot-every-entries", "500"])
                .args(["--auth=off", "--tls=off"])
                .env("ROTA_LOG", "info")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("rota-node starts"),
        );
    }

    /// `kill -9` of node `id`.
    pub fn kill(&self, id: u64) {
        let child = self
            .lock()
            .get_mut(&id)
            .and_then(|node| node.process.take());
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Node `id`'s API address.
    pub fn api(&self, id: u64) -> String {
        self.lock().get(&id).expect("started").api.clone()
    }

    /// Node `id` as `--initial-cluster` and `add-learner` want it: `ID=API/RAFT`.
    pub fn member(&self, id: u64) -> String {
        let nodes = self.lock();
        let node = nodes.get(&id).expect("started");
        format!("{id}={}/{}", node.api, node.raft)
    }

    /// Node `id`'s Raft address.
    pub fn raft(&self, id: u64) -> String {
        self.lock().get(&id).expect("started").raft.clone()
    }

    /// `--url` listing the API addresses of `ids`.
    pub fn urls(&self, ids: &[u64]) -> String {
        ids.iter()
            .map(|&id| self.api(id))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until node `id` answers `/health`.
    pub async fn wait_up(&self, id: u64) {
        let client = HttpClient::new();
        let addr = self.api(id);
        for _ in 0..300 {
            if client
                .get(&addr, "/health", CALL_TIMEOUT)
                .await
                .is_ok_and(|r| r.status.is_success())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = std::fs::read_to_string(self.dir.path().join(format!("node-{id}.log")))
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "node {id} did not come up at {addr}; the end of its log:\n{}",
            tail.join("\n")
        );
    }

    /// Waits until `ids` report the same applied index and state hash; returns the hash.
    pub async fn wait_converged(&self, ids: &[u64]) -> String {
        let client = HttpClient::new();
        let mut last = Vec::new();
        for _ in 0..300 {
            last.clear();
            for &id in ids {
                let hash = match client
                    .get(&self.api(id), "/admin/state-hash", CALL_TIMEOUT)
                    .await
                {
                    Ok(r) => r.json::<rpc::admin::StateHashJson>(&self.api(id)).ok(),
                    Err(_) => None,
                };
                last.push(hash.map(|h| (h.applied_index, h.state_hash)));
            }
            if last.iter().all(|h| h.is_some() && *h == last[0]) {
                return last[0].clone().map(|(_, hash)| hash).unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("nodes {ids:?} did not converge: {last:?}");
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for node in self.lock().values_mut() {
            if let Some(mut child) = node.process.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Workers adding tasks through any of a set of nodes until stopped, retrying each
/// add with its request id until it is acknowledged, as real clients do.
#[allow(dead_code, reason = "not every test binary uses it")]
pub struct Workers {
    stop: Arc<AtomicBool>,
    handles: Vec<tokio::task::JoinHandle<Vec<u64>>>,
    /// Every acknowledged task id, with the instant it was acknowledged.
    pub acked: Arc<Mutex<Vec<(u64, std::time::Instant)>>>,
}

#[allow(dead_code, reason = "not every test binary uses it")]
impl Workers {
    /// Starts `count` workers adding to group `group` through `addrs` (tried in turn).
    pub fn start(count: usize, addrs: Vec<String>, group: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let handles = (0..count)
            .map(|worker| {
                let (stop, acked, addrs) = (stop.clone(), acked.clone(), addrs.clone());
                let group = group.to_string();
                tokio::spawn(async move {
                    let client = WorkerClient::new(&addrs, worker as i64 + 1)
                        .expect("nodes to write through")
                        .spread_from(worker)
                        .with_timeouts(CALL_TIMEOUT, Duration::MAX);
                    let mut mine = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let update = UpdateRequestJson::by(worker as i64 + 1).with_add(
                            AddJson::in_group(&group).with_data(format!("w{worker}-{n}")),
                        );
                        // Retry the same request until it is acknowledged (or we stop).
                        let stop_flag = Arc::clone(&stop);
                        let written = client
                            .write_until(update, format!("w{worker}-{n}"), &move || {
                                stop_flag.load(Ordering::Relaxed)
                            })
                            .await;
                        match written {
                            Ok(tasks) => {
                                let id = tasks[0].id;
                                mine.push(id);
                                acked
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push((id, std::time::Instant::now()));
                            }
                            Err(WorkerError::Refused(errors)) => {
                                panic!("an add was refused: {errors:?}")
                            }
                            Err(WorkerError::Unavailable { .. }) => return mine,
                            Err(rejected) => panic!("an add was rejected: {rejected}"),
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    mine
                })
            })
            .collect();
        Self {
            stop,
            handles,
            acked,
        }
    }

    /// Stops the workers and returns every acknowledged id.
    pub async fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for handle in self.handles {
            all.extend(handle.await.expect("worker finished"));
        }
        all
    }
}

/// Checks that every id in `ids` is a live task at node `addr` (ids are unique).
#[allow(dead_code, reason = "not every test binary uses it")]
pub async fn assert_all_present(addr: &str, ids: &[u64]) {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "an id was acknowledged twice");
    let client = HttpClient::new();
    for chunk in sorted.chunks(500) {
        let list = chunk
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let found: Vec<Option<rpc::worker::TaskJson>> = client
            .get(addr, &format!("/tasks/{list}"), CALL_TIMEOUT)
            .await
            .expect("answers")
            .json(addr)
            .expect("tasks");
        let missing: Vec<u64> = chunk
            .iter()
            .zip(&found)
            .filter(|(_, t)| t.is_none())
            .map(|(id, _)| *id)
            .collect();
        assert!(missing.is_empty(), "acknowledged adds lost: {missing:?}");
    }
}
