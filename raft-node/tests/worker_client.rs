//! `rpc::worker_client::WorkerClient` against real nodes (issue 14): typed calls for the
//! seed and job API, writes sent to the leader it finds, exactly once under retries,
//! and through a leader kill.

mod common;

use std::time::Duration;

use common::TestCluster;
use rpc::worker::AddJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker_client::WorkerClient;
use rpc::worker_client::WorkerError;
use serde_json::json;

fn client(cluster: &TestCluster, ids: &[u64], client_id: i64) -> WorkerClient {
    WorkerClient::new(ids.iter().map(|&id| cluster.api(id).to_string()), client_id)
        .expect("a client")
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(30))
}

#[tokio::test]
async fn a_worker_client_runs_tasks_and_jobs_through_any_node() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let worker = client(&cluster, &[1, 2, 3], 7);
    assert_eq!(
        worker.find_leader().await.as_deref(),
        Some(cluster.api(leader)),
        "the leader is found from /cluster"
    );

    // Seed API: add, claim, renew (a new fencing id), delete.
    let added = worker.add("plain", "hello").await.expect("added");
    let claimed = worker
        .claim("plain", Duration::from_secs(60))
        .await
        .expect("answered")
        .expect("a task");
    assert_eq!((claimed.data.as_str(), claimed.ownerid), ("hello", 7));
    assert!(claimed.id > added.id);
    let renewed = worker
        .renew(&claimed, Duration::from_secs(60))
        .await
        .expect("renewed");
    assert!(renewed.id > claimed.id);
    // The old version is no fence any more.
    let stale = worker.delete(claimed.id).await;
    assert!(matches!(stale, Err(WorkerError::Refused(_))), "{stale:?}");
    worker.delete(renewed.id).await.expect("deleted");
    assert!(
        worker
            .claim("plain", Duration::from_secs(1))
            .await
            .expect("answered")
            .is_none()
    );

    // Jobs: keyed add, claim, fail with a retry, claim again, finish with a result.
    let job = AddJson {
        key: Some("report".into()),
        ..AddJson::in_group("jobs").with_data("q3")
    };
    let added = worker.add_task(job).await.expect("added");
    let first = worker
        .claim("jobs", Duration::from_secs(60))
        .await
        .expect("answered")
        .expect("the job");
    assert_eq!((first.key.as_deref(), first.attempt), (Some("report"), 1));
    worker
        .fail(first.id, "flaky", Some(Duration::ZERO))
        .await
        .expect("failed");
    let second = worker
        .claim_waiting("jobs", Duration::from_secs(60), Duration::from_secs(5))
        .await
        .expect("answered")
        .expect("the retry");
    assert_eq!(second.attempt, 2);
    worker
        .finish(second.id, Some(json!({"rows": 3})))
        .await
        .expect("finished");
    let record = worker.job("jobs", "report").await.expect("a record");
    assert_eq!(
        (record.state.as_str(), &record.result),
        ("succeeded", &Some(json!({"rows": 3})))
    );
    let by_id = worker.job_by_id(added.id).await.expect("a record by id");
    assert_eq!(by_id, record, "the id its add answered names the job");
    assert!(matches!(
        worker.job_by_id(second.id).await,
        Err(WorkerError::NotFound(_))
    ));
    let waited = worker
        .wait_jobs("jobs", &["report"], Duration::from_secs(5))
        .await
        .expect("answered");
    assert!(waited.finished);
    assert!(matches!(
        worker.job("jobs", "nothing").await,
        Err(WorkerError::NotFound(_))
    ));

    // A batch: three jobs claimed in one request and finished in one.
    for key in ["x", "y", "z"] {
        let job = AddJson {
            key: Some(key.into()),
            ..AddJson::in_group("batch").with_data(key)
        };
        worker.add_task(job).await.expect("added");
    }
    let batch = worker
        .claim_many("batch", Duration::from_secs(60), 3, Duration::ZERO)
        .await
        .expect("claimed");
    assert_eq!(batch.len(), 3);
    let finishes: Vec<(u64, Option<serde_json::Value>)> =
        batch.iter().map(|t| (t.id, Some(json!(t.data)))).collect();
    worker.finish_many(&finishes).await.expect("finished");
    let again = worker.finish_many(&finishes).await;
    assert!(
        matches!(&again, Err(WorkerError::Refused(errors)) if errors.len() == 3),
        "the tasks are gone: {again:?}"
    );
    let z = worker.job("batch", "z").await.expect("a record");
    assert_eq!(
        (z.state.as_str(), &z.result),
        ("succeeded", &Some(json!("z")))
    );

    // A watch from the start sees the job's changes.
    let page = worker
        .watch("jobs", Some(0), Duration::from_secs(5))
        .await
        .expect("a page");
    assert!(!page.changes.is_empty());

    // A bad request is rejected at once, not retried.
    let rejected = worker.claim("", Duration::from_secs(1)).await;
    assert!(rejected.is_err(), "{rejected:?}");
}

