//! `rota dev up | down`: a local cluster of `rota-node` processes on 127.0.0.1.
//!
//! The directory holds `cluster.json` (node ids and ports, chosen once so a restart
//! reuses them), and per node its data directory `node-ID/`, its log `node-ID.log` and
//! its process id `node-ID.pid`. A node also names itself in `node-ID/rota-node.pid`
//! once it holds its data directory's lock, so a node restarted by hand, outside
//! `rota dev`, is found and stopped too. Nodes run detached in their own process group, with
//! their output in the log files, so `urls=$(rota dev up ...)` returns.

use std::fs;
use std::fs::OpenOptions;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use serde::Serialize;
use tokio::time::Instant;

use crate::wait::Look;
use crate::wait::poll_until;

/// Most nodes a local cluster may have.
pub const NODES_MAX: u64 = 9;
/// How long `up` waits for every node to be ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `down` waits for a node to exit after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a `rota dev` command failed.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The node binary is nowhere to be found.
    #[error(
        "cannot find the rota-node binary; build it (cargo build -p raft-node) or set ROTA_NODE_BIN"
    )]
    NoNodeBinary,
    /// Nodes did not become ready in time.
    #[error("{0}")]
    NotReady(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DevError {
    let what = what.into();
    move |source| DevError::Io { what, source }
}

/// One node of a local cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevNode {
    /// Node id.
    pub id: u64,
    /// API port on 127.0.0.1.
    pub api_port: u16,
    /// Raft port on 127.0.0.1.
    pub raft_port: u16,
}

impl DevNode {
    fn api_addr(&self) -> String {
        format!("127.0.0.1:{}", self.api_port)
    }

    fn raft_addr(&self) -> String {
        format!("127.0.0.1:{}", self.raft_port)
    }
}

/// What `cluster.json` records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevCluster {
    /// The nodes, by id.
    pub nodes: Vec<DevNode>,
    /// Made with `--secure`: its nodes check tokens, and its first admin token is in
    /// [`ADMIN_TOKEN_FILE`]. Clusters made before this field read as not secure.
    #[serde(default)]
    pub secure: bool,
}

/// The file in a secure cluster's directory that holds its first admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// The directory in a secure cluster's directory that holds its CA and node certificates.
pub const TLS_DIR: &str = "tls";

impl DevCluster {
    /// The worker URLs, one per node (`https://` for a secure cluster).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.secure { "https" } else { "http" };
        self.nodes
            .iter()
            .map(|n| format!("{scheme}://{}", n.api_addr()))
            .collect()
    }
}

/// The CA certificate of the secure cluster in `dir`.
pub fn ca_path(dir: &Path) -> PathBuf {
    dir.join(TLS_DIR).join(crate::cert::CA_CERT)
}

/// A CA and a certificate for every node, for 127.0.0.1 and localhost.
fn make_certificates(dir: &Path, cluster: &DevCluster) -> Result<(), DevError> {
    let tls = dir.join(TLS_DIR);
    let failed = |e: crate::CliError| {
        DevError::Usage(format!("making certificates in {}: {e}", tls.display()))
    };
    crate::cert::make_ca(&tls).map_err(failed)?;
    for node in &cluster.nodes {
        let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
        crate::cert::make_node(&tls, node.id, &hosts).map_err(failed)?;
    }
    Ok(())
}

/// A client of the cluster in `dir`: TLS with its CA when it is secure.
fn dev_client(dir: &Path, cluster: &DevCluster) -> Result<rpc::client::HttpClient, DevError> {
    if !cluster.secure {
        return Ok(rpc::client::HttpClient::new());
    }
    let files = rpc::tls::ClientTlsFiles {
        ca: ca_path(dir),
        identity: None,
    };
    let tls = rpc::tls::ClientTls::load(files)
        .map_err(|e| DevError::Usage(format!("the cluster's CA: {e}")))?;
    Ok(rpc::client::HttpClient::new().with_tls(Some(tls)))
}

