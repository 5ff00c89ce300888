//! Watches through real nodes (issue 13): a group's changes from any node, in log order,
//! long-polled or streamed, once each across a leader change; clear 400s.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;
use std::time::Instant;

use common::TestCluster;
use hyper::Method;
use rpc::watch::WatchEventJson;
use rpc::watch::WatchPageJson;
use rpc::worker::AddJson;
use rpc::worker::UpdateRequestJson;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

async fn get(cluster: &TestCluster, via: u64, path: &str) -> (u16, Value) {
    let response = cluster
        .client
        .send(
            cluster.api(via),
            Method::GET,
            path,
            &[],
            Vec::new().into(),
            Duration::from_secs(70),
        )
        .await
        .expect("the node answered");
    let json = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status.as_u16(), json)
}

async fn watch(cluster: &TestCluster, via: u64, query: &str) -> WatchPageJson {
    let (status, json) = get(cluster, via, &format!("/watch?{query}")).await;
    assert_eq!(status, 200, "{json}");
    serde_json::from_value(json).expect("a watch page")
}

async fn add(cluster: &TestCluster, via: u64, group: &str, data: &str) -> Result<u64, String> {
    let mut request = UpdateRequestJson::by(1).with_add(AddJson::in_group(group).with_data(data));
    request.requestid = Some(format!("add-{data}"));
    match cluster.write(via, "/update", &request).await? {
        rpc::worker::WriteResultJson::Tasks { tasks } => Ok(tasks[0].id),
        rpc::worker::WriteResultJson::Errors { errors } => Err(errors.join("; ")),
    }
}

