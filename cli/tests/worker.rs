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
    std::process::Command::new(env!("CARGO_BIN_EXE_rota"))
        .arg("worker")
        .args(["--url", &dev.url])
        .args(args)
        .arg("--")
        .args(command)
        .env("ROTA_NODE_BIN", node_binary())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rota worker starts")
}

async fn job_state(dev: &DevCluster, group: &str, key: &str) -> Value {
    json(dev, &["job", "get", "--group", group, "--key", key]).await
}

fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait().expect("the worker exits")
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
        let mut stderr = String::new();
        if let Some(mut pipe) = worker.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        let jobs = rota(&["job", "list", "--group", "w", "--url", &url, "--json"]).await;
        panic!("{}\nworker: {stderr}\njobs: {}", waited.stderr, jobs.stdout);
    }
    let status = terminate(&mut worker);
    assert!(
        status.success(),
        "the worker stops cleanly on SIGTERM: {status}"
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
async fn a_cancel_kills_the_commands_process_group_within_a_renewal() {
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
    let mut worker = worker(
        &dev,
        &["--group", "c", "--lease", "3s"],
        &["sh", "-c", &script],
    );
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
    assert!(terminate(&mut worker).success());
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
    let long = job_state(&dev, "stop", "long").await;
    assert_eq!(long["state"], "waiting", "{long}");
    let last = &long["history"][long["history"].as_array().map_or(0, Vec::len) - 1];
    assert_eq!(last["outcome"], "released", "{long}");
    let claimed = json(&dev, &["task", "claim", "--group", "stop"]).await;
    assert_eq!(claimed.as_array().map(Vec::len), Some(1), "{claimed}");
}
