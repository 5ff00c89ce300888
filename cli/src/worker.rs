//! `rota worker --group G [--concurrency N] [--lease 30s] -- CMD ARGS...`, or
//! `rota worker --config worker.toml` for several groups each with its own command and
//! concurrency (issue 14): claims tasks with a wait, runs CMD once per task in its own
//! process group with the task's data on stdin and `ROTA_TASK_ID`, `ROTA_TASK_KEY`,
//! `ROTA_ATTEMPT`, `ROTA_GROUP` and `ROTA_FENCE_FILE` (a file that always holds the
//! current fence, rewritten at each renewal) in its environment, keeps the lease renewed
//! (`rpc::lease`), kills the process group when the lease is lost or the task
//! cancelled, and finishes the task on exit 0 (result: exit status, duration, the last
//! 64 KiB of stdout and stderr) or fails it otherwise (the same, as the error). On
//! SIGTERM or Ctrl-C it stops claiming, lets running commands go on for the grace
//! period (a second signal ends it), then kills them and gives their tasks back so they
//! run elsewhere. It logs what went wrong to stderr (docs/worker.md). With
//! `--metrics-addr` it serves Prometheus metrics.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use rpc::lease::EventHook;
use rpc::lease::Lease;
use rpc::lease::WorkerOptions;
use rpc::lease::WorkerStats;
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

/// The most one stream's end may take in a failure's error: half the job layer's
/// limit, less room for the exit status line.
const ERROR_TAIL_BYTES_MAX: usize = (rpc::job::JOB_ERROR_BYTES_MAX - 256) / 2;

/// The most one stream's end may take in a success's result as compact JSON: half the
/// job layer's limit, less room for the other fields. Control characters take up to six
/// bytes there, so binary output is cut to fit this rather than [`OUTPUT_TAIL_BYTES`].
const RESULT_TAIL_JSON_MAX: usize = (rpc::job::JOB_RESULT_BYTES_MAX - 256) / 2;

/// Most groups one worker works.
pub const GROUPS_MAX: usize = 64;

/// Largest `--config` file read.
const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// What `rota worker` runs and how.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Node addresses.
    pub urls: Vec<String>,
    /// The client id the worker claims as.
    pub client_id: i64,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The groups worked, each with its options and command.
    pub groups: Vec<GroupWork>,
}

/// One group a worker works: how, and the command it runs per task.
#[derive(Clone, Debug)]
pub struct GroupWork {
    /// Group, concurrency, lease, wait and grace.
    pub options: WorkerOptions,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// The `--config` file: nodes and defaults at the top, one `[[group]]` table per group.
///
/// ```toml
/// url = ["127.0.0.1:7001", "127.0.0.1:7002"]   # or --url / ROTA_URL
/// grace = "10s"
/// metrics_addr = "127.0.0.1:9464"
///
/// [[group]]
/// name = "thumbs"
/// concurrency = 4
/// lease = "30s"
/// command = ["./thumbnail.sh"]
/// ```
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Node addresses (`--url` wins when both are given).
    #[serde(default)]
    pub url: Vec<String>,
    /// The client id to claim as.
    pub client_id: Option<i64>,
    /// Grace after SIGTERM, for every group without its own (`10s` when absent).
    pub grace: Option<String>,
    /// Where to serve Prometheus metrics (`--metrics-addr` wins).
    pub metrics_addr: Option<String>,
    /// The groups.
    #[serde(default)]
    pub group: Vec<GroupFile>,
}

/// One `[[group]]` of the `--config` file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupFile {
    /// The group to take tasks from.
    pub name: String,
    /// Commands of this group run at once (default 1).
    pub concurrency: Option<usize>,
    /// Each claim's lease (default `30s`).
    pub lease: Option<String>,
    /// This group's grace after SIGTERM.
    pub grace: Option<String>,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// A duration setting of the config file (`30s`, `2m`, `500ms`).
fn config_duration(
    what: &str,
    text: Option<&str>,
    default: Duration,
) -> Result<Duration, CliError> {
    match text {
        None => Ok(default),
        Some(text) => crate::job::parse_duration(text)
            .map(|ms| Duration::from_millis(ms.max(0) as u64))
            .map_err(|e| CliError::Usage(format!("{what}: {e}"))),
    }
}

