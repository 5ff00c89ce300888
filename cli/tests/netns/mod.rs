//! A network lab for partition tests: real `rota-node` processes, each in its own network
//! namespace, joined by veth pairs to a bridge, with the workers on another namespace.
//!
//! ```text
//!   <prefix>-n1        <prefix>-n2   ...   <prefix>-nN        (one rota-node each)
//!   eth0 10.A.B.1      eth0 10.A.B.2       eth0 10.A.B.N
//!      |                  |                   |
//!   +--n1-----------------n2------------------nN--+  <prefix>-w: the "switch" host
//!   |  br0 10.A.B.100: the workers and the test   |  iptables chain ROTA (faults),
//!   +---------------------------------------------+  NFQUEUE delayer
//! ```
//!
//! The test binary runs twice. The outer run (the supervisor, in the root namespace)
//! checks that the machine allows namespaces, builds the namespaces and links, runs the
//! same test again inside the worker namespace with `ip netns exec`, relays its output,
//! and afterwards kills every process in the namespaces and deletes them, whether the
//! inner run passed, failed or hung. The inner run starts the nodes in their
//! namespaces, drives the HTTP API, injects faults and checks the history. Nothing is
//! created in the root namespace: the subnet exists only behind the bridge in the
//! worker namespace, so the test's traffic never leaves its own addresses, and a socket
//! left over after a failure dies with its namespace.
//!
//! Faults are applied where a real switch would apply them: node-to-node traffic is
//! bridged through the worker namespace, whose iptables see it (bridge netfilter), so a
//! partition is a set of DROP rules for pairs of node addresses, one-way loss a rule for
//! one direction, random loss an iptables `statistic` rule and delay a userspace
//! NFQUEUE delayer ([`delay`]), because this machine's kernel has no `sch_netem`.
//!
//! A lab may have spare slots after the initial nodes ([`run_test_with_spares`]): their
//! namespaces and links exist from the start, and their nodes start empty when the test
//! adds them to the cluster through the CLI ([`membership`]). The lab follows the
//! membership those changes leave: [`Lab::ids`] are the members (voters and learners)
//! as last confirmed by the leader, and a majority is one of the voters.

pub mod delay;
pub mod membership;
pub mod workload;

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::future::Future;
use std::io::BufRead;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use rpc::admin::ClusterStatusJson;
use rpc::admin::StateHashJson;
use rpc::client::HttpClient;
use serde::Deserialize;
use serde::Serialize;

/// Environment variable that carries the lab to the inner run.
const LAB_ENV: &str = "ROTA_NETNS_LAB";

/// Printed by the inner run when the scenario finished; without it the supervisor
/// fails, so a filter that matched no test cannot pass silently.
const DONE_MARKER: &str = "netns-lab: scenario finished";

/// Lines of the inner run that the supervisor prints past the test harness's capture,
/// so they show in `scripts/test` output.
const SUMMARY_PREFIX: &str = "partition summary";

/// Longest a whole inner run may take before the supervisor kills it.
const RUN_MAX: Duration = Duration::from_secs(240);

/// Namespace names start with this, then the supervisor's pid.
const NS_PREFIX: &str = "rota-pt";

/// Port of every node's worker API (each node has its own address).
const API_PORT: u16 = 7000;
/// Port of every node's Raft listener.
const RAFT_PORT: u16 = 7100;
/// Host part of the worker namespace's bridge address.
const WORKER_HOST: u8 = 100;
/// The NFQUEUE number the delayer binds, inside the worker namespace.
const DELAY_QUEUE: u16 = 7;

/// Deadline of one status or hash probe from the lab.
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);

/// Partition tests run one at a time: they share two cores with their node processes.
static SERIAL: Mutex<()> = Mutex::new(());

/// What the inner run needs to know about the lab the supervisor built.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LabSpec {
    /// The test to run inside.
    test: String,
    /// Namespace name prefix, unique to this supervisor and test.
    prefix: String,
    /// First three octets of the lab's /24.
    subnet: [u8; 3],
    /// Number of nodes in the initial cluster (ids 1..=nodes).
    pub nodes: u64,
    /// Slots for nodes that join later (ids nodes+1..=nodes+spares): each has its
    /// namespace and link from the start, and its node runs only once the test starts it.
    #[serde(default)]
    pub spares: u64,
    /// Directory for the nodes' data and logs.
    dir: PathBuf,
    /// The `rota-node` binary.
    node_bin: PathBuf,
    /// The supervisor's pid; the inner run cleans up and exits if it dies.
    supervisor: u32,
}

