//! `rota bench --mode wake` and `--mode idle`: what waiting costs and how fast it
//! answers (issue 13).
//!
//! `wake`: the workers wait in blocking claims on the group while one producer adds
//! one task at a time and waits until a worker has it; each cycle gives the latency
//! from sending the add to the claim's answer, and from the add's answer to the
//! claim's. `idle`: the workers wait in blocking claims on an empty group; the report
//! gives the log entries the first node applied per second meanwhile (0 is the aim).

use std::time::Duration;
use std::time::Instant;

use rpc::client::HttpClient;
use rpc::watch::WAIT_MS_MAX;
use rpc::worker::AddJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::UpdateRequestJson;
use tokio::sync::mpsc;

use crate::bench::BenchConfig;
use crate::bench::BenchError;
use crate::bench::REQUEST_TIMEOUT;
use crate::bench::bench_client;
use crate::bench::call;
use crate::bench::percentile;

/// How long each blocking claim of a benchmark waits.
const CLAIM_WAIT_MS: u64 = 10_000;

/// How long the idle bench lets the workers park before it starts counting.
const PARK_TIME: Duration = Duration::from_secs(2);

fn blocking_claim(client_id: i64, group: &str) -> ClaimRequestJson {
    ClaimRequestJson {
        wait_ms: Some(CLAIM_WAIT_MS.min(WAIT_MS_MAX)),
        ..ClaimRequestJson::new(client_id, group, 60_000)
    }
}

/// Workers that claim with a wait, delete what they get, and report when they got it.
fn spawn_waiters(
    config: &BenchConfig,
    got: Option<mpsc::UnboundedSender<Instant>>,
    until: Instant,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BenchError> {
    (0..config.workers)
        .map(|index| {
            // Spread over the nodes, so every node holds waiting claims.
            let client_id = 2_000_000 + index as i64;
            let client = bench_client(&config.addrs, client_id, Some(index as usize))?;
            let group = config.group.clone();
            let got = got.clone();
            Ok(tokio::spawn(async move {
                while Instant::now() < until {
                    let answer = call(&client, blocking_claim(client_id, &group)).await;
                    let answered = Instant::now();
                    let Ok(tasks) = answer else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    let Some(task) = tasks.first() else { continue };
                    if let Some(got) = &got {
                        let _ = got.send(answered);
                    }
                    let delete = UpdateRequestJson::by(client_id).with_deletes([task.id]);
                    let _ = call(&client, delete).await;
                }
            }))
        })
        .collect()
}

fn line(name: &str, samples: &mut [u64]) -> String {
    samples.sort_unstable();
    format!(
        "{name:<18} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
        samples.len(),
        percentile(samples, 50.0),
        percentile(samples, 90.0),
        percentile(samples, 99.0),
        percentile(samples, 100.0),
    )
}

/// The waiting modes spread their waiters over the nodes, each on a connection of its
/// own; sharing one would put every blocking claim behind one connection's stream limit.
fn refuse_http2(config: &BenchConfig) -> Result<(), BenchError> {
    if config.http2 {
        return Err(BenchError::Usage(
            "--http 2 applies to the cycle, job and add modes".into(),
        ));
    }
    Ok(())
}

/// The wake-up latency bench. See the module documentation.
pub async fn wake(config: BenchConfig) -> Result<String, BenchError> {
    refuse_http2(&config)?;
    let adder = bench_client(&config.addrs, 1_999_999, None)?;
    let until = Instant::now() + config.duration;
    let (got_tx, mut got) = mpsc::unbounded_channel();
    let waiters = spawn_waiters(&config, Some(got_tx), until + REQUEST_TIMEOUT)?;
    tokio::time::sleep(PARK_TIME.min(config.duration)).await;
    let addr = adder
        .find_leader()
        .await
        .unwrap_or_else(|| config.addrs[0].clone());
    let (mut from_send, mut from_ack) = (Vec::new(), Vec::new());
    let mut last_error = None;
    let mut cycle = 0u64;
    while Instant::now() < until && cycle < config.max_cycles {
        cycle += 1;
        let sent = Instant::now();
        let add = UpdateRequestJson::by(1_999_999)
            .with_add(AddJson::in_group(config.group.clone()).with_data(format!("wake-{cycle}")));
        if let Err(e) = call(&adder, add).await {
            last_error = Some(e);
            continue;
        }
        let acked = Instant::now();
        match tokio::time::timeout(REQUEST_TIMEOUT, got.recv()).await {
            Ok(Some(answered)) => {
                from_send.push(answered.saturating_duration_since(sent).as_micros() as u64);
                from_ack.push(answered.saturating_duration_since(acked).as_micros() as u64);
            }
            _ => last_error = Some("no waiting claim answered within 10 s".to_string()),
        }
    }
    for waiter in waiters {
        waiter.abort();
    }
    if from_send.is_empty() {
        return Err(BenchError::NothingWorked(last_error.unwrap_or_default()));
    }
    let mut report = format!(
        "rota bench: mode=Wake waiters={} urls={} adds through {addr}\n{:<18} {:>7} {:>9} {:>9} {:>9} {:>9}\n",
        config.workers,
        config.addrs.len(),
        "latency",
        "count",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms"
    );
    report.push_str(&line("add sent->claimed", &mut from_send));
    report.push_str(&line("add acked->claimed", &mut from_ack));
    if let Some(error) = last_error {
        report.push_str(&format!("last error: {error}\n"));
    }
    Ok(report)
}

/// One series of the node at `addr`'s `/metrics` (`name` with its labels).
async fn metric(client: &HttpClient, addr: &str, name: &str) -> Result<u64, String> {
    let response = client
        .get(addr, "/metrics", REQUEST_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&response.body);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("{addr} /metrics has no {name}"))
}

async fn applied_index(client: &HttpClient, addr: &str) -> Result<u64, String> {
    metric(client, addr, "rota_applied_index").await
}

/// Blocking claims waiting on all the nodes (they wait on the leader).
async fn waiting_claims(client: &HttpClient, addrs: &[String]) -> u64 {
    let mut total = 0;
    for addr in addrs {
        total += metric(client, addr, "rota_waiters{kind=\"claim\"}")
            .await
            .unwrap_or(0);
    }
    total
}

/// The idle cost bench. See the module documentation.
pub async fn idle(config: BenchConfig) -> Result<String, BenchError> {
    refuse_http2(&config)?;
    let client = crate::http_client();
    let until = Instant::now() + PARK_TIME + config.duration;
    let waiters = spawn_waiters(&config, None, until)?;
    tokio::time::sleep(PARK_TIME).await;
    let addr = &config.addrs[0];
    let first = applied_index(&client, addr)
        .await
        .map_err(BenchError::NothingWorked)?;
    let started = Instant::now();
    tokio::time::sleep(config.duration / 2).await;
    let parked = waiting_claims(&client, &config.addrs).await;
    tokio::time::sleep(config.duration - config.duration / 2).await;
    let last = applied_index(&client, addr)
        .await
        .map_err(BenchError::NothingWorked)?;
    let elapsed = started.elapsed().as_secs_f64();
    for waiter in waiters {
        waiter.abort();
    }
    let entries = last.saturating_sub(first);
    Ok(format!(
        "rota bench: mode=Idle waiters={} urls={}\nidle: {entries} log entries in {elapsed:.2}s = {:.2} per second while {} workers waited in blocking claims ({parked} waiting at mid-run)\n",
        config.workers,
        config.addrs.len(),
        entries as f64 / elapsed,
        config.workers
    ))
}