impl ConfigFile {
    /// Reads and parses the file at `path`.
    pub fn read(path: &std::path::Path) -> Result<Self, CliError> {
        let file = std::fs::File::open(path)
            .map_err(|e| CliError::Usage(format!("--config {}: {e}", path.display())))?;
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(file, CONFIG_BYTES_MAX + 1),
            &mut text,
        )
        .map_err(|e| CliError::Usage(format!("--config {}: {e}", path.display())))?;
        if text.len() as u64 > CONFIG_BYTES_MAX {
            return Err(CliError::Usage(format!(
                "--config {}: larger than {CONFIG_BYTES_MAX} bytes",
                path.display()
            )));
        }
        Self::parse(&text).map_err(|e| match e {
            CliError::Usage(m) => CliError::Usage(format!("--config {}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Self, CliError> {
        toml::from_str(text).map_err(|e| CliError::Usage(e.to_string()))
    }

    /// The groups to work, checked; `wait` is each claim's wait.
    pub fn groups(&self, wait: Duration) -> Result<Vec<GroupWork>, CliError> {
        let default_grace =
            config_duration("grace", self.grace.as_deref(), Duration::from_secs(10))?;
        let mut groups = Vec::with_capacity(self.group.len());
        for group in &self.group {
            let what = |field: &str| format!("group {:?}: {field}", group.name);
            let options = WorkerOptions {
                concurrency: group.concurrency.unwrap_or(1),
                lease: config_duration(
                    &what("lease"),
                    group.lease.as_deref(),
                    Duration::from_secs(30),
                )?,
                grace: config_duration(&what("grace"), group.grace.as_deref(), default_grace)?,
                wait,
                ..WorkerOptions::new(group.name.clone())
            };
            groups.push(GroupWork {
                options,
                command: group.command.clone(),
            });
        }
        Ok(groups)
    }
}

/// Checks what a worker is asked to run before it claims anything.
pub fn check_groups(groups: &[GroupWork]) -> Result<(), CliError> {
    if groups.is_empty() {
        return Err(CliError::Usage(
            "no group to work: give --group G -- CMD, or a --config file with [[group]] tables"
                .into(),
        ));
    }
    if groups.len() > GROUPS_MAX {
        return Err(CliError::Usage(format!(
            "{} groups: one worker works at most {GROUPS_MAX}",
            groups.len()
        )));
    }
    let mut total = 0;
    let mut names = std::collections::BTreeSet::new();
    for group in groups {
        let name = &group.options.group;
        if name.is_empty() {
            return Err(CliError::Usage("a group needs a name".into()));
        }
        if !names.insert(name.as_str()) {
            return Err(CliError::Usage(format!(
                "group {name:?} is given twice; give it one command and one concurrency"
            )));
        }
        if group.command.is_empty() || group.command[0].is_empty() {
            return Err(CliError::Usage(format!(
                "group {name:?}: give the command to run (after --, or command = [...] in the config)"
            )));
        }
        if !(1..=CONCURRENCY_MAX).contains(&group.options.concurrency) {
            return Err(CliError::Usage(format!(
                "group {name:?}: concurrency {}: use 1 to {CONCURRENCY_MAX}",
                group.options.concurrency
            )));
        }
        check_lease(group.options.lease)?;
        total += group.options.concurrency;
    }
    if total > CONCURRENCY_MAX {
        return Err(CliError::Usage(format!(
            "the groups' concurrency adds up to {total}: one worker runs at most {CONCURRENCY_MAX} commands"
        )));
    }
    Ok(())
}

/// The end of `bytes` as text (bytes that are not UTF-8 become U+FFFD): its last
/// [`OUTPUT_TAIL_BYTES`] at most, then cut at a character boundary to at most
/// `max_text` bytes of text and `max_json` bytes as a JSON string, so that an outcome
/// made of it always fits the job layer's limits, whatever the command wrote.
fn tail(bytes: &[u8], max_text: usize, max_json: usize) -> String {
    let mut start = bytes.len().saturating_sub(OUTPUT_TAIL_BYTES);
    // Not inside a character: a UTF-8 character continues for at most three bytes.
    for _ in 0..3 {
        if bytes.get(start).is_some_and(|b| b & 0xc0 == 0x80) {
            start += 1;
        }
    }
    let text = String::from_utf8_lossy(&bytes[start..]);
    let (mut text_len, mut json_len) = (0, 0);
    let mut cut = text.len();
    for (at, c) in text.char_indices().rev() {
        text_len += c.len_utf8();
        json_len += json_escaped_len(c);
        if text_len > max_text || json_len > max_json {
            break;
        }
        cut = at;
    }
    text[cut..].to_string()
}

/// Bytes `c` takes inside a JSON string as serde_json writes it.
fn json_escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// How long a command's output pipes are read after it exits: a process it left
/// behind may hold them open for ever, and must not keep its task from finishing.
const PIPES_READ_AFTER_EXIT: Duration = Duration::from_secs(1);

/// The end of an output stream as read so far, shared with the task reading it.
type Kept = Arc<std::sync::Mutex<Vec<u8>>>;

/// Reads a stream to its end into `kept`, keeping only its last [`OUTPUT_TAIL_BYTES`].
async fn read_tail(mut stream: impl tokio::io::AsyncRead + Unpin, kept: Kept) {
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                kept.extend_from_slice(&buffer[..n]);
                if kept.len() > 2 * OUTPUT_TAIL_BYTES {
                    let cut = kept.len() - OUTPUT_TAIL_BYTES;
                    kept.drain(..cut);
                }
            }
        }
    }
}

