//! A cluster of real `rota-node` processes on 127.0.0.1 for integration tests. Every
//! wait is on a condition read from the status endpoints, never a fixed sleep. Processes
//! are killed when the cluster is dropped, even when a test fails.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use rpc::admin::ClusterStatusJson;
use rpc::admin::StateHashJson;
use rpc::client::HttpClient;
use rpc::worker::WriteResultJson;
use serde::Serialize;

/// How long any wait in these tests may take before it fails.
pub const WAIT_MAX: Duration = Duration::from_secs(60);
/// Deadline of one HTTP call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Polls `probe` until it succeeds, failing the test with its last message after
/// [`WAIT_MAX`].
pub async fn eventually<T, F, Fut>(mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(message) => assert!(
                Instant::now() < deadline,
                "gave up after {WAIT_MAX:?}: {message}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One node's ports and process.
pub struct TestNode {
    /// Node id.
    pub id: u64,
    /// `127.0.0.1:port` of the API.
    pub api_addr: String,
    /// `127.0.0.1:port` of Raft.
    pub raft_addr: String,
    process: Mutex<Option<Child>>,
}

/// A cluster of node processes in a temporary directory.
pub struct TestCluster {
    /// The nodes, by position (id - 1).
    pub nodes: Vec<TestNode>,
    /// Nodes started alone, to be added later: they get no initial member list.
    pub joiners: Mutex<Vec<u64>>,
    /// HTTP client for all calls.
    pub client: HttpClient,
    dir: tempfile::TempDir,
    sync: &'static str,
    extra_args: Vec<String>,
    /// Environment variables set for one node's process: `(id, name, value)`.
    envs: Mutex<Vec<(u64, String, String)>>,
}

/// A bound `127.0.0.1` listener on a port this test process never handed out before (a
/// port released here may come back from the next bind), and its address.
pub fn free_addr() -> (TcpListener, String) {
    static HANDED_OUT: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = listener.local_addr().expect("bound");
        if handed_out.insert(addr.port()) {
            return (listener, addr.to_string());
        }
    }
}

impl TestCluster {
    /// Starts `n` nodes with a static initial member list.
    pub fn start(n: u64, sync: &'static str) -> Self {
        Self::start_with(n, sync, &[])
    }

    /// Starts `n` nodes, each with `extra_args` added to its command line.
    pub fn start_with(n: u64, sync: &'static str, extra_args: &[&str]) -> Self {
        Self::start_with_env(n, sync, extra_args, &[])
    }

    /// Starts `n` nodes, each with `extra_args` added to its command line and the
    /// environment variables `envs` names for it, `(id, name, value)`.
    pub fn start_with_env(
        n: u64,
        sync: &'static str,
        extra_args: &[&str],
        envs: &[(u64, &str, &str)],
    ) -> Self {
        let mut held = Vec::new();
        let mut nodes = Vec::new();
        for id in 1..=n {
            let (api, api_addr) = free_addr();
            let (raft, raft_addr) = free_addr();
            held.push((api, raft));
            nodes.push(TestNode {
                id,
                api_addr,
                raft_addr,
                process: Mutex::new(None),
            });
        }
        drop(held);
        let cluster = Self {
            nodes,
            joiners: Mutex::new(Vec::new()),
            client: HttpClient::new(),
            dir: tempfile::tempdir().expect("temporary directory"),
            sync,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            envs: Mutex::new(
                envs.iter()
                    .map(|&(id, name, value)| (id, name.to_string(), value.to_string()))
                    .collect(),
            ),
        };
        for id in 1..=n {
            cluster.start_node(id);
        }
        cluster
    }

    fn initial_cluster(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}={}/{}", n.id, n.api_addr, n.raft_addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    /// The log file of node `id`.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    /// `--auth=off` unless the test chose an `--auth` of its own.
    fn auth_args(&self) -> Vec<&'static str> {
        if self.extra_args.iter().any(|a| a.starts_with("--auth")) {
            vec![]
        } else {
            vec!["--auth=off"]
        }
        .into_iter()
        .chain((!self.extra_args.iter().any(|a| a.starts_with("--tls"))).then_some("--tls=off"))
        .collect()
    }

    /// Waits until node `id` has applied the record of the log form every member
    /// reads, which a new cluster's leader writes once, soon after it is elected: a
    /// test that counts log entries starts after it.
    pub async fn wait_log_form_recorded(&self, id: u64) {
        eventually(|| async {
            match self.status(id).await {
                Some(status) if status.log_form > 0 => Ok(()),
                Some(status) => Err(format!("log form {}", status.log_form)),
                None => Err("no status".to_string()),
            }
        })
        .await;
    }

    /// Starts (or restarts) node `id` with its original command line.
    pub fn start_node(&self, id: u64) {
        let initial = self.initial_cluster();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .expect("log file");
        let data_dir = self.dir.path().join(format!("node-{id}"));
        let node = &self.nodes[(id - 1) as usize];
        let child = Command::new(env!("CARGO_BIN_EXE_rota-node"))
            .args(["--id", &id.to_string()])
            .arg("--data-dir")
            .arg(data_dir)
            .args([
                "--listen-api",
                &node.api_addr,
                "--listen-raft",
                &node.raft_addr,
            ])
            .args(["--sync", self.sync])
            .args(self.auth_args())
            .args(
                if self
                    .joiners
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&id)
                {
                    vec![]
                } else {
                    vec!["--initial-cluster".to_string(), initial]
                },
            )
            .args(&self.extra_args)
            .envs(
                self.envs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter(|(node, _, _)| *node == id)
                    .map(|(_, name, value)| (name.clone(), value.clone())),
            )
            .env("ROTA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("rota-node starts");
        *node.process.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
    }

    /// Sets environment variable `name` to `value` for node `id` from its next start.
    pub fn set_env(&self, id: u64, name: &str, value: &str) {
        self.envs.lock().unwrap_or_else(|p| p.into_inner()).push((
            id,
            name.to_string(),
            value.to_string(),
        ));
    }

    /// Drops the environment variables set for node `id`, from its next start.
    pub fn clear_env(&self, id: u64) {
        self.envs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(node, _, _)| *node != id);
    }

    /// Prepares node `id` (beyond the initial ones) to start alone, without a member
    /// list; it serves once an admin adds it.
    pub fn with_joiner(mut self, id: u64) -> Self {
        let (api, api_addr) = free_addr();
        let (raft, raft_addr) = free_addr();
        drop((api, raft));
        self.nodes.push(TestNode {
            id,
            api_addr,
            raft_addr,
            process: Mutex::new(None),
        });
        self.joiners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id);
        self
    }

    /// `kill -9` of node `id`.
    pub fn kill(&self, id: u64) {
        let process = self.nodes[(id - 1) as usize]
            .process
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut child) = process {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`HUP`, `STOP`, ...) to node `id`'s process, if it runs.
    pub fn signal(&self, id: u64, signal: &str) {
        let process = self.nodes[(id - 1) as usize]
            .process
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(child) = process.as_ref() {
            let _ = std::process::Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
        }
    }

    /// SIGTERM to node `id`; its exit status once it has stopped.
    pub fn terminate(&self, id: u64) -> Option<std::process::ExitStatus> {
        let mut child = self.nodes[(id - 1) as usize]
            .process
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        child.wait().ok()
    }

    /// The API address of node `id`.
    pub fn api(&self, id: u64) -> &str {
        &self.nodes[(id - 1) as usize].api_addr
    }

    /// Node `id`'s `/cluster`, if it answers.
    pub async fn status(&self, id: u64) -> Option<ClusterStatusJson> {
        self.get_json(id, "/cluster").await
    }

    /// Node `id`'s state hash.
    pub async fn state_hash(&self, id: u64) -> Option<StateHashJson> {
        self.get_json(id, "/admin/state-hash").await
    }

    /// The value of the `/metrics` line of node `id` that starts with `series` (a
    /// name, with its labels if it has any).
    pub async fn metric(&self, id: u64, series: &str) -> f64 {
        let response = self
            .client
            .get(self.api(id), "/metrics", CALL_TIMEOUT)
            .await
            .expect("metrics");
        let text = String::from_utf8_lossy(&response.body).to_string();
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    }

    /// `GET path` on node `id`, decoded, if it answers 2xx.
    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, id: u64, path: &str) -> Option<T> {
        let response = self
            .client
            .get(self.api(id), path, CALL_TIMEOUT)
            .await
            .ok()?;
        response.success(self.api(id)).ok()?.json(self.api(id)).ok()
    }

    /// Waits until every listed node answers `/ready` with 200.
    pub async fn wait_ready(&self, ids: &[u64]) {
        for &id in ids {
            eventually(|| async move {
                let ready = self
                    .client
                    .get(self.api(id), "/ready", CALL_TIMEOUT)
                    .await
                    .is_ok_and(|r| r.status.is_success());
                ready
                    .then_some(())
                    .ok_or_else(|| format!("node {id} not ready; see {:?}", self.log_path(id)))
            })
            .await;
        }
    }

    /// The leader that the listed nodes agree on, once they do.
    pub async fn wait_leader(&self, ids: &[u64]) -> u64 {
        eventually(|| async move {
            let mut leaders = Vec::new();
            for &id in ids {
                leaders.push(self.status(id).await.and_then(|s| s.leader));
            }
            match leaders.first().copied() {
                Some(Some(leader))
                    if leaders.iter().all(|l| *l == Some(leader)) && ids.contains(&leader) =>
                {
                    Ok(leader)
                }
                _ => Err(format!("no agreed leader among {ids:?}: {leaders:?}")),
            }
        })
        .await
    }

    /// Waits until node `expected` is the leader that every initial node names.
    pub async fn wait_leader_is(&self, expected: u64) -> u64 {
        eventually(|| async move {
            let leader = self.wait_leader(&[1, 2, 3]).await;
            (leader == expected)
                .then_some(leader)
                .ok_or_else(|| format!("leadership stayed with {leader}, not {expected}"))
        })
        .await
    }

    /// Waits until the listed nodes have applied the same index and report equal state
    /// hashes; returns the hash.
    pub async fn wait_converged(&self, ids: &[u64]) -> StateHashJson {
        eventually(|| async move {
            let mut hashes = Vec::new();
            for &id in ids {
                hashes.push(self.state_hash(id).await);
            }
            match hashes.first() {
                Some(Some(first)) if hashes.iter().all(|h| h.as_ref() == Some(first)) => {
                    Ok(first.clone())
                }
                _ => Err(format!("nodes {ids:?} did not converge: {hashes:?}")),
            }
        })
        .await
    }

    /// POSTs `body` as JSON to node `id` and parses a processed write's answer.
    pub async fn write<T: Serialize>(
        &self,
        id: u64,
        path: &str,
        body: &T,
    ) -> Result<WriteResultJson, String> {
        let response = self
            .client
            .post_json(self.api(id), path, body, CALL_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?
            .success(self.api(id))
            .map_err(|e| e.to_string())?;
        response.json(self.api(id)).map_err(|e| e.to_string())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            let process = node
                .process
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(mut child) = process {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// This package's directory as `cargo test` names it when it runs the test, so that a
/// test binary built from a clone at another path (a shared target directory keeps it
/// when the sources are the same) reads this clone's files; the path it was built at
/// otherwise.
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
