//! Simulated workers speaking the HTTP API as real clients do (add, claim, renew with a
//! negative timespec, delete, finish-and-follow-up transactions, reads at both
//! consistency levels; a request id on every write, retried through any node until the
//! outcome is known). What they see becomes a [`History`] for the checkers.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use madsim::rand::Rng;
use rpc::client::ClientError;
use rpc::job::FailRequestJson;
use rpc::job::FinishItemJson;
use rpc::job::FinishManyRequestJson;
use rpc::job::FinishRequestJson;
use rpc::job::KeysRequestJson;
use rpc::job::NextClaimJson;
use rpc::job::SettingsChangeJson;
use rpc::watch::WatchEventJson;
use rpc::worker::AddJson;
use rpc::worker::ChangeJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteRequestJson;
use rpc::worker_client::WorkerClient;
use rpc::worker_client::WorkerError;

use crate::JOB_GROUP;
use crate::JOB_LEASE_MS;
use crate::JOB_MAX_ATTEMPTS;
use crate::JOB_MAX_RUNNING;
use crate::cluster::SimTokens;
use crate::history::Answer;
use crate::history::Call;
use crate::history::History;
use crate::history::Op;
use crate::history::WatchSeen;
use crate::history::WatchStream;

/// How many tasks a claim takes, from the step's choice (no draw of its own, so the
/// random stream stays as it was): a third of claims take two or three.
fn claim_count(choice: u32) -> u32 {
    match choice % 6 {
        0 => 3,
        3 => 2,
        _ => 1,
    }
}

/// A claim's wait: a third of claims block, for 0.1 to 1.5 s.
fn blocking_wait_ms(rng: &mut impl Rng) -> u64 {
    if rng.gen_bool(1.0 / 3.0) {
        rng.gen_range(100..1_500)
    } else {
        0
    }
}

/// How many keys the job workload draws from: few, so that adds collide with live keys
/// and `after` names jobs that exist.
const JOB_KEYS: u32 = 8;

/// A client of `addrs` that starts at node `first` and moves on after a failure, never
/// asking who leads (so that writes cross relays too), and never gives up: the
/// simulation heals every fault in the end.
fn spread_client(addrs: &[String], first: usize, client_id: i64, token: &str) -> WorkerClient {
    WorkerClient::new(addrs, client_id)
        .expect("the workers are given the cluster's addresses")
        .with_token(Some(token))
        .expect("the harness's tokens fit a header")
        .spread_from(first)
        .with_timeouts(WORKER_CALL_TIMEOUT, Duration::MAX)
}

/// Sets the job group's settings the checkers assume ([`JOB_MAX_RUNNING`],
/// [`JOB_MAX_ATTEMPTS`]), through
/// any node, before the workers start.
pub async fn configure_job_group(addrs: Vec<String>, admin_token: String) {
    if addrs.is_empty() {
        return;
    }
    let client = spread_client(&addrs, 0, 0, &admin_token);
    let change = SettingsChangeJson {
        max_running: Some(i64::from(JOB_MAX_RUNNING)),
        max_attempts: Some(i64::from(JOB_MAX_ATTEMPTS)),
        requestid: Some("configure-job-group".into()),
        ..SettingsChangeJson::default()
    };
    if let Err(e) = client.change_settings(JOB_GROUP, &change).await {
        panic!("the job group's settings were not taken: {e}");
    }
}

/// Deadline of one call from a worker.
pub const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The groups the workers share; few, so that they contend for the same tasks, and more
/// than one, so that each group's linearizability search stays small.
pub const GROUPS: [&str; 3] = ["g0", "g1", "g2"];

/// How often a worker picks each operation, in percent; reads take the rest, and an
/// operation on an owned task falls through to a read when the worker owns none.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    /// Adds.
    pub add: u32,
    /// Claims.
    pub claim: u32,
    /// Deletes of an owned task.
    pub delete: u32,
    /// Finish transactions (delete an owned task, add a follow-up).
    pub finish: u32,
    /// Renewals of an owned task.
    pub renew: u32,
    /// Steps spent on the job group instead (add with key and `after`, claim, finish,
    /// fail, cancel), drawn before the others.
    pub jobs: u32,
}

