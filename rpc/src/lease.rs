//! [`Lease`]: a claimed task that renews itself in the background and always knows its
//! current fencing id; and [`run_worker`], the claim, run, finish loop with a
//! concurrency limit and a graceful stop.
//!
//! A renewal writes a new version of the task, whose id is the fence from then on: pass
//! [`Lease::fence`] to whatever the work writes downstream, so that a worker whose lease
//! lapsed cannot overwrite a newer worker's output (docs/fencing.md). A lease is lost
//! when a renewal is refused (the task was cancelled, or its lease lapsed and another
//! worker claimed it) or when no renewal succeeded before the lease ran out; the work
//! should then stop, since it no longer owns the task.
//!
//! A claim answered late (retried through an outage, with less than a third of its
//! lease left by the reckoning from its first send) may have been granted long ago and
//! lapsed, or only just now: its work should wait for [`Lease::held`], which resolves
//! once the first renewal lands. [`run_worker`] does so.
//!
//! ```no_run
//! # async fn example() -> Result<(), rpc::worker_client::WorkerError> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use rpc::lease::{run_worker, WorkerOptions};
//! use rpc::worker_client::WorkerClient;
//!
//! let client = Arc::new(WorkerClient::new(["127.0.0.1:7001"], 7)?);
//! let (_stop, stopped) = tokio::sync::watch::channel(false);
//! let options = WorkerOptions::new("mail");
//! run_worker(client, options, stopped, |lease| async move {
//!     // lease.task().data is the payload; lease.fence() goes downstream.
//!     Ok(Some(serde_json::json!({"sent": lease.task().data})))
//! })
//! .await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::ClientError;
use crate::worker::TaskJson;
use crate::worker_client::WorkerClient;
use crate::worker_client::WorkerError;

/// Why a lease ended without its holder ending it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseLost {
    /// A renewal was refused (the task was cancelled, deleted, or claimed by another
    /// worker after the lease lapsed); the cluster's reasons.
    Refused(Vec<String>),
    /// No renewal succeeded before the lease ran out.
    Expired,
}

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(reasons) => write!(f, "renewal refused: {}", reasons.join("; ")),
            Self::Expired => f.write_str("no renewal landed before it ran out"),
        }
    }
}

struct Shared {
    /// The task as last written: its id is the current fence.
    task: std::sync::Mutex<TaskJson>,
    /// When the current lease runs out, by this process's clock (conservatively: from
    /// when the write that granted it was sent). Held while a renewal is written, so
    /// that ending the lease waits for it and then uses the version it wrote.
    until: Mutex<Instant>,
    /// Set once the holder ends the lease: the renewer stops.
    ended: std::sync::atomic::AtomicBool,
    /// Whether the lease is known to be held: at once for a claim answered in good time,
    /// after the first renewal for one answered late.
    held: watch::Sender<bool>,
    /// The current fence, for holders that follow it as it changes.
    fence: watch::Sender<u64>,
}

