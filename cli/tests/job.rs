//! `rota job ...` and `rota group ...` against a one-node local cluster: a job's whole
//! life through the binary, as an operator or a script would drive it.

mod common;
#[path = "common/dev_cluster.rs"]
mod dev_cluster;

use common::Run;
use common::rota;
use dev_cluster::DevCluster;
use serde_json::Value;

impl Run {
    /// Asserts exit 0; the output as JSON.
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "{}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    /// Asserts exit 0; standard output.
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "{}", self.stderr);
        &self.stdout
    }
}

fn id_of(task: &Value) -> String {
    task["id"].as_u64().expect("a task id").to_string()
}

/// `rota task claim` by `client` in `group`: the claimed task, or none.
async fn claim(cluster: &DevCluster, group: &str, client: &str) -> Option<Value> {
    let tasks = cluster
        .rota(&[
            "task",
            "claim",
            "--group",
            group,
            "--client-id",
            client,
            "--json",
        ])
        .await
        .json();
    tasks.as_array().expect("a list").first().cloned()
}

/// `rota job add --group GROUP --key KEY more...`, which must succeed.
async fn add(cluster: &DevCluster, group: &str, key: &str, more: &[&str]) {
    let mut args = vec!["job", "add", "--group", group, "--key", key];
    args.extend(more);
    cluster.rota(&args).await.ok();
}

/// `rota job fail` of `task` by `client` with `error`, then `more`; its output.
async fn fail(
    cluster: &DevCluster,
    task: &Value,
    client: &str,
    error: &str,
    more: &[&str],
) -> String {
    let id = id_of(task);
    let mut args = vec![
        "job", "fail", "--client", client, "--id", &id, "--error", error,
    ];
    args.extend(more);
    cluster.rota(&args).await.ok().to_string()
}