fn added_data(changes: &[WatchEventJson]) -> Vec<String> {
    changes
        .iter()
        .filter_map(|c| match c {
            WatchEventJson::Task { task, .. } => Some(task.data.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_follower_serves_a_groups_changes_in_order_and_wakes_a_long_poll() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    add(&cluster, leader, "w", "first").await.expect("added");
    add(&cluster, leader, "other", "elsewhere")
        .await
        .expect("added");
    add(&cluster, follower, "w", "second").await.expect("added");

    // From the start: the follower waits until it applied them, then answers in order.
    let mut seen = Vec::new();
    let mut after = 0;
    while seen.len() < 2 {
        let page = watch(
            &cluster,
            follower,
            &format!("group=w&after={after}&wait_ms=5000"),
        )
        .await;
        assert_eq!((page.node, page.group.as_str()), (follower, "w"));
        assert!(page.changes.iter().all(|c| c.revision() > after));
        assert!(page.revision >= after);
        seen.extend(added_data(&page.changes));
        after = page.revision;
    }
    assert_eq!(seen, vec!["first", "second"]);

    // A long poll from the current revision is answered by the next change, not by
    // its deadline.
    let waiting = {
        let api = cluster.api(follower).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let response = client
                .send(
                    &api,
                    Method::GET,
                    &format!("/watch?group=w&after={after}&wait_ms=30000"),
                    &[],
                    Vec::new().into(),
                    Duration::from_secs(40),
                )
                .await
                .expect("answered");
            let page: WatchPageJson = serde_json::from_slice(&response.body).expect("a page");
            (page, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    add(&cluster, leader, "w", "third").await.expect("added");
    let (page, waited) = waiting.await.expect("the watch ended");
    assert_eq!(added_data(&page.changes), vec!["third"]);
    assert!(
        waited < Duration::from_secs(30),
        "woken by the add, not the deadline"
    );

    // Nothing new: an empty page at the deadline, with the revision to ask from.
    let idle = watch(
        &cluster,
        follower,
        &format!("group=w&after={}&wait_ms=100", page.revision),
    )
    .await;
    assert!(idle.changes.is_empty());
    assert!(idle.revision >= page.revision);
}

#[tokio::test]
async fn bad_watch_input_is_a_400_that_names_the_field() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    for (query, field) in [
        ("after=1", "group"),
        ("group=g&wait_ms=60001", "wait_ms"),
        ("group=g&wait_ms=soon", "wait_ms"),
        ("group=g&after=-1", "after"),
        ("group=g&limit=10001", "limit"),
    ] {
        let (status, json) = get(&cluster, 1, &format!("/watch?{query}")).await;
        assert_eq!(status, 400, "{query}: {json}");
        let message = json["error"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{query}: {message}");
    }
}

/// Found from outside: a watch after a revision this cluster never reached (one kept
/// across a restore, whose log starts again at 1) answered empty pages at that revision
/// and so skipped every change up to it. It is a 410 with the revision to resume from.
#[tokio::test]
async fn a_watch_after_a_revision_ahead_of_the_log_is_gone_not_silently_empty() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    add(&cluster, 1, "ahead", "one").await.expect("added");
    let (status, json) = get(&cluster, 1, "/watch?group=ahead&after=0").await;
    assert_eq!(status, 200, "{json}");
    let revision = json["revision"].as_u64().expect("revision");
    let (status, json) = get(
        &cluster,
        1,
        &format!("/watch?group=ahead&after={}", revision + 1000),
    )
    .await;
    assert_eq!(status, 410, "{json}");
    assert_eq!(json["revision"], revision, "{json}");
    assert!(
        json["error"].as_str().unwrap_or_default().contains("ahead"),
        "{json}"
    );
    // Its own revision, and one a moment ahead of what it applied, are fine.
    let (status, json) = get(&cluster, 1, &format!("/watch?group=ahead&after={revision}")).await;
    assert_eq!(status, 200, "{json}");
}

/// Found from outside: on an idle cluster a lease that ran out reached no watch until
/// some unrelated write applied it. The leader now passes due time in the log.
#[tokio::test]
async fn a_watch_sees_a_lease_run_out_on_an_idle_cluster() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    let job = serde_json::json!({"clientid": 1, "adds": [{"group": "lapse", "key": "k", "max_attempts": 1}]});
    cluster.write(1, "/update", &job).await.expect("added");
    let claim = serde_json::json!({"clientid": 5, "group": "lapse", "duration": 500});
    cluster.write(1, "/claim", &claim).await.expect("claimed");
    let revision = watch(&cluster, 1, "group=lapse&after=0").await.revision;
    let started = std::time::Instant::now();
    let page = watch(
        &cluster,
        1,
        &format!("group=lapse&after={revision}&wait_ms=20000"),
    )
    .await;
    assert!(!page.changes.is_empty(), "{page:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "woken by the lapse, not the wait's end"
    );
    let (_, job) = get(&cluster, 1, "/job?group=lapse&key=k").await;
    assert_eq!(job["state"], "dead", "{job}");
}

/// Reads a server-sent event stream from `path` on `addr` until `enough` says so.
async fn read_stream(addr: &str, path: &str, enough: impl Fn(&str) -> bool) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut text = String::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !enough(&text) {
        assert!(Instant::now() < deadline, "stream so far: {text}");
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buffer))
            .await
            .expect("the stream went quiet")
            .expect("read");
        assert!(read > 0, "the stream ended: {text}");
        text.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
    text
}

#[tokio::test]
async fn an_event_stream_sends_each_change_with_resumable_ids() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    add(&cluster, 1, "s", "one").await.expect("added");
    add(&cluster, 1, "s", "two").await.expect("added");
    let text = read_stream(cluster.api(1), "/watch?group=s&after=0", |t| {
        t.matches("event: task").count() >= 2
    })
    .await;
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    assert!(
        text.contains("x-rota-node: 1"),
        "the serving node is named: {text}"
    );
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    assert_eq!(ids.len(), 2, "{text}");
    assert!(ids[0] < ids[1], "{text}");

    // Resuming with Last-Event-ID gives what came after, once, even when the URL is the
    // first one with its `after` (a browser's EventSource reconnects with it).
    add(&cluster, 1, "s", "three").await.expect("added");
    let mut stream = tokio::net::TcpStream::connect(cluster.api(1))
        .await
        .expect("connect");
    let request = format!(
        "GET /watch?group=s&after=0 HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nLast-Event-ID: {}\r\n\r\n",
        cluster.api(1),
        ids[1]
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut resumed = String::new();
    let mut buffer = [0u8; 4096];
    while !resumed.contains("event: task") {
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buffer))
            .await
            .expect("the stream went quiet")
            .expect("read");
        assert!(read > 0, "the stream ended: {resumed}");
        resumed.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
    assert!(
        resumed.contains("three") && !resumed.contains("\"two\""),
        "{resumed}"
    );

    // An id this stream never sent is refused, not taken as "from now".
    let mut stream = tokio::net::TcpStream::connect(cluster.api(1))
        .await
        .expect("connect");
    let request = format!(
        "GET /watch?group=s&after=0 HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nLast-Event-ID: abc\r\nConnection: close\r\n\r\n",
        cluster.api(1)
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut refused = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut refused))
        .await
        .expect("answered")
        .expect("read");
    let refused = String::from_utf8_lossy(&refused);
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    assert!(
        refused.contains("Last-Event-ID \\\"abc\\\" is not a revision"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_watch_through_a_follower_sees_every_change_once_across_a_leader_change() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let watcher = (1..=3).find(|&id| id != leader).expect("a follower");
    let writer_nodes: Vec<u64> = (1..=3).collect();

    // Adds through every node in turn, each retried with its request id until known.
    let writes = {
        let cluster = &cluster;
        async move {
            let mut acknowledged = Vec::new();
            for i in 0..60 {
                let data = format!("x{i}");
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut via = writer_nodes[i % writer_nodes.len()];
                loop {
                    let alive = via != leader || i <= 20;
                    if alive && add(cluster, via, "c", &data).await.is_ok() {
                        break;
                    }
                    assert!(Instant::now() < deadline, "add {data} never succeeded");
                    via = via % 3 + 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                acknowledged.push(data);
                if i == 20 {
                    cluster.kill(leader);
                }
            }
            acknowledged
        }
    };
    let acknowledged = writes.await;

    let mut seen = Vec::new();
    let mut revisions = Vec::new();
    let mut after = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < acknowledged.len() {
        assert!(Instant::now() < deadline, "saw only {seen:?}");
        let page = watch(
            &cluster,
            watcher,
            &format!("group=c&after={after}&wait_ms=2000"),
        )
        .await;
        revisions.extend(page.changes.iter().map(|c| c.revision()));
        seen.extend(added_data(&page.changes));
        after = page.revision;
    }
    assert!(
        revisions.windows(2).all(|w| w[0] <= w[1]),
        "in log order: {revisions:?}"
    );
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "each change once: {seen:?}");
    assert_eq!(
        unique,
        acknowledged.iter().collect::<BTreeSet<_>>(),
        "every acknowledged add, nothing else"
    );
}