fn load_or_create(dir: &Path, nodes: u64, secure: bool) -> Result<DevCluster, DevError> {
    let path = dir.join("cluster.json");
    if path.exists() {
        let text = fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        let cluster: DevCluster = serde_json::from_str(&text).map_err(|e| {
            DevError::Usage(format!(
                "{} is damaged ({e}); remove the directory",
                path.display()
            ))
        })?;
        if cluster.nodes.len() as u64 != nodes {
            return Err(DevError::Usage(format!(
                "{} holds a {}-node cluster; pass --nodes {} or use another --dir",
                dir.display(),
                cluster.nodes.len(),
                cluster.nodes.len()
            )));
        }
        if secure && !cluster.secure {
            return Err(DevError::Usage(format!(
                "the cluster in {} was made without --secure; use another --dir for a secure one",
                dir.display()
            )));
        }
        return Ok(cluster);
    }
    // Hold every listener until all ports are chosen so no two nodes get the same one.
    let mut held = Vec::new();
    let mut cluster = DevCluster {
        nodes: Vec::new(),
        secure,
    };
    let mut ports = PortPicker::new();
    for id in 1..=nodes {
        let api = ports.reserve().map_err(io("finding a free port"))?;
        let raft = ports.reserve().map_err(io("finding a free port"))?;
        cluster.nodes.push(DevNode {
            id,
            api_port: api.local_addr().map_err(io("finding a free port"))?.port(),
            raft_port: raft.local_addr().map_err(io("finding a free port"))?.port(),
        });
        held.push((api, raft));
    }
    drop(held);
    if secure {
        make_certificates(dir, &cluster)?;
    }
    let text = serde_json::to_string_pretty(&cluster)
        .map_err(|e| DevError::Usage(format!("encoding cluster.json: {e}")))?;
    fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    Ok(cluster)
}

/// Picks the dev cluster's ports below the kernel's ephemeral range. A port is chosen by
/// binding it and released before its node binds it; a port from the ephemeral range
/// (`bind` to port 0) can be taken in that gap by any process's outgoing connection,
/// which a busy machine (a test suite) makes by the thousand. Below the range, only
/// another process choosing the same port on purpose could.
struct PortPicker {
    low: u16,
    high: u16,
    state: u64,
}

impl PortPicker {
    /// Lowest port this picker uses when the ephemeral range starts high enough.
    const FLOOR: u16 = 10_000;
    /// Ports tried before falling back to one of the ephemeral range.
    const TRIES: usize = 64;

    fn new() -> Self {
        let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32_768);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            low: Self::FLOOR,
            high: ephemeral_low,
            // Two `dev up`s at once start from different ports.
            state: nanos ^ (u64::from(std::process::id()) << 32) | 1,
        }
    }

    /// A listener on a free `127.0.0.1` port, held until the caller drops it.
    fn reserve(&mut self) -> std::io::Result<TcpListener> {
        if self.high > self.low {
            for _ in 0..Self::TRIES {
                // xorshift64: spread, not secret.
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                let span = u64::from(self.high - self.low);
                let port = self.low + (self.state % span) as u16;
                if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                    return Ok(listener);
                }
            }
        }
        TcpListener::bind("127.0.0.1:0")
    }
}

/// The `rota-node` binary: `ROTA_NODE_BIN`, beside this executable, or on `PATH`.
fn node_binary() -> Result<PathBuf, DevError> {
    if let Some(path) = std::env::var_os("ROTA_NODE_BIN") {
        return Ok(PathBuf::from(path));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("rota-node")));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("rota-node"));
    beside
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or(DevError::NoNodeBinary)
}

fn pid_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}.pid"))
}

fn recorded_pid(dir: &Path, id: u64) -> Option<u32> {
    fs::read_to_string(pid_path(dir, id))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Where a process is in its life, as far as its files and ports go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Liveness {
    Running,
    /// Its first thread has exited (a zombie), and other threads still hold its files,
    /// ports and data directory lock: a killed node's log writer in an `fdatasync` ends
    /// only when the disk answers.
    Exiting,
    /// Gone, or a zombie with no thread left: nothing of it holds a file.
    Gone,
}

fn liveness(pid: u32) -> Liveness {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Liveness::Gone;
    };
    let state = stat
        .rsplit(')')
        .next()
        .map(str::trim_start)
        .and_then(|rest| rest.chars().next());
    if !matches!(state, None | Some('Z') | Some('X')) {
        return Liveness::Running;
    }
    let threads = fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    if threads > 1 {
        Liveness::Exiting
    } else {
        Liveness::Gone
    }
}