#[tokio::test]
async fn a_write_retried_under_one_request_id_applies_once_even_across_a_leader_kill() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let worker = client(&cluster, &[1, 2, 3], 9);
    let request = UpdateRequestJson::by(9).with_add(AddJson::in_group("once").with_data("x"));
    let id = worker.next_request_id();
    let first = worker
        .write_as(request.clone(), id.clone())
        .await
        .expect("added");
    let again = worker
        .write_as(request.clone(), id)
        .await
        .expect("replayed");
    assert_eq!(
        first, again,
        "the same request id answers the first outcome"
    );

    // Kill the leader: the client finds the next one and goes on.
    cluster.kill(leader);
    for i in 0..20 {
        worker
            .add("after-kill", &format!("t{i}"))
            .await
            .expect("added after the kill");
    }
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let reader = client(&cluster, &survivors, 10);
    let mut seen = 0;
    while reader
        .claim("after-kill", Duration::from_secs(60))
        .await
        .expect("answered")
        .is_some()
    {
        seen += 1;
    }
    assert_eq!(seen, 20, "every add applied exactly once");
    let lone = reader
        .claim("once", Duration::from_secs(60))
        .await
        .expect("answered");
    assert!(lone.is_some());
    assert!(
        reader
            .claim("once", Duration::from_secs(60))
            .await
            .expect("answered")
            .is_none()
    );
}

#[tokio::test]
async fn a_client_given_one_node_learns_the_others_and_outlives_it() {
    let cluster = TestCluster::start(3, "never");
    cluster.wait_leader(&[1, 2, 3]).await;
    let lonely = client(&cluster, &[1], 11);
    lonely
        .add("learn", "first")
        .await
        .expect("added through node 1");
    let mut known = lonely.known_nodes();
    known.sort();
    let mut all: Vec<String> = (1..=3).map(|id| cluster.api(id).to_string()).collect();
    all.sort();
    assert_eq!(known, all);
    cluster.kill(1);
    lonely
        .add("learn", "second")
        .await
        .expect("added through a member it learned of");
    let tasks = lonely
        .group_tasks("learn", false, false)
        .await
        .expect("listed");
    assert_eq!(tasks.len(), 2, "{tasks:?}");
}