impl LabSpec {
    fn worker_ns(&self) -> String {
        format!("{}-w", self.prefix)
    }

    fn node_ns(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// Every node slot: the initial members, then the spares.
    pub fn slots(&self) -> Vec<u64> {
        (1..=self.nodes + self.spares).collect()
    }

    fn namespaces(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .slots()
            .into_iter()
            .map(|id| self.node_ns(id))
            .collect();
        all.push(self.worker_ns());
        all
    }

    fn host(&self, host: u8) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}.{host}")
    }

    /// Node `id`'s address.
    pub fn ip(&self, id: u64) -> String {
        self.host(u8::try_from(id).expect("a small node id"))
    }

    /// Node `id`'s worker API address.
    pub fn api(&self, id: u64) -> String {
        format!("{}:{API_PORT}", self.ip(id))
    }

    /// Node `id`'s Raft address.
    pub fn raft(&self, id: u64) -> String {
        format!("{}:{RAFT_PORT}", self.ip(id))
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}.log"))
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }
}

/// Why the lab cannot be built on this machine.
struct Skip(String);

/// Runs `program args...`, returning its stdout, or stderr as the error.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} cannot run: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The effective user id, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Runs a partition test: the supervisor outside, `scenario` inside the lab.
///
/// `name` must be the test function's name: the supervisor re-runs the test binary with
/// `--exact name` inside the worker namespace.
pub fn run_test<F, Fut>(name: &str, nodes: u64, scenario: F)
where
    F: FnOnce(Arc<Lab>) -> Fut,
    Fut: Future<Output = ()>,
{
    run_test_with_spares(name, nodes, 0, scenario);
}

/// [`run_test`] with `spares` more node slots (ids after the initial `nodes`), for nodes
/// that join the cluster during the scenario ([`Lab::start_empty`]).
pub fn run_test_with_spares<F, Fut>(name: &str, nodes: u64, spares: u64, scenario: F)
where
    F: FnOnce(Arc<Lab>) -> Fut,
    Fut: Future<Output = ()>,
{
    match std::env::var(LAB_ENV) {
        Ok(spec) => {
            let spec: LabSpec = serde_json::from_str(&spec).expect("the lab spec parses");
            assert_eq!(spec.test, name, "the inner run ran another test");
            inside(spec, scenario);
        }
        Err(_) => supervise(name, nodes, spares),
    }
}

/// The inner run: in the worker namespace, with its own runtime, so that every socket
/// the scenario opened is closed when it ends. Its nodes are killed however it ends.
fn inside<F, Fut>(spec: LabSpec, scenario: F)
where
    F: FnOnce(Arc<Lab>) -> Fut,
    Fut: Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let lab = Arc::new(Lab::new(spec));
    let watchdog = lab.clone();
    std::thread::spawn(move || {
        while watchdog.supervisor_alive() {
            std::thread::sleep(Duration::from_millis(500));
        }
        watchdog.remove_orphaned();
    });
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(scenario(lab.clone()));
    }));
    drop(runtime);
    lab.shutdown();
    if !lab.supervisor_alive() {
        lab.remove_orphaned();
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    out(DONE_MARKER);
}