/// Whether process `pid` still holds its files and ports: running, or still exiting.
pub fn process_alive(pid: u32) -> bool {
    liveness(pid) != Liveness::Gone
}

/// The file in a node's data directory where the node names itself (raft-node's
/// `PID_FILE`).
const NODE_PID_FILE: &str = "rota-node.pid";

/// The process serving node `id`'s data directory, if one runs: the one that names
/// itself in the data directory (however it was started), else the one `up` started.
/// Either must be a live `rota-node` whose command line names that data directory, so
/// a reused pid never counts.
fn running_pid(dir: &Path, id: u64) -> Option<u32> {
    let data_dir = dir.join(format!("node-{id}"));
    named_pids(dir, id).find(|&pid| serves(pid, &data_dir))
}

/// The processes named for node `id`: by the node itself in its data directory, and by
/// `up`. Either may be stale, or another process's by now.
fn named_pids(dir: &Path, id: u64) -> impl Iterator<Item = u32> {
    let own = fs::read_to_string(dir.join(format!("node-{id}")).join(NODE_PID_FILE))
        .ok()
        .and_then(|text| text.trim().parse().ok());
    [own, recorded_pid(dir, id)].into_iter().flatten()
}

/// Waits, until `deadline` at most, while a process named for node `id` is still
/// exiting: a node killed a moment ago may hold its ports and data directory, and one
/// started meanwhile would fail. A zombie's command line is empty, so whose process it
/// is cannot be told; a stranger's exit costs the same wait at most. Says so if one is
/// still exiting at the deadline.
async fn let_exiting_end(dir: &Path, id: u64, deadline: Instant) {
    let mut pids: Vec<u32> = named_pids(dir, id).collect();
    pids.dedup();
    for pid in pids {
        if liveness(pid) == Liveness::Exiting && !exited_by(pid, deadline).await {
            eprintln!(
                "rota: node {id}'s earlier process {pid} is still exiting (a thread of it \
                 is stuck, in the kernel or a debugger) and may hold its ports"
            );
        }
    }
}

/// Whether `pid` is a live `rota-node` started on `data_dir` (however the path was
/// spelt: relative paths resolve against the process's working directory).
fn serves(pid: u32, data_dir: &Path) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let names_binary = args.first().is_some_and(|a| a.contains("rota-node"));
    let Ok(wanted) = data_dir.canonicalize() else {
        return false;
    };
    let cwd = PathBuf::from(format!("/proc/{pid}/cwd"));
    let is_wanted = |arg: &str| {
        let path = Path::new(arg);
        let path = if path.is_relative() {
            cwd.join(path)
        } else {
            path.to_path_buf()
        };
        path.canonicalize().is_ok_and(|p| p == wanted)
    };
    let names_dir = args
        .iter()
        .enumerate()
        .any(|(i, arg)| match arg.strip_prefix("--data-dir=") {
            Some(dir) => is_wanted(dir),
            None => arg == "--data-dir" && args.get(i + 1).is_some_and(|d| is_wanted(d)),
        });
    process_alive(pid) && names_binary && names_dir
}

fn spawn(
    dir: &Path,
    binary: &Path,
    node: &DevNode,
    cluster: &DevCluster,
    sync: &str,
    node_args: &[String],
) -> Result<(), DevError> {
    let initial_cluster = cluster
        .nodes
        .iter()
        .map(|n| format!("{}={}/{}", n.id, n.api_addr(), n.raft_addr()))
        .collect::<Vec<_>>()
        .join(",");
    let log_path = dir.join(format!("node-{}.log", node.id));
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("opening {}", log_path.display())))?;
    let log_err = log.try_clone().map_err(io("duplicating the log file"))?;
    let child = Command::new(binary)
        .arg("--id")
        .arg(node.id.to_string())
        .arg("--data-dir")
        .arg(dir.join(format!("node-{}", node.id)))
        .arg("--listen-api")
        .arg(node.api_addr())
        .arg("--listen-raft")
        .arg(node.raft_addr())
        .arg("--initial-cluster")
        .arg(initial_cluster)
        .arg("--sync")
        .arg(sync)
        .args(security_args(dir, node, cluster, node_args))
        .args(node_args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Its own process group: the caller's Ctrl-C or closed terminal does not reach it.
        .process_group(0)
        .spawn()
        .map_err(io(format!("starting {}", binary.display())))?;
    fs::write(pid_path(dir, node.id), child.id().to_string())
        .map_err(io("writing the pid file"))?;
    Ok(())
}

