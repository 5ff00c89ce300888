//! `rota worker --group G [--concurrency N] [--lease 30s] -- CMD ARGS...` (issue 14):
//! claims tasks with a wait, runs CMD once per task in its own process group with the
//! task's data on stdin and `ROTA_TASK_ID`, `ROTA_TASK_KEY`, `ROTA_ATTEMPT` and
//! `ROTA_GROUP` in its environment, keeps the lease renewed (`rpc::lease`), kills the
//! process group when the lease is lost or the task cancelled, and finishes the task on
//! exit 0 (result: exit status, duration, the last 64 KiB of stdout and stderr) or
//! fails it otherwise (the same, as the error). On SIGTERM or Ctrl-C it stops claiming,
//! lets running commands go on for the grace period, then kills them and fails their
//! tasks so they run elsewhere.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use rpc::lease::Lease;
use rpc::lease::WorkerOptions;
use rpc::lease::run_worker;
use rpc::worker_client::WorkerClient;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use crate::CliError;

/// How much of each output stream a task's outcome keeps (its end).
pub const OUTPUT_TAIL_BYTES: usize = 64 * 1024;

/// Most commands one worker runs at once.
pub const CONCURRENCY_MAX: usize = 1024;

/// The most a failure's error may hold (the job layer's limit), with room for the
/// exit status line.
const ERROR_BYTES_MAX: usize = 64 * 1024 - 256;

/// What `rota worker` runs and how.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Node addresses.
    pub urls: Vec<String>,
    /// The client id the worker claims as.
    pub client_id: i64,
    /// Group, concurrency, lease, wait and grace.
    pub options: WorkerOptions,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// The last `max` bytes of `bytes`, as text (cut at a character boundary).
fn tail(bytes: &[u8], max: usize) -> String {
    let start = bytes.len().saturating_sub(max);
    let text = String::from_utf8_lossy(&bytes[start..]);
    text.into_owned()
}

/// Reads a stream to its end, keeping only its last [`OUTPUT_TAIL_BYTES`].
async fn read_tail(mut stream: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    let mut kept: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                kept.extend_from_slice(&buffer[..n]);
                if kept.len() > 2 * OUTPUT_TAIL_BYTES {
                    kept.drain(..kept.len() - OUTPUT_TAIL_BYTES);
                }
            }
        }
    }
}

/// Kills process group `pgid` (the command and everything it started).
fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Kills the process group when dropped: work that is dropped (a lost lease, a stop
/// past its grace) takes its command with it.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            kill_group(pgid);
        }
    }
}

/// Runs the command for one task; the result to finish with, or the error to fail with.
async fn run_command(
    command: Arc<Vec<String>>,
    lease: Arc<Lease>,
) -> Result<Option<serde_json::Value>, String> {
    let task = lease.task();
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("ROTA_TASK_ID", task.id.to_string())
        .env("ROTA_TASK_KEY", task.key.clone().unwrap_or_default())
        .env("ROTA_ATTEMPT", task.attempt.to_string())
        .env("ROTA_GROUP", &task.group)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("could not start {:?}: {e}", command[0]))?;
    let guard = GroupGuard(child.id());
    if let Some(mut stdin) = child.stdin.take() {
        let data = task.data.clone();
        tokio::spawn(async move {
            let _ = stdin.write_all(data.as_bytes()).await;
        });
    }
    let stdout = tokio::spawn(read_tail(child.stdout.take().ok_or("no stdout")?));
    let stderr = tokio::spawn(read_tail(child.stderr.take().ok_or("no stderr")?));
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for the command: {e}"))?;
    // The command has ended: its group need not be killed any more.
    std::mem::forget(guard);
    let stdout = stdout.await.unwrap_or_default();
    let stderr = stderr.await.unwrap_or_default();
    let duration_ms = started.elapsed().as_millis() as u64;
    let code = status.code();
    if status.success() {
        return Ok(Some(json!({
            "exit": 0,
            "duration_ms": duration_ms,
            "stdout": tail(&stdout, OUTPUT_TAIL_BYTES),
            "stderr": tail(&stderr, OUTPUT_TAIL_BYTES),
        })));
    }
    let how = match code {
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_string(),
    };
    let half = ERROR_BYTES_MAX / 2;
    Err(format!(
        "{how} after {duration_ms} ms\n--- stdout (end) ---\n{}\n--- stderr (end) ---\n{}",
        tail(&stdout, half),
        tail(&stderr, half)
    ))
}

/// Runs the worker until SIGTERM or Ctrl-C; how many tasks it finished.
pub async fn run(config: WorkerConfig) -> Result<u64, CliError> {
    if config.command.is_empty() {
        return Err(CliError::Usage(
            "give the command to run after --, e.g. rota worker --group g -- ./job.sh".into(),
        ));
    }
    if !(1..=CONCURRENCY_MAX).contains(&config.options.concurrency) {
        return Err(CliError::Usage(format!(
            "--concurrency: use 1 to {CONCURRENCY_MAX}"
        )));
    }
    let client = WorkerClient::new(&config.urls, config.client_id)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let client = Arc::new(client);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_stop_signal().await;
        let _ = stop.send(true);
    });
    let command = Arc::new(config.command);
    let finished = run_worker(client, config.options, stopped, move |lease| {
        run_command(Arc::clone(&command), lease)
    })
    .await;
    Ok(finished)
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::SignalKind;
    use tokio::signal::unix::signal;
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// `--lease` and `--grace` values must leave room for renewals.
pub fn check_lease(lease: Duration) -> Result<(), CliError> {
    if lease < Duration::from_secs(1) {
        return Err(CliError::Usage(
            "--lease: use at least 1s, so that renewals at a third of it can land".into(),
        ));
    }
    Ok(())
}
