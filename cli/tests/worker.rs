//! `rota worker` against a local cluster (issue 14): commands run once per task with
//! the task on stdin and in the environment, outcomes recorded, a cancel kills the
//! command's process group, SIGTERM stops the worker cleanly.

mod common;
#[path = "common/dev_cluster.rs"]
mod dev_cluster;

use std::time::Duration;
use std::time::Instant;

use common::node_binary;
use common::rota;
use dev_cluster::DevCluster;
use serde_json::Value;

/// `rota ARGS --url URL --json`, parsed.
async fn json(dev: &DevCluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let run = dev.rota(&all).await;
    assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// `rota worker` in the background with `args` before `--` and `command` after.
fn worker(dev: &DevCluster, args: &[&str], command: &[&str]) -> std::process::Child {
    worker_command(dev, args, command)
        .spawn()
        .expect("rota worker starts")
}

/// The command line of [`worker`], to change before it starts.
fn worker_command(dev: &DevCluster, args: &[&str], command: &[&str]) -> std::process::Command {
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_rota"));
    worker
        .arg("worker")
        .args(["--url", &dev.url])
        .args(args)
        .arg("--")
        .args(command)
        .env("ROTA_NODE_BIN", node_binary())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    worker
}

/// A directory holding only links to `programs` (found on this PATH), for a PATH
/// without anything else: no `kill` program, as in a minimal container image.
fn path_of_only(dir: &std::path::Path, programs: &[&str]) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("a bin directory");
    for program in programs {
        let found = std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .map(|d| std::path::Path::new(d).join(program))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{program} is not on PATH"));
        std::os::unix::fs::symlink(found, bin.join(program)).expect("a link");
    }
    bin.to_str().expect("utf-8").to_string()
}

async fn job_state(dev: &DevCluster, group: &str, key: &str) -> Value {
    json(dev, &["job", "get", "--group", group, "--key", key]).await
}

fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    signal(child, "TERM");
    child.wait().expect("the worker exits")
}

fn signal(child: &std::process::Child, name: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status();
}

/// What an ended worker wrote to stderr.
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut text = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
    }
    text
}

#[tokio::test]
async fn a_worker_whose_command_cannot_start_stops_before_it_claims() {
    let dev = DevCluster::up().await;
    json(
        &dev,
        &[
            "job",
            "add",
            "--group",
            "w",
            "--key",
            "k",
            "--max-attempts",
            "1",
        ],
    )
    .await;
    let dir = tempfile::tempdir().expect("a directory");
    let not_runnable = dir.path().join("script.sh");
    std::fs::write(&not_runnable, "#!/bin/sh\ntrue\n").expect("a script");
    let not_runnable = not_runnable.to_str().expect("utf-8").to_string();
    for (command, says) in [
        (
            "no-such-program-rota-test",
            "no executable \"no-such-program-rota-test\" in PATH",
        ),
        (
            "/no/such/dir/program",
            "\"/no/such/dir/program\" is not an executable file",
        ),
        (not_runnable.as_str(), "is not an executable file"),
    ] {
        let mut worker = worker(&dev, &["--group", "w"], &[command]);
        let status = worker.wait().expect("the worker exits");
        let stderr = stderr_of(&mut worker);
        assert_eq!(status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains(says), "{command}: {stderr}");
    }
    // Nothing was claimed: the job is still waiting, its one attempt unspent.
    let job = job_state(&dev, "w", "k").await;
    assert_eq!(job["state"], "waiting", "{job}");
}

