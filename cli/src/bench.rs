//! `rota bench`: concurrent workers against a cluster, printing throughput and latency
//! percentiles per operation.
//!
//! In `cycle` mode each worker adds a task, claims one, and deletes what it claimed; in
//! `job` mode it adds a task with a fresh key, claims one, and finishes it with a small
//! result (the job cycle); in `next` mode it adds a task and finishes the one it holds
//! with `next`, which claims its next task in the same write (a claim only when it holds
//! none); in `add` mode it only adds. Workers spread over the given URLs. The run stops after
//! `--duration` seconds or `--max-cycles` cycles, whichever comes first.
//!
//! With `--batch N`, each request carries N tasks: one update adds N, one claim takes up
//! to N (`count`), one update deletes what it took (in job mode one `/finish/many`
//! finishes them); the report then counts tasks per second as well as requests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use rpc::job::FinishItemJson;
use rpc::job::FinishManyRequestJson;
use rpc::job::FinishRequestJson;
use rpc::job::NextClaimJson;
use rpc::worker::AddJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::TaskJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteRequestJson;
use rpc::worker_client::WorkerClient;

/// Deadline of one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most workers a run may use.
pub const WORKERS_MAX: u64 = 16_384;

/// What the workers do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchMode {
    /// add, claim, delete.
    Cycle,
    /// add with a key, claim, finish with a result.
    Job,
    /// wake-up latency: the workers wait in blocking claims while one task at a time is
    /// added; from the add to the claim's answer.
    Wake,
    /// idle cost: the workers wait in blocking claims on an empty group; log entries
    /// written per second meanwhile.
    Idle,
    /// add only.
    Add,
    /// add, then finish the task claimed before with `next`: the finish claims the
    /// worker's next task in the same write (a plain claim only when none is held), as
    /// `rota worker` cycles.
    Next,
}

/// Whether workers share HTTP/2 connections under `--http auto` (the default): when
/// there is more than one of them in a mode that sends one request after another. Many
/// workers' requests on one connection arrive, commit and answer together, which costs
/// every process far fewer system calls and wake-ups than a connection each
/// (docs/performance.md, session 17); one worker has nothing to share, and HTTP/2's
/// framing and extra task hop only add to its latency. The waiting modes hold blocking
/// claims, which keep connections of their own.
pub fn shares_http2_by_default(workers: u64, mode: BenchMode) -> bool {
    workers > 1
        && matches!(
            mode,
            BenchMode::Cycle | BenchMode::Job | BenchMode::Add | BenchMode::Next
        )
}

/// A benchmark run's settings.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// API addresses (`host:port`) to spread workers over.
    pub addrs: Vec<String>,
    /// Concurrent workers.
    pub workers: u64,
    /// What they do.
    pub mode: BenchMode,
    /// Longest run.
    pub duration: Duration,
    /// Most cycles in all.
    pub max_cycles: u64,
    /// Group the tasks go to.
    pub group: String,
    /// Tasks per request (1: the seed's one-task requests).
    pub batch: u32,
    /// Cycles per second for all workers together, spread evenly; `None`: as fast as
    /// they go. A paced run measures latency at a chosen load (say half the peak).
    pub rate: Option<f64>,
    /// Whether the workers share HTTP/2 connections (one per node for each
    /// `rpc::client::HTTP2_STREAMS_MAX` workers) instead of each holding its own HTTP/1.1
    /// connection.
    pub http2: bool,
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad settings.
    #[error("{0}")]
    Usage(String),
    /// Every request failed.
    #[error("no request succeeded: {0}")]
    NothingWorked(String),
}

#[derive(Default)]
pub(crate) struct Samples {
    latencies_us: BTreeMap<&'static str, Vec<u64>>,
    errors: BTreeMap<&'static str, u64>,
    last_error: Option<String>,
    /// Tasks through the last step of a cycle (deleted, finished, or added in add mode).
    tasks_done: u64,
}

impl Samples {
    pub(crate) fn record(&mut self, op: &'static str, started: Instant) {
        self.latencies_us
            .entry(op)
            .or_default()
            .push(started.elapsed().as_micros() as u64);
    }

    pub(crate) fn fail(&mut self, op: &'static str, error: String) {
        *self.errors.entry(op).or_default() += 1;
        self.last_error = Some(error);
    }
}

/// A bench client of `addrs` writing as `client_id`: writes go to the leader (learned
/// from `/cluster`), as a real worker's do, and are retried under one request id for
/// at most [`REQUEST_TIMEOUT`]. With `spread_from`, it never asks who leads and starts
/// at that node instead (blocking claims spread over the nodes).
pub(crate) fn bench_client(
    addrs: &[String],
    client_id: i64,
    spread_from: Option<usize>,
) -> Result<WorkerClient, BenchError> {
    let client = WorkerClient::new(addrs, client_id)
        .and_then(|c| c.with_token(crate::token()))
        .map(|c| c.with_tls(crate::tls()))
        .map_err(|e| BenchError::Usage(e.to_string()))?
        .with_timeouts(REQUEST_TIMEOUT, REQUEST_TIMEOUT);
    Ok(match spread_from {
        Some(first) => client.spread_from(first),
        None => client,
    })
}