#[tokio::test]
async fn a_client_whose_first_node_is_a_frozen_leader_finds_the_new_one_at_once() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    cluster.signal(leader, "STOP");
    let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    cluster.wait_leader(&others).await;
    let mut order = vec![leader];
    order.extend(&others);
    let client = WorkerClient::new(order.iter().map(|&id| cluster.api(id).to_string()), 13)
        .expect("a client");
    let started = std::time::Instant::now();
    let added = client.add("frozen", "x").await;
    let took = started.elapsed();
    cluster.signal(leader, "CONT");
    added.expect("added through the new leader");
    // One look at the frozen node (LEADER_LOOKUP_TIMEOUT), not a whole call on it.
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn a_lease_renews_itself_moves_its_fence_and_is_lost_when_cancelled() {
    use rpc::lease::Lease;
    use rpc::lease::LeaseLost;
    use std::sync::Arc;

    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    let worker = Arc::new(client(&cluster, &[1], 5));
    let other = client(&cluster, &[1], 6);
    let job = AddJson {
        key: Some("long".into()),
        ..AddJson::in_group("leases").with_data("work")
    };
    worker.add_task(job.clone()).await.expect("added");
    let lease_for = Duration::from_millis(1_500);
    let claimed_at = tokio::time::Instant::now();
    let task = worker
        .claim("leases", lease_for)
        .await
        .expect("answered")
        .expect("the job");
    let lease = Lease::hold(Arc::clone(&worker), task.clone(), lease_for, claimed_at);
    // Well past the first lease: renewals keep it, each with a new fencing id.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(lease.lost_reason().is_none(), "{:?}", lease.lost_reason());
    assert!(lease.fence() > task.id, "renewals wrote new versions");
    assert!(
        other
            .claim("leases", lease_for)
            .await
            .expect("answered")
            .is_none()
    );
    lease
        .finish(Some(json!({"done": true})))
        .await
        .expect("finished with the fence");
    let record = worker.job("leases", "long").await.expect("a record");
    assert_eq!((record.state.as_str(), record.attempts), ("succeeded", 1));

    // A cancel is seen by the next renewal: the lease is lost with the reason.
    let again = AddJson {
        key: Some("halted".into()),
        ..AddJson::in_group("leases").with_data("work")
    };
    worker.add_task(again).await.expect("added");
    let claimed_at = tokio::time::Instant::now();
    let task = worker
        .claim("leases", lease_for)
        .await
        .expect("answered")
        .expect("the job");
    let lease = Lease::hold(Arc::clone(&worker), task, lease_for, claimed_at);
    other
        .cancel("leases", &["halted"])
        .await
        .expect("cancelled");
    let lost = tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("lost within a renewal");
    let LeaseLost::Refused(reasons) = lost else {
        panic!("{lost:?}")
    };
    assert!(reasons.iter().any(|r| r.contains("cancel")), "{reasons:?}");
    assert!(
        lease.finish(None).await.is_err(),
        "a lost lease finishes nothing"
    );

    // A claim that waited most of a lease before its task came: the first renewal goes
    // out at once, and the lease holds.
    let late = AddJson {
        key: Some("late".into()),
        ..AddJson::in_group("leases").with_data("work")
    };
    worker.add_task(late).await.expect("added");
    let lease_for = Duration::from_secs(3);
    let task = worker
        .claim("leases", lease_for)
        .await
        .expect("answered")
        .expect("the job");
    let claimed_at = tokio::time::Instant::now() - Duration::from_millis(2_500);
    let lease = Lease::hold(Arc::clone(&worker), task.clone(), lease_for, claimed_at);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(lease.lost_reason().is_none(), "{:?}", lease.lost_reason());
    assert!(lease.fence() > task.id, "renewed at once");
    lease.finish(None).await.expect("finished");
}