#[tokio::test]
async fn a_worker_runs_each_task_once_and_records_its_outcome() {
    let dev = DevCluster::up().await;
    for (key, data, extra) in [("k0", "a", ""), ("k1", "b", ""), ("k2", "c", "1")] {
        let mut args = vec!["job", "add", "--group", "w", "--key", key, "--data", data];
        if !extra.is_empty() {
            args.extend(["--max-attempts", extra]);
        }
        json(&dev, &args).await;
    }
    let script = r#"cat; echo " on $ROTA_GROUP/$ROTA_TASK_KEY attempt $ROTA_ATTEMPT"; echo oops >&2; [ "$(cat "$ROTA_FENCE_FILE")" = "$ROTA_TASK_ID" ] || echo "fence file: $(cat "$ROTA_FENCE_FILE")"; [ "$ROTA_TASK_KEY" != k2 ]"#;
    let mut worker = worker(
        &dev,
        &["--group", "w", "--concurrency", "2"],
        &["sh", "-c", script],
    );
    let url = dev.url.clone();
    let waited = rota(&[
        "job",
        "wait",
        "--group",
        "w",
        "--timeout",
        "60s",
        "--url",
        &url,
        "k0",
        "k1",
        "k2",
    ])
    .await;
    if waited.code != 0 {
        terminate(&mut worker);
        let stderr = stderr_of(&mut worker);
        let jobs = rota(&["job", "list", "--group", "w", "--url", &url, "--json"]).await;
        panic!("{}\nworker: {stderr}\njobs: {}", waited.stderr, jobs.stdout);
    }
    let status = terminate(&mut worker);
    assert!(
        status.success(),
        "the worker stops cleanly on SIGTERM: {status}"
    );
    // An operator reads of each failure in the worker's log.
    let log = stderr_of(&mut worker);
    assert!(
        log.contains(r#"(key "k2") failed: exit status 1 after"#),
        "{log}"
    );

    let k0 = job_state(&dev, "w", "k0").await;
    assert_eq!(k0["state"], "succeeded", "{k0}");
    assert_eq!(k0["result"]["exit"], 0);
    assert_eq!(k0["result"]["stdout"], "a on w/k0 attempt 1\n");
    assert_eq!(k0["result"]["stderr"], "oops\n");
    assert!(k0["result"]["duration_ms"].is_u64());
    let k2 = job_state(&dev, "w", "k2").await;
    assert_eq!(k2["state"], "dead", "{k2}");
    let error = k2["history"][0]["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("exit status 1 after"), "{error}");
    assert!(error.contains("c on w/k2 attempt 1"), "{error}");
}

#[tokio::test]
async fn a_cancel_kills_the_commands_process_group_within_a_renewal_without_a_kill_program() {
    let dev = DevCluster::up().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("pid");
    json(
        &dev,
        &["job", "add", "--group", "c", "--key", "long", "--data", "x"],
    )
    .await;
    let info_file = dir.path().join("info");
    let script = format!(
        "echo $ROTA_TASK_ID $ROTA_FENCE_FILE > {}; sleep 300 & echo $! > {}; wait",
        info_file.to_str().expect("utf-8"),
        pid_file.to_str().expect("utf-8")
    );
    // Without a `kill` program on its PATH: the worker signals the group itself.
    let mut worker = worker_command(
        &dev,
        &["--group", "c", "--lease", "3s"],
        &["sh", "-c", &script],
    )
    .env("PATH", path_of_only(dir.path(), &["sh", "sleep"]))
    .spawn()
    .expect("rota worker starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let sleeper = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    assert!(alive(sleeper));
    // The fence file follows the renewals (one every second with a 3 s lease).
    let info = std::fs::read_to_string(&info_file).expect("the command wrote its info");
    let (first_id, fence_path) = info.trim().split_once(' ').expect("id and path");
    let first_id: u64 = first_id.parse().expect("a task id");
    let fence = |path: &str| -> u64 {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while fence(fence_path) <= first_id {
        assert!(
            Instant::now() < deadline,
            "the fence file never moved past {first_id}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    json(&dev, &["job", "cancel", "--group", "c", "long"]).await;
    // The next renewal (a third of the 3 s lease) learns of the cancel.
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(sleeper) {
        assert!(
            Instant::now() < deadline,
            "the command's group outlived the cancel"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record = job_state(&dev, "c", "long").await;
    assert_eq!(record["state"], "cancelled", "{record}");
    assert!(
        !std::path::Path::new(fence_path).exists(),
        "the fence file goes with its command"
    );
    // Only its owner may enter the fence files' directory.
    let fence_dir = std::path::Path::new(fence_path)
        .parent()
        .expect("a directory");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(fence_dir)
            .expect("the directory lasts while the worker runs")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o700, "{}", fence_dir.display());
    assert!(terminate(&mut worker).success());
    let log = stderr_of(&mut worker);
    assert!(
        log.contains(r#"(key "long"): lease lost, its work stopped (renewal refused"#),
        "{log}"
    );
    assert!(!fence_dir.exists(), "the directory goes with the worker");
}

#[tokio::test]
async fn binary_output_still_finishes_and_a_stop_past_the_grace_gives_the_task_back() {
    let dev = DevCluster::up().await;
    let url = dev.url.clone();
    // Random bytes and NULs: invalid UTF-8 takes three bytes as text and a control
    // character six once JSON-escaped, so the raw 64 KiB of each stream would not fit
    // the result's limit.
    json(
        &dev,
        &[
            "job",
            "add",
            "--group",
            "bin",
            "--key",
            "noise",
            "--max-attempts",
            "1",
        ],
    )
    .await;
    let mut noisy = worker(
        &dev,
        &["--group", "bin"],
        &[
            "sh",
            "-c",
            "cat >/dev/null; head -c 200000 /dev/urandom; head -c 200000 /dev/zero >&2",
        ],
    );
    let waited = rota(&[
        "job",
        "wait",
        "--group",
        "bin",
        "--timeout",
        "60s",
        "--url",
        &url,
        "noise",
    ])
    .await;
    terminate(&mut noisy);
    let noise = job_state(&dev, "bin", "noise").await;
    assert_eq!(waited.code, 0, "{}: {noise}", waited.stderr);
    assert_eq!(noise["state"], "succeeded", "{noise}");
    assert!(
        noise["result"]["stdout"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );

    // On its only attempt: a stop must not make it dead, and it is claimable at once.
    json(
        &dev,
        &[
            "job",
            "add",
            "--group",
            "stop",
            "--key",
            "long",
            "--max-attempts",
            "1",
        ],
    )
    .await;
    let mut stopped = worker(
        &dev,
        &["--group", "stop", "--grace", "0s"],
        &["sh", "-c", "cat >/dev/null; exec sleep 120"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while job_state(&dev, "stop", "long").await["state"] != "running" {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = terminate(&mut stopped);
    assert!(status.success(), "{status}");
    let log = stderr_of(&mut stopped);
    assert!(log.contains(r#"(key "long") given back"#), "{log}");
    let long = job_state(&dev, "stop", "long").await;
    assert_eq!(long["state"], "waiting", "{long}");
    let last = &long["history"][long["history"].as_array().map_or(0, Vec::len) - 1];
    assert_eq!(last["outcome"], "released", "{long}");
    let claimed = json(&dev, &["task", "claim", "--group", "stop"]).await;
    assert_eq!(claimed.as_array().map(Vec::len), Some(1), "{claimed}");
}

#[tokio::test]
async fn a_process_left_holding_the_output_does_not_hold_the_task_and_a_second_stop_hurries() {
    let dev = DevCluster::up().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("pid");
    json(&dev, &["job", "add", "--group", "bg", "--key", "daemon"]).await;
    // The command ends at once, but the sleep it leaves behind holds stdout and stderr
    // open for five minutes.
    let script = format!(
        "cat >/dev/null; sleep 300 & echo $! > {}; echo started",
        pid_file.to_str().expect("utf-8")
    );
    let mut daemon = worker(&dev, &["--group", "bg"], &["sh", "-c", &script]);
    let waited = rota(&[
        "job",
        "wait",
        "--group",
        "bg",
        "--timeout",
        "30s",
        "--url",
        &dev.url,
        "daemon",
    ])
    .await;
    if let Some(pid) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    {
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
    }
    terminate(&mut daemon);
    assert_eq!(waited.code, 0, "{}", waited.stderr);
    let record = job_state(&dev, "bg", "daemon").await;
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(record["result"]["stdout"], "started\n", "{record}");

    // A minute's grace, cut short by a second SIGTERM.
    json(&dev, &["job", "add", "--group", "slow", "--key", "long"]).await;
    let mut slow = worker(
        &dev,
        &["--group", "slow", "--grace", "60s"],
        &["sh", "-c", "cat >/dev/null; exec sleep 120"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while job_state(&dev, "slow", "long").await["state"] != "running" {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal(&slow, "TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        slow.try_wait().expect("a status").is_none(),
        "the first SIGTERM leaves the command its grace"
    );
    let hurried = Instant::now();
    signal(&slow, "TERM");
    let status = slow.wait().expect("the worker exits");
    assert!(status.success(), "{status}");
    assert!(
        hurried.elapsed() < Duration::from_secs(30),
        "the second SIGTERM ended the grace: {:?}",
        hurried.elapsed()
    );
    let long = job_state(&dev, "slow", "long").await;
    assert_eq!(long["state"], "waiting", "given back: {long}");
}
