//! A small MapReduce run by `rota worker` (issue 14): word count over generated files.
//! Map tasks, then reduce tasks added with `after` the maps (one group, since `after`
//! names keys of its own group; the command does what the key says), worked by three
//! `rota worker --config` processes (which also work a second group, `ping`) on a three-node cluster while the leader is killed with
//! `kill -9` and one worker is killed mid-task. Every output is produced once (written
//! under a temporary name and renamed, so a task that runs twice writes the same file)
//! and the word counts are exactly right.

mod common;
#[path = "common/dev_cluster.rs"]
mod dev_cluster;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use common::node_binary;
use common::rota;
use dev_cluster::DevCluster;
use serde_json::Value;

const MAPS: usize = 8;
const REDUCES: usize = 2;
const WORDS: [&str; 12] = [
    "apple", "bridge", "cedar", "delta", "ember", "fjord", "nectar", "orbit", "prism", "quartz",
    "river", "sable",
];

/// Input file `i`: words picked by a fixed recurrence, so the counts are known.
fn input(i: usize) -> String {
    let mut x = (i as u64 + 1) * 2_654_435_761;
    let mut text = String::new();
    for n in 0..400 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        text.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
        text.push(if n % 10 == 9 { '\n' } else { ' ' });
    }
    text
}

/// Map: count the words of the file named on stdin into out/map-KEY, one "word count"
/// per line, written whole or not at all. Each start is logged with the worker's name.
const MAP: &str = r#"case "$ROTA_TASK_KEY" in reduce-*) exec sh -c "$REDUCE";; esac
f=$(cat)
echo "$ROTA_TASK_KEY $WORKER_NAME" >> "$OUT/started"
sleep 1
awk '{ for (i = 1; i <= NF; i++) c[$i]++ } END { for (w in c) print w, c[w] }' "$f" > "$OUT/map-$ROTA_TASK_KEY.tmp.$ROTA_TASK_ID"
mv "$OUT/map-$ROTA_TASK_KEY.tmp.$ROTA_TASK_ID" "$OUT/map-$ROTA_TASK_KEY""#;

/// Reduce partition r (stdin): words starting a-m go to 0, the rest to 1; sums the map
/// outputs into out/reduce-r.
const REDUCE: &str = r#"r=$(cat)
cat "$OUT"/map-map-* | awk -v r="$r" '{ p = (substr($1, 1, 1) < "n") ? 0 : 1; if (p == r) c[$1] += $2 } END { for (w in c) print w, c[w] }' > "$OUT/reduce-$r.tmp.$ROTA_TASK_ID"
mv "$OUT/reduce-$r.tmp.$ROTA_TASK_ID" "$OUT/reduce-$r""#;

