//! Simulated workers speaking the HTTP API as real clients do (add, claim, renew,
//! delete, reads at both consistency levels; a request id on every write, retried
//! through any node until the outcome is known), and the checks their history must
//! pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use madsim::rand::Rng;
use rpc::client::HttpClient;
use rpc::worker::TaskJson;
use rpc::worker::WriteResultJson;

/// Deadline of one call from a worker.
pub const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The one group the workers share, so that they contend for the same tasks.
pub const GROUP: &str = "work";

/// A write whose outcome a worker learned.
#[derive(Clone, Debug)]
pub struct Write {
    /// The worker (also its client id).
    pub worker: u64,
    /// What it asked for.
    pub kind: WriteKind,
    /// Simulated time it was first sent, in ms since the run began.
    pub invoked_ms: u64,
    /// Simulated time the definite answer arrived.
    pub completed_ms: u64,
    /// The answer.
    pub result: WriteResult,
}

/// What a write asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// Add a task with this payload.
    Add(String),
    /// Claim for this long.
    Claim(i64),
    /// Renew task `id` for this long, keeping its payload.
    Renew(u64, String, i64),
    /// Delete task `id`.
    Delete(u64),
}

/// A definite answer.
#[derive(Clone, Debug)]
pub enum WriteResult {
    /// Done; these task versions were written.
    Tasks(Vec<TaskJson>),
    /// Refused, nothing changed.
    Refused(Vec<String>),
}

/// Everything the workers saw.
#[derive(Debug, Default)]
pub struct History {
    /// Writes with known outcomes, in completion order.
    pub writes: Vec<Write>,
    /// Reads that answered.
    pub reads: u64,
    /// Calls that failed and were retried (timeouts, 503s, dropped connections).
    pub retries: u64,
}