/// Writes `line` to the real standard output: past the test harness's capture in the
/// supervisor, and ignoring a closed pipe in the inner run (the supervisor may be gone).
pub fn out(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

fn supervise(name: &str, nodes: u64, spares: u64) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    remove_stale_labs();
    let net = match Net::create(name, nodes, spares) {
        Ok(net) => net,
        Err(Skip(reason)) => {
            out(&format!("partition tests skipped ({name}): {reason}"));
            return;
        }
    };
    let exe = std::env::current_exe().expect("the test binary's path");
    let spec_json = serde_json::to_string(&net.spec).expect("the spec serialises");
    let worker_ns = net.spec.worker_ns();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &worker_ns])
        .arg(&exe)
        // The supervisor ran, so the test was selected (an ignored one too, with
        // --ignored): the inner run runs it whether ignored or not.
        .args([
            name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LAB_ENV, spec_json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ip netns exec starts the inner run");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        let tx = lines_tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        }));
    }
    if let Some(err) = child.stderr.take() {
        let tx = lines_tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        }));
    }
    drop(lines_tx);

    let deadline = Instant::now() + RUN_MAX;
    let mut finished = false;
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if line == DONE_MARKER {
                    finished = true;
                }
                if line.starts_with(SUMMARY_PREFIX) {
                    out(&format!("{line} [{name}]"));
                } else {
                    println!("  | {line}");
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    let status = child.wait().expect("the inner run is reaped");
    let passed = status.success() && finished && !timed_out;
    if !passed {
        net.print_node_logs();
    }
    drop(net);
    for reader in readers {
        let _ = reader.join();
    }
    assert!(
        !timed_out,
        "the inner run of {name} took longer than {RUN_MAX:?} and was killed"
    );
    assert!(status.success(), "the inner run of {name} failed: {status}");
    assert!(
        finished,
        "the inner run of {name} did not finish its scenario (did --exact {name} match a test?)"
    );
}

/// Deletes namespaces that an earlier run, now dead, left behind.
fn remove_stale_labs() {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            println!("removing namespace {name} left by dead run {pid}");
            remove_namespace(name);
        }
    }
}