/// `rota ARGS --json` against the cluster, parsed.
async fn json(dev: &DevCluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    let urls = dev.urls.join(",");
    all.extend(["--json", "--url", &urls]);
    let run = rota(&all).await;
    assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// A `rota worker --config` process named `name`, with `extra` arguments.
fn worker(config: &Path, out: &Path, name: &str, extra: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(["worker", "--config"])
        .arg(config)
        .args(extra)
        .env("OUT", out)
        .env("REDUCE", REDUCE)
        .env("WORKER_NAME", name)
        .env("ROTA_NODE_BIN", node_binary())
        .env_remove("ROTA_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("rota worker starts")
}

fn signal(child: &std::process::Child, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
}

/// The leader's node id, once there is one other than `not`.
async fn leader(dev: &DevCluster, not: Option<u64>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = json(dev, &["cluster", "status"]).await;
        if let Some(id) = status["cluster"]["leader"].as_u64()
            && Some(id) != not
        {
            return id;
        }
        assert!(Instant::now() < deadline, "no leader: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until some map started by `name` is logged; its key.
async fn started_by(out: &Path, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(out.join("started")).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.ends_with(&format!(" {name}"))) {
            return line.split(' ').next().unwrap_or_default().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "worker {name} never started a map: {log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How often each word occurs in `text`.
fn word_counts(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_string()).or_default() += 1;
    }
    counts
}

/// "word count" lines as a map; panics on a repeated word (an output counted twice).
fn counts(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let (word, n) = line.split_once(' ').expect("word count");
        let fresh = counts.insert(word.to_string(), n.parse().expect("a count"));
        assert!(fresh.is_none(), "{word} appears twice in one output");
    }
    counts
}

#[tokio::test]
async fn word_count_survives_a_leader_kill_and_a_worker_kill() {
    let dev = DevCluster::up_nodes(3).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("out dir");
    let mut all_text = String::new();
    for i in 0..MAPS {
        let text = input(i);
        all_text.push_str(&text);
        std::fs::write(dir.path().join(format!("in-{i}")), text).expect("input");
    }

    let config = dir.path().join("worker.toml");
    let urls: Vec<String> = dev.urls.iter().map(|u| format!("{u:?}")).collect();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let toml = format!(
        "url = [{}]\ngrace = \"5s\"\n\n[[group]]\nname = \"wc\"\nconcurrency = 2\nlease = \"6s\"\ncommand = [\"sh\", \"-c\", {MAP:?}]\n\n[[group]]\nname = \"ping\"\nlease = \"6s\"\ncommand = [\"true\"]\n",
        urls.join(", ")
    );
    std::fs::write(&config, toml).expect("config");

    let map_keys: Vec<String> = (0..MAPS).map(|i| format!("map-{i}")).collect();
    for (i, key) in map_keys.iter().enumerate() {
        let file = dir.path().join(format!("in-{i}"));
        let file = file.to_str().expect("utf-8");
        json(
            &dev,
            &[
                "job",
                "add",
                "--group",
                "wc",
                "--key",
                key,
                "--data",
                file,
                "--max-attempts",
                "5",
            ],
        )
        .await;
    }
    let after = map_keys.join(",");
    for r in 0..REDUCES {
        let key = format!("reduce-{r}");
        let data = r.to_string();
        json(
            &dev,
            &[
                "job",
                "add",
                "--group",
                "wc",
                "--key",
                &key,
                "--data",
                &data,
                "--after",
                &after,
                "--max-attempts",
                "5",
            ],
        )
        .await;
    }

    for n in 0..3 {
        let key = format!("ping-{n}");
        json(&dev, &["job", "add", "--group", "ping", "--key", &key]).await;
    }
    let mut doomed = worker(&config, &out, "doomed", &[]);
    // Only the doomed worker runs at first, so it surely holds a task when killed.
    let doomed_key = started_by(&out, "doomed").await;
    signal(&doomed, "-KILL");
    let _ = doomed.wait();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut workers = vec![
        worker(&config, &out, "w1", &["--metrics-addr", &metrics_addr]),
        worker(&config, &out, "w2", &[]),
    ];
    // Kill the leader once the surviving workers are under way.
    started_by(&out, "w1").await;
    let killed = leader(&dev, None).await;
    dev.kill_node(killed);
    // A new leader is elected among the two left.
    leader(&dev, Some(killed)).await;
    workers.push(worker(&config, &out, "w3", &[]));

    let urls = dev.urls.join(",");
    let waited = rota(&[
        "job",
        "wait",
        "--group",
        "wc",
        "--timeout",
        "120s",
        "--url",
        &urls,
        "reduce-0",
        "reduce-1",
    ])
    .await;
    let metrics = rota_metrics(metrics_port).await;
    for child in &workers {
        signal(child, "-TERM");
    }
    for child in &mut workers {
        let status = child.wait().expect("the worker exits");
        assert!(
            status.success(),
            "a worker stops cleanly on SIGTERM: {status}"
        );
    }
    assert_eq!(
        waited.code, 0,
        "the reduces ended: {}{}",
        waited.stdout, waited.stderr
    );

    // Every map and reduce succeeded exactly once; the doomed worker's map lost its
    // first attempt and ran again.
    for key in &map_keys {
        let job = json(&dev, &["job", "get", "--group", "wc", "--key", key]).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        let outcomes: Vec<&str> = job["history"]
            .as_array()
            .expect("a history")
            .iter()
            .filter_map(|h| h["outcome"].as_str())
            .collect();
        let successes = outcomes.iter().filter(|o| **o == "succeeded").count();
        assert_eq!(successes, 1, "{job}");
        if *key == doomed_key {
            assert_eq!(outcomes.first(), Some(&"lost"), "{job}");
        }
        let file = std::fs::read_to_string(out.join(format!("map-{key}"))).expect("map output");
        let want = word_counts(&input(key[4..].parse().expect("an index")));
        assert_eq!(counts(&file), want, "map {key}");
    }
    let mut total = BTreeMap::new();
    for r in 0..REDUCES {
        let job = json(
            &dev,
            &[
                "job",
                "get",
                "--group",
                "wc",
                "--key",
                &format!("reduce-{r}"),
            ],
        )
        .await;
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(job["history"].as_array().map(Vec::len), Some(1), "{job}");
        let text = std::fs::read_to_string(out.join(format!("reduce-{r}"))).expect("reduce output");
        for (word, n) in counts(&text) {
            assert!(
                total.insert(word.clone(), n).is_none(),
                "{word} in two partitions"
            );
        }
    }
    assert_eq!(total, word_counts(&all_text), "the word counts");
    // Nothing half-written is left behind: every output was renamed into place.
    let leftovers: Vec<String> = std::fs::read_dir(&out)
        .expect("out dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.contains(".tmp.") && !is_orphan_of(&doomed_key, name))
        .collect();
    assert!(leftovers.is_empty(), "half-written outputs: {leftovers:?}");

    assert!(
        metrics.contains("rota_worker_tasks_claimed_total{group=\"wc\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rota_worker_concurrency{group=\"wc\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rota_worker_concurrency{group=\"ping\"} 1"),
        "{metrics}"
    );
    // w1 was waiting on or renewing with the leader when it was killed.
    let node_retries = metrics
        .lines()
        .find_map(|l| l.strip_prefix("rota_worker_node_retries_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(node_retries.is_some_and(|n| n >= 1), "{metrics}");
}

/// The killed worker's command may still be writing its temporary file: it was an
/// orphan when its worker died, and finishes on its own.
fn is_orphan_of(doomed_key: &str, name: &str) -> bool {
    name.starts_with(&format!("map-{doomed_key}.tmp."))
}

/// The metrics page of the worker on `port`.
async fn rota_metrics(port: u16) -> String {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the metrics port answers");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request sent");
    let mut page = String::new();
    stream.read_to_string(&mut page).await.expect("page read");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    page
}