/// The node flags that make a dev cluster plain or secure, without rate limits, unless
/// `node_args` choose.
fn security_args(
    dir: &Path,
    node: &DevNode,
    cluster: &DevCluster,
    node_args: &[String],
) -> Vec<String> {
    let chose = |flag: &str| node_args.iter().any(|a| a.starts_with(flag));
    let mut args = Vec::new();
    if !chose("--auth") {
        // A laptop's cluster: no tokens, as the README's one command promises.
        let auth = if cluster.secure { "tokens" } else { "off" };
        args.push(format!("--auth={auth}"));
    }
    // Rate limits would only get in the way of a laptop's benchmarks.
    for limit in ["--rate-limit-per-connection", "--rate-limit-per-token"] {
        if !chose(limit) {
            args.push(format!("{limit}=0"));
        }
    }
    if !chose("--tls") {
        if cluster.secure {
            let tls = dir.join(TLS_DIR);
            let path = |name: String| tls.join(name).display().to_string();
            args.extend([
                format!("--tls-cert={}", path(format!("node-{}.pem", node.id))),
                format!("--tls-key={}", path(format!("node-{}.key", node.id))),
                format!("--tls-ca={}", path(crate::cert::CA_CERT.to_string())),
            ]);
        } else {
            args.push("--tls=off".to_string());
        }
    }
    args
}

/// Polls in a row a node must look gone before `up` gives up on it, so one odd read of
/// `/proc` right after a start does not abort a cluster that is coming up.
const EXITED_POLLS: u32 = 5;

/// How often `up` looks whether the nodes are ready.
const READY_POLL: Duration = Duration::from_millis(100);

/// How often `down` looks whether a node has exited.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// Waits until every node answers `/ready`; fails early, with the end of its log, when a
/// node has exited.
async fn wait_ready(dir: &Path, cluster: &DevCluster) -> Result<(), DevError> {
    let client = dev_client(dir, cluster)?;
    let mut gone_polls: Vec<u32> = vec![0; cluster.nodes.len()];
    let look = async || {
        let mut waiting = Vec::new();
        for (index, node) in cluster.nodes.iter().enumerate() {
            let ready = client
                .get(&node.api_addr(), "/ready", Duration::from_secs(1))
                .await
                .is_ok_and(|r| r.status.is_success());
            if ready {
                continue;
            }
            let alive = recorded_pid(dir, node.id).is_some_and(process_alive);
            gone_polls[index] = if alive { 0 } else { gone_polls[index] + 1 };
            if gone_polls[index] >= EXITED_POLLS {
                return Err(exited(dir, node.id));
            }
            waiting.push(node.id.to_string());
        }
        Ok(if waiting.is_empty() {
            Look::Done(())
        } else {
            Look::NotYet(waiting)
        })
    };
    let timed_out = |waiting: Vec<String>| {
        DevError::NotReady(format!(
            "nodes {} were not ready within {READY_TIMEOUT:?}; see the node-*.log files in {}",
            waiting.join(", "),
            dir.display()
        ))
    };
    poll_until(Instant::now() + READY_TIMEOUT, READY_POLL, look, timed_out).await
}