impl Shared {
    fn task(&self) -> TaskJson {
        self.task.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A claimed task, renewed in the background at about a third of its lease. See the
/// module documentation.
pub struct Lease {
    client: Arc<WorkerClient>,
    shared: Arc<Shared>,
    lost: watch::Receiver<Option<LeaseLost>>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Lease {
    /// Holds `task`, claimed for `lease` by `client` with a request sent at
    /// `claimed_at`, renewing it until the holder finishes or fails it.
    pub fn hold(
        client: Arc<WorkerClient>,
        task: TaskJson,
        lease: Duration,
        claimed_at: Instant,
    ) -> Self {
        let fence = watch::Sender::new(task.id);
        let until = claimed_at + lease;
        let in_good_time = until.saturating_duration_since(Instant::now()) >= lease / 3;
        let shared = Arc::new(Shared {
            task: std::sync::Mutex::new(task),
            until: Mutex::new(until),
            ended: std::sync::atomic::AtomicBool::new(false),
            held: watch::Sender::new(in_good_time),
            fence,
        });
        let (lost_tx, lost) = watch::channel(None);
        let renewer = tokio::spawn(renew(
            Arc::clone(&client),
            Arc::clone(&shared),
            lease,
            lost_tx,
        ));
        Self {
            client,
            shared,
            lost,
            renewer,
        }
    }

    /// The task as last written (its id is the current fence).
    pub fn task(&self) -> TaskJson {
        self.shared.task()
    }

    /// The current fencing id: pass it downstream with every write the work makes.
    pub fn fence(&self) -> u64 {
        self.task().id
    }

    /// The fence as it changes: a receiver whose value is the current fencing id, marked
    /// changed at each renewal.
    pub fn fences(&self) -> watch::Receiver<u64> {
        self.shared.fence.subscribe()
    }

    /// Resolves once the lease is known to be held: at once for a claim answered with at
    /// least a third of its lease left, otherwise when the first renewal lands (never,
    /// if the lease is lost instead: see [`Lease::lost`]). Start the work after it.
    pub async fn held(&self) {
        let mut held = self.shared.held.subscribe();
        if held.wait_for(|held| *held).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LeaseLost> {
        self.lost.borrow().clone()
    }

    /// Resolves when the lease is lost; the work should stop then.
    pub async fn lost(&self) -> LeaseLost {
        let mut lost = self.lost.clone();
        loop {
            if let Some(reason) = lost.borrow_and_update().clone() {
                return reason;
            }
            if lost.changed().await.is_err() {
                // The renewer ended without a loss: the holder ended the lease.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops renewing and hands back the current version, unless the lease is lost.
    async fn end(&self) -> Result<TaskJson, WorkerError> {
        let _renewal = self.shared.until.lock().await;
        self.shared
            .ended
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.renewer.abort();
        if let Some(reason) = self.lost_reason() {
            return Err(WorkerError::Refused(vec![format!(
                "the lease was lost ({reason})"
            )]));
        }
        Ok(self.task())
    }

    /// Ends the claim with success and an optional JSON result.
    pub async fn finish(&self, result: Option<Value>) -> Result<(), WorkerError> {
        let task = self.end().await?;
        self.client.finish(task.id, result).await
    }

    /// Ends the claim with success and, in the same write, claims up to `count` of
    /// `group`'s next tasks for `lease` ([`WorkerClient::finish_and_claim`]): the
    /// claimed tasks, to be held in leases of their own.
    pub async fn finish_and_claim(
        &self,
        result: Option<Value>,
        group: &str,
        lease: Duration,
        count: u32,
    ) -> Result<Vec<TaskJson>, WorkerError> {
        let task = self.end().await?;
        self.client
            .finish_and_claim(task.id, result, group, lease, count)
            .await
    }

    /// Ends the claim by giving the task back, to be claimed again at once (for a job,
    /// a released attempt, which never makes it dead).
    pub async fn release(&self) -> Result<(), WorkerError> {
        let task = self.end().await?;
        self.client.release(&task).await
    }

    /// Ends the claim with an error: the task is retried after the group's back-off (or
    /// `retry_in`), or is dead after its last attempt.
    pub async fn fail(&self, error: &str, retry_in: Option<Duration>) -> Result<(), WorkerError> {
        let task = self.end().await?;
        self.client.fail(task.id, error, retry_in).await.map(drop)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// The renewer: a renewal when a third of the lease has passed since it was granted
/// (for a claim that waited, that may be at once); a refusal (by the cluster, or by a
/// node that turned the request away, such as a 401 for a revoked token), or a lease that runs out
/// with no renewal known to have landed, is a loss. A renewal whose outcome is unknown is sent again under the same
/// request id, so that one that did apply is not mistaken for a refusal.
async fn renew(
    client: Arc<WorkerClient>,
    shared: Arc<Shared>,
    lease: Duration,
    lost: watch::Sender<Option<LeaseLost>>,
) {
    let ahead = lease - lease / 3;
    let mut due = {
        let until = *shared.until.lock().await;
        until.checked_sub(ahead).unwrap_or_else(Instant::now)
    };
    // The request id and first send time of a renewal whose outcome is not known yet.
    let mut pending: Option<(String, Instant)> = None;
    loop {
        tokio::time::sleep_until(due).await;
        let mut until = shared.until.lock().await;
        if shared.ended.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (request_id, sent) = pending
            .get_or_insert_with(|| (client.next_request_id(), Instant::now()))
            .clone();
        // Bounded by what is left of the lease: past it, the task is not ours unless
        // nobody took it meanwhile, and work running on it may collide with another
        // worker's. A late claim's first renewal gets at least one call instead: its
        // claim may have been granted only just now, the renewal (fenced by the
        // version) settles it, and its work waits for that (`Lease::held`).
        let left = until.saturating_duration_since(Instant::now());
        let left = if *shared.held.borrow() {
            left
        } else {
            left.max(client.call_timeout())
        };
        let task = shared.task();
        match tokio::time::timeout(left, client.renew_as(&task, lease, request_id)).await {
            Ok(Ok(task)) => {
                let fence = task.id;
                *shared.task.lock().unwrap_or_else(|p| p.into_inner()) = task;
                shared.fence.send_replace(fence);
                shared.held.send_replace(true);
                // Conservatively from the first send: the write applied after it.
                *until = sent + lease;
                due = sent + lease / 3;
                pending = None;
            }
            Ok(Err(WorkerError::Refused(reasons))) => {
                let _ = lost.send(Some(LeaseLost::Refused(reasons)));
                return;
            }
            // A node turned the client itself away (a revoked token: 401; a token no
            // longer allowed the group: 403) or the renewal (400, 422), or it may not
            // talk to the nodes at all (https without TLS): every retry gets the same
            // answer, and the lease cannot be kept, so it is lost now rather than when
            // it runs out.
            Ok(Err(rejected)) if matches!(&rejected, WorkerError::Rejected(error) if ends_the_lease(error)) =>
            {
                let _ = lost.send(Some(LeaseLost::Refused(vec![rejected.to_string()])));
                return;
            }
            _ if Instant::now() >= *until => {
                let _ = lost.send(Some(LeaseLost::Expired));
                return;
            }
            // Not known yet: the same renewal again shortly, while the lease lasts.
            _ => due = Instant::now() + RENEWAL_RETRY_PAUSE,
        }
    }
}

/// Whether a renewal rejected with `error` would be rejected so again: it could not
/// connect (https without TLS), or a definite 4xx.
fn ends_the_lease(error: &ClientError) -> bool {
    match error {
        ClientError::Connect { .. } => true,
        ClientError::Status { status, .. } => rejected_for_good(*status),
        _ => false,
    }
}

/// Whether a renewal answered `status` will be answered so again: any 4xx but those
/// that say the request was not taken yet (408 and 429, which the client retries
/// itself; 421 and 425, which HTTP lets a client send again).
fn rejected_for_good(status: StatusCode) -> bool {
    status.is_client_error()
        && !matches!(
            status,
            StatusCode::REQUEST_TIMEOUT
                | StatusCode::MISDIRECTED_REQUEST
                | StatusCode::TOO_EARLY
                | StatusCode::TOO_MANY_REQUESTS
        )
}

/// Pause before a renewal whose outcome is unknown is sent again.
const RENEWAL_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// How [`run_worker`] works a group.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The group to claim from.
    pub group: String,
    /// Tasks run at once.
    pub concurrency: usize,
    /// Each claim's lease, renewed at about a third of it.
    pub lease: Duration,
    /// How long a claim waits for a task (at most a minute, and at most a third of the
    /// lease).
    pub wait: Duration,
    /// After a stop, how long running work may go on before its task is given back.
    pub grace: Duration,
    /// Counters of what the loop did, for metrics; share one to read them.
    pub stats: Arc<WorkerStats>,
    /// Told of what an operator should hear of (lost leases, failures, give-backs).
    pub events: EventHook,
}

/// Something [`run_worker`] did that an operator may want to read in a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerEvent {
    /// Claims fail: no node gave a definite answer, or the cluster refused the claim.
    /// Told once when claims start failing and then at most every
    /// [`CLAIM_FAILURE_REPORT_EVERY`] while they keep failing.
    ClaimsFailing {
        /// Claims that failed in a row so far.
        failures: u64,
        /// The last failure.
        error: String,
    },
    /// Claims are answered again after `failures` failed in a row.
    ClaimsRecovered {
        /// Claims that had failed in a row.
        failures: u64,
    },
    /// The work of task `task` failed; the task was failed with `error`.
    WorkFailed {
        /// The task.
        task: ClaimedTask,
        /// The error's first line.
        error: String,
    },
    /// Task `task`'s lease was lost while its work ran: the work was dropped.
    LeaseLost {
        /// The task.
        task: ClaimedTask,
        /// Why.
        reason: LeaseLost,
    },
    /// The work of task `task` ended but ending the claim (`how`: finish, fail or give
    /// back) did not go through: refused (the job was cancelled, the lease lost) or
    /// never answered (the task runs again once its lease lapses).
    EndFailed {
        /// The task.
        task: ClaimedTask,
        /// `"finish"`, `"fail"` or `"give back"`.
        how: &'static str,
        /// Why.
        error: String,
    },
    /// Task `task` was given back: the worker stopped and its work ran past the grace.
    Released {
        /// The task.
        task: ClaimedTask,
    },
}

impl std::fmt::Display for WorkerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ClaimsFailing { failures, error } => {
                write!(f, "claims failing ({failures} in a row): {error}")
            }
            Self::ClaimsRecovered { failures } => {
                write!(f, "claims answered again after {failures} failed")
            }
            Self::WorkFailed { task, error } => write!(f, "{task} failed: {error}"),
            Self::LeaseLost { task, reason } => {
                write!(f, "{task}: lease lost, its work stopped ({reason})")
            }
            Self::EndFailed { task, how, error } => write!(
                f,
                "{task}: its {how} did not go through, so this worker's outcome is not recorded: {error}"
            ),
            Self::Released { task } => write!(
                f,
                "{task} given back: the worker stopped and its work ran past the grace"
            ),
        }
    }
}

/// The task an event is about: the id of the version claimed, and its job's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedTask {
    /// The id of the version claimed (later versions, written by renewals, have others).
    pub id: u64,
    /// Its job's key, for a task that has one.
    pub key: Option<String>,
}

impl std::fmt::Display for ClaimedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(key) => write!(f, "task {} (key {key:?})", self.id),
            None => write!(f, "task {}", self.id),
        }
    }
}