/// One write; the tasks it wrote, or why it did not (a refusal counts as an error).
pub(crate) async fn call(
    client: &WorkerClient,
    request: impl Into<WriteRequestJson>,
) -> Result<Vec<TaskJson>, String> {
    client.write(request).await.map_err(|e| e.to_string())
}

async fn worker(
    config: Arc<BenchConfig>,
    index: u64,
    client: WorkerClient,
    stop: Arc<AtomicBool>,
    cycles: Arc<AtomicU64>,
) -> Samples {
    let client_id = client.client_id();
    let mut samples = Samples::default();
    // Keys are unique per run and worker, so that runs against one cluster never meet
    // each other's live keys.
    let run = std::process::id();
    let mut sequence = 0u64;
    // A paced worker starts its cycles `interval` apart, offset from the others'.
    let interval = config
        .rate
        .map(|rate| Duration::from_secs_f64(config.workers as f64 / rate));
    let mut next_start =
        interval.map(|every| Instant::now() + every.mul_f64(index as f64 / config.workers as f64));
    // In next mode, the task the last finish claimed.
    let mut carried: Option<u64> = None;
    while !stop.load(Ordering::Relaxed) {
        if let (Some(at), Some(every)) = (next_start, interval) {
            tokio::time::sleep_until(at.into()).await;
            // A cycle that overran does not make the next ones bunch up.
            next_start = Some((at + every).max(Instant::now()));
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if cycles.fetch_add(1, Ordering::Relaxed) >= config.max_cycles {
            break;
        }
        let started = Instant::now();
        let mut add = UpdateRequestJson::by(client_id);
        for _ in 0..config.batch {
            let mut task = AddJson::in_group(config.group.clone()).with_data("bench");
            if config.mode == BenchMode::Job {
                sequence += 1;
                task.key = Some(format!("bench-{run}-{index}-{sequence}"));
            }
            add = add.with_add(task);
        }
        match call(&client, add).await {
            Ok(added) => {
                samples.record("add", started);
                if config.mode == BenchMode::Add {
                    samples.tasks_done += added.len() as u64;
                    continue;
                }
            }
            Err(e) => {
                samples.fail("add", e);
                continue;
            }
        }
        if let Some(id) = carried.take() {
            let started = Instant::now();
            match call(&client, finish_with_next(client_id, id, &config.group)).await {
                Ok(tasks) => {
                    samples.record("next", started);
                    samples.tasks_done += 1;
                    carried = tasks.first().map(|t| t.id);
                }
                Err(e) => samples.fail("next", e),
            }
            continue;
        }
        let started = Instant::now();
        let mut claim = ClaimRequestJson::new(client_id, config.group.clone(), 60_000);
        if config.batch > 1 {
            claim = claim.with_count(config.batch);
        }
        let claimed: Vec<u64> = match call(&client, claim).await {
            Ok(tasks) => {
                samples.record("claim", started);
                tasks.iter().map(|t| t.id).collect()
            }
            Err(e) => {
                samples.fail("claim", e);
                Vec::new()
            }
        };
        if config.mode == BenchMode::Next || claimed.is_empty() {
            carried = claimed.first().copied();
            continue;
        }
        let done = claimed.len() as u64;
        let id = claimed[0];
        let started = Instant::now();
        let (op, end): (_, WriteRequestJson) = match config.mode {
            BenchMode::Job if claimed.len() > 1 => (
                "finish",
                FinishManyRequestJson {
                    clientid: client_id,
                    finishes: claimed
                        .iter()
                        .map(|&id| FinishItemJson {
                            id,
                            result: Some(serde_json::json!({ "ok": true })),
                        })
                        .collect(),
                    requestid: None,
                }
                .into(),
            ),
            BenchMode::Job => (
                "finish",
                FinishRequestJson {
                    clientid: client_id,
                    id,
                    result: Some(serde_json::json!({ "ok": true })),
                    requestid: None,
                    next: None,
                }
                .into(),
            ),
            _ => (
                "delete",
                UpdateRequestJson::by(client_id)
                    .with_deletes(claimed)
                    .into(),
            ),
        };
        match call(&client, end).await {
            Ok(_) => {
                samples.record(op, started);
                samples.tasks_done += done;
            }
            Err(e) => samples.fail(op, e),
        }
    }
    // Not left claimed for a minute: the next run may use the group. Untimed.
    if let Some(id) = carried {
        let _ = call(&client, UpdateRequestJson::by(client_id).with_deletes([id])).await;
    }
    samples
}

/// A finish of `id` that claims the worker's next task of `group` in the same write.
fn finish_with_next(client_id: i64, id: u64, group: &str) -> FinishRequestJson {
    FinishRequestJson {
        clientid: client_id,
        id,
        result: None,
        requestid: None,
        next: Some(NextClaimJson {
            group: group.to_string(),
            duration: 60_000,
            count: None,
        }),
    }
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Runs a cycle, job or add benchmark and returns its report, one line per operation
/// (the waiting modes are `bench_wait`'s).
pub async fn run(config: BenchConfig) -> Result<String, BenchError> {
    if config.addrs.is_empty() {
        return Err(BenchError::Usage("give at least one --url".into()));
    }
    if !(1..=WORKERS_MAX).contains(&config.workers) {
        return Err(BenchError::Usage(format!(
            "--workers: use 1 to {WORKERS_MAX}"
        )));
    }
    if matches!(config.mode, BenchMode::Wake | BenchMode::Idle) {
        return Err(BenchError::Usage(
            "the wake and idle modes run in bench_wait".into(),
        ));
    }
    let batch_max = rpc::worker::CLAIM_COUNT_MAX;
    if !(1..=batch_max).contains(&config.batch) {
        return Err(BenchError::Usage(format!("--batch: use 1 to {batch_max}")));
    }
    if config
        .rate
        .is_some_and(|rate| !(rate.is_finite() && rate > 0.0))
    {
        return Err(BenchError::Usage(
            "--rate: give a positive number of cycles per second".into(),
        ));
    }
    if config.batch > 1
        && !matches!(
            config.mode,
            BenchMode::Cycle | BenchMode::Add | BenchMode::Job
        )
    {
        return Err(BenchError::Usage(
            "--batch applies to the cycle, job and add modes".into(),
        ));
    }
    let config = Arc::new(config);
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let mut clients: Vec<WorkerClient> = Vec::new();
    // HTTP/2: each group of as many workers as a node serves at once on one connection
    // shares the connections of its first; more in one group would only wait in line.
    let group = rpc::client::HTTP2_STREAMS_MAX as usize;
    for i in 0..config.workers as usize {
        let client = bench_client(&config.addrs, 1_000_000 + i as i64, None)?;
        clients.push(match clients.get(i - i % group) {
            Some(first) if config.http2 => client.sharing_connections_of(first),
            _ => client.with_http2(config.http2),
        });
    }
    let started = Instant::now();
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            tokio::spawn(worker(
                config.clone(),
                i as u64,
                client,
                stop.clone(),
                cycles.clone(),
            ))
        })
        .collect();
    let timer = {
        let stop = stop.clone();
        let duration = config.duration;
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut all = Samples::default();
    for handle in handles {
        let Ok(samples) = handle.await else { continue };
        for (op, latencies) in samples.latencies_us {
            all.latencies_us.entry(op).or_default().extend(latencies);
        }
        for (op, errors) in samples.errors {
            *all.errors.entry(op).or_default() += errors;
        }
        all.last_error = samples.last_error.or(all.last_error);
        all.tasks_done += samples.tasks_done;
    }
    timer.abort();
    let elapsed = started.elapsed().as_secs_f64();
    if all.latencies_us.is_empty() {
        return Err(BenchError::NothingWorked(
            all.last_error.unwrap_or_default(),
        ));
    }

    let mut report = format!(
        "rota bench: mode={:?} workers={} urls={} elapsed={elapsed:.2}s{}\n",
        config.mode,
        config.workers,
        config.addrs.len(),
        config
            .rate
            .map_or(String::new(), |rate| format!(" rate={rate}/s"))
    );
    let done_ops = match config.mode {
        BenchMode::Cycle => "delete",
        BenchMode::Job => "finish",
        BenchMode::Next => "next",
        BenchMode::Add | BenchMode::Wake | BenchMode::Idle => "add",
    };
    let completed = all.latencies_us.get(done_ops).map_or(0, Vec::len);
    report.push_str(&format!(
        "{:<8} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
        "op", "count", "per second", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"
    ));
    for op in ["add", "claim", "delete", "finish", "next"] {
        let Some(latencies) = all.latencies_us.get_mut(op) else {
            continue;
        };
        latencies.sort_unstable();
        report.push_str(&format!(
            "{op:<8} {:>9} {:>11.0} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7}\n",
            latencies.len(),
            latencies.len() as f64 / elapsed,
            percentile(latencies, 50.0),
            percentile(latencies, 90.0),
            percentile(latencies, 99.0),
            percentile(latencies, 100.0),
            all.errors.get(op).copied().unwrap_or(0),
        ));
    }
    report.push_str(&format!(
        "{}: {completed} in {elapsed:.2}s = {:.0} per second\n",
        match config.mode {
            BenchMode::Cycle => "cycles",
            BenchMode::Job => "job cycles",
            BenchMode::Next => "cycles with next",
            BenchMode::Add | BenchMode::Wake | BenchMode::Idle => "adds",
        },
        completed as f64 / elapsed
    ));
    if config.batch > 1 {
        report.push_str(&format!(
            "tasks: {} in {elapsed:.2}s = {:.0} per second (up to {} per request)\n",
            all.tasks_done,
            all.tasks_done as f64 / elapsed,
            config.batch
        ));
    }
    if let Some(error) = all.last_error {
        report.push_str(&format!("last error: {error}\n"));
    }
    Ok(report)
}