#[tokio::test]
async fn a_lease_whose_claim_was_retried_past_its_length_is_renewed_not_dropped() {
    use rpc::lease::Lease;
    use rpc::lease::LeaseLost;
    use std::sync::Arc;

    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    let worker = Arc::new(client(&cluster, &[1], 12));
    let job = AddJson {
        key: Some("late".into()),
        max_attempts: Some(1),
        ..AddJson::in_group("late")
    };
    worker.add_task(job).await.expect("added");
    let lease_for = Duration::from_secs(3);
    let task = worker
        .claim("late", lease_for)
        .await
        .expect("answered")
        .expect("the job");
    // As if the claim had been sent ten seconds ago and retried through an outage
    // until it was granted just now: by the local reckoning its lease is long over.
    let claimed_at = tokio::time::Instant::now() - Duration::from_secs(10);
    let lease = Lease::hold(Arc::clone(&worker), task.clone(), lease_for, claimed_at);
    // Its work waits for the first renewal: the claim may have been granted long ago.
    let at_once = tokio::time::timeout(Duration::ZERO, lease.held()).await;
    assert!(at_once.is_err(), "not held before a renewal lands");
    tokio::time::timeout(Duration::from_secs(2), lease.held())
        .await
        .expect("held once renewed");
    assert!(lease.lost_reason().is_none(), "{:?}", lease.lost_reason());
    assert!(lease.fence() > task.id, "renewed at once");
    lease.finish(None).await.expect("finished with the fence");
    let record = worker.job("late", "late").await.expect("a record");
    assert_eq!((record.state.as_str(), record.attempts), ("succeeded", 1));

    // A claim answered in good time is held at once.
    worker
        .add_task(AddJson::in_group("late").with_data("prompt"))
        .await
        .expect("added");
    let claimed_at = tokio::time::Instant::now();
    let task = worker
        .claim("late", lease_for)
        .await
        .expect("answered")
        .expect("the task");
    let lease = Lease::hold(Arc::clone(&worker), task, lease_for, claimed_at);
    let at_once = tokio::time::timeout(Duration::ZERO, lease.held()).await;
    assert!(at_once.is_ok(), "held at once");
    lease.finish(None).await.expect("finished");

    // A late answer to a claim whose lease did lapse, and whose task another worker
    // took since: the renewal is refused, so the work never starts.
    let other = client(&cluster, &[1], 13);
    let job = AddJson {
        key: Some("taken".into()),
        ..AddJson::in_group("late")
    };
    worker.add_task(job).await.expect("added");
    let short = Duration::from_millis(1_000);
    let task = worker
        .claim("late", short)
        .await
        .expect("answered")
        .expect("the job");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    other
        .claim("late", lease_for)
        .await
        .expect("answered")
        .expect("the lapsed job, taken by another worker");
    let claimed_at = tokio::time::Instant::now() - Duration::from_secs(10);
    let lease = Lease::hold(Arc::clone(&worker), task, short, claimed_at);
    let lost = tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("lost at the first renewal");
    assert!(matches!(lost, LeaseLost::Refused(_)), "{lost:?}");
    let held = tokio::time::timeout(Duration::from_millis(200), lease.held()).await;
    assert!(held.is_err(), "a lost lease is never held");
}

#[tokio::test]
async fn run_worker_finishes_every_task_with_its_concurrency_and_stops_when_told() {
    use rpc::lease::WorkerOptions;
    use rpc::lease::run_worker;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering;

    let cluster = TestCluster::start(3, "never");
    cluster.wait_leader(&[1, 2, 3]).await;
    let producer = client(&cluster, &[1, 2, 3], 1);
    for i in 0..30 {
        let job = AddJson {
            key: Some(format!("t{i}")),
            ..AddJson::in_group("pool").with_data(format!("{i}"))
        };
        producer.add_task(job).await.expect("added");
    }
    let worker = Arc::new(client(&cluster, &[1, 2, 3], 2));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let options = WorkerOptions {
        concurrency: 4,
        lease: Duration::from_secs(10),
        wait: Duration::from_secs(1),
        ..WorkerOptions::new("pool")
    };
    let stats = Arc::clone(&options.stats);
    let loop_running = {
        let (running, most) = (Arc::clone(&running), Arc::clone(&most));
        tokio::spawn(run_worker(worker, options, stopped, move |lease| {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                let n: u64 = lease.task().data.parse().map_err(|e| format!("{e}"))?;
                Ok(Some(json!({ "square": n * n })))
            }
        }))
    };
    let keys: Vec<String> = (0..30).map(|i| format!("t{i}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut done = producer
        .wait_jobs("pool", &key_refs, Duration::from_secs(30))
        .await
        .expect("answered");
    if !done.finished {
        done = producer
            .wait_jobs("pool", &key_refs, Duration::from_secs(30))
            .await
            .expect("answered");
    }
    assert!(done.finished, "{done:?}");
    assert!(
        done.jobs
            .iter()
            .all(|j| j.state == "succeeded" && j.attempts == 1)
    );
    stop.send(true).expect("the loop listens");
    let finished = tokio::time::timeout(Duration::from_secs(10), loop_running)
        .await
        .expect("the loop stops")
        .expect("joined");
    assert_eq!(finished, 30);
    // Most tasks came with the finish of the one before, in the same write.
    let sent = rpc::lease::WorkerStats::get(&stats.claims_sent);
    assert!(sent < 20, "{sent} claim requests for 30 tasks");
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=4).contains(&most),
        "ran {most} at once, over the concurrency of 4"
    );
}