/// How often [`WorkerEvent::ClaimsFailing`] is told again while claims keep failing.
pub const CLAIM_FAILURE_REPORT_EVERY: Duration = Duration::from_secs(60);

/// Where [`run_worker`] tells its [`WorkerEvent`]s, with the group's name: a callback
/// shared by every slot (the default tells no one).
#[derive(Clone, Default)]
pub struct EventHook(Option<Arc<TellEvent>>);

/// A callback told of a group's name and one of its events.
type TellEvent = dyn Fn(&str, &WorkerEvent) + Send + Sync;

impl EventHook {
    /// Calls `tell` with the group and each event.
    pub fn new(tell: impl Fn(&str, &WorkerEvent) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(tell)))
    }

    fn tell(&self, group: &str, event: WorkerEvent) {
        if let Some(tell) = &self.0 {
            tell(group, &event);
        }
    }
}

impl std::fmt::Debug for EventHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "EventHook(set)"
        } else {
            "EventHook(none)"
        })
    }
}

/// What [`run_worker`] has done so far, for metrics (every field only grows, except
/// `running`).
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Tasks claimed.
    pub claimed: AtomicU64,
    /// Tasks finished (the finish was acknowledged).
    pub finished: AtomicU64,
    /// Tasks failed by their work.
    pub failed: AtomicU64,
    /// Tasks given back because the worker stopped while their work ran, past the grace.
    pub released: AtomicU64,
    /// Leases lost while the work ran (refused renewal, cancel, expiry).
    pub lost: AtomicU64,
    /// Claims that ended in an error (no node answered, a refusal).
    pub claim_errors: AtomicU64,
    /// Claim requests sent (a task that a finish claimed in the same write needs none).
    pub claims_sent: AtomicU64,
    /// Work running now.
    pub running: AtomicU64,
    /// Total time work ran, in milliseconds.
    pub work_ms: AtomicU64,
}