/// Reads `stream` in the background; what it read so far, and the reader.
fn spawn_reader(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> (Kept, tokio::task::JoinHandle<()>) {
    let kept = Kept::default();
    let reader = tokio::spawn(read_tail(stream, Arc::clone(&kept)));
    (kept, reader)
}

/// Waits for both readers to reach the end of their streams, for at most `within`,
/// then stops them (closing the pipes) and takes what they read.
async fn collect_output(
    readers: [(Kept, tokio::task::JoinHandle<()>); 2],
    within: Duration,
) -> [Vec<u8>; 2] {
    let [(out, mut out_reader), (err, mut err_reader)] = readers;
    let _ = tokio::time::timeout(within, async {
        let _ = (&mut out_reader).await;
        let _ = (&mut err_reader).await;
    })
    .await;
    out_reader.abort();
    err_reader.abort();
    let take = |kept: &Kept| std::mem::take(&mut *kept.lock().unwrap_or_else(|p| p.into_inner()));
    [take(&out), take(&err)]
}

/// Kills process group `pgid` (the command and everything it started).
fn kill_group(pgid: u32) {
    if let Err(e) = crate::dev::send_signal(pgid, true, rustix::process::Signal::KILL) {
        eprintln!("rota worker: cannot kill process group {pgid}: {e}");
    }
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

/// Writes `fence` to `path` whole (a reader never sees half a number).
fn write_fence(path: &std::path::Path, fence: u64) {
    let partial = path.with_extension("partial");
    if std::fs::write(&partial, format!("{fence}\n")).is_ok() {
        let _ = std::fs::rename(&partial, path);
    }
}

/// Keeps `path` holding the lease's current fence until dropped, then removes it.
struct FenceFile {
    path: std::path::PathBuf,
    follower: tokio::task::JoinHandle<()>,
}

impl FenceFile {
    fn follow(dir: &std::path::Path, lease: &Lease) -> Self {
        let mut fences = lease.fences();
        let path = dir.join(format!("fence-{}", *fences.borrow()));
        write_fence(&path, *fences.borrow_and_update());
        let followed = path.clone();
        let follower = tokio::spawn(async move {
            while fences.changed().await.is_ok() {
                let fence = *fences.borrow_and_update();
                write_fence(&followed, fence);
            }
        });
        Self { path, follower }
    }
}

impl Drop for FenceFile {
    fn drop(&mut self) {
        self.follower.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs the command for one task; the result to finish with, or the error to fail with.
async fn run_command(
    command: Arc<Vec<String>>,
    fence_dir: Arc<std::path::PathBuf>,
    lease: Arc<Lease>,
) -> Result<Option<serde_json::Value>, String> {
    let task = lease.task();
    let started = Instant::now();
    let fence_file = FenceFile::follow(&fence_dir, &lease);
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("ROTA_TASK_ID", task.id.to_string())
        .env("ROTA_FENCE_FILE", &fence_file.path)
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
    let stdin = child.stdin.take().map(|mut stdin| {
        let data = task.data.clone();
        tokio::spawn(async move {
            let _ = stdin.write_all(data.as_bytes()).await;
        })
    });
    let stdout = spawn_reader(child.stdout.take().ok_or("no stdout")?);
    let stderr = spawn_reader(child.stderr.take().ok_or("no stderr")?);
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for the command: {e}"))?;
    // The command has ended: its group need not be killed any more.
    std::mem::forget(guard);
    let duration_ms = started.elapsed().as_millis() as u64;
    let [stdout, stderr] = collect_output([stdout, stderr], PIPES_READ_AFTER_EXIT).await;
    // A process left behind may hold stdin open without reading it.
    if let Some(stdin) = stdin {
        stdin.abort();
    }
    let code = status.code();
    if status.success() {
        return Ok(Some(json!({
            "exit": 0,
            "duration_ms": duration_ms,
            "stdout": tail(&stdout, OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX),
            "stderr": tail(&stderr, OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX),
        })));
    }
    let how = match (code, status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "killed by a signal".to_string(),
    };
    Err(format!(
        "{how} after {duration_ms} ms\n--- stdout (end) ---\n{}\n--- stderr (end) ---\n{}",
        tail(&stdout, ERROR_TAIL_BYTES_MAX, usize::MAX),
        tail(&stderr, ERROR_TAIL_BYTES_MAX, usize::MAX)
    ))
}

/// Whether `program` names a file the worker can run, found as the spawn finds it: a
/// path (with a `/`) as given, a bare name in `PATH`. A command that cannot start fails
/// every task it is given, and a worker that claimed them anyway would spend each
/// job's attempts and leave the whole queue dead.
pub fn check_program(program: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |path: &std::path::Path| {
        std::fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return if runnable(std::path::Path::new(program)) {
            Ok(())
        } else {
            Err(format!(
                "{program:?} is not an executable file (from {}); fix the path or its mode",
                std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|_| "this directory".into())
            ))
        };
    }
    // Without PATH, the spawn (execvp) looks in the C library's default path.
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    if std::env::split_paths(&path).any(|dir| runnable(&dir.join(program))) {
        return Ok(());
    }
    Err(format!(
        "no executable {program:?} in PATH; install it, or give its path"
    ))
}

/// Runs the worker until SIGTERM or Ctrl-C; how many tasks it finished.
pub async fn run(config: WorkerConfig) -> Result<u64, CliError> {
    check_groups(&config.groups)?;
    for group in &config.groups {
        check_program(&group.command[0])
            .map_err(|e| CliError::Usage(format!("group {:?}: {e}", group.options.group)))?;
    }
    let client = WorkerClient::new(&config.urls, config.client_id)
        .and_then(|c| c.with_token(crate::token()))
        .map(|c| c.with_tls(crate::tls()))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let client = Arc::new(client);
    if let Some(addr) = config.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| CliError::Failed(format!("--metrics-addr {addr}: {e}")))?;
        let groups: Vec<(String, Arc<WorkerStats>, usize)> = config
            .groups
            .iter()
            .map(|g| {
                let o = &g.options;
                (o.group.clone(), Arc::clone(&o.stats), o.concurrency)
            })
            .collect();
        tokio::spawn(crate::worker_metrics::serve(
            listener,
            groups,
            Arc::clone(&client),
        ));
    }
    // Each running command's fence file lives here, gone when the worker stops.
    // A new directory under a random name that only this user can enter: one another
    // user could guess and create first would let them read or replace the fence
    // files. Removed when the worker ends.
    let fence_tmp = tempfile::Builder::new()
        .prefix("rota-worker-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map_err(|e| {
            CliError::Failed(format!(
                "creating a directory for fence files in {}: {e} (set TMPDIR to a writable directory)",
                std::env::temp_dir().display()
            ))
        })?;
    let fence_dir = Arc::new(fence_tmp.path().to_path_buf());
    let grace = config.groups.iter().map(|g| g.options.grace).max();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(stop_on_signals(stop, grace.unwrap_or_default()));
    let workers: Vec<_> = config
        .groups
        .into_iter()
        .map(|group| {
            let command = Arc::new(group.command);
            let fence_dir = Arc::clone(&fence_dir);
            let options = WorkerOptions {
                events: EventHook::new(|group, event| {
                    eprintln!("rota worker: group {group:?}: {event}");
                }),
                ..group.options
            };
            tokio::spawn(run_worker(
                Arc::clone(&client),
                options,
                stopped.clone(),
                move |lease| run_command(Arc::clone(&command), Arc::clone(&fence_dir), lease),
            ))
        })
        .collect();
    let mut finished = 0;
    for worker in workers {
        finished += worker.await.unwrap_or(0);
    }
    drop(fence_tmp);
    Ok(finished)
}