/// Workers running on the client host until stopped.
pub struct Workers {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    handles: Vec<madsim::task::JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` workers (client ids 1..=count) against `addrs` on the current
    /// host (call it on the client host).
    pub fn start(count: u64, addrs: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(History::default()));
        let started = madsim::time::Instant::now();
        let handles = (1..=count)
            .map(|worker| {
                let worker_state = Worker {
                    id: worker,
                    addrs: addrs.clone(),
                    client: HttpClient::new(),
                    stop: stop.clone(),
                    history: history.clone(),
                    started,
                    turn: worker as usize,
                    owned: Vec::new(),
                    sent: 0,
                };
                madsim::task::spawn(worker_state.run())
            })
            .collect();
        Self {
            stop,
            history,
            handles,
        }
    }

    /// Stops issuing new operations, waits until every worker knows the outcome of its
    /// last one, and returns the history.
    pub async fn stop(self) -> History {
        self.stop.store(true, Ordering::SeqCst);
        for handle in self.handles {
            let _ = handle.await;
        }
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

struct Worker {
    id: u64,
    addrs: Vec<String>,
    client: HttpClient,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    started: madsim::time::Instant,
    turn: usize,
    /// Task versions (id, payload) this worker claimed and may renew or delete.
    owned: Vec<(u64, String)>,
    sent: u64,
}

impl Worker {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn record<F: FnOnce(&mut History)>(&self, f: F) {
        f(&mut self.history.lock().unwrap_or_else(|p| p.into_inner()));
    }

    async fn run(mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            let choice = madsim::rand::thread_rng().gen_range(0..100);
            match choice {
                0..=34 => {
                    let data = format!("w{}-{}", self.id, self.sent);
                    self.write(WriteKind::Add(data)).await;
                }
                35..=59 => {
                    let duration = madsim::rand::thread_rng().gen_range(200..3000);
                    self.write(WriteKind::Claim(duration)).await;
                }
                60..=74 if !self.owned.is_empty() => {
                    let (id, _) = self.owned.remove(0);
                    self.write(WriteKind::Delete(id)).await;
                }
                75..=84 if !self.owned.is_empty() => {
                    let (id, data) = self.owned.remove(0);
                    let duration = madsim::rand::thread_rng().gen_range(200..3000);
                    self.write(WriteKind::Renew(id, data, duration)).await;
                }
                _ => self.read().await,
            }
            madsim::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn body(&self, kind: &WriteKind, request_id: &str) -> (&'static str, serde_json::Value) {
        let client = self.id as i64;
        match kind {
            WriteKind::Add(data) => (
                "/update",
                serde_json::json!({"clientid": client, "requestid": request_id,
                    "adds": [{"group": GROUP, "data": data}]}),
            ),
            WriteKind::Claim(duration) => (
                "/claim",
                serde_json::json!({"clientid": client, "requestid": request_id,
                    "group": GROUP, "duration": duration}),
            ),
            WriteKind::Renew(id, data, duration) => (
                "/update",
                serde_json::json!({"clientid": client, "requestid": request_id,
                    "updates": [{"id": id, "data": data, "timespec": -duration}]}),
            ),
            WriteKind::Delete(id) => (
                "/update",
                serde_json::json!({"clientid": client, "requestid": request_id,
                    "deletes": [id]}),
            ),
        }
    }

    /// Sends `kind` with one request id until a definite answer arrives, trying the
    /// nodes in turn, as a real client does after a timeout.
    async fn write(&mut self, kind: WriteKind) {
        self.sent += 1;
        let request_id = format!("w{}-r{}", self.id, self.sent);
        let (path, body) = self.body(&kind, &request_id);
        let invoked_ms = self.now_ms();
        loop {
            let addr = self.addrs[self.turn % self.addrs.len()].clone();
            let answer = self
                .client
                .post_json(&addr, path, &body, WORKER_CALL_TIMEOUT)
                .await;
            let parsed = match answer {
                Ok(r) if r.status.is_success() => r.json::<WriteResultJson>(&addr).ok(),
                Ok(r) if r.status.is_client_error() => panic!(
                    "worker {} sent a request the API rejects ({}): {body}",
                    self.id, r.status
                ),
                _ => None,
            };
            let result = match parsed {
                Some(WriteResultJson::Tasks { tasks }) => WriteResult::Tasks(tasks),
                Some(WriteResultJson::Errors { errors }) => WriteResult::Refused(errors),
                None => {
                    self.turn += 1;
                    self.record(|h| h.retries += 1);
                    madsim::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let (WriteKind::Claim(_) | WriteKind::Renew(..), WriteResult::Tasks(tasks)) =
                (&kind, &result)
            {
                self.owned
                    .extend(tasks.iter().map(|t| (t.id, t.data.clone())));
            }
            let write = Write {
                worker: self.id,
                kind,
                invoked_ms,
                completed_ms: self.now_ms(),
                result,
            };
            self.record(|h| h.writes.push(write));
            return;
        }
    }

    async fn read(&mut self) {
        let addr = self.addrs[self.turn % self.addrs.len()].clone();
        let stale = madsim::rand::thread_rng().gen_bool(0.5);
        let path = format!(
            "/group/{GROUP}?owned=1&limit=20{}",
            if stale { "&consistency=stale" } else { "" }
        );
        match self.client.get(&addr, &path, WORKER_CALL_TIMEOUT).await {
            Ok(r) if r.status.is_success() => self.record(|h| h.reads += 1),
            _ => self.turn += 1,
        }
    }
}

/// What the checks counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Acknowledged writes checked.
    pub writes: usize,
    /// Task versions written.
    pub versions: usize,
    /// Claims checked for a second owner.
    pub claims: usize,
    /// Payloads whose final state was checked.
    pub payloads: usize,
}

/// Checks a history against the final state (`final_tasks`, every task of the group):
/// ids unique and increasing in real-time order, no acknowledged write lost, no
/// deleted task back, the latest version of every payload is the one that remains,
/// and no task version with two owners at once. Returns what it checked, or every
/// violation found.
pub fn check(history: &History, final_tasks: &[TaskJson]) -> Result<CheckReport, Vec<String>> {
    let mut problems = Vec::new();
    let mut report = CheckReport::default();
    let mut writers: BTreeMap<u64, usize> = BTreeMap::new();
    // Per payload: its versions in id order, with the claim duration that made each.
    let mut lineage: BTreeMap<&str, Vec<(&TaskJson, Option<i64>)>> = BTreeMap::new();
    let mut deleted_ids = std::collections::BTreeSet::new();
    for (index, write) in history.writes.iter().enumerate() {
        let WriteResult::Tasks(tasks) = &write.result else {
            continue;
        };
        report.writes += 1;
        if let WriteKind::Delete(id) = write.kind {
            deleted_ids.insert(id);
        }
        for task in tasks {
            report.versions += 1;
            if let Some(other) = writers.insert(task.id, index) {
                problems.push(format!(
                    "task id {} written by two acknowledged writes: {:?} and {:?}",
                    task.id, history.writes[other], write
                ));
            }
            let claimed = match write.kind {
                WriteKind::Claim(duration) => Some(duration),
                _ => None,
            };
            lineage.entry(&task.data).or_default().push((task, claimed));
        }
    }
    // Real-time order: a write that finished before another began has lower ids.
    let mut spans: Vec<(u64, u64, u64, u64)> = history
        .writes
        .iter()
        .filter_map(|w| match &w.result {
            WriteResult::Tasks(tasks) if !tasks.is_empty() => {
                let low = tasks.iter().map(|t| t.id).min().unwrap_or(0);
                let high = tasks.iter().map(|t| t.id).max().unwrap_or(0);
                Some((w.invoked_ms, w.completed_ms, low, high))
            }
            _ => None,
        })
        .collect();
    spans.sort_unstable();
    let mut highest_completed: Vec<(u64, u64)> = spans.iter().map(|s| (s.1, s.3)).collect();
    highest_completed.sort_unstable();
    for &(invoked, _, low, _) in &spans {
        let earlier_max = highest_completed
            .iter()
            .take_while(|(completed, _)| *completed < invoked)
            .map(|(_, high)| *high)
            .max();
        if let Some(high) = earlier_max
            && high >= low
        {
            problems.push(format!(
                "id {low} written at {invoked} ms is not above id {high} acknowledged before"
            ));
        }
    }
    let final_by_data: BTreeMap<&str, &TaskJson> =
        final_tasks.iter().map(|t| (t.data.as_str(), t)).collect();
    for (data, versions) in &mut lineage {
        report.payloads += 1;
        versions.sort_by_key(|(task, _)| task.id);
        let latest = versions.last().map(|(task, _)| *task);
        let was_deleted = versions.iter().any(|(t, _)| deleted_ids.contains(&t.id));
        match (final_by_data.get(data), latest, was_deleted) {
            (Some(found), _, true) => problems.push(format!(
                "payload {data:?} was deleted but task {} holds it",
                found.id
            )),
            (Some(found), Some(latest), false) if found.id != latest.id => problems.push(format!(
                "payload {data:?}: the store holds version {} but the latest acknowledged is {}",
                found.id, latest.id
            )),
            (None, Some(latest), false) => problems.push(format!(
                "payload {data:?}: acknowledged version {} is lost",
                latest.id
            )),
            _ => {}
        }
        // A claim by another worker may only start once the previous owner's lease ended.
        for pair in versions.windows(2) {
            let ((before, _), (after, claimed)) = (&pair[0], &pair[1]);
            let Some(duration) = claimed else { continue };
            report.claims += 1;
            let claimed_at = after.timespec - duration;
            if before.ownerid != after.ownerid && claimed_at < before.timespec {
                problems.push(format!(
                    "payload {data:?}: client {} claimed version {} at {claimed_at} while client {} owned version {} until {}",
                    after.ownerid, after.id, before.ownerid, before.id, before.timespec
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(problems)
    }
}