/// Kills every process in namespace `name`, waits for them to go, and deletes it.
fn remove_namespace(name: &str) {
    for _ in 0..50 {
        let pids = run("ip", &["netns", "pids", name]).unwrap_or_default();
        let pids: Vec<&str> = pids.split_whitespace().collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = run("kill", &["-9", pid]);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Err(e) = run("ip", &["netns", "delete", name]) {
        println!("could not delete namespace {name}: {e}");
    }
}

/// The namespaces and links of one lab; dropping it removes them and everything
/// running in them.
struct Net {
    spec: LabSpec,
    /// Holds the nodes' data until the lab is gone.
    _dir: tempfile::TempDir,
}

impl Net {
    fn create(name: &str, nodes: u64, spares: u64) -> Result<Self, Skip> {
        match effective_uid() {
            Some(0) => {}
            Some(uid) => {
                return Err(Skip(format!(
                    "they need root to create network namespaces (running as uid {uid})"
                )));
            }
            None => return Err(Skip("the effective user id is unknown".into())),
        }
        run("ip", &["-V"]).map_err(|e| Skip(format!("iproute2's `ip` is missing: {e}")))?;
        run("iptables", &["-V"]).map_err(|e| {
            Skip(format!(
                "iptables is missing (scripts/install-prerequisites installs it): {e}"
            ))
        })?;
        let pid = std::process::id();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (prefix, size) = match spares {
            0 => (format!("{NS_PREFIX}{pid}-{nodes}"), nodes),
            _ => (
                format!("{NS_PREFIX}{pid}-{nodes}j{spares}"),
                nodes + 10 * spares,
            ),
        };
        let spec = LabSpec {
            test: name.to_string(),
            prefix,
            // Any /24 would do (the lab's namespaces are a network of their own); this
            // one differs per run and size, which keeps logs of concurrent runs apart.
            subnet: [
                10,
                64 + (pid % 128) as u8,
                u8::try_from(size).expect("few nodes"),
            ],
            nodes,
            spares,
            dir: dir.path().to_path_buf(),
            node_bin: crate::common::node_binary(),
            supervisor: pid,
        };
        let net = Self { spec, _dir: dir };
        net.build().map_err(Skip)?;
        Ok(net)
    }

    /// Namespaces, the bridge, veth pairs, addresses, and the fault chain. What the
    /// machine may lack (namespaces, bridge netfilter, a working iptables) is a reason
    /// to skip; any other failure fails the test.
    fn build(&self) -> Result<(), String> {
        let spec = &self.spec;
        let w = spec.worker_ns();
        let must = |args: &[&str]| {
            run("ip", args).unwrap_or_else(|e| panic!("building the lab: {e}"));
        };
        run("ip", &["netns", "add", &w])
            .map_err(|e| format!("this machine does not allow network namespaces: {e}"))?;
        for id in spec.slots() {
            must(&["netns", "add", &spec.node_ns(id)]);
        }
        let bridge_ip = format!("{}/24", spec.host(WORKER_HOST));
        must(&["-n", &w, "link", "set", "lo", "up"]);
        must(&["-n", &w, "link", "add", "br0", "type", "bridge"]);
        must(&["-n", &w, "addr", "add", &bridge_ip, "dev", "br0"]);
        must(&["-n", &w, "link", "set", "br0", "up"]);
        for id in spec.slots() {
            let ns = spec.node_ns(id);
            let port = format!("n{id}");
            let ip = format!("{}/24", spec.ip(id));
            must(&[
                "-n", &w, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            must(&["-n", &w, "link", "set", &port, "master", "br0"]);
            must(&["-n", &w, "link", "set", &port, "up"]);
            must(&["-n", &ns, "link", "set", "lo", "up"]);
            must(&["-n", &ns, "addr", "add", &ip, "dev", "eth0"]);
            must(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        // Bridged node-to-node traffic passes the worker namespace's iptables.
        run(
            "ip",
            &[
                "netns",
                "exec",
                &w,
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables",
            ],
        )
        .map_err(|e| format!("bridge netfilter is unavailable in this kernel: {e}"))?;
        let iptables = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &w, "iptables", "-w"];
            all.extend_from_slice(args);
            run("ip", &all)
        };
        iptables(&["-N", "ROTA"])
            .map_err(|e| format!("iptables does not work in this kernel: {e}"))?;
        for chain in ["INPUT", "OUTPUT", "FORWARD"] {
            iptables(&["-I", chain, "1", "-j", "ROTA"])
                .unwrap_or_else(|e| panic!("building the lab: {e}"));
        }
        Ok(())
    }

    fn print_node_logs(&self) {
        for id in self.spec.slots() {
            let path = self.spec.log_path(id);
            // A spare that never ran has no log.
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(25)..];
            println!("--- last lines of {}:\n{}", path.display(), tail.join("\n"));
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.spec.namespaces() {
            remove_namespace(&ns);
        }
        let left: Vec<String> = run("ip", &["netns", "list"])
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(&format!("{}-", self.spec.prefix)))
            .map(str::to_string)
            .collect();
        if left.is_empty() {
            println!(
                "lab {} removed: {} namespaces, their links and processes",
                self.spec.prefix,
                self.spec.namespaces().len()
            );
        } else {
            println!("namespaces left behind: {left:?}");
        }
    }
}

/// What the fault rules did before [`Lab::heal`] removed them.
#[derive(Clone, Copy, Debug)]
pub struct Healed {
    /// Packets dropped by DROP rules (partitions, one-way and random loss).
    pub dropped: u64,
    /// Packets the delayer held back.
    pub delayed: u64,
}

/// Faults injected, by kind, for the summary.
#[derive(Default)]
struct FaultLog {
    counts: BTreeMap<&'static str, u32>,
    order: Vec<&'static str>,
}

/// The cluster's membership as the test last confirmed it from the leader.
#[derive(Clone, Debug, Default)]
struct Members {
    voters: Vec<u64>,
    learners: Vec<u64>,
    /// Ids removed from the cluster, never to be used again.
    retired: Vec<u64>,
}

/// The bearer tokens of a lab's cluster.
#[derive(Clone, Debug)]
pub struct LabTokens {
    /// The first admin token: the test's own calls and the CLI's carry it.
    pub admin: String,
    /// A worker token limited to the workloads' groups.
    pub worker: String,
}

/// The lab seen from inside the worker namespace: nodes, faults, probes.
pub struct Lab {
    /// The lab's layout.
    pub spec: LabSpec,
    /// Probes (`/health` needs no token).
    client: HttpClient,
    /// The tokens [`Lab::bootstrap`] made, and a client that carries the admin token.
    tokens: std::sync::OnceLock<(LabTokens, HttpClient)>,
    nodes: Mutex<BTreeMap<u64, Child>>,
    members: Mutex<Members>,
    /// Nodes SIGSTOPped now.
    paused: Mutex<BTreeSet<u64>>,
    /// Nodes a partition keeps from the largest side now (until [`Lab::heal`]).
    cut_off: Mutex<BTreeSet<u64>>,
    faults: Mutex<FaultLog>,
    /// Membership changes made, by kind, for the summary.
    changes: Mutex<FaultLog>,
    delayer: Mutex<Option<delay::Delayer>>,
    started: Instant,
}

impl Lab {
    fn new(spec: LabSpec) -> Self {
        let members = Members {
            voters: (1..=spec.nodes).collect(),
            ..Members::default()
        };
        Self {
            spec,
            client: HttpClient::new(),
            tokens: std::sync::OnceLock::new(),
            nodes: Mutex::new(BTreeMap::new()),
            members: Mutex::new(members),
            paused: Mutex::new(BTreeSet::new()),
            cut_off: Mutex::new(BTreeSet::new()),
            faults: Mutex::new(FaultLog::default()),
            changes: Mutex::new(FaultLog::default()),
            delayer: Mutex::new(None),
            started: Instant::now(),
        }
    }

    /// Makes the cluster's first admin token (asking the nodes in turn until one answers,
    /// as `rota cluster init` does) and a worker token limited to the workloads' groups.
    /// The lab's calls and `rota` commands carry the admin token from then on.
    pub async fn bootstrap(&self, within: Duration) -> LabTokens {
        let deadline = Instant::now() + within;
        let body = serde_json::json!({});
        let admin = self
            .make_token(&self.client, rpc::auth::BOOTSTRAP_PATH, &body, deadline)
            .await;
        let admin_client = HttpClient::new()
            .with_token(Some(&admin))
            .expect("a token fits a header");
        let add = rpc::auth::TokenAddJson {
            name: "partition-test workers".into(),
            role: "worker".into(),
            groups: vec![workload::GROUP.into(), workload::JOB_GROUP.into()],
        };
        let worker = self
            .make_token(&admin_client, "/admin/tokens", &add, deadline)
            .await;
        let tokens = LabTokens { admin, worker };
        self.say("made the first admin token and a worker token for `work` and `jobs`");
        let _ = self.tokens.set((tokens.clone(), admin_client));
        tokens
    }

    /// POSTs `body` to `path` (a token-making endpoint) with `client`, asking the nodes
    /// in turn until one makes the token; its bearer form. A 409 (the bootstrap was done
    /// already) or the deadline fails the test.
    async fn make_token<B: serde::Serialize>(
        &self,
        client: &HttpClient,
        path: &str,
        body: &B,
        deadline: Instant,
    ) -> String {
        let mut last = String::from("not asked");
        loop {
            for id in self.ids() {
                assert!(
                    Instant::now() < deadline,
                    "no node answered {path} in time: {last}"
                );
                let addr = self.spec.api(id);
                match client.post_json(&addr, path, body, PROBE_TIMEOUT).await {
                    Ok(answer) if answer.status.is_success() => {
                        let made: rpc::auth::NewTokenJson =
                            answer.json(&addr).expect("a new token");
                        return made.bearer;
                    }
                    Ok(answer) => {
                        last = format!(
                            "{} {}",
                            answer.status,
                            String::from_utf8_lossy(&answer.body)
                        );
                        assert_ne!(answer.status.as_u16(), 409, "{path}: {last}");
                    }
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// The tokens [`Lab::bootstrap`] made.
    pub fn tokens(&self) -> &LabTokens {
        &self
            .tokens
            .get()
            .expect("the lab's cluster was bootstrapped")
            .0
    }

    /// A client for the lab's own calls: with the admin token once there is one.
    pub fn http(&self) -> &HttpClient {
        self.tokens.get().map_or(&self.client, |(_, client)| client)
    }

    /// The cluster's members (voters and learners) as last confirmed, ascending: at
    /// first the initial nodes 1..=N.
    pub fn ids(&self) -> Vec<u64> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<u64> = members
            .voters
            .iter()
            .chain(&members.learners)
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The voters as last confirmed, ascending.
    pub fn voters(&self) -> Vec<u64> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.voters.clone()
    }

    /// Every node id but those in `except`, ascending.
    pub fn others(&self, except: &[u64]) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| !except.contains(id))
            .collect()
    }

    /// The lowest-numbered node that is not `leader`.
    pub fn a_follower(&self, leader: u64) -> u64 {
        self.others(&[leader])[0]
    }

    /// The worker API addresses of every node.
    pub fn api_addrs(&self) -> Vec<String> {
        self.ids().into_iter().map(|id| self.spec.api(id)).collect()
    }

    /// The worker API addresses of every slot, spares included (a client that is told of
    /// nodes before they run, and keeps nodes that left in its list).
    pub fn slot_addrs(&self) -> Vec<String> {
        self.spec
            .slots()
            .into_iter()
            .map(|id| self.spec.api(id))
            .collect()
    }

    /// Prints `message` with the time since the lab started.
    pub fn say(&self, message: &str) {
        out(&format!(
            "[{:6.2}s] {message}",
            self.started.elapsed().as_secs_f64()
        ));
    }

    fn supervisor_alive(&self) -> bool {
        // A killed supervisor may linger as a zombie until it is reaped.
        let status = std::fs::read_to_string(format!("/proc/{}/stat", self.spec.supervisor));
        status.is_ok_and(|stat| {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        })
    }

    /// When the supervisor died (say `kill -9` of the test run), nothing else would
    /// remove the lab: kill the nodes, delete the namespaces and the data, and exit.
    /// (A later run would also remove the namespaces: see [`remove_stale_labs`].)
    fn remove_orphaned(&self) {
        self.shutdown();
        for id in self.spec.slots() {
            remove_namespace(&self.spec.node_ns(id));
        }
        let _ = run("ip", &["netns", "delete", &self.spec.worker_ns()]);
        let _ = std::fs::remove_dir_all(&self.spec.dir);
        std::process::exit(2);
    }

    /// Records a fault of `kind` and says what it is.
    pub fn fault(&self, kind: &'static str, detail: &str) {
        {
            let mut log = self.faults.lock().unwrap_or_else(|p| p.into_inner());
            if !log.counts.contains_key(kind) {
                log.order.push(kind);
            }
            *log.counts.entry(kind).or_default() += 1;
        }
        self.say(&format!("FAULT {kind}: {detail}"));
    }

    /// `kind xN, ...` in the order the faults were first injected.
    pub fn faults_summary(&self) -> String {
        let log = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        log.order
            .iter()
            .map(|kind| format!("{kind} x{}", log.counts[kind]))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The initial nodes 1..=N as `--initial-cluster` lists them (whatever the
    /// membership became since).
    fn initial_cluster(&self) -> String {
        (1..=self.spec.nodes)
            .map(|id| format!("{id}={}/{}", self.spec.api(id), self.spec.raft(id)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts node `id` in its namespace (on its data directory, so a restart keeps it).
    /// The initial nodes get `--initial-cluster`; a spare's node joined through the CLI
    /// and restarts without it, as an operator runs a node added later.
    pub fn start(&self, id: u64) {
        self.spawn(id, id <= self.spec.nodes, "started");
    }

    /// Starts node `id` on an empty data directory (wiped first) and without
    /// `--initial-cluster`: a new node that belongs to no cluster until it is added.
    pub fn start_empty(&self, id: u64) {
        let dir = self.spec.data_dir(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("the node's data directory is wiped");
        }
        self.spawn(id, false, "started empty");
    }

    fn spawn(&self, id: u64, initial_cluster: bool, what: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.spec.log_path(id))
            .expect("the node's log file opens");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.spec.node_ns(id)])
            .arg(&self.spec.node_bin)
            .args(["--id", &id.to_string()])
            .arg("--data-dir")
            .arg(self.spec.data_dir(id))
            .args(["--listen-api", &self.spec.api(id)])
            .args(["--listen-raft", &self.spec.raft(id)]);
        if initial_cluster {
            command.args(["--initial-cluster", &self.initial_cluster()]);
        }
        if self.spec.spares > 0 {
            // A short log behind each snapshot: a node that joins (or restarts) well
            // behind catches up from a snapshot.
            command.args(["--logs-kept-after-snapshot", "100"]);
        }
        let child = command
            .args(["--snapshot-every-entries", "300"])
            // Tokens are checked as in production; TLS stays off (tests/tls.rs covers it).
            .args(["--auth=tokens", "--tls=off"])
            .env("ROTA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("rota-node starts in its namespace");
        self.say(&format!(
            "node {id} {what} (pid {}) at {}",
            child.id(),
            self.spec.api(id)
        ));
        let old = self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, child);
        assert!(old.is_none(), "node {id} was started twice");
    }

    fn pid(&self, id: u64) -> u32 {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .map(Child::id)
            .unwrap_or_else(|| panic!("node {id} is not running"))
    }

    /// `kill -9` of node `id` (the `ip netns exec` process became the node).
    pub fn kill9(&self, id: u64) {
        let child = self
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let mut child = child.unwrap_or_else(|| panic!("node {id} is not running"));
        child.kill().expect("SIGKILL is delivered");
        let status = child.wait().expect("the node is reaped");
        // SIGKILL ends a stopped process too.
        self.paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        self.say(&format!("node {id} killed: {status}"));
    }

    /// Sends `signal` (`STOP` or `CONT`) to node `id`.
    pub fn signal(&self, id: u64, signal: &str) {
        let pid = self.pid(id).to_string();
        run("kill", &[&format!("-{signal}"), &pid])
            .unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
        let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        match signal {
            "STOP" => {
                paused.insert(id);
            }
            "CONT" => {
                paused.remove(&id);
            }
            _ => {}
        }
    }

    /// Node `id`'s view of the cluster, if it answers within the probe deadline.
    pub async fn status(&self, id: u64) -> Option<ClusterStatusJson> {
        let addr = self.spec.api(id);
        let response = self
            .http()
            .get(&addr, "/cluster", PROBE_TIMEOUT)
            .await
            .ok()?;
        response.success(&addr).ok()?.json(&addr).ok()
    }

    /// Waits until node `id` answers `/health`.
    pub async fn wait_up(&self, id: u64, within: Duration) {
        let addr = self.spec.api(id);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let answer = self.client.get(&addr, "/health", PROBE_TIMEOUT).await;
            if answer.is_ok_and(|r| r.status.is_success()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("node {id} did not answer /health at {addr} within {within:?}");
    }

    /// Waits until a node of `among` leads and a majority of the whole cluster, polled
    /// among `among`, names it; returns it. A leader in `not` does not count.
    pub async fn wait_leader(&self, among: &[u64], not: &[u64], within: Duration) -> u64 {
        let majority = self.voters().len() / 2 + 1;
        let deadline = Instant::now() + within;
        let mut last = Vec::new();
        while Instant::now() < deadline {
            last.clear();
            for &id in among {
                last.push((id, self.status(id).await));
            }
            for &(candidate, ref view) in &last {
                let believes = view.as_ref().is_some_and(|v| v.leader == Some(candidate));
                let named_by = last
                    .iter()
                    .filter(|(_, v)| v.as_ref().is_some_and(|v| v.leader == Some(candidate)))
                    .count();
                if believes && named_by >= majority && !not.contains(&candidate) {
                    return candidate;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let views: Vec<String> = last
            .iter()
            .map(|(id, v)| match v {
                Some(v) => format!("node {id}: leader {:?} term {}", v.leader, v.term),
                None => format!("node {id}: no answer"),
            })
            .collect();
        panic!(
            "no leader among {among:?} (excluding {not:?}) named by a majority within {within:?}: {views:?}"
        );
    }

    /// Waits until node `id` names a leader other than itself.
    pub async fn wait_follows(&self, id: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.status(id).await;
            if let Some(leader) = last.as_ref().and_then(|v| v.leader)
                && leader != id
            {
                return leader;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("node {id} still did not follow another leader after {within:?}: {last:?}");
    }

    /// Waits until every node reports the same applied index and state hash; returns
    /// `(applied index, hash, live tasks)`.
    pub async fn wait_converged(&self, within: Duration) -> (u64, String, u64) {
        let deadline = Instant::now() + within;
        let mut last = Vec::new();
        while Instant::now() < deadline {
            last.clear();
            for id in self.ids() {
                let addr = self.spec.api(id);
                let hash = match self
                    .http()
                    .get(&addr, "/admin/state-hash", PROBE_TIMEOUT)
                    .await
                {
                    Ok(r) => r.json::<StateHashJson>(&addr).ok(),
                    Err(_) => None,
                };
                last.push(hash.map(|h| (h.applied_index.unwrap_or(0), h.state_hash, h.tasks)));
            }
            if last.iter().all(|h| h.is_some() && *h == last[0])
                && let Some(Some(first)) = last.first()
            {
                return first.clone();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("the nodes did not converge within {within:?}: {last:?}");
    }

    /// Adds one rule to the fault chain.
    fn rule(&self, rule: &[&str]) {
        let mut args = vec!["-w", "-A", "ROTA"];
        args.extend_from_slice(rule);
        run("iptables", &args).unwrap_or_else(|e| panic!("adding a fault rule: {e}"));
    }

    /// Drops every packet between nodes of different `groups` (workers still reach every
    /// node: the clients' side of a partition is not cut).
    pub fn partition(&self, groups: &[&[u64]]) {
        if let Some(largest) = groups.iter().max_by_key(|g| g.len()) {
            let mut cut_off = self.cut_off.lock().unwrap_or_else(|p| p.into_inner());
            for group in groups {
                if !std::ptr::eq(group, largest) {
                    cut_off.extend(group.iter().copied());
                }
            }
        }
        for (i, a) in groups.iter().enumerate() {
            for b in &groups[i + 1..] {
                for &x in a.iter() {
                    for &y in b.iter() {
                        self.cut(x, y);
                        self.cut(y, x);
                    }
                }
            }
        }
    }

    /// Drops every packet from node `from` to node `to`, and only those.
    pub fn cut(&self, from: u64, to: u64) {
        let (src, dst) = (self.spec.ip(from), self.spec.ip(to));
        self.rule(&["-s", &src, "-d", &dst, "-j", "DROP"]);
    }

    /// Loses `loss_percent` of node `id`'s packets in each direction and delays the rest
    /// by `delay` ± `jitter` in each direction (workers' traffic too).
    pub fn degrade(&self, id: u64, loss_percent: u32, delay: Duration, jitter: Duration) {
        let ip = self.spec.ip(id);
        let probability = format!("{:.2}", f64::from(loss_percent) / 100.0);
        for side in ["-s", "-d"] {
            self.rule(&[
                side,
                &ip,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
                "-j",
                "DROP",
            ]);
        }
        let mut delayer = self.delayer.lock().unwrap_or_else(|p| p.into_inner());
        if delayer.is_none() {
            match delay::Delayer::start(DELAY_QUEUE, delay, jitter) {
                Ok(started) => *delayer = Some(started),
                Err(e) => panic!("the NFQUEUE delayer cannot start: {e}"),
            }
        }
        let queue = DELAY_QUEUE.to_string();
        for side in ["-s", "-d"] {
            self.rule(&[
                side,
                &ip,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &queue,
                "--queue-bypass",
            ]);
        }
    }

    /// Packets the fault rules dropped since they were put in place.
    pub fn dropped_so_far(&self) -> u64 {
        self.rule_counts().0
    }

    /// Counts of packets the fault rules dropped, and that the delayer held, so far.
    fn rule_counts(&self) -> (u64, u64) {
        let listing = run("iptables", &["-w", "-L", "ROTA", "-n", "-v", "-x"]).unwrap_or_default();
        let (mut dropped, mut queued) = (0, 0);
        for line in listing.lines().skip(2) {
            let mut fields = line.split_whitespace();
            let packets: u64 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            match fields.nth(1) {
                Some("DROP") => dropped += packets,
                Some("NFQUEUE") => queued += packets,
                _ => {}
            }
        }
        (dropped, queued)
    }

    /// Removes every fault rule and stops the delayer; says and returns what the faults
    /// did.
    pub fn heal(&self) -> Healed {
        let (dropped, queued) = self.rule_counts();
        run("iptables", &["-w", "-F", "ROTA"]).expect("the fault chain flushes");
        self.cut_off
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let delayer = self
            .delayer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let delayed = match delayer.map(delay::Delayer::stop) {
            Some(Ok(delayed)) => delayed,
            Some(Err(e)) => panic!("the delayer failed: {e}"),
            None => 0,
        };
        self.say(&format!(
            "healed: {dropped} packets dropped, {queued} queued for delay, {delayed} delayed"
        ));
        Healed { dropped, delayed }
    }

    /// Median time of `/health` calls to node `id` that answered (of `count`).
    pub async fn round_trip(&self, id: u64, count: usize) -> Option<Duration> {
        let addr = self.spec.api(id);
        let mut times = Vec::new();
        for _ in 0..count {
            let sent = Instant::now();
            let answer = self.client.get(&addr, "/health", PROBE_TIMEOUT).await;
            if answer.is_ok_and(|r| r.status.is_success()) {
                times.push(sent.elapsed());
            }
        }
        times.sort_unstable();
        times.get(times.len() / 2).copied()
    }

    /// Kills every node still running (the supervisor removes the namespaces).
    fn shutdown(&self) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        for (_, mut child) in std::mem::take(&mut *nodes) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