impl WorkerStats {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// How one claim's work ended.
enum Ended {
    /// The work returned: a result to finish with, or an error to fail with.
    Done(Result<Option<Value>, String>),
    /// The worker was stopped and the grace ran out first.
    Stopped,
    /// The lease was lost (cancel, refused renewal, expiry).
    Lost,
}

/// The pause before claiming again after `empties` claims in a row came back empty
/// sooner than their wait (a node that cannot wait, or a wait cut short): doubling
/// from 100 ms up to 5 s, with up to half of it added at random (from `seed`), so that
/// many workers polling a quiet group neither spin nor march in step.
pub fn poll_backoff(empties: u32, seed: u64) -> Duration {
    const FIRST_MS: u64 = 100;
    const MOST_MS: u64 = 5_000;
    let base = FIRST_MS
        .saturating_mul(1u64 << empties.saturating_sub(1).min(16))
        .min(MOST_MS);
    // splitmix64: a cheap, well-spread hash of the seed.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    Duration::from_millis(base + z % (base / 2 + 1))
}

impl WorkerOptions {
    /// One task at a time from `group`, 30 s leases, 20 s waits, a 10 s grace.
    pub fn new(group: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            concurrency: 1,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(20),
            grace: Duration::from_secs(10),
            stats: Arc::default(),
            events: EventHook::default(),
        }
    }
}