impl Mix {
    /// Queues that grow slowly while workers claim, renew and finish.
    pub const BALANCED: Mix = Mix {
        add: 30,
        claim: 25,
        delete: 10,
        finish: 10,
        renew: 10,
        jobs: 40,
    };
    /// Few adds, many claims: queues stay nearly empty, so a task whose lease ends is
    /// claimed again soon, and a lease cut short shows at once.
    pub const CLAIM_HEAVY: Mix = Mix {
        add: 15,
        claim: 40,
        delete: 5,
        finish: 10,
        renew: 15,
        jobs: 40,
    };
}

/// Workers running on the client host until stopped.
pub struct Workers {
    stop: Arc<AtomicBool>,
    drain: Arc<Drain>,
    history: Arc<Mutex<History>>,
    handles: Vec<madsim::task::JoinHandle<()>>,
    /// One watcher per group, following its changes (`GET /watch`).
    watchers: Vec<madsim::task::JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` workers (client ids 1..=count) with operation `mix` against
    /// `addrs` on the current host (call it on the client host). Workers carry the
    /// worker token (an admin token only to pause the job group), watchers the reader's.
    pub fn start(count: u64, addrs: Vec<String>, mix: Mix, tokens: SimTokens) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let drain = Arc::new(Drain::default());
        let history = Arc::new(Mutex::new(History::default()));
        let started = madsim::time::Instant::now();
        let handles = (1..=count)
            .map(|worker| {
                let worker_state = Worker {
                    id: worker,
                    client: spread_client(&addrs, worker as usize, worker as i64, &tokens.worker),
                    admin: spread_client(&addrs, worker as usize, worker as i64, &tokens.admin),
                    stop: stop.clone(),
                    drain: drain.clone(),
                    history: history.clone(),
                    started,
                    owned: Vec::new(),
                    owned_jobs: Vec::new(),
                    owned_job_keys: std::collections::BTreeMap::new(),
                    seen: std::collections::BTreeMap::new(),
                    sent: 0,
                    mix,
                };
                madsim::task::spawn(worker_state.run())
            })
            .collect();
        let watchers = GROUPS
            .iter()
            .copied()
            .chain([JOB_GROUP])
            .enumerate()
            .map(|(i, group)| {
                let client = spread_client(&addrs, i, 0, &tokens.reader);
                madsim::task::spawn(watch(group, client, stop.clone(), history.clone()))
            })
            .collect();
        Self {
            stop,
            drain,
            history,
            handles,
            watchers,
        }
    }

    /// Switches every worker to emptying the queues (delete what it owns, claim and
    /// delete the rest) and waits up to `within` until all find nothing left, as happens
    /// when a real queue runs dry; says whether they did. Call [`Workers::resume`] after.
    pub async fn drain(&self, within: Duration) -> bool {
        self.drain.active.store(true, Ordering::SeqCst);
        let deadline = madsim::time::Instant::now() + within;
        while madsim::time::Instant::now() < deadline {
            if self.drain.dry.load(Ordering::SeqCst) as usize == self.handles.len() {
                return true;
            }
            madsim::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Back to the usual mix after [`Workers::drain`].
    pub fn resume(&self) {
        self.drain.active.store(false, Ordering::SeqCst);
        self.drain.dry.store(0, Ordering::SeqCst);
    }

    /// Stops issuing new operations, waits until every worker knows the outcome of its
    /// last one, and returns the history.
    pub async fn stop(self) -> History {
        self.stop.store(true, Ordering::SeqCst);
        for handle in self.handles.into_iter().chain(self.watchers) {
            let _ = handle.await;
        }
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Forgotten answers (410) in a row, from different nodes, after which a watcher takes
/// the gap and goes on from the current revision.
const WATCH_FORGOTTEN_TRIES: u32 = 5;

/// Failed calls a watcher makes after the workers stopped before it ends.
const WATCH_TRIES_AFTER_STOP: u32 = 20;

/// Watches `group`'s changes through any node until the workers stop, each page asked
/// after the previous one's revision, and adds the stream to the history. A revision
/// that every node it asks has forgotten ends a segment (the checkers expect no gap
/// inside one).
async fn watch(
    group: &'static str,
    client: WorkerClient,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
) {
    let mut stream = WatchStream {
        group: group.to_string(),
        segments: vec![Vec::new()],
    };
    let mut after = 0u64;
    let mut forgotten = 0;
    let mut tries_after_stop = 0;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if stopping {
            tries_after_stop += 1;
            if tries_after_stop > WATCH_TRIES_AFTER_STOP {
                break;
            }
        }
        let wait_ms = if stopping { 0 } else { 500 };
        let answer = client
            .watch(group, Some(after), Duration::from_millis(wait_ms))
            .await;
        match answer {
            Ok(page) => {
                forgotten = 0;
                if let Some(segment) = stream.segments.last_mut() {
                    segment.extend(page.changes.iter().map(|change| WatchSeen {
                        revision: change.revision(),
                        task: match change {
                            WatchEventJson::Task { task, .. } => Some(task.id),
                            _ => None,
                        },
                    }));
                }
                after = page.revision;
                if stopping {
                    break;
                }
            }
            Err(WorkerError::Forgotten(gone)) => {
                forgotten += 1;
                if forgotten >= WATCH_FORGOTTEN_TRIES {
                    after = gone.revision;
                    stream.segments.push(Vec::new());
                    forgotten = 0;
                }
                client.next_node();
            }
            Err(e) => panic!("watcher of {group} got an answer it cannot use: {e}"),
        }
    }
    history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .watches
        .push(stream);
}

/// The drain switch and how many workers found the queues dry.
#[derive(Default)]
struct Drain {
    active: AtomicBool,
    dry: std::sync::atomic::AtomicU64,
}

/// Consecutive empty claims after which a draining worker calls the queues dry.
const EMPTY_CLAIMS_WHEN_DRY: u32 = 9;

struct Worker {
    id: u64,
    /// The nodes, tried in turn; a failed call moves on to the next.
    client: WorkerClient,
    /// The same with the admin token, for what only an admin may do (pausing a group).
    admin: WorkerClient,
    stop: Arc<AtomicBool>,
    drain: Arc<Drain>,
    history: Arc<Mutex<History>>,
    started: madsim::time::Instant,
    /// Task versions (id, payload, group) this worker claimed and may renew or finish.
    owned: Vec<(u64, String, &'static str)>,
    /// Job task versions this worker claimed and may finish or fail.
    owned_jobs: Vec<u64>,
    /// The key of each job task version in `owned_jobs` (and of some it no longer owns).
    owned_job_keys: std::collections::BTreeMap<u64, String>,
    /// A task id per group from this worker's last read of it, for `depends`.
    seen: std::collections::BTreeMap<&'static str, u64>,
    sent: u64,
    mix: Mix,
}

impl Worker {
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn record<F: FnOnce(&mut History)>(&self, f: F) {
        f(&mut self.history.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn payload(&self) -> String {
        format!("w{}-{}", self.id, self.sent)
    }

    async fn run(mut self) {
        let mut empty_claims = 0;
        while !self.stop.load(Ordering::SeqCst) {
            if self.drain.active.load(Ordering::SeqCst) {
                empty_claims = self.drain_step(empty_claims).await;
                madsim::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            empty_claims = 0;
            let (job_turn, choice, group, duration_ms, wait_ms) = {
                let mut rng = madsim::rand::thread_rng();
                let job_turn = rng.gen_range(0u32..100) < self.mix.jobs;
                let group = GROUPS[rng.gen_range(0..GROUPS.len())];
                (
                    job_turn,
                    rng.gen_range(0u32..100),
                    group,
                    rng.gen_range(200..3000),
                    blocking_wait_ms(&mut rng),
                )
            };
            if job_turn {
                self.job_step(choice).await;
                madsim::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let m = self.mix;
            let owns = !self.owned.is_empty();
            let (adds, claims) = (m.add, m.add + m.claim);
            let (deletes, finishes) = (claims + m.delete, claims + m.delete + m.finish);
            let renews = finishes + m.renew;
            match choice {
                c if c < adds => {
                    let data = self.payload();
                    let depends = self.depends_on(group);
                    self.write(group, Call::Add { data, depends }).await;
                }
                c if c < claims => {
                    let call = Call::Claim {
                        duration_ms,
                        wait_ms,
                        count: claim_count(c),
                    };
                    self.write(group, call).await;
                }
                c if c < deletes && owns => {
                    let (id, _, group) = self.owned.remove(0);
                    self.write(group, Call::Delete { id }).await;
                }
                c if c < finishes && owns => {
                    let (id, _, group) = self.owned.remove(0);
                    let follow_up = self.payload();
                    self.write(group, Call::Finish { id, follow_up }).await;
                }
                c if c < renews && owns => {
                    let (id, data, group) = self.owned.remove(0);
                    let call = Call::Renew {
                        id,
                        data,
                        duration_ms,
                    };
                    self.write(group, call).await;
                }
                _ => self.read(group).await,
            }
            madsim::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One operation on the job group, `choice` in 0..100: finishes and failures (retried
    /// at once) of owned jobs, adds of keys from a small pool (so keys collide, and a
    /// third wait for another key), claims, cancels (so that owners of cancelled jobs
    /// are refused often) and pauses or resumes of the group.
    async fn job_step(&mut self, choice: u32) {
        let key = || format!("k{}", madsim::rand::thread_rng().gen_range(0..JOB_KEYS));
        let owns = !self.owned_jobs.is_empty();
        let call = {
            let mut rng = madsim::rand::thread_rng();
            match choice {
                c if c < 20 && self.owned_jobs.len() > 1 => Call::CompleteMany {
                    ids: std::mem::take(&mut self.owned_jobs),
                },
                // Half of the finishes claim the next job in the same write, as the
                // workers of `rota worker` and the Python client do.
                c if c < 30 && owns && rng.gen_bool(0.5) => Call::CompleteAndClaim {
                    id: self.owned_jobs.remove(0),
                    duration_ms: JOB_LEASE_MS,
                },
                c if c < 30 && owns => Call::Complete {
                    id: self.owned_jobs.remove(0),
                },
                c if c < 40 && owns => Call::FailJob {
                    id: self.owned_jobs.remove(0),
                },
                c if c < if owns { 60 } else { 40 } => {
                    let own = key();
                    let after = if rng.gen_bool(0.33) {
                        vec![key()].into_iter().filter(|k| *k != own).collect()
                    } else {
                        Vec::new()
                    };
                    Call::AddJob {
                        data: self.payload(),
                        key: own,
                        after,
                    }
                }
                // A third take up to two or three (max_running allows two), so that
                // workers hold several jobs and finish them in one request.
                c if c < 80 => Call::Claim {
                    duration_ms: JOB_LEASE_MS,
                    wait_ms: blocking_wait_ms(&mut rng),
                    count: claim_count(c),
                },
                // Half of the cancels while it owns a job are of that job's key, as an
                // operator cancels a running job: its owner's next finish must be refused.
                c if c < 95 => Call::Cancel {
                    key: match self
                        .owned_jobs
                        .first()
                        .and_then(|id| self.owned_job_keys.get(id))
                    {
                        Some(running) if rng.gen_bool(0.5) => running.clone(),
                        _ => key(),
                    },
                },
                _ => Call::Pause {
                    paused: rng.gen_bool(0.5),
                },
            }
        };
        match call {
            Call::Pause { paused } => self.pause(paused).await,
            call => self.write(JOB_GROUP, call).await,
        }
    }

    /// Pauses or resumes the job group through any node, with one request id until a
    /// node answers 200 (the simulation heals every fault in the end).
    async fn pause(&mut self, paused: bool) {
        self.sent += 1;
        let body = SettingsChangeJson {
            clientid: self.id as i64,
            paused: Some(paused),
            requestid: Some(format!("w{}-r{}", self.id, self.sent)),
            ..SettingsChangeJson::default()
        };
        let invoked_us = self.now_us();
        let retries_before = self.admin.retries();
        if let Err(e) = self.admin.change_settings(JOB_GROUP, &body).await {
            panic!("worker {} sent settings the API rejects: {e}", self.id);
        }
        let retried = self.admin.retries() - retries_before;
        self.record(|h| h.retries += retried);
        let op = Op {
            worker: self.id,
            group: JOB_GROUP.to_string(),
            invoked_us,
            completed_us: self.now_us(),
            call: Call::Pause { paused },
            result: Answer::Tasks(Vec::new()),
        };
        self.record(|h| h.ops.push(op));
    }

    /// A third of adds depend on a task of the same group this worker saw last time it
    /// read the group; it may be gone by now, and then the add must be refused whole.
    fn depends_on(&self, group: &str) -> Vec<u64> {
        match self.seen.get(group) {
            Some(&id) if madsim::rand::thread_rng().gen_bool(0.33) => vec![id],
            _ => Vec::new(),
        }
    }

    /// One step of draining: delete an owned task, else claim one (briefly) from a
    /// random group; returns the count of consecutive empty claims, and reports the
    /// worker dry once it reaches [`EMPTY_CLAIMS_WHEN_DRY`].
    async fn drain_step(&mut self, empty_claims: u32) -> u32 {
        if let Some((id, _, group)) = self.owned.pop() {
            self.write(group, Call::Delete { id }).await;
            return 0;
        }
        if empty_claims >= EMPTY_CLAIMS_WHEN_DRY {
            return empty_claims;
        }
        let group = GROUPS[madsim::rand::thread_rng().gen_range(0..GROUPS.len())];
        let owned_before = self.owned.len();
        let call = Call::Claim {
            duration_ms: 500,
            wait_ms: 0,
            count: 1,
        };
        self.write(group, call).await;
        if self.owned.len() > owned_before {
            return 0;
        }
        if empty_claims + 1 == EMPTY_CLAIMS_WHEN_DRY {
            self.drain.dry.fetch_add(1, Ordering::SeqCst);
        }
        empty_claims + 1
    }

    /// The request of a write; `None` for a read.
    fn request(&self, group: &str, call: &Call, request_id: String) -> Option<WriteRequestJson> {
        let update = UpdateRequestJson::by(self.id as i64);
        let request: WriteRequestJson = match call {
            Call::Add { data, depends } => update
                .with_add(AddJson::in_group(group).with_data(data))
                .with_depends(depends.iter().copied())
                .into(),
            Call::Claim {
                duration_ms,
                wait_ms,
                count,
            } => ClaimRequestJson {
                wait_ms: (*wait_ms > 0).then_some(*wait_ms),
                count: (*count > 1).then_some(*count),
                ..ClaimRequestJson::new(self.id as i64, group, *duration_ms)
            }
            .into(),
            Call::Renew {
                id,
                data,
                duration_ms,
            } => update
                .with_change(ChangeJson::renewal(*id, data, *duration_ms))
                .into(),
            Call::Delete { id } => update.with_deletes([*id]).into(),
            Call::Finish { id, follow_up } => update
                .with_add(AddJson::in_group(group).with_data(follow_up))
                .with_deletes([*id])
                .into(),
            Call::AddJob { data, key, after } => update
                .with_add(AddJson {
                    key: Some(key.clone()),
                    after: after.clone(),
                    ..AddJson::in_group(group).with_data(data)
                })
                .into(),
            Call::Complete { id } => WriteRequestJson::Finish(FinishRequestJson {
                clientid: self.id as i64,
                id: *id,
                result: None,
                requestid: None,
                next: None,
            }),
            Call::CompleteAndClaim { id, duration_ms } => {
                WriteRequestJson::Finish(FinishRequestJson {
                    clientid: self.id as i64,
                    id: *id,
                    result: None,
                    requestid: None,
                    next: Some(NextClaimJson {
                        group: group.to_string(),
                        duration: *duration_ms,
                        count: None,
                    }),
                })
            }
            Call::CompleteMany { ids } => WriteRequestJson::FinishMany(FinishManyRequestJson {
                clientid: self.id as i64,
                finishes: ids
                    .iter()
                    .map(|&id| FinishItemJson { id, result: None })
                    .collect(),
                requestid: None,
            }),
            Call::FailJob { id } => WriteRequestJson::Fail(FailRequestJson {
                clientid: self.id as i64,
                id: *id,
                error: "simulated failure".into(),
                retry_in_ms: Some(0),
                requestid: None,
            }),
            Call::Cancel { key } => WriteRequestJson::Cancel(KeysRequestJson {
                clientid: self.id as i64,
                group: group.to_string(),
                keys: vec![key.clone()],
                requestid: None,
            }),
            Call::Read | Call::Pause { .. } => return None,
        };
        Some(request.with_request_id(request_id))
    }

    /// Sends `call` with one request id until a definite answer arrives, trying the
    /// nodes in turn, as a real client does after a timeout.
    async fn write(&mut self, group: &'static str, call: Call) {
        self.sent += 1;
        let request_id = format!("w{}-r{}", self.id, self.sent);
        let Some(request) = self.request(group, &call, request_id.clone()) else {
            return;
        };
        let invoked_us = self.now_us();
        let retries_before = self.client.retries();
        let answer = self.client.write_as(request.clone(), request_id).await;
        let retried = self.client.retries() - retries_before;
        self.record(|h| h.retries += retried);
        let result = match answer {
            Ok(tasks) => Answer::Tasks(tasks),
            Err(WorkerError::Refused(errors)) => Answer::Refused(errors),
            // The leader has not heard from every member yet (a learner just added, a
            // node down since it was elected): nothing was written; finish alone, as the
            // clients do.
            Err(WorkerError::Rejected(ClientError::Status {
                status, message, ..
            })) if rpc::job::next_not_taken(status.as_u16(), &message) => {
                let Call::CompleteAndClaim { id, .. } = call else {
                    panic!("worker {} got {status} to {request:?}: {message}", self.id);
                };
                self.record(|h| h.next_not_taken += 1);
                return Box::pin(self.write(group, Call::Complete { id })).await;
            }
            Err(e) => panic!(
                "worker {} got no definite answer to {request:?}: {e}",
                self.id
            ),
        };
        // A refused finish of many finished none: the tasks its refusal does not name are
        // still held, to be finished later.
        if let (Call::CompleteMany { ids }, Answer::Refused(errors)) = (&call, &result) {
            let still_held = ids
                .iter()
                .filter(|&&id| !crate::job_checks::names_task(errors, id));
            self.owned_jobs.extend(still_held);
        }
        if let (
            Call::Claim { .. } | Call::Renew { .. } | Call::CompleteAndClaim { .. },
            Answer::Tasks(tasks),
        ) = (&call, &result)
        {
            if group == JOB_GROUP {
                self.owned_jobs.extend(tasks.iter().map(|t| t.id));
                let owned = &self.owned_jobs;
                self.owned_job_keys.retain(|id, _| owned.contains(id));
                self.owned_job_keys.extend(
                    tasks
                        .iter()
                        .filter_map(|t| t.key.clone().map(|key| (t.id, key))),
                );
            } else {
                self.owned
                    .extend(tasks.iter().map(|t| (t.id, t.data.clone(), group)));
            }
        }
        let op = Op {
            worker: self.id,
            group: group.to_string(),
            invoked_us,
            completed_us: self.now_us(),
            call,
            result,
        };
        self.record(|h| h.ops.push(op));
    }

    /// Reads the whole group, linearizable or stale at random, from the nodes in turn
    /// until one answers; a stale read is only counted.
    async fn read(&mut self, group: &'static str) {
        let stale = madsim::rand::thread_rng().gen_bool(0.3);
        let invoked_us = self.now_us();
        let tasks = match self.client.group_tasks(group, true, stale).await {
            Ok(tasks) => tasks,
            Err(e) => panic!("worker {} could not read {group}: {e}", self.id),
        };
        if !tasks.is_empty() {
            let pick = madsim::rand::thread_rng().gen_range(0..tasks.len());
            self.seen.insert(group, tasks[pick].id);
        }
        if stale {
            self.record(|h| h.stale_reads += 1);
            return;
        }
        let op = Op {
            worker: self.id,
            group: group.to_string(),
            invoked_us,
            completed_us: self.now_us(),
            call: Call::Read,
            result: Answer::Read(tasks),
        };
        self.record(|h| h.ops.push(op));
    }
}