#[tokio::test]
async fn run_worker_tells_of_failures_lost_leases_and_an_unreachable_cluster_once() {
    use rpc::lease::EventHook;
    use rpc::lease::LeaseLost;
    use rpc::lease::WorkerEvent;
    use rpc::lease::WorkerOptions;
    use rpc::lease::WorkerStats;
    use rpc::lease::run_worker;
    use std::sync::Arc;
    use std::sync::Mutex;

    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    let producer = client(&cluster, &[1], 1);
    for key in ["fails", "held"] {
        let job = AddJson {
            key: Some(key.into()),
            max_attempts: Some(1),
            ..AddJson::in_group("told")
        };
        producer.add_task(job).await.expect("added");
    }
    let worker = client(&cluster, &[1], 2)
        .with_timeouts(Duration::from_millis(300), Duration::from_millis(500));
    let events: Arc<Mutex<Vec<(String, WorkerEvent)>>> = Arc::default();
    let told = Arc::clone(&events);
    let options = WorkerOptions {
        concurrency: 3,
        lease: Duration::from_secs(3),
        wait: Duration::from_millis(500),
        events: EventHook::new(move |group, event| {
            told.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((group.to_string(), event.clone()));
        }),
        ..WorkerOptions::new("told")
    };
    let stats = Arc::clone(&options.stats);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(run_worker(
        Arc::new(worker),
        options,
        stopped,
        |lease| async move {
            match lease.task().key.as_deref() {
                Some("fails") => Err("boom\nmore detail".to_string()),
                _ => std::future::pending().await,
            }
        },
    ));
    let seen = |pick: &dyn Fn(&WorkerEvent) -> bool| {
        events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(group, event)| group == "told" && pick(event))
            .count()
    };
    let key_is = |task: &rpc::lease::ClaimedTask, key: &str| task.key.as_deref() == Some(key);
    let told_of = |what: &str, n: usize| {
        let all = format!("{:?}", events.lock().unwrap_or_else(|p| p.into_inner()));
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{what} told {n} times: {all}"))
        }
    };
    common::eventually(|| async {
        let failed = seen(&|e| {
            matches!(e, WorkerEvent::WorkFailed { task, error } if key_is(task, "fails") && error == "boom")
        });
        told_of("the failure", failed)
    })
    .await;
    common::eventually(|| async {
        let state = producer.job("told", "held").await.map(|j| j.state);
        match state {
            Ok(state) if state == "running" => Ok(()),
            other => Err(format!("held: {other:?}")),
        }
    })
    .await;
    producer.cancel("told", &["held"]).await.expect("cancelled");
    common::eventually(|| async {
        let lost = seen(&|e| {
            matches!(e, WorkerEvent::LeaseLost { task, reason: LeaseLost::Refused(_) } if key_is(task, "held"))
        });
        told_of("the lost lease", lost)
    })
    .await;

    // Three slots failing over and over are told of once, then their recovery once.
    cluster.kill(1);
    common::eventually(|| async {
        let errors = WorkerStats::get(&stats.claim_errors);
        if errors >= 6 {
            Ok(())
        } else {
            Err(format!("{errors} claim errors"))
        }
    })
    .await;
    assert_eq!(
        seen(&|e| matches!(e, WorkerEvent::ClaimsFailing { failures: 1, .. })),
        1
    );
    assert_eq!(seen(&|e| matches!(e, WorkerEvent::ClaimsFailing { .. })), 1);
    cluster.start_node(1);
    common::eventually(|| async {
        let recovered =
            seen(&|e| matches!(e, WorkerEvent::ClaimsRecovered { failures } if *failures >= 6));
        told_of("the recovery", recovered)
    })
    .await;
    stop.send(true).expect("the loop listens");
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the loop stops")
        .expect("joined");
    assert_eq!(
        seen(&|e| matches!(e, WorkerEvent::ClaimsRecovered { .. })),
        1
    );
    let text = WorkerEvent::WorkFailed {
        task: rpc::lease::ClaimedTask {
            id: 7,
            key: Some("fails".into()),
        },
        error: "boom".into(),
    }
    .to_string();
    assert_eq!(text, "task 7 (key \"fails\") failed: boom");
}