/// Node `id` exited: where its log is, and its last lines.
fn exited(dir: &Path, id: u64) -> DevError {
    let log = dir.join(format!("node-{id}.log"));
    let text = fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    DevError::NotReady(format!(
        "node {id} exited; see {}; its last lines:\n{}",
        log.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

/// Waits until process `pid` has exited or `deadline` passes; says whether it exited.
async fn exited_by(pid: u32, deadline: Instant) -> bool {
    let look = async || Ok(Look::from((!process_alive(pid)).then_some(())));
    poll_until(deadline, EXIT_POLL, look, |()| ()).await.is_ok()
}

/// Starts every node of the cluster in `dir` that is not running (with `node_args`
/// added to each started node's command line) and waits until all are ready; their
/// worker URLs.
pub async fn up(
    dir: &Path,
    nodes: u64,
    sync: &str,
    node_args: &[String],
    secure: bool,
) -> Result<Vec<String>, DevError> {
    if !(1..=NODES_MAX).contains(&nodes) {
        return Err(DevError::Usage(format!(
            "--nodes {nodes}: use 1 to {NODES_MAX}"
        )));
    }
    if sync != "always" && sync != "never" {
        return Err(DevError::Usage(format!(
            "--sync {sync}: use always or never"
        )));
    }
    fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let cluster = load_or_create(dir, nodes, secure)?;
    let binary = node_binary()?;
    let mut started = 0;
    let exits_by = Instant::now() + STOP_TIMEOUT;
    for node in &cluster.nodes {
        let_exiting_end(dir, node.id, exits_by).await;
        if running_pid(dir, node.id).is_none() {
            spawn(dir, &binary, node, &cluster, sync, node_args)?;
            started += 1;
        }
    }
    if started == 0 {
        eprintln!("rota: the cluster in {} is already running", dir.display());
    }
    wait_ready(dir, &cluster).await?;
    if cluster.secure {
        let path = dir.join(ADMIN_TOKEN_FILE);
        if !path.exists() {
            let token = bootstrap(dir, &cluster).await?;
            crate::cert::write_new(&path, &format!("{token}\n"), true)
                .map_err(|e| DevError::Usage(e.to_string()))?;
            eprintln!(
                "rota: admin token (shown once; also in {}):",
                path.display()
            );
            eprintln!("{token}");
        }
        eprintln!(
            "rota: export ROTA_TOKEN=$(cat {}) ROTA_CA={}",
            path.display(),
            ca_path(dir).display()
        );
    }
    Ok(cluster.urls())
}

/// Makes the cluster's first admin token through its first node.
async fn bootstrap(dir: &Path, cluster: &DevCluster) -> Result<String, DevError> {
    let addrs: Vec<String> = cluster.nodes.iter().map(DevNode::api_addr).collect();
    let nodes = crate::nodes::Nodes::with_client(dev_client(dir, cluster)?, addrs);
    let made = crate::auth::bootstrap(&nodes)
        .await
        .map_err(|e| DevError::NotReady(format!("making the first admin token: {e}")))?;
    Ok(made.bearer)
}

/// Sends `signal` to process `pid`, or to process group `pid` with `group`, without the
/// `kill` program (a minimal image has none). A target already gone (ESRCH) is what was
/// wanted, and no error.
pub(crate) fn send_signal(
    pid: u32,
    group: bool,
    signal: rustix::process::Signal,
) -> rustix::io::Result<()> {
    let Some(target) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return Ok(());
    };
    let sent = if group {
        rustix::process::kill_process_group(target, signal)
    } else {
        rustix::process::kill_process(target, signal)
    };
    match sent {
        Err(rustix::io::Errno::SRCH) => Ok(()),
        other => other,
    }
}

/// [`send_signal`] to a node: anything but success (a pid file naming another user's
/// process: EPERM) is said, and the other nodes are still stopped.
fn signal(pid: u32, signal: rustix::process::Signal) {
    if let Err(e) = send_signal(pid, false, signal) {
        eprintln!("rota: cannot send {signal:?} to process {pid}: {e}");
    }
}

/// Stops every node of the cluster in `dir`: SIGTERM, then SIGKILL after a grace period.
pub async fn down(dir: &Path) -> Result<(), DevError> {
    let path = dir.join("cluster.json");
    let text = fs::read_to_string(&path).map_err(|_| {
        DevError::Usage(format!(
            "{} holds no local cluster (no cluster.json)",
            dir.display()
        ))
    })?;
    let cluster: DevCluster = serde_json::from_str(&text)
        .map_err(|e| DevError::Usage(format!("{} is damaged: {e}", path.display())))?;
    let mut stopped = 0;
    for node in &cluster.nodes {
        let Some(pid) = running_pid(dir, node.id) else {
            continue;
        };
        signal(pid, rustix::process::Signal::TERM);
        // Until it has really exited: its data directory lock and ports are free only then.
        let deadline = Instant::now() + STOP_TIMEOUT;
        if !exited_by(pid, deadline).await {
            signal(pid, rustix::process::Signal::KILL);
            exited_by(pid, deadline + STOP_TIMEOUT).await;
        }
        stopped += 1;
    }
    // A node killed by someone else a moment ago is not found running (a zombie names no
    // command line), yet it may still hold its ports: waited for while its pid is known.
    let exits_by = Instant::now() + STOP_TIMEOUT;
    for node in &cluster.nodes {
        let_exiting_end(dir, node.id, exits_by).await;
        let _ = fs::remove_file(pid_path(dir, node.id));
    }
    eprintln!("rota: stopped {stopped} node(s) in {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `pid` until it is in `wanted`, for at most 10 s.
    fn wait_for(pid: u32, wanted: Liveness) -> Liveness {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = liveness(pid);
            if now == wanted || std::time::Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A process whose first thread has ended while a second one listens on a port and
    /// waits for its stdin to close: a killed node whose log writer is in an fdatasync.
    /// The child and its port.
    fn half_exited() -> (std::process::Child, u16) {
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import ctypes, socket, sys, threading\n\
                 s = socket.socket()\n\
                 s.bind(('127.0.0.1', 0))\n\
                 s.listen()\n\
                 print(s.getsockname()[1], flush=True)\n\
                 threading.Thread(target=sys.stdin.read).start()\n\
                 ctypes.CDLL(None).pthread_exit(None)",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")),
            &mut line,
        )
        .expect("the port");
        let port = line.trim().parse().expect("a port number");
        (child, port)
    }

    fn can_listen_on(port: u16) -> bool {
        TcpListener::bind(("127.0.0.1", port)).is_ok()
    }

    #[test]
    fn a_process_whose_first_thread_ended_holds_its_ports_until_its_last_thread_ends() {
        assert_eq!(liveness(std::process::id()), Liveness::Running);
        assert_eq!(liveness(u32::MAX), Liveness::Gone, "no such process");

        let (mut child, port) = half_exited();
        let pid = child.id();
        assert_eq!(wait_for(pid, Liveness::Exiting), Liveness::Exiting);
        assert!(process_alive(pid), "exiting, not gone");
        assert!(!can_listen_on(port), "its last thread still holds the port");
        drop(child.stdin.take());
        // Gone before its parent reaps it: a zombie with no thread left holds nothing.
        assert_eq!(wait_for(pid, Liveness::Gone), Liveness::Gone);
        assert!(!process_alive(pid));
        assert!(can_listen_on(port), "the port is free once it is gone");
        let status = child.wait().expect("reaped");
        assert!(status.success(), "{status}");
    }

    #[tokio::test]
    async fn up_waits_for_a_node_killed_a_moment_ago_to_let_go_of_its_ports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut child, port) = half_exited();
        let pid = child.id();
        assert_eq!(wait_for(pid, Liveness::Exiting), Liveness::Exiting);
        fs::create_dir_all(dir.path().join("node-1")).expect("data dir");
        fs::write(
            dir.path().join("node-1").join(NODE_PID_FILE),
            format!("{pid}\n"),
        )
        .expect("its pid file");
        fs::write(pid_path(dir.path(), 1), format!("{pid}\n")).expect("up's pid file");
        let stdin = child.stdin.take();
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(stdin);
        });
        let_exiting_end(dir.path(), 1, Instant::now() + STOP_TIMEOUT).await;
        assert_eq!(
            liveness(pid),
            Liveness::Gone,
            "it returns once the last thread ended"
        );
        assert!(can_listen_on(port));
        ender.join().expect("the ender");
        child.wait().expect("reaped");
    }

    #[test]
    fn dev_ports_come_from_below_the_ephemeral_range() {
        let mut ports = PortPicker::new();
        let mut held = Vec::new();
        for _ in 0..6 {
            let listener = ports.reserve().expect("a free port");
            let port = listener.local_addr().expect("bound").port();
            assert!(
                (PortPicker::FLOOR..ports.high).contains(&port),
                "port {port} is outside {}..{}",
                PortPicker::FLOOR,
                ports.high
            );
            held.push(listener);
        }
    }
}
