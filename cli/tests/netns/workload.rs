//! Workers that add, claim, renew, delete and read over the HTTP API as real clients
//! do (a request id on every write, retried through any node until the outcome is
//! known), and the checker their history must pass against the final state.
//!
//! A smaller workload than the simulation's (one group; no finish, depends or read
//! checks), on real time and real sockets; the id-order and final-state checks are the
//! simulation's own (`sim_tests::history`). Beside it, job traffic in [`JOB_GROUP`]:
//! keyed adds, claims and finishes with a result, checked against the final job records
//! ([`check_jobs`]).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use rpc::job::FinishRequestJson;
use rpc::job::JobJson;
use rpc::worker::AddJson;
use rpc::worker::ChangeJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::TaskJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteRequestJson;
use rpc::worker_client::WorkerClient;
use rpc::worker_client::WorkerError;
use sim_tests::history::IdSpan;
use sim_tests::history::final_state_violation;
use sim_tests::history::id_order_violations;

/// Deadline of one call from a worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest wait for a read, over every node it tries; past it the read is dropped.
const READ_MAX: Duration = Duration::from_secs(4);

/// After the workers are told to stop, each must learn the outcome of its last write
/// within this (the faults are healed by then).
const SETTLE_MAX: Duration = Duration::from_secs(45);

/// The one group the workers share, so that they contend for the same tasks.
pub const GROUP: &str = "work";

/// The group of the job traffic.
pub const JOB_GROUP: &str = "jobs";

/// How long a job claim lasts: longer than a run, so only a finish ends it.
const JOB_LEASE_MS: i64 = 600_000;

/// What a write asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// Add a task with this payload.
    Add(String),
    /// Claim for this long (ms).
    Claim(i64),
    /// Renew task `id` for this long, keeping its payload.
    Renew(u64, String, i64),
    /// Delete task `id`.
    Delete(u64),
    /// Add a job with this key (its payload too) to the job group.
    AddJob(String),
    /// Claim a job.
    ClaimJob,
    /// Finish job task `id` (of this key) with the key as its result.
    Finish(u64, String),
}

/// The outcome a worker learned.
#[derive(Clone, Debug)]
pub enum WriteResult {
    /// Done; these task versions were written.
    Tasks(Vec<TaskJson>),
    /// Refused; nothing changed.
    Refused(Vec<String>),
    /// Never learned (only when the cluster stayed unavailable after the faults).
    Unknown,
}

/// One write and its outcome.
#[derive(Clone, Debug)]
pub struct Write {
    /// The worker (also its client id).
    pub worker: u64,
    /// What it asked for.
    pub kind: WriteKind,
    /// When it was first sent, since the workers started.
    pub invoked: Duration,
    /// When the definite answer arrived.
    pub completed: Duration,
    /// The answer.
    pub result: WriteResult,
}

/// Everything the workers saw.
#[derive(Debug, Default)]
pub struct History {
    /// Writes, in completion order.
    pub writes: Vec<Write>,
    /// Reads that answered.
    pub reads: u64,
    /// Calls that failed and were retried (timeouts, 503s, dropped connections).
    pub retries: u64,
}

