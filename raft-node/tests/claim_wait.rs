//! Blocking claims through real nodes (issue 13): a waiting claim is served by an add
//! through another node, many waiters and a few adds wake as many claims without a
//! stampede, waiting costs no log entry, and a leader kill during waits loses no task
//! and hands none out twice.

mod common;

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use common::TestCluster;
use rpc::worker::AddJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::TaskJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteResultJson;

fn waiting_claim(client: i64, group: &str, duration_ms: i64, wait_ms: u64) -> ClaimRequestJson {
    ClaimRequestJson {
        wait_ms: Some(wait_ms),
        ..ClaimRequestJson::new(client, group, duration_ms)
    }
}

async fn add(cluster: &TestCluster, via: u64, group: &str, data: &str) {
    add_through(cluster, &[via], group, data).await;
}

/// Adds a task through the first of `nodes` that takes it, retrying with one request id.
async fn add_through(cluster: &TestCluster, nodes: &[u64], group: &str, data: &str) {
    let mut request = UpdateRequestJson::by(1).with_add(AddJson::in_group(group).with_data(data));
    request.requestid = Some(format!("add-{group}-{data}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    for via in nodes.iter().cycle() {
        match cluster.write(*via, "/update", &request).await {
            Ok(WriteResultJson::Tasks { .. }) => return,
            Ok(refused) => panic!("add refused: {refused:?}"),
            Err(e) => assert!(Instant::now() < deadline, "add {data} never succeeded: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// POSTs a blocking claim with a deadline long enough for its wait.
async fn claim(
    cluster: &TestCluster,
    via: u64,
    request: &ClaimRequestJson,
) -> Result<Vec<TaskJson>, String> {
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
    let response = cluster
        .client
        .post_json(
            cluster.api(via),
            "/claim",
            request,
            common::CALL_TIMEOUT + wait,
        )
        .await
        .map_err(|e| e.to_string())?
        .success(cluster.api(via))
        .map_err(|e| e.to_string())?;
    match response.json(cluster.api(via)).map_err(|e| e.to_string())? {
        WriteResultJson::Tasks { tasks } => Ok(tasks),
        WriteResultJson::Errors { errors } => Err(errors.join("; ")),
    }
}

/// POSTs a blocking claim to node `via` in the background; its answer, whatever the
/// status, and how long it took.
fn spawn_claim(
    cluster: &TestCluster,
    via: u64,
    request: ClaimRequestJson,
) -> tokio::task::JoinHandle<(rpc::client::HttpResponse, Duration)> {
    let api = cluster.api(via).to_string();
    let client = cluster.client.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let answer = client
            .post_json(&api, "/claim", &request, Duration::from_secs(90))
            .await
            .expect("answered");
        (answer, started.elapsed())
    })
}

async fn metric(cluster: &TestCluster, id: u64, series: &str) -> f64 {
    cluster.metric(id, series).await
}

async fn applied_index(cluster: &TestCluster, id: u64) -> u64 {
    metric(cluster, id, "rota_feed_revision").await as u64
}

/// Commands node `id` applied: an entry that several writes share counts each.
async fn applied_commands(cluster: &TestCluster, id: u64) -> u64 {
    metric(cluster, id, "rota_applied_commands_total").await as u64
}

#[tokio::test]
async fn a_waiting_claim_is_served_by_an_add_through_another_node() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let other = (1..=3)
        .find(|&id| id != leader && id != follower)
        .expect("another follower");

    // Sent to a follower, which relays the whole wait to the leader.
    let waiting = spawn_claim(&cluster, follower, waiting_claim(7, "q", 60_000, 30_000));
    tokio::time::sleep(Duration::from_millis(500)).await;
    add(&cluster, other, "q", "wanted").await;
    let (answer, waited) = waiting.await.expect("the claim ended");
    let answer: WriteResultJson = answer.json(cluster.api(follower)).expect("JSON");
    let WriteResultJson::Tasks { tasks } = answer else {
        panic!("refused: {answer:?}");
    };
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!((tasks[0].data.as_str(), tasks[0].ownerid), ("wanted", 7));
    assert!(
        waited < Duration::from_secs(30),
        "served by the add, not the deadline"
    );

    // Nothing to claim: the usual empty answer at the deadline; over a minute is a 400.
    let empty = claim(&cluster, leader, &waiting_claim(7, "q", 60_000, 200)).await;
    assert_eq!(empty.expect("answered").len(), 0);
    let too_long = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/claim",
            &waiting_claim(7, "q", 60_000, 60_001),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("answered");
    assert_eq!(too_long.status.as_u16(), 400);
    assert!(String::from_utf8_lossy(&too_long.body).contains("wait_ms"));
}

#[tokio::test]
async fn many_waiters_and_ten_adds_wake_ten_claims_and_idle_waiting_writes_nothing() {
    const WAITERS: i64 = 1_000;
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    cluster.wait_log_form_recorded(1).await;
    let before = applied_index(&cluster, 1).await;
    let commands_before = applied_commands(&cluster, 1).await;
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let request = waiting_claim(100 + i, "crowd", 60_000, 20_000);
            let api = cluster.api(1).to_string();
            let client = cluster.client.clone();
            tokio::spawn(async move {
                let answer = client
                    .post_json(&api, "/claim", &request, Duration::from_secs(40))
                    .await
                    .map_err(|e| e.to_string())?;
                answer
                    .json::<WriteResultJson>(&api)
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    // Every waiter is parked before the adds.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&cluster, 1, "rota_waiters{kind=\"claim\"}").await < WAITERS as f64 {
        assert!(Instant::now() < deadline, "the waiters never all parked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Idle waiting proposed nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        applied_index(&cluster, 1).await,
        before,
        "waiting wrote to the log"
    );

    for i in 0..10 {
        add(&cluster, 1, "crowd", &format!("t{i}")).await;
    }
    let mut claimed = BTreeSet::new();
    let mut empty = 0;
    for waiter in waiters {
        match waiter.await.expect("joined").expect("answered") {
            WriteResultJson::Tasks { tasks } if tasks.is_empty() => empty += 1,
            WriteResultJson::Tasks { tasks } => {
                claimed.insert(tasks[0].data.clone());
            }
            WriteResultJson::Errors { errors } => panic!("refused: {errors:?}"),
        }
    }
    assert_eq!((claimed.len(), empty), (10, WAITERS as usize - 10));
    // Ten adds and ten claims: no claim was proposed for a waiter that got nothing.
    let commands = applied_commands(&cluster, 1).await - commands_before;
    assert_eq!(commands, 20, "commands for 10 adds and 10 claims");
    let wasted = metric(
        &cluster,
        1,
        "rota_waiter_wasted_wakeups_total{kind=\"claim\"}",
    )
    .await;
    assert_eq!(wasted, 0.0);
}

#[tokio::test]
async fn a_leader_kill_during_waits_loses_no_task_and_hands_none_out_twice() {
    const TASKS: usize = 40;
    const WORKERS: i64 = 8;
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();

    // Workers claim with a wait through the survivors and delete what they claim; a
    // call that fails is retried with its request id through the other survivor.
    let done = AtomicUsize::new(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let other = |via: u64| {
        if via == survivors[0] {
            survivors[1]
        } else {
            survivors[0]
        }
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (cluster, done, survivors, other) = (&cluster, &done, &survivors, &other);
            async move {
                let mut deleted = Vec::new();
                let mut round = 0;
                while done.load(Ordering::SeqCst) < TASKS && Instant::now() < deadline {
                    round += 1;
                    let mut request = waiting_claim(w + 1, "k", 2_000, 1_500);
                    request.requestid = Some(format!("w{w}-claim{round}"));
                    let mut via = survivors[(w as usize + round) % survivors.len()];
                    let tasks = loop {
                        match claim(cluster, via, &request).await {
                            Ok(tasks) => break tasks,
                            Err(_) if Instant::now() < deadline => {
                                via = other(via);
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            Err(e) => panic!("claims failed until the deadline: {e}"),
                        }
                    };
                    let Some(task) = tasks.first() else { continue };
                    let mut delete = UpdateRequestJson::by(w + 1).with_deletes([task.id]);
                    delete.requestid = Some(format!("w{w}-delete{round}"));
                    while Instant::now() < deadline {
                        match cluster.write(via, "/update", &delete).await {
                            Ok(WriteResultJson::Tasks { .. }) => {
                                deleted.push(task.data.clone());
                                done.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            // Its lease lapsed and someone else claimed it: not ours.
                            Ok(WriteResultJson::Errors { .. }) => break,
                            Err(_) => {
                                via = other(via);
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
                deleted
            }
        })
        .collect();
    let producer = async {
        for i in 0..TASKS {
            add_through(&cluster, &survivors, "k", &format!("job{i}")).await;
            if i == TASKS / 2 {
                cluster.kill(leader);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (results, ()) = tokio::join!(futures_util::future::join_all(workers), producer);
    let mut deleted_by: BTreeMap<String, usize> = BTreeMap::new();
    for data in results.into_iter().flatten() {
        *deleted_by.entry(data).or_default() += 1;
    }
    let twice: Vec<_> = deleted_by.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "deleted twice: {twice:?}");
    assert_eq!(
        deleted_by.len(),
        TASKS,
        "every task claimed and finished once: {deleted_by:?}"
    );
}

#[tokio::test]
async fn waiters_beyond_the_bound_get_503_and_a_stopping_node_answers_every_waiter() {
    let cluster = TestCluster::start_with(1, "never", &["--max-waiters", "2"]);
    cluster.wait_leader(&[1]).await;
    let waiting: Vec<_> = [
        "/watch?group=a&wait_ms=30000",
        "/jobs/wait?group=a&key=k&wait_ms=30000",
    ]
    .into_iter()
    .map(|path| {
        let api = cluster.api(1).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = client
                .get(&api, path, Duration::from_secs(40))
                .await
                .map(|r| {
                    (
                        r.status.as_u16(),
                        String::from_utf8_lossy(&r.body).into_owned(),
                    )
                });
            (path, answer, started.elapsed())
        })
    })
    .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let watches = metric(&cluster, 1, "rota_waiters{kind=\"watch\"}").await;
        let jobs = metric(&cluster, 1, "rota_waiters{kind=\"job\"}").await;
        if watches + jobs >= 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiters never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let third = cluster
        .client
        .post_json(
            cluster.api(1),
            "/claim",
            &waiting_claim(3, "a", 1_000, 30_000),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("answered");
    assert_eq!(third.status.as_u16(), 503);
    assert!(third.headers.iter().any(|(name, _)| name == "retry-after"));
    assert!(String::from_utf8_lossy(&third.body).contains("--max-waiters"));
    // A watch that does not wait is a read, not a waiter: served while the slots are full.
    for path in ["/watch?group=a", "/watch?group=a&wait_ms=0"] {
        let read = cluster
            .client
            .get(cluster.api(1), path, common::CALL_TIMEOUT)
            .await
            .expect("answered");
        assert_eq!(read.status.as_u16(), 200, "{path}");
    }

    let status = cluster.terminate(1).expect("the node was running");
    assert!(status.success(), "stopped with {status}");
    for waiter in waiting {
        let (path, answer, waited) = waiter.await.expect("joined");
        let (status, body) = answer.expect("answered before the node stopped");
        assert_eq!(status, 200, "{path}: {body}");
        assert!(waited < Duration::from_secs(30), "answered by the shutdown");
    }
}

#[tokio::test]
async fn a_blocking_claim_whose_client_left_hands_nothing_to_it_or_anybody_else() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    let mut request = waiting_claim(7, "left", 60_000, 20_000);
    request.requestid = Some("gone-7".into());
    let gave_up = cluster
        .client
        .post_json(
            cluster.api(1),
            "/claim",
            &request,
            Duration::from_millis(300),
        )
        .await;
    assert!(gave_up.is_err(), "the client gave up first: {gave_up:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        metric(&cluster, 1, "rota_waiters{kind=\"claim\"}").await,
        0.0,
        "the waiter left with its client"
    );
    add(&cluster, 1, "left", "after").await;
    // Nobody claimed it for the client that left: the next worker gets it.
    let other = claim(&cluster, 1, &waiting_claim(8, "left", 60_000, 0)).await;
    let other = other.expect("answered");
    assert_eq!(other.len(), 1, "{other:?}");
    assert_eq!((other[0].data.as_str(), other[0].ownerid), ("after", 8));
}

#[tokio::test]
async fn a_retried_blocking_claim_gets_the_task_its_first_try_claimed_and_no_other() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    add(&cluster, 1, "retry", "one").await;
    add(&cluster, 1, "retry", "two").await;
    let mut request = waiting_claim(7, "retry", 60_000, 5_000);
    request.requestid = Some("claim-once".into());
    let first = claim(&cluster, 1, &request).await.expect("answered");
    let again = claim(&cluster, 1, &request).await.expect("answered");
    assert_eq!(first, again, "a retry answers the first claim");
    assert_eq!(first.len(), 1);
    // The other task is still there for somebody else.
    let other = claim(&cluster, 1, &waiting_claim(8, "retry", 60_000, 0)).await;
    assert_eq!(other.expect("answered")[0].data, "two");
}

#[tokio::test]
async fn a_waiting_claim_wakes_when_a_lease_lapses_and_when_the_group_resumes() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    add(&cluster, 1, "lapse", "held").await;
    let held = claim(&cluster, 1, &waiting_claim(7, "lapse", 1_000, 0)).await;
    assert_eq!(held.expect("answered").len(), 1);
    // Nothing is written while the lease runs out: time alone wakes the waiter.
    let started = Instant::now();
    let lapsed = claim(&cluster, 1, &waiting_claim(8, "lapse", 60_000, 20_000)).await;
    let lapsed = lapsed.expect("answered");
    assert_eq!((lapsed.len(), lapsed[0].ownerid), (1, 8), "{lapsed:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "woken by the lapse"
    );

    // A paused group holds its waiters until it resumes.
    let settings = |paused: bool| {
        let body = serde_json::json!({ "paused": paused });
        let api = cluster.api(1).to_string();
        let client = cluster.client.clone();
        async move {
            let answer = client
                .send(
                    &api,
                    hyper::Method::PUT,
                    "/groups/paused/settings",
                    &[(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    )],
                    body.to_string().into(),
                    common::CALL_TIMEOUT,
                )
                .await
                .expect("answered");
            assert_eq!(answer.status.as_u16(), 200);
        }
    };
    settings(true).await;
    add(&cluster, 1, "paused", "waits").await;
    let waiting = {
        let request = waiting_claim(9, "paused", 60_000, 20_000);
        let api = cluster.api(1).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            let answer = client
                .post_json(&api, "/claim", &request, Duration::from_secs(30))
                .await
                .expect("answered");
            (
                answer.json::<WriteResultJson>(&api).expect("JSON"),
                Instant::now(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a paused group answers no claim");
    let resumed_at = Instant::now();
    settings(false).await;
    let (answer, answered_at) = waiting.await.expect("joined");
    let WriteResultJson::Tasks { tasks } = answer else {
        panic!("refused: {answer:?}")
    };
    assert_eq!(tasks[0].data, "waits");
    assert!(answered_at >= resumed_at);
}

#[tokio::test]
async fn a_waiting_claim_wakes_for_a_task_that_a_write_during_the_wait_makes_claimable_later() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    // The waiter sets its timer when it starts, with nothing in the group; the add then
    // brings a claimable time into its wait, which must move the timer forward.
    let waiting = spawn_claim(&cluster, 1, waiting_claim(7, "later", 60_000, 30_000));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut later = AddJson::in_group("later").with_data("in a second");
    later.timespec = Some(-1_000);
    let added = cluster
        .write(1, "/update", &UpdateRequestJson::by(1).with_add(later))
        .await
        .expect("added");
    assert!(matches!(added, WriteResultJson::Tasks { .. }), "{added:?}");
    // Without the new timer the claim would sleep to its deadline (30 s) and only then
    // look again.
    let (answer, waited) = waiting.await.expect("joined");
    let answer: WriteResultJson = answer.json(cluster.api(1)).expect("JSON");
    assert!(
        waited < Duration::from_secs(15),
        "woken for the task claimable after a second, not at the deadline: {waited:?}"
    );
    let WriteResultJson::Tasks { tasks } = answer else {
        panic!("refused: {answer:?}")
    };
    assert_eq!(
        tasks.len(),
        1,
        "the task claimable during the wait: {tasks:?}"
    );
    assert_eq!(
        (tasks[0].data.as_str(), tasks[0].ownerid),
        ("in a second", 7)
    );
}

#[tokio::test]
async fn a_wait_relayed_to_a_leader_that_froze_is_told_to_retry_once_a_new_leader_serves() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let waiting = spawn_claim(
        &cluster,
        follower,
        waiting_claim(7, "frozen", 60_000, 20_000),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.signal(leader, "STOP");
    let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let new_leader = cluster.wait_leader(&others).await;
    let (answer, _) = waiting.await.expect("joined");
    cluster.signal(leader, "CONT");
    // Not the relay's timeout (the wait and 10 s more) on a leader that answers nothing:
    // a retry now reaches the new one.
    let body = String::from_utf8_lossy(&answer.body).to_string();
    assert_eq!(answer.status.as_u16(), 503, "{body}");
    assert!(body.contains("the leader changed"), "{body}");
    let retried = claim(&cluster, follower, &waiting_claim(7, "frozen", 60_000, 0)).await;
    assert!(
        retried.is_ok(),
        "node {new_leader} serves the retry: {retried:?}"
    );
}

#[tokio::test]
async fn a_wait_relayed_by_a_follower_that_stops_is_answered_at_once() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let waiting = spawn_claim(
        &cluster,
        follower,
        waiting_claim(7, "leaving", 60_000, 30_000),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped_at = Instant::now();
    let status = cluster.terminate(follower).expect("the follower stops");
    assert!(status.success(), "{status}");
    let (answer, _) = waiting.await.expect("joined");
    let body = String::from_utf8_lossy(&answer.body).to_string();
    assert_eq!(answer.status.as_u16(), 503, "{body}");
    assert!(body.contains("this node is stopping"), "{body}");
    // Not the connection's cut-off (10 s) nor the wait's end (30 s).
    assert!(
        stopped_at.elapsed() < Duration::from_secs(8),
        "{:?}",
        stopped_at.elapsed()
    );
}

/// The status and body of a POST of `body` to node `via`.
async fn post(
    cluster: &TestCluster,
    via: u64,
    path: &str,
    body: &impl serde::Serialize,
) -> (u16, String) {
    let client = rpc::client::HttpClient::new();
    let response = client
        .post_json(cluster.api(via), path, body, Duration::from_secs(10))
        .await
        .expect("the node answers");
    (
        response.status.as_u16(),
        String::from_utf8_lossy(&response.body).into_owned(),
    )
}

#[tokio::test]
async fn a_request_id_reused_for_another_request_is_refused_with_422_on_every_path() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3]
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    let mut first = UpdateRequestJson::by(5).with_add(AddJson::in_group("r").with_data("one"));
    first.requestid = Some("dup-1".into());
    let (status, answer) = post(&cluster, leader, "/update", &first).await;
    assert_eq!(status, 200, "{answer}");
    let mut other = UpdateRequestJson::by(5).with_add(AddJson::in_group("r").with_data("two"));
    other.requestid = Some("dup-1".into());
    for via in [leader, follower] {
        let (status, answer) = post(&cluster, via, "/update", &other).await;
        assert_eq!(status, 422, "through node {via}: {answer}");
        let error: serde_json::Value = serde_json::from_str(&answer).expect("a JSON error");
        let message = error["error"].as_str().unwrap_or_default();
        assert!(
            message.contains("\"dup-1\""),
            "the message names the id: {answer}"
        );
    }
    // The first request, sent again, still gets its first outcome; one task exists.
    let (status, again) = post(&cluster, follower, "/update", &first).await;
    assert_eq!(
        (status, again.clone()),
        (200, answer_of(&cluster, leader, &first).await)
    );
    let tasks: Vec<TaskJson> = cluster.get_json(leader, "/group/r").await.expect("a read");
    assert_eq!(tasks.len(), 1, "{tasks:?}");

    // A claim, then a blocking claim under the same id with another lease.
    let mut claim = ClaimRequestJson::new(5, "r", 60_000);
    claim.requestid = Some("dup-2".into());
    let (status, claimed) = post(&cluster, leader, "/claim", &claim).await;
    assert_eq!(status, 200, "{claimed}");
    let mut waiting = waiting_claim(5, "r", 30_000, 1_000);
    waiting.requestid = Some("dup-2".into());
    let (status, answer) = post(&cluster, leader, "/claim", &waiting).await;
    assert_eq!(status, 422, "{answer}");
}

/// What node `via` answers to `request` now (a replay of its first outcome).
async fn answer_of(cluster: &TestCluster, via: u64, request: &UpdateRequestJson) -> String {
    post(cluster, via, "/update", request).await.1
}

#[tokio::test]
async fn a_claim_with_a_count_takes_several_tasks_through_any_node_and_waits_for_the_first() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    for data in ["a", "b", "c", "d"] {
        add(&cluster, leader, "batch", data).await;
    }
    // Through a follower, relayed; retried under its request id, it answers the same.
    let mut request = ClaimRequestJson::new(7, "batch", 60_000).with_count(3);
    request.requestid = Some("three".into());
    let first = claim(&cluster, follower, &request).await.expect("claimed");
    let datas: Vec<&str> = first.iter().map(|t| t.data.as_str()).collect();
    assert_eq!(
        datas,
        ["a", "b", "c"],
        "in the order successive claims take them"
    );
    assert!(first.iter().all(|t| t.ownerid == 7));
    let ids: BTreeSet<u64> = first.iter().map(|t| t.id).collect();
    assert_eq!(ids.len(), 3, "each its own version");
    let again = claim(&cluster, leader, &request).await.expect("answered");
    assert_eq!(first, again, "a retry gets the first outcome");

    // Fewer than asked when fewer are left; a waiting one gets the next add.
    let five = ClaimRequestJson::new(8, "batch", 60_000).with_count(5);
    let rest = claim(&cluster, leader, &five).await.expect("claimed");
    assert_eq!(rest.len(), 1);
    let waiting = {
        let request = ClaimRequestJson {
            wait_ms: Some(20_000),
            ..ClaimRequestJson::new(9, "batch", 60_000).with_count(10)
        };
        let cluster_api = cluster.api(follower).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            let answer = client
                .post_json(&cluster_api, "/claim", &request, Duration::from_secs(30))
                .await
                .expect("answered");
            answer.json::<WriteResultJson>(&cluster_api).expect("JSON")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    add(&cluster, leader, "batch", "late").await;
    let WriteResultJson::Tasks { tasks } = waiting.await.expect("ended") else {
        panic!("refused");
    };
    assert_eq!(tasks.len(), 1);
    assert_eq!((tasks[0].data.as_str(), tasks[0].ownerid), ("late", 9));

    // A count outside 1 to 1000 is a 400 that names it.
    for count in [0, 1_001] {
        let refused = cluster
            .client
            .post_json(
                cluster.api(leader),
                "/claim",
                &ClaimRequestJson::new(7, "batch", 60_000).with_count(count),
                common::CALL_TIMEOUT,
            )
            .await
            .expect("answered");
        assert_eq!(refused.status.as_u16(), 400);
        assert!(String::from_utf8_lossy(&refused.body).contains(&format!("count {count}")));
    }
}

#[tokio::test]
async fn a_waiting_claim_the_machine_would_refuse_is_refused_not_answered_empty() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");

    // Refused at once, through either node, as without a wait; with the old code each
    // of these waited 20 s and answered `{"tasks":[]}`.
    let missing = ClaimRequestJson {
        depends: vec![999_999],
        ..waiting_claim(7, "nothing-here", 60_000, 20_000)
    };
    for via in [leader, follower] {
        let answer = claim(&cluster, via, &missing).await;
        assert_eq!(
            answer,
            Err("depends: task 999999 does not exist".to_string())
        );
        let answer = claim(&cluster, via, &waiting_claim(7, "", 60_000, 20_000)).await;
        assert_eq!(answer, Err("claim: group is missing or empty".to_string()));
    }

    // A dependency deleted while the claim waits: refused when the wait ends, not empty.
    let mut request = UpdateRequestJson::by(1).with_add(AddJson::in_group("barrier"));
    request.requestid = Some("barrier".into());
    let WriteResultJson::Tasks { tasks } = cluster
        .write(leader, "/update", &request)
        .await
        .expect("added")
    else {
        panic!("the barrier was refused");
    };
    let barrier = tasks[0].id;
    let waiting = {
        let request = ClaimRequestJson {
            depends: vec![barrier],
            ..waiting_claim(7, "nothing-here", 60_000, 1_500)
        };
        let api = cluster.api(follower).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            client
                .post_json(&api, "/claim", &request, Duration::from_secs(30))
                .await
                .expect("answered")
                .json::<WriteResultJson>(&api)
                .expect("JSON")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut delete = UpdateRequestJson::by(1);
    delete.deletes = vec![barrier];
    cluster
        .write(leader, "/update", &delete)
        .await
        .expect("deleted");
    assert_eq!(
        waiting.await.expect("the claim ended"),
        WriteResultJson::Errors {
            errors: vec![format!("depends: task {barrier} does not exist")]
        }
    );
}

/// Found from outside: a blocking claim waiting on a leader that handed leadership on
/// waited out its time there and then answered 503, and a task added meanwhile met a
/// 503 instead of the waiter. Now the wait goes to the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_follows_leadership_to_the_new_leader() {
    let cluster = TestCluster::start(3, "never");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let target = (1..=3).find(|&id| id != leader).expect("a follower");
    let waiting = {
        let mut request = waiting_claim(5, "moved", 60_000, 20_000);
        request.requestid = Some("moving-claim".into());
        let api = cluster.api(leader).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            client
                .post_json(&api, "/claim", &request, Duration::from_secs(30))
                .await
                .map(|answer| {
                    (
                        answer.status.as_u16(),
                        String::from_utf8_lossy(&answer.body).to_string(),
                    )
                })
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/admin/transfer-leader",
            &serde_json::json!({"id": target}),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("transfer answered");
    assert_eq!(response.status.as_u16(), 200);
    assert_eq!(cluster.wait_leader_is(target).await, target);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let added_at = Instant::now();
    add(&cluster, target, "moved", "for the waiter").await;
    let (status, body) = waiting.await.expect("joined").expect("answered");
    assert_eq!(status, 200, "{body}");
    let answer: WriteResultJson = serde_json::from_str(&body).expect("JSON");
    let WriteResultJson::Tasks { tasks } = answer else {
        panic!("refused: {body}")
    };
    assert_eq!(tasks.len(), 1, "{body}");
    assert_eq!(
        (tasks[0].data.as_str(), tasks[0].ownerid),
        ("for the waiter", 5)
    );
    assert!(
        added_at.elapsed() < Duration::from_secs(15),
        "answered by the add"
    );
}

/// Found from outside: a blocking claim whose leader stepped down mid-wait was relayed
/// to the new leader with its whole `wait_ms` again, so it answered that much past its
/// deadline. It now waits at most its `wait_ms` in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_moved_to_a_new_leader_keeps_its_deadline() {
    let cluster = TestCluster::start(3, "never");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let target = (1..=3).find(|&id| id != leader).expect("a follower");
    let wait = Duration::from_secs(6);
    let waiting = spawn_claim(
        &cluster,
        leader,
        waiting_claim(5, "deadline", 60_000, wait.as_millis() as u64),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let response = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/admin/transfer-leader",
            &serde_json::json!({"id": target}),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("transfer answered");
    assert_eq!(response.status.as_u16(), 200);
    let (answer, took) = waiting.await.expect("joined");
    let body = String::from_utf8_lossy(&answer.body).to_string();
    assert_eq!(answer.status.as_u16(), 200, "{body}");
    assert_eq!(body, r#"{"tasks":[]}"#);
    // Its own 6 s, not 2 s at the old leader and then 6 s more at the new one.
    assert!(took >= wait - Duration::from_millis(100), "{took:?}");
    assert!(took < wait + Duration::from_millis(1_500), "{took:?}");
}

/// A waiter whose claim depends on the group's only claimable task cannot take it: it
/// must not hold the grant that a later plain waiter can use (a review found the later
/// one answered empty at its deadline, and the first proposing at every change).
#[tokio::test]
async fn a_waiter_that_depends_on_the_only_task_does_not_keep_it_from_the_next() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    add(&cluster, 1, "d", "only").await;
    let only = claim(&cluster, 1, &waiting_claim(1, "d", 1, 0))
        .await
        .expect("claimed")
        .pop()
        .expect("the task");
    // Its 1 ms lease lapses at once; the task is claimable again under its new id.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut picky = waiting_claim(7, "d", 60_000, 20_000);
    picky.depends = vec![only.id];
    let picky = spawn_claim(&cluster, 1, picky);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let commands_before = applied_commands(&cluster, 1).await;
    let plain = claim(&cluster, 1, &waiting_claim(8, "d", 60_000, 15_000))
        .await
        .expect("answered");
    assert_eq!(plain.len(), 1, "the plain waiter gets the task: {plain:?}");
    assert_eq!((plain[0].data.as_str(), plain[0].ownerid), ("only", 8));
    assert!(
        applied_commands(&cluster, 1).await <= commands_before + 1,
        "one claim went into the log, none from the waiter that cannot use the task"
    );
    picky.abort();
}