/// Claims tasks of `options.group` and runs `work` on each, `options.concurrency` at a
/// time, until `stop` turns true: the work's `Ok(result)` finishes the task, `Err`
/// fails it (retried after the group's back-off). Claims wait at the node for a task
/// (`options.wait`); a claim that comes back empty sooner is followed by a growing,
/// jittered pause ([`poll_backoff`]), so a node that cannot wait is polled, not
/// hammered; a claim that fails is followed by the same growing pause. Work whose lease
/// is lost is dropped (it no longer owns the task); after a stop, running work gets
/// `options.grace` (cut short by another send on `stop`), then is dropped and its task
/// given back so that it runs elsewhere. Returns how many tasks were finished;
/// `options.stats` counts the rest and `options.events` hears what went wrong.
pub async fn run_worker<F, Fut>(
    client: Arc<WorkerClient>,
    options: WorkerOptions,
    mut stop: watch::Receiver<bool>,
    work: F,
) -> u64
where
    F: Fn(Arc<Lease>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Value>, String>> + Send + 'static,
{
    let work = Arc::new(work);
    let options = Arc::new(options);
    let claims = Arc::new(ClaimHealth::default());
    let finished_before = WorkerStats::get(&options.stats.finished);
    // One loop per slot, each claiming for itself: claims run side by side, as the work
    // does, so one slow claim never holds up the others.
    let slots: Vec<_> = (0..options.concurrency.max(1))
        .map(|slot| {
            tokio::spawn(work_slot(
                Arc::clone(&client),
                Arc::clone(&options),
                Arc::clone(&claims),
                stop.clone(),
                Arc::clone(&work),
                slot as u64,
            ))
        })
        .collect();
    let _ = stop.wait_for(|s| *s).await;
    futures_util::future::join_all(slots).await;
    WorkerStats::get(&options.stats.finished) - finished_before
}

/// Sleeps `pause`, or less if the stop comes first; whether the stop came.
async fn pause_unless_stopped(pause: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => true,
        () = tokio::time::sleep(pause) => false,
    }
}

/// Whether a group's claims are failing, shared by its slots so that a cluster out of
/// reach is told once per group, not once per slot and retry.
#[derive(Default)]
struct ClaimHealth {
    /// Claims failed in a row, and when that was last told.
    failing: std::sync::Mutex<(u64, Option<Instant>)>,
}