/// Sends on `stop` at the first SIGTERM or Ctrl-C (no new claims; running commands get
/// their grace) and again at the second (their grace ends at once).
async fn stop_on_signals(stop: tokio::sync::watch::Sender<bool>, grace: Duration) {
    use tokio::signal::unix::SignalKind;
    use tokio::signal::unix::signal;
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("rota worker: cannot catch SIGTERM or Ctrl-C: they will kill it at once");
        return std::future::pending().await;
    };
    for nth in 0.. {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        if nth == 0 {
            eprintln!(
                "rota worker: stopping: no new claims; running commands have up to {grace:?} to end, then their tasks are given back (again to give them back now)"
            );
        } else {
            eprintln!("rota worker: stopping now: running commands' tasks are given back");
        }
        let _ = stop.send(true);
    }
}

/// `--lease` must leave room for renewals and be a claim some node can grant; one over
/// what nodes grant by default gets a warning, since every claim would be refused
/// unless the cluster was configured for it.
pub fn check_lease(lease: Duration) -> Result<(), CliError> {
    if lease < Duration::from_secs(1) {
        return Err(CliError::Usage(
            "--lease: use at least 1s, so that renewals at a third of it can land".into(),
        ));
    }
    if lease.as_millis() > rpc::worker::CLAIM_DURATION_MS_MAX as u128 {
        return Err(CliError::Usage(format!(
            "--lease: use at most {}ms (a year), the longest claim any node grants",
            rpc::worker::CLAIM_DURATION_MS_MAX
        )));
    }
    if lease.as_millis() > rpc::worker::CLAIM_DURATION_MAX_MS_DEFAULT as u128 {
        eprintln!(
            "rota worker: warning: a lease of {}s is longer than the 24h nodes grant unless started with a longer --claim-duration-max-ms; if claims are refused, use a shorter --lease (renewals keep long commands running)",
            lease.as_secs()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value, over and over: control characters, quotes, invalid UTF-8.
    fn binary(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 256) as u8).collect()
    }

    #[test]
    fn any_output_makes_a_result_and_an_error_within_the_job_layers_limits() {
        for output in [binary(200_000), vec![0u8; 200_000], vec![0xff; 200_000]] {
            let result = json!({
                "exit": 0,
                "duration_ms": u64::MAX,
                "stdout": tail(&output, OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX),
                "stderr": tail(&output, OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX),
            });
            rpc::job::result_text(&result).expect("the result fits");
            let error = format!(
                "killed by signal 9 after {} ms\n--- stdout (end) ---\n{}\n--- stderr (end) ---\n{}",
                u64::MAX,
                tail(&output, ERROR_TAIL_BYTES_MAX, usize::MAX),
                tail(&output, ERROR_TAIL_BYTES_MAX, usize::MAX)
            );
            assert!(
                error.len() <= rpc::job::JOB_ERROR_BYTES_MAX,
                "{}",
                error.len()
            );
        }
    }

    #[test]
    fn text_output_keeps_its_last_64_kib_cut_at_a_character() {
        let text = "é".repeat(40_000) + "end";
        let kept = tail(text.as_bytes(), OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX);
        assert!(kept.ends_with("end"));
        assert!(kept.len() <= OUTPUT_TAIL_BYTES && kept.len() > OUTPUT_TAIL_BYTES - 4);
        assert!(!kept.contains('\u{fffd}'), "cut inside a character");
        let ascii = "x".repeat(100_000);
        assert_eq!(
            tail(ascii.as_bytes(), OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX).len(),
            OUTPUT_TAIL_BYTES
        );
        let short = tail(b"line\n", OUTPUT_TAIL_BYTES, RESULT_TAIL_JSON_MAX);
        assert_eq!(short, "line\n");
    }

    #[test]
    fn json_escape_lengths_match_serde_json() {
        for c in (0u32..0x100)
            .filter_map(char::from_u32)
            .chain(['é', '€', '😀'])
        {
            let encoded = serde_json::to_string(&c.to_string()).expect("a string encodes");
            assert_eq!(json_escaped_len(c), encoded.len() - 2, "{c:?}");
        }
    }

    const EXAMPLE: &str = r#"
url = ["127.0.0.1:7001"]
grace = "20s"
metrics_addr = "127.0.0.1:9464"

[[group]]
name = "map"
concurrency = 4
lease = "2m"
command = ["./map.sh", "--fast"]

[[group]]
name = "reduce"
command = ["./reduce.sh"]
grace = "1s"
"#;

    #[test]
    fn a_config_file_gives_each_group_its_command_and_limits() {
        let file = ConfigFile::parse(EXAMPLE).expect("parses");
        assert_eq!(file.url, ["127.0.0.1:7001"]);
        assert_eq!(file.metrics_addr.as_deref(), Some("127.0.0.1:9464"));
        let groups = file.groups(Duration::from_secs(20)).expect("valid");
        check_groups(&groups).expect("valid");
        assert_eq!(groups[0].options.group, "map");
        assert_eq!(groups[0].options.concurrency, 4);
        assert_eq!(groups[0].options.lease, Duration::from_secs(120));
        assert_eq!(groups[0].options.grace, Duration::from_secs(20));
        assert_eq!(groups[0].command, ["./map.sh", "--fast"]);
        assert_eq!(groups[1].options.concurrency, 1);
        assert_eq!(groups[1].options.lease, Duration::from_secs(30));
        assert_eq!(groups[1].options.grace, Duration::from_secs(1));
    }

    #[test]
    fn bad_configs_are_refused_with_what_to_fix() {
        let unknown =
            ConfigFile::parse("[[group]]\nname = \"a\"\ncommand = [\"x\"]\nthreads = 2\n");
        assert!(matches!(unknown, Err(CliError::Usage(m)) if m.contains("threads")));
        let refused = |text: &str, needle: &str| {
            let file = ConfigFile::parse(text).expect("parses");
            let checked = file
                .groups(Duration::from_secs(20))
                .and_then(|g| check_groups(&g));
            match checked {
                Err(CliError::Usage(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("{text}: {other:?}"),
            }
        };
        refused("", "no group");
        refused("[[group]]\nname = \"a\"\ncommand = []\n", "command");
        refused(
            "[[group]]\nname = \"a\"\ncommand = [\"x\"]\n[[group]]\nname = \"a\"\ncommand = [\"y\"]\n",
            "twice",
        );
        refused(
            "[[group]]\nname = \"a\"\ncommand = [\"x\"]\nconcurrency = 0\n",
            "concurrency 0",
        );
        refused(
            "[[group]]\nname = \"a\"\ncommand = [\"x\"]\nconcurrency = 1000\n[[group]]\nname = \"b\"\ncommand = [\"x\"]\nconcurrency = 100\n",
            "adds up to 1100",
        );
        refused(
            "[[group]]\nname = \"a\"\ncommand = [\"x\"]\nlease = \"10ms\"\n",
            "at least 1s",
        );
        refused(
            "[[group]]\nname = \"a\"\ncommand = [\"x\"]\nlease = \"soon\"\n",
            "lease",
        );
        refused(
            "[[group]]\nname = \"a\"\ncommand = [\"x\"]\nlease = \"400d\"\n",
            "at most",
        );
    }
}