#[tokio::test]
async fn a_jobs_whole_life_through_the_cli() {
    let cluster = DevCluster::up().await;

    // Add a job and a dependant; the first node of --url is down, the write goes to the
    // next one (under one request id).
    let extract = cluster
        .rota(&[
            "job", "add", "--group", "etl", "--key", "extract", "--data", "src=a", "--json",
        ])
        .await;
    let extract = extract.json()[0].clone();
    assert_eq!(
        (&extract["key"], &extract["group"], &extract["data"]),
        (
            &Value::from("extract"),
            &Value::from("etl"),
            &Value::from("src=a")
        )
    );
    let load = rota(&[
        "job",
        "add",
        "--url",
        &format!("127.0.0.1:9,{}", cluster.url),
        "--group",
        "etl",
        "--key",
        "load",
        "--after",
        "extract",
        "--priority",
        "5",
    ])
    .await;
    let table = load.ok();
    assert!(
        table.starts_with("ID") && table.contains("KEY") && table.contains(" load "),
        "{table}"
    );

    // A live key is refused (exit 1, each reason printed); --on-conflict keep answers it.
    let again = cluster
        .rota(&["job", "add", "--group", "etl", "--key", "extract"])
        .await;
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(
        again.stderr.contains("refused by the cluster:\n  ") && again.stderr.contains("live task"),
        "{}",
        again.stderr
    );
    let kept = cluster
        .rota(&[
            "job",
            "add",
            "--group",
            "etl",
            "--key",
            "extract",
            "--on-conflict",
            "keep",
            "--json",
        ])
        .await;
    assert_eq!(kept.json()[0]["id"], extract["id"]);

    // load waits for extract despite its priority: the claim gets extract, attempt 1.
    let claimed = claim(&cluster, "etl", "7").await.expect("a task");
    assert_eq!(
        (&claimed["key"], &claimed["attempt"]),
        (&Value::from("extract"), &Value::from(1))
    );
    let finished = cluster
        .rota(&[
            "job",
            "finish",
            "--client",
            "7",
            "--id",
            &id_of(&claimed),
            "--result",
            r#"{"rows": 3}"#,
        ])
        .await;
    assert_eq!(
        finished.ok(),
        format!("finished task {}\n", id_of(&claimed))
    );
    let record = cluster
        .rota(&["job", "get", "--group", "etl", "--key", "extract", "--json"])
        .await
        .json();
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(record["result"], serde_json::json!({"rows": 3}));
    assert_eq!(record["history"][0]["outcome"], "succeeded");
    let shown = cluster
        .rota(&["job", "get", "--group", "etl", "--key", "extract"])
        .await;
    let shown = shown.ok();
    assert!(shown.contains("state:        succeeded\n"), "{shown}");
    assert!(shown.contains(r#"result:       {"rows":3}"#), "{shown}");
    assert!(
        shown.contains("1 7             "),
        "the attempt's owner: {shown}"
    );
    let by_id = cluster
        .rota(&["job", "get", "--id", &id_of(&extract), "--json"])
        .await
        .json();
    assert_eq!(by_id, record, "the id its add printed names the job");

    // Now load is claimable.
    let load = claim(&cluster, "etl", "7").await.expect("load");
    assert_eq!(load["key"], "load");
    let finished = cluster
        .rota(&["job", "finish", "--client", "7", "--id", &id_of(&load)])
        .await;
    finished.ok();

    // Pages: one job per page, then --all follows the cursors.
    let first = cluster
        .rota(&["job", "list", "--group", "etl", "--limit", "1", "--json"])
        .await
        .json();
    assert_eq!(first["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(first["next"], "extract");
    let page = cluster
        .rota(&["job", "list", "--group", "etl", "--limit", "1"])
        .await;
    assert!(page.ok().contains("--after \"extract\""), "{}", page.stdout);
    let all = cluster
        .rota(&[
            "job", "list", "--group", "etl", "--limit", "1", "--all", "--json",
        ])
        .await
        .json();
    let keys: Vec<&str> = all["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["key"].as_str())
        .collect();
    assert_eq!(
        (keys, &all["next"]),
        (vec!["extract", "load"], &Value::Null)
    );
    let succeeded = cluster
        .rota(&[
            "job",
            "list",
            "--group",
            "etl",
            "--state",
            "succeeded",
            "--json",
        ])
        .await
        .json();
    assert_eq!(succeeded["jobs"].as_array().map(Vec::len), Some(2));

    // The fail path: one attempt allowed, so the failure makes the job dead.
    let more = ["--data", "to=42", "--max-attempts", "1"];
    add(&cluster, "mail", "welcome", &more).await;
    let welcome = claim(&cluster, "mail", "8").await.expect("welcome");
    let failed = fail(&cluster, &welcome, "8", "smtp down", &[]).await;
    assert!(failed.contains("its job is dead"), "{failed}");
    let dead = cluster
        .rota(&["job", "dead", "--group", "mail", "--json"])
        .await
        .json();
    assert_eq!(dead["jobs"][0]["key"], "welcome", "{dead}");
    assert_eq!(dead["jobs"][0]["state"], "dead");
    assert_eq!(dead["jobs"][0]["data"], "to=42");
    assert_eq!(dead["jobs"][0]["history"][0]["error"], "smtp down");
    let table = cluster.rota(&["job", "dead", "--group", "mail"]).await;
    assert!(
        table.ok().contains("welcome") && table.stdout.contains("smtp down"),
        "{}",
        table.stdout
    );

    // Retry re-drives it; a retry of a job that is not dead is refused.
    let retried = cluster
        .rota(&["job", "retry", "--group", "mail", "welcome", "--json"])
        .await
        .json();
    assert_eq!(retried[0]["key"], "welcome", "{retried}");
    assert_eq!(retried[0]["data"], "to=42");
    let twice = cluster
        .rota(&["job", "retry", "--group", "mail", "welcome"])
        .await;
    assert_eq!(twice.code, 1, "{}", twice.stderr);
    assert!(twice.stderr.contains("only dead jobs"), "{}", twice.stderr);

    // Cancel it: the record says so, and who asked.
    cluster
        .rota(&[
            "job", "cancel", "--group", "mail", "--client", "3", "welcome",
        ])
        .await
        .ok();
    let record = cluster
        .rota(&[
            "job", "get", "--group", "mail", "--key", "welcome", "--json",
        ])
        .await
        .json();
    assert_eq!(record["state"], "cancelled", "{record}");
    assert_eq!(record["reason"], "cancelled by client 3");

    // With attempts left, a failure with --retry-in answers the retry.
    add(&cluster, "mail", "digest", &["--max-attempts", "2"]).await;
    let digest = claim(&cluster, "mail", "8").await.expect("digest");
    let failed = fail(&cluster, &digest, "8", "greylisted", &["--retry-in", "0s"]).await;
    assert!(
        failed.contains("its retry:") && failed.contains("digest"),
        "{failed}"
    );
    let record = cluster
        .rota(&["job", "get", "--group", "mail", "--key", "digest", "--json"])
        .await
        .json();
    assert_eq!(record["state"], "failed", "{record}");
    assert_eq!(record["history"][0]["error"], "greylisted");

    // --at puts the job in the future.
    let later = cluster
        .rota(&[
            "job", "add", "--group", "cal", "--key", "later", "--at", "+1h", "--json",
        ])
        .await
        .json();
    assert_eq!(claim(&cluster, "cal", "9").await, None);
    let record = cluster
        .rota(&["job", "get", "--group", "cal", "--key", "later", "--json"])
        .await
        .json();
    let wait = record["available_at"].as_i64().expect("available")
        - record["created_at"].as_i64().expect("created");
    assert!((3_590_000..=3_600_000).contains(&wait), "{record}");
    assert_eq!(later[0]["timespec"], record["available_at"]);

    // A paused group's claims answer empty; resumed, the job is claimed.
    add(&cluster, "ops", "nightly", &["--every", "24h"]).await;
    let paused = cluster.rota(&["group", "pause", "ops"]).await;
    assert!(
        paused.ok().contains("state:        paused"),
        "{}",
        paused.stdout
    );
    assert_eq!(claim(&cluster, "ops", "9").await, None);
    let settings = cluster
        .rota(&["group", "settings", "ops", "--json"])
        .await
        .json();
    assert_eq!(settings["paused"], true, "{settings}");
    cluster.rota(&["group", "resume", "ops"]).await.ok();
    let nightly = claim(&cluster, "ops", "9")
        .await
        .expect("claimed after resume");
    assert_eq!(nightly["key"], "nightly");

    // Settings: shown, then changed; a partial back-off keeps the other two values.
    let before = cluster
        .rota(&["group", "settings", "ops", "--json"])
        .await
        .json();
    assert_eq!(before["running"], 1, "{before}");
    let changed = cluster
        .rota(&[
            "group",
            "settings",
            "ops",
            "--max-running",
            "2",
            "--max-attempts",
            "4",
            "--backoff-factor",
            "3",
            "--retention",
            "1d",
            "--json",
        ])
        .await
        .json();
    assert_eq!(changed["max_running"], 2, "{changed}");
    assert_eq!(changed["max_attempts"], 4);
    assert_eq!(changed["retention_ms"], 86_400_000);
    assert_eq!(changed["backoff"]["factor"], 3.0);
    assert_eq!(changed["backoff"]["base_ms"], before["backoff"]["base_ms"]);
    assert_eq!(changed["backoff"]["max_ms"], before["backoff"]["max_ms"]);
    let shown = cluster.rota(&["group", "settings", "ops"]).await;
    let shown = shown.ok();
    for line in [
        "state:        active",
        "max running:  2",
        "max attempts: 4",
        "retention:    1d",
        "running:      1",
    ] {
        assert!(shown.contains(line), "{line}: {shown}");
    }
    let bad = cluster
        .rota(&[
            "group",
            "settings",
            "ops",
            "--backoff-base",
            "1m",
            "--backoff-max",
            "1s",
        ])
        .await;
    assert_eq!(bad.code, 2, "checked before sending: {}", bad.stderr);
    assert!(bad.stderr.contains("backoff.max_ms"), "{}", bad.stderr);

    // Unknown jobs are the node's 404 (exit 1); malformed commands are usage errors (2).
    let missing = cluster
        .rota(&["job", "get", "--group", "etl", "--key", "nope"])
        .await;
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("no job with key"),
        "{}",
        missing.stderr
    );
    for args in [
        &["job", "add", "--group", "g", "--after", "x"][..],
        &["job", "add", "--group", "g", "--key", "k", "--every", "60"],
        &[
            "job",
            "fail",
            "--client",
            "1",
            "--id",
            "1",
            "--error",
            "e",
            "--retry-in",
            "5",
        ],
        &[
            "job", "finish", "--client", "1", "--id", "1", "--result", "not json",
        ],
        &["job", "list", "--group", "g", "--state", "sleeping"],
        &["job", "list", "--group", "g", "--limit", "1001"],
        &["job", "add", "--group", "g", "--at", "tomorrow"],
        &["job", "get"],
        &["job", "get", "--group", "g"],
        &["job", "get", "--key", "k"],
        &["job", "get", "--id", "3", "--group", "g", "--key", "k"],
        &["job", "get", "--id", "x"],
    ] {
        let run = cluster.rota(args).await;
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
}

/// `rota bench --mode next`: after each worker's first claim, every cycle is an add and
/// one finish that claims the next task; the claim op is sent only to start.
#[tokio::test]
async fn bench_next_mode_finishes_with_next() {
    let cluster = DevCluster::up().await;
    let report = cluster
        .rota(&[
            "bench",
            "--mode",
            "next",
            "--workers",
            "2",
            "--max-cycles",
            "12",
            "--group",
            "bench-next",
        ])
        .await;
    let text = report.ok();
    let count = |op: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(op))
            .unwrap_or_else(|| panic!("no {op} line: {text}"));
        assert!(line.trim_end().ends_with(" 0"), "errors: {text}");
        line.split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count: {line}"))
    };
    let (claims, nexts) = (count("claim"), count("next"));
    assert!(
        (1..=2).contains(&claims),
        "one claim per worker to start: {text}"
    );
    assert_eq!(claims + nexts, 12, "{text}");
    assert!(
        text.contains(&format!("cycles with next: {nexts} in")),
        "{text}"
    );
}

#[tokio::test]
async fn bench_job_mode_runs_whole_job_cycles() {
    let cluster = DevCluster::up().await;
    let report = cluster
        .rota(&[
            "bench",
            "--mode",
            "job",
            "--workers",
            "2",
            "--max-cycles",
            "12",
            "--group",
            "bench-jobs",
        ])
        .await;
    let text = report.ok();
    assert!(text.contains("job cycles: 12 in"), "{text}");
    let finish_line = text
        .lines()
        .find(|l| l.starts_with("finish"))
        .unwrap_or_else(|| panic!("no finish line: {text}"));
    assert!(finish_line.trim_end().ends_with(" 0"), "errors: {text}");

    // Every cycle left a succeeded job record with the bench's result.
    let listed = cluster
        .rota(&[
            "job",
            "list",
            "--group",
            "bench-jobs",
            "--state",
            "succeeded",
            "--all",
            "--json",
        ])
        .await
        .json();
    let jobs = listed["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 12, "{listed}");
    assert!(jobs.iter().all(|j| j["result"]["ok"] == true), "{listed}");

    // In batches: five jobs added, claimed and finished (/finish/many) per request.
    let report = cluster
        .rota(&[
            "bench",
            "--mode",
            "job",
            "--workers",
            "1",
            "--max-cycles",
            "4",
            "--batch",
            "5",
            "--group",
            "bench-batch",
        ])
        .await;
    let text = report.ok();
    assert!(text.contains("job cycles: 4 in"), "{text}");
    let listed = cluster
        .rota(&[
            "job",
            "list",
            "--group",
            "bench-batch",
            "--state",
            "succeeded",
            "--all",
            "--json",
        ])
        .await
        .json();
    assert_eq!(
        listed["jobs"].as_array().map(Vec::len),
        Some(20),
        "{listed}"
    );
}

#[tokio::test]
async fn job_wait_returns_once_the_jobs_finish_and_fails_at_its_timeout() {
    let cluster = DevCluster::up().await;
    cluster
        .rota(&["job", "add", "--group", "w", "--key", "only", "--data", "x"])
        .await
        .ok();
    let early = cluster
        .rota(&["job", "wait", "--group", "w", "--timeout", "1s", "only"])
        .await;
    assert_eq!(early.code, 1, "{}", early.stderr);
    assert!(
        early.stderr.contains("not every job had finished"),
        "{}",
        early.stderr
    );

    let task = claim(&cluster, "w", "3").await.expect("the job");
    cluster
        .rota(&["job", "finish", "--client", "3", "--id", &id_of(&task)])
        .await
        .ok();
    let done = cluster
        .rota(&["job", "wait", "--group", "w", "only", "--json"])
        .await
        .json();
    assert_eq!(done["finished"], true, "{done}");
    assert_eq!(done["jobs"][0]["state"], "succeeded");

    // More keys than a URL holds go in a body: the job above and 400 never added.
    let mut args: Vec<String> = [
        "job",
        "wait",
        "--group",
        "w",
        "--timeout",
        "0s",
        "--json",
        "only",
    ]
    .map(String::from)
    .to_vec();
    let missing: Vec<String> = (0..400)
        .map(|n| format!("{n:04}{}", "k".repeat(200)))
        .collect();
    args.extend(missing.iter().cloned());
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let many = cluster.rota(&arg_refs).await;
    assert_eq!(many.code, 1, "{}", many.stderr);
    let answer: serde_json::Value = serde_json::from_str(&many.stdout).expect("JSON");
    assert_eq!(answer["jobs"][0]["key"], "only", "{answer}");
    assert_eq!(answer["missing"], serde_json::json!(missing));
}

#[tokio::test]
async fn bench_wake_and_idle_modes_measure_waiting() {
    let cluster = DevCluster::up().await;
    let wake = cluster
        .rota(&[
            "bench",
            "--mode",
            "wake",
            "--workers",
            "4",
            "--duration",
            "3",
            "--max-cycles",
            "20",
            "--group",
            "bench-wake",
        ])
        .await;
    let text = wake.ok();
    let sent = text
        .lines()
        .find(|l| l.starts_with("add sent->claimed"))
        .unwrap_or_else(|| panic!("no latency line: {text}"));
    let count: u64 = sent
        .split_whitespace()
        .nth(2)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no count: {sent}"));
    assert!(count > 0, "{text}");

    let idle = cluster
        .rota(&[
            "bench",
            "--mode",
            "idle",
            "--workers",
            "20",
            "--duration",
            "1",
            "--group",
            "bench-idle",
        ])
        .await;
    let text = idle.ok();
    assert!(text.contains("idle: 0 log entries"), "{text}");
}

#[tokio::test]
async fn job_claim_waits_for_a_job_and_shows_its_key_and_attempt() {
    let cluster = DevCluster::up().await;
    let url = cluster.url.clone();
    let waiting = tokio::spawn(async move {
        rota(&[
            "job",
            "claim",
            "--group",
            "later",
            "--client-id",
            "4",
            "--wait-ms",
            "20000",
            "--json",
            "--url",
            &url,
        ])
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    cluster
        .rota(&[
            "job", "add", "--group", "later", "--key", "k1", "--data", "x",
        ])
        .await
        .ok();
    let claimed = waiting.await.expect("joined").json();
    assert_eq!(claimed[0]["key"], "k1", "{claimed}");
    assert_eq!(claimed[0]["attempt"], 1);
    assert_eq!(claimed[0]["ownerid"], 4);
}