impl ClaimHealth {
    fn failed(&self, options: &WorkerOptions, error: &WorkerError) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        failing.0 += 1;
        let due = failing
            .1
            .is_none_or(|told| told.elapsed() >= CLAIM_FAILURE_REPORT_EVERY);
        if due {
            failing.1 = Some(Instant::now());
            let event = WorkerEvent::ClaimsFailing {
                failures: failing.0,
                error: error.to_string(),
            };
            options.events.tell(&options.group, event);
        }
    }

    fn answered(&self, options: &WorkerOptions) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.0 > 0 {
            let event = WorkerEvent::ClaimsRecovered {
                failures: failing.0,
            };
            *failing = (0, None);
            options.events.tell(&options.group, event);
        }
    }
}

/// One slot of [`run_worker`]: claim, work, finish or fail, until the stop.
async fn work_slot<F, Fut>(
    client: Arc<WorkerClient>,
    options: Arc<WorkerOptions>,
    claim_health: Arc<ClaimHealth>,
    mut stop: watch::Receiver<bool>,
    work: Arc<F>,
    slot: u64,
) where
    F: Fn(Arc<Lease>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Value>, String>> + Send + 'static,
{
    let stats = &options.stats;
    // A granted lease is counted from when its claim was sent, so a claim may wait at
    // most a third of the lease: the first renewal, due then, still finds it held.
    let wait = options.wait.min(options.lease / 3);
    let mut empties: u32 = 0;
    let mut errors: u32 = 0;
    let mut claims: u64 = 0;
    // A task the last finish claimed in the same write, and when that write was sent.
    let mut carried: Option<(TaskJson, Instant)> = None;
    while !*stop.borrow() {
        let (task, claimed_at) = if let Some(next) = carried.take() {
            next
        } else {
            let claimed_at = Instant::now();
            claims += 1;
            WorkerStats::add(&stats.claims_sent);
            let claim = client.claim_waiting(&options.group, options.lease, wait);
            let task = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                task = claim => task,
            };
            if task.is_ok() {
                errors = 0;
                claim_health.answered(&options);
            }
            let task = match task {
                Ok(Some(task)) => task,
                Ok(None) => {
                    // An empty answer well before the wait was up: this node does not wait
                    // (or the wait was cut short), so poll with a growing pause instead.
                    if claimed_at.elapsed() < wait / 2 {
                        empties = empties.saturating_add(1);
                        let seed = slot.rotate_left(32) ^ claims;
                        if pause_unless_stopped(poll_backoff(empties, seed), &mut stop).await {
                            return;
                        }
                    } else {
                        empties = 0;
                    }
                    continue;
                }
                Err(error) => {
                    WorkerStats::add(&stats.claim_errors);
                    claim_health.failed(&options, &error);
                    // Growing: a refused claim (a lease the cluster does not grant) fails
                    // at once every time, and must not become a stream of requests.
                    errors = errors.saturating_add(1);
                    let seed = slot.rotate_left(32) ^ claims;
                    if pause_unless_stopped(poll_backoff(errors, seed), &mut stop).await {
                        return;
                    }
                    continue;
                }
            };
            empties = 0;
            (task, claimed_at)
        };
        let claimed = ClaimedTask {
            id: task.id,
            key: task.key.clone(),
        };
        WorkerStats::add(&stats.claimed);
        stats.running.fetch_add(1, Ordering::Relaxed);
        let lease = Arc::new(Lease::hold(
            Arc::clone(&client),
            task,
            options.lease,
            claimed_at,
        ));
        let mut stop_for_grace = stop.clone();
        let grace = options.grace;
        let started = Instant::now();
        let outcome = tokio::select! {
            biased;
            _ = lease.lost() => Ended::Lost,
            () = async {
                let _ = stop_for_grace.wait_for(|s| *s).await;
                // Another send on `stop` (a second Ctrl-C) cuts the grace short; a
                // sender gone is not one.
                let hurried = async {
                    if stop_for_grace.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    biased;
                    () = hurried => {}
                    () = tokio::time::sleep(grace) => {}
                }
            } => Ended::Stopped,
            outcome = async {
                lease.held().await;
                work(Arc::clone(&lease)).await
            } => Ended::Done(outcome),
        };
        stats
            .work_ms
            .fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        stats.running.fetch_sub(1, Ordering::Relaxed);
        let tell = |event| options.events.tell(&options.group, event);
        let end_failed = |how, error: WorkerError| {
            WorkerStats::add(&stats.lost);
            tell(WorkerEvent::EndFailed {
                task: claimed.clone(),
                how,
                error: error.to_string(),
            });
        };
        match outcome {
            // While the worker runs on, the finish claims the slot's next task in the
            // same write: one commit per task while tasks are there.
            Ended::Done(Ok(result)) if !*stop.borrow() => {
                let sent = Instant::now();
                let group = &options.group;
                match lease
                    .finish_and_claim(result, group, options.lease, 1)
                    .await
                {
                    Ok(next) => {
                        WorkerStats::add(&stats.finished);
                        carried = next.into_iter().next().map(|task| (task, sent));
                    }
                    Err(error) => end_failed("finish", error),
                }
            }
            Ended::Done(Ok(result)) => match lease.finish(result).await {
                Ok(()) => WorkerStats::add(&stats.finished),
                Err(error) => end_failed("finish", error),
            },
            Ended::Done(Err(error)) => match lease.fail(&error, None).await {
                Ok(()) => {
                    WorkerStats::add(&stats.failed);
                    let first_line = error.lines().next().unwrap_or_default().to_string();
                    tell(WorkerEvent::WorkFailed {
                        task: claimed.clone(),
                        error: first_line,
                    });
                }
                Err(error) => end_failed("fail", error),
            },
            // Not the task's failure: a worker going away must not spend its attempts
            // (a rolling restart would make jobs on their last attempt dead), and
            // another worker may take it at once, without the group's back-off.
            Ended::Stopped => match lease.release().await {
                Ok(()) => {
                    WorkerStats::add(&stats.released);
                    tell(WorkerEvent::Released {
                        task: claimed.clone(),
                    });
                }
                Err(error) => end_failed("give back", error),
            },
            Ended::Lost => {
                WorkerStats::add(&stats.lost);
                let reason = lease.lost_reason().unwrap_or(LeaseLost::Expired);
                tell(WorkerEvent::LeaseLost {
                    task: claimed.clone(),
                    reason,
                });
            }
        }
    }
    // Claimed by the last finish as the stop came: given back unstarted.
    if let Some((task, _)) = carried
        && client.release(&task).await.is_err()
    {
        options.events.tell(
            &options.group,
            WorkerEvent::EndFailed {
                task: ClaimedTask {
                    id: task.id,
                    key: task.key.clone(),
                },
                how: "give back",
                error: "no answer; the task runs again once its lease lapses".into(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_rejected_with_a_definite_4xx_is_not_sent_again() {
        for code in [400, 401, 403, 404, 405, 413, 422] {
            let status = StatusCode::from_u16(code).expect("a status");
            assert!(rejected_for_good(status), "{code}");
        }
        for code in [408, 421, 425, 429, 500, 502, 503] {
            let status = StatusCode::from_u16(code).expect("a status");
            assert!(!rejected_for_good(status), "{code}");
        }
    }

    #[test]
    fn poll_backoff_grows_to_its_cap_with_bounded_jitter() {
        for seed in 0..200 {
            let first = poll_backoff(1, seed).as_millis();
            assert!((100..=150).contains(&first), "{first}");
            let third = poll_backoff(3, seed).as_millis();
            assert!((400..=600).contains(&third), "{third}");
            let late = poll_backoff(40, seed).as_millis();
            assert!((5_000..=7_500).contains(&late), "{late}");
        }
        let spread: std::collections::BTreeSet<_> = (0..50).map(|s| poll_backoff(2, s)).collect();
        assert!(spread.len() > 10, "the jitter spreads workers: {spread:?}");
    }
}