/// Established TCP connections of this machine whose far end is `addr` (`host:port`):
/// the test process's own, since nodes reach each other's API ports only to relay.
fn connections_to(addr: &str) -> usize {
    let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let port = format!("{:04X}", port.expect("a port"));
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|row| {
            let fields: Vec<&str> = row.split_whitespace().collect();
            fields.len() > 3 && fields[2].ends_with(&format!(":{port}")) && fields[3] == "01"
        })
        .count()
}

#[tokio::test]
async fn workers_sharing_one_http2_connection_each_get_their_own_tasks() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    // The leader only: through a follower, the relays' own connections would count too.
    let first = client(&cluster, &[leader], 100).with_http2(true);
    let mut workers: Vec<WorkerClient> = (1..16)
        .map(|i| client(&cluster, &[leader], 100 + i).sharing_connections_of(&first))
        .collect();
    workers.push(first);
    let workers = std::sync::Arc::new(workers);
    // The harness's own (HTTP/1.1) connections, which the workers do not use.
    let before = connections_to(cluster.api(leader));

    // Every worker adds, claims and deletes ten tasks, all at once over the shared
    // connection: each claim gets a task no other worker holds.
    let rounds = (0..workers.len()).map(|i| {
        let workers = workers.clone();
        tokio::spawn(async move {
            let worker = &workers[i];
            let mut claimed = Vec::new();
            for n in 0..10 {
                worker
                    .add("shared", &format!("{i}-{n}"))
                    .await
                    .expect("added");
                let task = worker
                    .claim("shared", Duration::from_secs(60))
                    .await
                    .expect("answered")
                    .expect("a task");
                assert_eq!(task.ownerid, worker.client_id());
                claimed.push(task.data.clone());
                worker.delete(task.id).await.expect("deleted");
            }
            claimed
        })
    });
    let mut all = Vec::new();
    for round in rounds {
        all.extend(round.await.expect("a worker"));
    }
    let after = connections_to(cluster.api(leader));
    assert!(
        after <= before + 1,
        "sixteen workers wrote to the leader over one HTTP/2 connection: {before} connections before, {after} after"
    );
    all.sort();
    let claims = all.len();
    all.dedup();
    assert_eq!((claims, all.len()), (160, 160), "no task claimed twice");
    let left: Vec<serde_json::Value> = cluster
        .get_json(leader, "/group/shared")
        .await
        .expect("the group");
    assert!(left.is_empty(), "every task was deleted: {left:?}");
}

/// A rolling upgrade's cluster, where the leader takes no finish with `next` (here a
/// learner it never heard from): `finish_and_claim` finishes and then claims, two
/// writes, and the task it finished is done, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_and_claim_sends_its_parts_apart_where_next_is_not_taken() {
    let cluster = TestCluster::start(3, "never").with_joiner(4);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let node4 = &cluster.nodes[3];
    let learner = json!({"id": 4, "api_addr": node4.api_addr, "raft_addr": node4.raft_addr});
    cluster
        .client
        .post_json(
            cluster.api(leader),
            "/admin/add-learner",
            &learner,
            common::CALL_TIMEOUT,
        )
        .await
        .and_then(|answer| answer.success(cluster.api(leader)))
        .expect("learner added");
    let worker = client(&cluster, &[1, 2, 3], 7);
    for key in ["a", "b"] {
        let job = AddJson {
            key: Some(key.into()),
            ..AddJson::in_group("up")
        };
        worker.add_task(job).await.expect("added");
    }
    let lease = Duration::from_secs(60);
    let a = worker
        .claim("up", lease)
        .await
        .expect("answered")
        .expect("a");
    let next = worker
        .finish_and_claim(a.id, Some(json!(1)), "up", lease, 1)
        .await
        .expect("finished and claimed apart");
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0].key.as_deref(), Some("b"));
    let a_job = worker.job("up", "a").await.expect("a's record");
    assert_eq!(a_job.state, "succeeded", "{a_job:?}");
    let none = worker
        .finish_and_claim(next[0].id, None, "up", lease, 1)
        .await
        .expect("finished");
    assert!(none.is_empty(), "{none:?}");
    let b_job = worker.job("up", "b").await.expect("b's record");
    assert_eq!(b_job.state, "succeeded", "{b_job:?}");
}