/// Workers running until stopped.
pub struct Workers {
    stop: Arc<AtomicBool>,
    give_up: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    history: Arc<Mutex<History>>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` workers (client ids 1..=count) against `addrs`, with `token`.
    pub fn start(count: u64, addrs: Vec<String>, token: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let give_up = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let history = Arc::new(Mutex::new(History::default()));
        let started = Instant::now();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        let handles = (1..=count)
            .map(|id| {
                let worker = Worker {
                    id,
                    // Spread over the nodes, relays included; writes are retried until
                    // definite or until the test gives up on them.
                    client: WorkerClient::new(&addrs, id as i64)
                        .expect("the workers are given the nodes' addresses")
                        .with_token(Some(token))
                        .expect("a token fits a header")
                        .spread_from(id as usize)
                        .with_timeouts(CALL_TIMEOUT, Duration::MAX),
                    stop: stop.clone(),
                    give_up: give_up.clone(),
                    acked: acked.clone(),
                    history: history.clone(),
                    started,
                    owned: Vec::new(),
                    owned_jobs: Vec::new(),
                    sent: 0,
                    rng: seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                };
                tokio::spawn(worker.run())
            })
            .collect();
        Self {
            stop,
            give_up,
            acked,
            history,
            handles,
        }
    }

    /// Acknowledged (processed) writes so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Stops issuing operations, waits until every worker knows the outcome of its last
    /// one (at most [`SETTLE_MAX`]), and returns the history.
    pub async fn stop(self) -> History {
        self.stop.store(true, Ordering::SeqCst);
        let give_up = self.give_up.clone();
        let deadline = tokio::time::sleep(SETTLE_MAX);
        tokio::pin!(deadline);
        for mut handle in self.handles {
            tokio::select! {
                joined = &mut handle => joined.expect("a worker panicked"),
                () = &mut deadline => {
                    give_up.store(true, Ordering::SeqCst);
                    handle.await.expect("a worker panicked");
                }
            }
        }
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

struct Worker {
    id: u64,
    /// The nodes, tried in turn; a failed call moves on to the next.
    client: WorkerClient,
    stop: Arc<AtomicBool>,
    give_up: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    history: Arc<Mutex<History>>,
    started: Instant,
    /// Task versions (id, payload) this worker claimed and may renew or delete.
    owned: Vec<(u64, String)>,
    /// Job task versions (id, key) this worker claimed and may finish.
    owned_jobs: Vec<(u64, String)>,
    sent: u64,
    rng: u64,
}

impl Worker {
    /// xorshift64*.
    fn random(&mut self, below: u64) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % below
    }

    fn record<F: FnOnce(&mut History)>(&self, f: F) {
        f(&mut self.history.lock().unwrap_or_else(|p| p.into_inner()));
    }

    async fn run(mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            match self.random(100) {
                0..=34 => {
                    let data = format!("w{}-{}", self.id, self.sent);
                    self.write(WriteKind::Add(data)).await;
                }
                35..=59 => {
                    let duration = 200 + self.random(2800) as i64;
                    self.write(WriteKind::Claim(duration)).await;
                }
                60..=74 if !self.owned.is_empty() => {
                    let (id, _) = self.owned.remove(0);
                    self.write(WriteKind::Delete(id)).await;
                }
                75..=84 if !self.owned.is_empty() => {
                    let (id, data) = self.owned.remove(0);
                    let duration = 200 + self.random(2800) as i64;
                    self.write(WriteKind::Renew(id, data, duration)).await;
                }
                85..=89 => {
                    let key = format!("w{}-j{}", self.id, self.sent);
                    self.write(WriteKind::AddJob(key)).await;
                }
                90..=93 => self.write(WriteKind::ClaimJob).await,
                94..=97 if !self.owned_jobs.is_empty() => {
                    let (id, key) = self.owned_jobs.remove(0);
                    self.write(WriteKind::Finish(id, key)).await;
                }
                _ => self.read().await,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn request(&self, kind: &WriteKind, request_id: String) -> WriteRequestJson {
        let client = self.id as i64;
        let update = UpdateRequestJson::by(client);
        let request: WriteRequestJson = match kind {
            WriteKind::Add(data) => update
                .with_add(AddJson::in_group(GROUP).with_data(data))
                .into(),
            WriteKind::Claim(duration) => ClaimRequestJson::new(client, GROUP, *duration).into(),
            WriteKind::Renew(id, data, duration) => update
                .with_change(ChangeJson::renewal(*id, data, *duration))
                .into(),
            WriteKind::Delete(id) => update.with_deletes([*id]).into(),
            WriteKind::AddJob(key) => update
                .with_add(AddJson {
                    key: Some(key.clone()),
                    ..AddJson::in_group(JOB_GROUP).with_data(key)
                })
                .into(),
            WriteKind::ClaimJob => ClaimRequestJson::new(client, JOB_GROUP, JOB_LEASE_MS).into(),
            WriteKind::Finish(id, key) => WriteRequestJson::Finish(FinishRequestJson {
                clientid: client,
                id: *id,
                result: Some(serde_json::Value::String(key.clone())),
                requestid: None,
                next: None,
            }),
        };
        request.with_request_id(request_id)
    }

    /// Sends `kind` with one request id until a definite answer arrives, trying the
    /// nodes in turn, as a real client does after a timeout.
    async fn write(&mut self, kind: WriteKind) {
        self.sent += 1;
        let request_id = format!("w{}-r{}", self.id, self.sent);
        let request = self.request(&kind, request_id.clone());
        let invoked = self.started.elapsed();
        let retries_before = self.client.retries();
        let give_up = Arc::clone(&self.give_up);
        let answer = self
            .client
            .write_until(request.clone(), request_id, &move || {
                give_up.load(Ordering::SeqCst)
            })
            .await;
        let retried = self.client.retries() - retries_before;
        self.record(|h| h.retries += retried);
        let result = match answer {
            Ok(tasks) => WriteResult::Tasks(tasks),
            Err(WorkerError::Refused(errors)) => WriteResult::Refused(errors),
            Err(WorkerError::Unavailable { .. }) => WriteResult::Unknown,
            Err(rejected) => panic!(
                "worker {} sent a request the API rejects ({rejected}): {request:?}",
                self.id
            ),
        };
        if let (WriteKind::Claim(_) | WriteKind::Renew(..), WriteResult::Tasks(tasks)) =
            (&kind, &result)
        {
            self.owned
                .extend(tasks.iter().map(|t| (t.id, t.data.clone())));
        }
        if let (WriteKind::ClaimJob, WriteResult::Tasks(tasks)) = (&kind, &result) {
            self.owned_jobs.extend(
                tasks
                    .iter()
                    .map(|t| (t.id, t.key.clone().unwrap_or_default())),
            );
        }
        if !matches!(result, WriteResult::Unknown) {
            self.acked.fetch_add(1, Ordering::SeqCst);
        }
        let write = Write {
            worker: self.id,
            kind,
            invoked,
            completed: self.started.elapsed(),
            result,
        };
        self.record(|h| h.writes.push(write));
    }

    async fn read(&mut self) {
        let stale = self.random(2) == 0;
        let read = tokio::time::timeout(READ_MAX, self.client.group_tasks(GROUP, true, stale));
        match read.await {
            Ok(Ok(_)) => self.record(|h| h.reads += 1),
            _ => self.client.next_node(),
        }
    }
}

/// What the checker counted.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// Acknowledged writes that wrote task versions, each checked.
    pub writes: usize,
    /// Of those, adds.
    pub adds: usize,
    /// Acknowledged claims that took a task, each checked for a second owner.
    pub claims: usize,
    /// Acknowledged claims that found nothing available.
    pub empty_claims: usize,
    /// Writes refused by the cluster (an expired or stolen claim, for instance).
    pub refused: usize,
    /// Refusal reasons with the numbers taken out, and how often each came.
    pub refusals: BTreeMap<String, usize>,
    /// Task versions written by acknowledged writes (ids checked unique).
    pub versions: usize,
    /// Payloads whose final state was checked.
    pub payloads: usize,
}

/// `duration` in whole microseconds, the simulation checker's unit.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Checks a history against the final state (`final_tasks`, every task of the group):
/// every write got a definite answer; ids unique and increasing in real-time order; no
/// acknowledged write lost; no deleted task back; the latest version of every payload
/// is the one that remains; no task version with two owners at once. Returns what it
/// checked, or every violation found.
pub fn check(history: &History, final_tasks: &[TaskJson]) -> Result<CheckReport, Vec<String>> {
    let mut problems = Vec::new();
    let mut report = CheckReport::default();
    let mut writers: BTreeMap<u64, usize> = BTreeMap::new();
    // Per payload: its versions in id order, with the claim duration that made each.
    let mut lineage: BTreeMap<&str, Vec<(&TaskJson, Option<i64>)>> = BTreeMap::new();
    let mut deleted_ids = BTreeSet::new();
    for (index, write) in history.writes.iter().enumerate() {
        let tasks = match &write.result {
            WriteResult::Tasks(tasks) => tasks,
            WriteResult::Refused(errors) => {
                report.refused += 1;
                for error in errors {
                    let reason: String = error.chars().filter(|c| !c.is_ascii_digit()).collect();
                    *report.refusals.entry(reason).or_default() += 1;
                }
                continue;
            }
            WriteResult::Unknown => {
                problems.push(format!(
                    "worker {} never learned the outcome of {:?} (sent at {:?})",
                    write.worker, write.kind, write.invoked
                ));
                continue;
            }
        };
        if matches!(
            write.kind,
            WriteKind::AddJob(_) | WriteKind::ClaimJob | WriteKind::Finish(..)
        ) {
            // Checked by `check_jobs`; their ids still count for uniqueness and order.
            for task in tasks {
                if let Some(other) = writers.insert(task.id, index) {
                    problems.push(format!(
                        "task id {} written by two acknowledged writes: {:?} and {:?}",
                        task.id, history.writes[other], write
                    ));
                }
            }
            continue;
        }
        match write.kind {
            WriteKind::Claim(_) if tasks.is_empty() => report.empty_claims += 1,
            WriteKind::Claim(_) => report.claims += 1,
            WriteKind::Add(_) => report.adds += 1,
            WriteKind::Delete(id) => {
                deleted_ids.insert(id);
            }
            WriteKind::Renew(..) => {}
            WriteKind::AddJob(_) | WriteKind::ClaimJob | WriteKind::Finish(..) => {}
        }
        if tasks.is_empty() && !matches!(write.kind, WriteKind::Delete(_)) {
            continue;
        }
        report.writes += 1;
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
    let spans = history
        .writes
        .iter()
        .filter_map(|w| match &w.result {
            WriteResult::Tasks(tasks) => IdSpan::of(micros(w.invoked), micros(w.completed), tasks),
            _ => None,
        })
        .collect();
    problems.extend(id_order_violations(spans));
    let final_by_data: BTreeMap<&str, &TaskJson> =
        final_tasks.iter().map(|t| (t.data.as_str(), t)).collect();
    for (data, versions) in &mut lineage {
        report.payloads += 1;
        versions.sort_by_key(|(task, _)| task.id);
        let latest = versions.last().map(|(task, _)| *task);
        let was_deleted = versions.iter().any(|(t, _)| deleted_ids.contains(&t.id));
        let found = final_by_data.get(data).copied();
        problems.extend(final_state_violation(data, latest, was_deleted, found));
        // A claim by another worker may only start once the previous owner's lease ended.
        for pair in versions.windows(2) {
            let ((before, _), (after, claimed)) = (&pair[0], &pair[1]);
            let Some(duration) = claimed else { continue };
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

/// What the job check counted.
#[derive(Debug, Default)]
pub struct JobReport {
    /// Acknowledged keyed adds found in the final records.
    pub added: usize,
    /// Acknowledged claims that took a job.
    pub claimed: usize,
    /// Acknowledged finishes found succeeded with their result.
    pub finished: usize,
}

/// Checks the job traffic against the final job records (`jobs`, by key): every
/// acknowledged keyed add has a record; every job an acknowledged claim took was added
/// by an acknowledged add (or one whose answer was lost) and claimed by one claim only;
/// every acknowledged finish left its job succeeded with the result it sent, and no job
/// succeeded without one.
pub fn check_jobs(
    history: &History,
    jobs: &BTreeMap<String, JobJson>,
) -> Result<JobReport, Vec<String>> {
    let mut problems = Vec::new();
    let mut report = JobReport::default();
    let mut claimed_by: BTreeMap<String, u64> = BTreeMap::new();
    let mut finished = BTreeSet::new();
    for write in &history.writes {
        let WriteResult::Tasks(tasks) = &write.result else {
            continue;
        };
        match &write.kind {
            WriteKind::AddJob(key) => match jobs.get(key) {
                Some(_) => report.added += 1,
                None => problems.push(format!("acknowledged job {key:?} has no record")),
            },
            WriteKind::ClaimJob => {
                for task in tasks {
                    report.claimed += 1;
                    let key = task.key.clone().unwrap_or_default();
                    if task.attempt != 1 {
                        problems.push(format!(
                            "job {key:?} was claimed as attempt {} though no lease of it ever lapsed",
                            task.attempt
                        ));
                    }
                    if let Some(first) = claimed_by.insert(key.clone(), write.worker) {
                        problems.push(format!(
                            "job {key:?} claimed twice: by worker {first} and by worker {}",
                            write.worker
                        ));
                    }
                }
            }
            WriteKind::Finish(_, key) => {
                finished.insert(key.clone());
                match jobs.get(key) {
                    Some(job)
                        if job.state == "succeeded"
                            && job.result == Some(serde_json::Value::String(key.clone())) =>
                    {
                        report.finished += 1
                    }
                    other => {
                        problems.push(format!("acknowledged finish of job {key:?} left {other:?}"))
                    }
                }
            }
            _ => {}
        }
    }
    for (key, job) in jobs {
        let unanswered = history.writes.iter().any(|w| {
            matches!((&w.kind, &w.result), (WriteKind::Finish(_, k), WriteResult::Unknown) if k == key)
        });
        if job.state == "succeeded" && !finished.contains(key) && !unanswered {
            problems.push(format!(
                "job {key:?} succeeded though no finish of it was sent"
            ));
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(problems)
    }
}

/// The checker flags what it is there to catch (no root needed: it runs everywhere).
#[test]
fn the_checker_flags_lost_writes_second_owners_duplicate_ids_and_unknown_outcomes() {
    let task = |id: u64, data: &str, timespec: i64, owner: i64| TaskJson {
        id,
        group: GROUP.to_string(),
        data: data.to_string(),
        timespec,
        ownerid: owner,
        key: None,
        priority: 0,
        attempt: 0,
    };
    let write = |worker: u64, kind: WriteKind, at: u64, result: WriteResult| Write {
        worker,
        kind,
        invoked: Duration::from_millis(at),
        completed: Duration::from_millis(at + 1),
        result,
    };
    let tasks = |list: Vec<TaskJson>| WriteResult::Tasks(list);
    let add = |data: &str| WriteKind::Add(data.to_string());
    let good = History {
        writes: vec![
            write(1, add("a"), 0, tasks(vec![task(1, "a", 100, 1)])),
            write(2, add("b"), 2, tasks(vec![task(2, "b", 100, 2)])),
            // Client 2 claims "a" for 1000 ms at 200: after client 1's version.
            write(
                2,
                WriteKind::Claim(1000),
                4,
                tasks(vec![task(3, "a", 1200, 2)]),
            ),
            write(2, WriteKind::Delete(2), 6, tasks(vec![])),
        ],
        ..History::default()
    };
    let report = check(&good, &[task(3, "a", 1200, 2)]).expect("a clean history passes");
    assert_eq!((report.writes, report.adds, report.claims), (4, 2, 1));

    let bad = History {
        writes: vec![
            write(1, add("a"), 0, tasks(vec![task(1, "a", 100, 1)])),
            // Client 1 holds "a" until 5000; client 2 claims it at 1000.
            write(
                1,
                WriteKind::Claim(4900),
                2,
                tasks(vec![task(2, "a", 5000, 1)]),
            ),
            write(
                2,
                WriteKind::Claim(1000),
                4,
                tasks(vec![task(3, "a", 2000, 2)]),
            ),
            // Acknowledged, then gone.
            write(3, add("lost"), 6, tasks(vec![task(4, "lost", 100, 3)])),
            // The same id acknowledged twice, and an id below one acknowledged before.
            write(3, add("dup"), 8, tasks(vec![task(4, "dup", 100, 3)])),
            write(3, add("never"), 10, WriteResult::Unknown),
        ],
        ..History::default()
    };
    let problems = check(&bad, &[task(3, "a", 2000, 2), task(4, "dup", 100, 3)])
        .expect_err("a broken history fails");
    let all = problems.join("\n");
    for expected in [
        "claimed version 3 at 1000 while client 1 owned version 2 until 5000",
        "payload \"lost\": acknowledged version 4 is lost",
        "task id 4 written by two acknowledged writes",
        "is not above id",
        "never learned the outcome",
    ] {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
}
