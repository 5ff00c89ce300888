//! Integration tests with real `rota-node` processes on 127.0.0.1.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use common::TestCluster;
use common::eventually;
use rpc::worker::WriteResultJson;
use serde_json::json;

fn tasks(result: WriteResultJson) -> Vec<rpc::worker::TaskJson> {
    match result {
        WriteResultJson::Tasks { tasks } => tasks,
        WriteResultJson::Errors { errors } => panic!("refused: {errors:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_and_serve_through_every_node() {
    let cluster = TestCluster::start(3, "always");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;

    // A write through every node, followers forwarding to the leader.
    let mut ids = Vec::new();
    for id in 1..=3 {
        let added = cluster
            .write(id, "/update", &json!({"clientid": 10 + id, "adds": [{"group": "g", "data": format!("via {id}")}]}))
            .await
            .expect("write accepted");
        ids.extend(tasks(added).into_iter().map(|t| t.id));
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");

    // Linearizable reads from every node see every acknowledged write.
    for id in 1..=3 {
        let response = cluster
            .client
            .get(cluster.api(id), "/group/g", common::CALL_TIMEOUT)
            .await
            .expect("read");
        let listed: Vec<rpc::worker::TaskJson> = response.json(cluster.api(id)).expect("json");
        assert_eq!(
            listed.iter().map(|t| t.id).collect::<Vec<_>>(),
            ids,
            "read via node {id}"
        );
    }

    // A claim through a follower, then the stale owner is fenced off.
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let claimed = tasks(
        cluster
            .write(
                follower,
                "/claim",
                &json!({"clientid": 99, "group": "g", "duration": 60_000}),
            )
            .await
            .expect("claim"),
    );
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, ids[2] + 1, "claims make a new version");
    let stale = cluster
        .write(
            leader,
            "/update",
            &json!({"clientid": 99, "deletes": [ids[0]]}),
        )
        .await
        .expect("processed");
    assert_eq!(
        stale,
        WriteResultJson::Errors {
            errors: vec![format!("deletes: task {} does not exist", ids[0])]
        },
        "the claimed task's old id is gone"
    );

    // Status from any node names the same leader and members.
    for id in 1..=3 {
        let status = cluster.status(id).await.expect("status");
        assert_eq!(status.leader, Some(leader));
        assert_eq!(status.voters, vec![1, 2, 3]);
    }
    // The leader records the members' log form once it heard from all of them, a write
    // of its own at a moment of its choosing: the two backups below must see one state.
    cluster.wait_log_form_recorded(leader).await;
    cluster.wait_converged(&[1, 2, 3]).await;

    // A backup through a follower holds every acknowledged write and says its hash.
    let backup = cluster
        .client
        .get(cluster.api(follower), "/admin/backup", common::CALL_TIMEOUT)
        .await
        .expect("backup")
        .success(cluster.api(follower))
        .expect("200");
    let machine = store_sm::snapshot::decode_snapshot(&backup.body).expect("a valid snapshot");
    assert_eq!(machine.group_len("g"), 3);
    let hash = backup
        .headers
        .get(rpc::admin::BACKUP_HASH_HEADER)
        .expect("hash header");
    assert_eq!(
        hash.to_str().expect("ascii"),
        store_sm::snapshot::state_hash(&machine).to_string()
    );

    // Downloaded piece by piece into a sink (as `rota cluster backup` writes a file),
    // the same bytes; over the caller's limit, an error, not a truncated backup.
    let mut streamed = Vec::new();
    let download = cluster
        .client
        .download(
            cluster.api(follower),
            "/admin/backup",
            common::CALL_TIMEOUT,
            backup.body.len() as u64,
            &mut |bytes: &[u8]| {
                streamed.extend_from_slice(bytes);
                Ok(())
            },
        )
        .await
        .expect("downloaded");
    assert!(download.status.is_success());
    assert_eq!(download.bytes, backup.body.len() as u64);
    assert_eq!(streamed, backup.body);
    let too_small = cluster
        .client
        .download(
            cluster.api(follower),
            "/admin/backup",
            common::CALL_TIMEOUT,
            backup.body.len() as u64 - 1,
            &mut |_: &[u8]| Ok(()),
        )
        .await;
    assert!(
        too_small
            .expect_err("over the limit")
            .to_string()
            .contains("larger than"),
    );

    // Prometheus metrics name the role, count the log's appends and the requests served.
    let metrics = cluster
        .client
        .get(cluster.api(leader), "/metrics", common::CALL_TIMEOUT)
        .await
        .expect("metrics");
    let text = String::from_utf8_lossy(&metrics.body);
    for expected in [
        "rota_role{role=\"leader\"} 1",
        "rota_group_tasks{group=\"g\"} 3",
        "rota_http_requests_total{endpoint=\"POST /update\",status=\"200\"}",
        "rota_log_sync_seconds_count",
    ] {
        assert!(
            text.contains(expected),
            "metrics lack {expected:?}:\n{text}"
        );
    }
    // The leader timed the appends that carried the writes above to its followers.
    let appends_timed = text
        .lines()
        .find_map(|line| line.strip_prefix("rota_raft_append_seconds_count "))
        .and_then(|count| count.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no rota_raft_append_seconds_count in:\n{text}"));
    assert!(appends_timed > 0, "no append timed:\n{text}");
    // ...through one replication stream per follower at least, not a request each.
    let streams = text
        .lines()
        .find_map(|line| line.strip_prefix("rota_raft_append_streams_total "))
        .and_then(|count| count.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no rota_raft_append_streams_total in:\n{text}"));
    assert!(streams >= 2, "{streams} replication streams:\n{text}");
}

/// What one worker saw acknowledged.
#[derive(Default, Debug)]
struct WorkerLog {
    added: Vec<u64>,
    claimed: Vec<(u64, u64)>,
    deleted: Vec<u64>,
    ids: Vec<u64>,
    /// The longest any of its writes took, retries included.
    slowest: Duration,
}

/// Sends a write with a fixed request id until some node processes it; a retry of the
/// same request id returns the first outcome, so an acknowledged write applied once.
/// Answers the outcome and how long it took to get.
async fn write_until_processed(
    cluster: &TestCluster,
    start: u64,
    path: &str,
    body: serde_json::Value,
) -> Option<(WriteResultJson, Duration)> {
    let started = Instant::now();
    let deadline = started + common::WAIT_MAX;
    let mut target = start;
    while Instant::now() < deadline {
        match cluster.write(target, path, &body).await {
            Ok(result) => return Some((result, started.elapsed())),
            Err(_) => {
                target = target % cluster.nodes.len() as u64 + 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    None
}

async fn worker(cluster: Arc<TestCluster>, worker: u64, stop: Arc<AtomicBool>) -> WorkerLog {
    let mut log = WorkerLog::default();
    let group = format!("w{worker}");
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let node = (n + worker) % 3 + 1;
        let rid = |step: &str| format!("worker{worker}-{n}-{step}");
        let Some((added, took)) = write_until_processed(&cluster, node, "/update", json!({
            "clientid": worker, "adds": [{"group": group, "data": format!("{n}")}], "requestid": rid("add")
        }))
        .await
        else {
            break;
        };
        log.slowest = log.slowest.max(took);
        let [added] = tasks(added).try_into().expect("one added task");
        log.added.push(added.id);
        log.ids.push(added.id);
        let Some((claimed, took)) = write_until_processed(
            &cluster,
            node,
            "/claim",
            json!({
                "clientid": worker, "group": group, "duration": 60_000, "requestid": rid("claim")
            }),
        )
        .await
        else {
            break;
        };
        log.slowest = log.slowest.max(took);
        let [claimed] = tasks(claimed)
            .try_into()
            .expect("the worker's own task is claimable");
        assert_eq!(
            claimed.data,
            format!("{n}"),
            "a claim returns the task that was added"
        );
        log.claimed.push((added.id, claimed.id));
        log.ids.push(claimed.id);
        let Some((deleted, took)) = write_until_processed(
            &cluster,
            node,
            "/update",
            json!({
                "clientid": worker, "deletes": [claimed.id], "requestid": rid("delete")
            }),
        )
        .await
        else {
            break;
        };
        log.slowest = log.slowest.max(took);
        assert_eq!(tasks(deleted), vec![], "the owner deletes its claimed task");
        log.deleted.push(claimed.id);
    }
    log
}

/// What every worker's acknowledged writes must have left, read through node `via`: ids
/// unique across every answer, each claim a newer version of the task added, deleted
/// versions gone, and what a worker added and did not finish still there as acknowledged.
async fn assert_no_acknowledged_write_lost(cluster: &TestCluster, via: u64, logs: &[WorkerLog]) {
    // Ids unique across every acknowledged answer.
    let all_ids: Vec<u64> = logs.iter().flat_map(|l| l.ids.iter().copied()).collect();
    let unique: BTreeSet<u64> = all_ids.iter().copied().collect();
    assert_eq!(unique.len(), all_ids.len(), "an id was issued twice");

    // No acknowledged write lost: deleted versions are gone; what each worker added and
    // did not finish is still there, owned as acknowledged.
    for (w, log) in logs.iter().enumerate() {
        for &(added, claimed) in &log.claimed {
            assert!(
                claimed > added,
                "worker {w}: claim {claimed} of {added} is a newer version"
            );
        }
        let group = format!("w{}", w + 1);
        let response = cluster
            .client
            .get(
                cluster.api(via),
                &format!("/group/{group}?owned=1"),
                common::CALL_TIMEOUT,
            )
            .await
            .expect("read");
        let live: Vec<u64> = response
            .json::<Vec<rpc::worker::TaskJson>>(cluster.api(via))
            .expect("json")
            .iter()
            .map(|t| t.id)
            .collect();
        let expected: Vec<u64> = match (log.added.last(), log.claimed.last(), log.deleted.last()) {
            (Some(&a), Some(&(ca, c)), Some(&d)) if ca == a && d == c => vec![],
            (Some(&a), Some(&(ca, c)), _) if ca == a => vec![c],
            (Some(&a), _, _) => vec![a],
            (None, _, _) => vec![],
        };
        assert_eq!(
            live,
            expected,
            "worker {}: live tasks after {:?}",
            w + 1,
            log
        );
    }
    let acked: usize = logs
        .iter()
        .map(|l| l.added.len() + l.claimed.len() + l.deleted.len())
        .sum();
    eprintln!(
        "checked {acked} acknowledged writes from {} workers",
        logs.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_of_the_leader_under_load_loses_no_acknowledged_write() {
    let cluster = Arc::new(TestCluster::start(3, "always"));
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (1..=4)
        .map(|w| tokio::spawn(worker(cluster.clone(), w, stop.clone())))
        .collect();
    // Let the workers get going, judged by progress in the log, not by time.
    let deadline = Instant::now() + common::WAIT_MAX;
    while cluster
        .status(leader)
        .await
        .and_then(|s| s.applied_index)
        .unwrap_or(0)
        < 40
    {
        assert!(Instant::now() < deadline, "workers made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // kill -9 the leader while the workers run; time the first write a survivor accepts.
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    cluster.kill(leader);
    let killed_at = Instant::now();
    let mut probe = 0;
    loop {
        probe += 1;
        let target = survivors[probe % survivors.len()];
        let body = json!({"clientid": 1000, "adds": [{"group": "probe"}], "requestid": format!("probe-{probe}")});
        if cluster.write(target, "/update", &body).await.is_ok() {
            break;
        }
        assert!(
            killed_at.elapsed() < common::WAIT_MAX,
            "no write succeeded after the leader died"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let failover = killed_at.elapsed();
    eprintln!("failover: first write accepted {failover:?} after kill -9 of leader {leader}");

    // Keep the load on under the new leader for a while, measured in applied entries.
    let new_leader = cluster.wait_leader(&survivors).await;
    let resume_from = cluster
        .status(new_leader)
        .await
        .and_then(|s| s.applied_index)
        .unwrap_or(0);
    while cluster
        .status(new_leader)
        .await
        .and_then(|s| s.applied_index)
        .unwrap_or(0)
        < resume_from + 40
    {
        assert!(
            Instant::now() < deadline + common::WAIT_MAX,
            "no progress under the new leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut logs = Vec::new();
    for handle in workers {
        logs.push(handle.await.expect("worker finished"));
    }

    assert_no_acknowledged_write_lost(&cluster, new_leader, &logs).await;

    // The killed node restarts with its original command line and catches up.
    cluster.start_node(leader);
    cluster.wait_ready(&[1, 2, 3]).await;
    let converged = cluster.wait_converged(&[1, 2, 3]).await;
    eprintln!(
        "converged at index {:?}: {}",
        converged.applied_index, converged.state_hash
    );
}

/// Issue 17's snapshot test: snapshots forced on every node every few hundred
/// milliseconds while workers add, claim and delete through every node. Every write is
/// acknowledged and none is lost, every node compacts its log behind several snapshots,
/// and the nodes converge. The longest write is printed, not asserted: timing belongs to
/// `scripts/bench-tail`, which measures it under a heavier load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_forced_under_load_lose_no_acknowledged_write() {
    // Few entries kept behind a snapshot, so that every snapshot also purges the log.
    let cluster = Arc::new(TestCluster::start_with(
        3,
        "always",
        &["--logs-kept-after-snapshot=50"],
    ));
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    // Tasks for every snapshot to write, so that a build takes a while.
    for batch in 0..20 {
        let adds: Vec<_> = (0..1000)
            .map(|i| json!({"group": "held", "data": format!("{batch}-{i}-{}", "x".repeat(64))}))
            .collect();
        let body = json!({"clientid": 9, "adds": adds});
        tasks(
            cluster
                .write(leader, "/update", &body)
                .await
                .expect("preload"),
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (1..=4)
        .map(|w| tokio::spawn(worker(cluster.clone(), w, stop.clone())))
        .collect();
    // Until every node has built six snapshots, each of more entries than the last.
    let mut snapshots: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); 3];
    let deadline = Instant::now() + common::WAIT_MAX;
    while snapshots.iter().any(|built| built.len() < 6) {
        assert!(
            Instant::now() < deadline,
            "snapshots built under load: {snapshots:?}"
        );
        for id in 1..=3 {
            let status = admin(&cluster, id, "/admin/snapshot", json!({})).await;
            snapshots[id as usize - 1].extend(status.snapshot_index);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut logs = Vec::new();
    for handle in workers {
        logs.push(handle.await.expect("worker finished"));
    }
    assert!(
        logs.iter().all(|log| log.deleted.len() >= 5),
        "every worker went on working: {logs:?}"
    );
    assert_no_acknowledged_write_lost(&cluster, leader, &logs).await;
    for id in 1..=3 {
        let status = cluster.status(id).await.expect("status");
        assert!(
            status.purged_index.is_some_and(|purged| purged > 0),
            "node {id} compacted its log: {status:?}"
        );
    }
    let converged = cluster.wait_converged(&[1, 2, 3]).await;
    let slowest = logs.iter().map(|log| log.slowest).max().unwrap_or_default();
    eprintln!(
        "snapshots per node {:?}; converged at index {:?}; the slowest write took {slowest:?}",
        snapshots.iter().map(BTreeSet::len).collect::<Vec<_>>(),
        converged.applied_index,
    );
}

/// `GET /ready` and the `rota_ready` gauge of a node.
async fn readiness(cluster: &TestCluster, id: u64) -> (u16, String, bool) {
    let ready = cluster
        .client
        .get(cluster.api(id), "/ready", common::CALL_TIMEOUT)
        .await
        .expect("/ready answered");
    let metrics = cluster
        .client
        .get(cluster.api(id), "/metrics", common::CALL_TIMEOUT)
        .await
        .expect("/metrics answered");
    let gauge = String::from_utf8_lossy(&metrics.body)
        .lines()
        .any(|line| line == "rota_ready 1");
    (
        ready.status.as_u16(),
        String::from_utf8_lossy(&ready.body).into_owned(),
        gauge,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_quorum_is_not_ready_until_it_hears_from_one_again() {
    let cluster = TestCluster::start(3, "never");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    assert_eq!(readiness(&cluster, leader).await.0, 200);
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    for &id in &followers {
        cluster.signal(id, "STOP");
    }
    // Still the leader by its own metrics, but no longer able to serve: not ready.
    eventually(|| async {
        match readiness(&cluster, leader).await {
            (503, body, false) if body.contains("no quorum has answered") => Ok(()),
            other => Err(format!("the cut-off leader still looks ready: {other:?}")),
        }
    })
    .await;
    for &id in &followers {
        cluster.signal(id, "CONT");
    }
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    assert!(matches!(readiness(&cluster, leader).await, (200, _, true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_restarts_cleanly() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    // A lone voter is its own quorum: it stays ready with nobody to answer it, past any
    // lease (the default longest election timeout is 600 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(readiness(&cluster, 1).await, (200, _, true)));
    let added = tasks(
        cluster
            .write(
                1,
                "/update",
                &json!({"clientid": 1, "adds": [{"group": "solo", "data": "kept"}]}),
            )
            .await
            .expect("write"),
    );
    let before = cluster.wait_converged(&[1]).await;
    cluster.kill(1);
    cluster.start_node(1);
    cluster.wait_ready(&[1]).await;
    let after = cluster.wait_converged(&[1]).await;
    assert_eq!(
        after.state_hash, before.state_hash,
        "same state after restart"
    );
    let task = cluster
        .client
        .get(
            cluster.api(1),
            &format!("/task/{}", added[0].id),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("read");
    assert!(task.status.is_success(), "the task survived the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_a_compacted_log_catches_up_by_snapshot() {
    // Keep no log behind a snapshot, so a follower that missed entries needs one.
    let cluster = TestCluster::start_with(3, "always", &["--logs-kept-after-snapshot", "0"]);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    // Its one entry lands before the log is compacted, not after.
    cluster.wait_log_form_recorded(leader).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    cluster.kill(follower);

    for i in 0..50 {
        let adds: Vec<_> = (0..20)
            .map(|j| json!({"group": format!("g{}", j % 3), "data": format!("{i}-{j}")}))
            .collect();
        tasks(
            cluster
                .write(leader, "/update", &json!({"clientid": 5, "adds": adds}))
                .await
                .expect("write"),
        );
    }
    let response = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/admin/snapshot",
            &json!({}),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("snapshot triggered");
    assert!(response.status.is_success());
    let deadline = Instant::now() + common::WAIT_MAX;
    loop {
        let status = cluster.status(leader).await.expect("status");
        if status.purged_index.is_some() && status.purged_index >= status.applied_index {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never purged its log: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    cluster.start_node(follower);
    cluster.wait_ready(&[1, 2, 3]).await;
    let converged = cluster.wait_converged(&[1, 2, 3]).await;
    assert_eq!(converged.tasks, 1000);
    let log = std::fs::read_to_string(cluster.log_path(follower)).expect("log");
    assert!(
        log.contains("snapshot installed"),
        "the follower caught up by snapshot"
    );
}

/// Writes `batches` updates of 20 tasks with `bytes`-byte payloads through `leader`.
async fn fill(cluster: &TestCluster, leader: u64, batches: usize, bytes: usize) {
    for i in 0..batches {
        let adds: Vec<_> = (0..20)
            .map(|j| json!({"group": "big", "data": format!("{i}-{j}-{}", "x".repeat(bytes))}))
            .collect();
        tasks(
            cluster
                .write(leader, "/update", &json!({"clientid": 5, "adds": adds}))
                .await
                .expect("write"),
        );
    }
}

/// Snapshots the leader and waits until its log is purged behind the snapshot.
async fn snapshot_and_purge(cluster: &TestCluster, leader: u64) {
    admin(cluster, leader, "/admin/snapshot", json!({})).await;
    eventually(|| async {
        let status = cluster.status(leader).await.ok_or("no status")?;
        if status.purged_index.is_some() && status.purged_index >= status.applied_index {
            Ok(())
        } else {
            Err(format!("the leader has not purged its log: {status:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_stream_through_disk_within_one_limit_shared_with_restore() {
    // 256 KiB: small, so the test is fast; the snapshot path never gathers a body in
    // memory, so only this limit (not the Raft message limit) bounds it.
    const LIMIT: usize = 256 * 1024;
    let limit = LIMIT.to_string();
    let cluster = TestCluster::start_with(
        3,
        "always",
        &[
            "--logs-kept-after-snapshot",
            "0",
            "--snapshot-max-bytes",
            &limit,
        ],
    )
    .with_joiner(4);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    // Its one entry lands before the log is compacted, not after.
    cluster.wait_log_form_recorded(leader).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");

    // Under the limit (about 150 KiB): the follower catches up by a streamed snapshot.
    cluster.kill(follower);
    fill(&cluster, leader, 30, 200).await;
    snapshot_and_purge(&cluster, leader).await;
    let backup = cluster
        .client
        .get(cluster.api(leader), "/admin/backup", common::CALL_TIMEOUT)
        .await
        .expect("backup");
    let size = backup.body.len();
    assert!(
        (LIMIT / 2..LIMIT).contains(&size),
        "a snapshot of {size} bytes, under the limit"
    );
    cluster.start_node(follower);
    let converged = cluster.wait_converged(&[1, 2, 3]).await;
    assert_eq!(converged.tasks, 600);
    let log = std::fs::read_to_string(cluster.log_path(follower)).expect("log");
    assert!(log.contains("snapshot installed"), "caught up by snapshot");
    let snapshots = cluster.data_dir(follower).join("snapshots");
    let leftovers: Vec<_> = std::fs::read_dir(&snapshots)
        .expect("snapshot directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("incoming"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "spool files left behind: {leftovers:?}"
    );

    // Over the limit: the follower refuses it (413), stays behind, and the rest serve.
    cluster.kill(follower);
    fill(&cluster, leader, 40, 200).await;
    snapshot_and_purge(&cluster, leader).await;
    cluster.start_node(follower);
    eventually(|| async {
        let log = std::fs::read_to_string(cluster.log_path(follower)).map_err(|e| e.to_string())?;
        if log.contains(&format!("snapshot larger than the limit of {LIMIT} bytes")) {
            Ok(())
        } else {
            let snapshot_lines: Vec<&str> = log.lines().filter(|l| l.contains("napshot")).collect();
            Err(format!(
                "the follower has not refused the snapshot: {:?}",
                &snapshot_lines[snapshot_lines.len().saturating_sub(6)..]
            ))
        }
    })
    .await;
    let behind = cluster
        .status(follower)
        .await
        .expect("the follower answers");
    let ahead = cluster.status(leader).await.expect("the leader answers");
    assert!(
        behind.applied_index < ahead.applied_index,
        "the follower did not install a snapshot over the limit"
    );
    let write = cluster
        .write(
            leader,
            "/update",
            &json!({"clientid": 6, "adds": [{"group": "g", "data": "x"}]}),
        )
        .await;
    assert!(write.is_ok(), "a majority still serves");

    // The same limit bounds a restore: a body over it is refused before it is decoded,
    // and the empty node stays empty.
    start_empty(&cluster, 4).await;
    for (body, status, says) in [
        (vec![7u8; LIMIT + 1], 413, "larger than"),
        (vec![7u8; 1000], 400, "not a usable backup"),
    ] {
        let response = restore_alone(&cluster, 4, body).await;
        assert_eq!(response.status.as_u16(), status);
        let text = String::from_utf8_lossy(&response.body);
        assert!(text.contains(says), "{text}");
    }
    let empty = cluster.status(4).await.expect("node 4 answers");
    assert!(
        empty.voters.is_empty() && empty.applied_index.is_none(),
        "{empty:?}"
    );
}

async fn admin(
    cluster: &TestCluster,
    via: u64,
    path: &str,
    body: serde_json::Value,
) -> rpc::admin::ClusterStatusJson {
    let response = cluster
        .client
        .post_json(cluster.api(via), path, &body, common::CALL_TIMEOUT)
        .await
        .expect("admin call answered")
        .success(cluster.api(via))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    response.json(cluster.api(via)).expect("status json")
}

/// Log time across an idle spell and a new leader that joined after it: the new leader
/// continues the cluster's time, not the time of the last command it applied (found from
/// outside: 20 s behind the wall clock after 20 s of idle, and closing at 1%).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_that_joined_after_an_idle_spell_keeps_the_clusters_time() {
    let cluster = TestCluster::start(3, "never").with_joiner(4);
    cluster.start_node(4);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let body = json!({"clientid": 1, "adds": [{"group": "clock", "data": "before"}]});
    tasks(
        cluster
            .write(leader, "/update", &body)
            .await
            .expect("write"),
    );
    let idle = Duration::from_secs(6);
    tokio::time::sleep(idle).await;

    let node4 = &cluster.nodes[3];
    admin(
        &cluster,
        leader,
        "/admin/add-learner",
        json!({"id": 4, "api_addr": node4.api_addr, "raft_addr": node4.raft_addr}),
    )
    .await;
    eventually(|| async {
        let status = cluster.status(leader).await.ok_or("no status")?;
        match status.nodes.iter().find(|n| n.id == 4).and_then(|n| n.lag) {
            Some(0) => Ok(()),
            lag => Err(format!("node 4 not caught up: lag {lag:?}")),
        }
    })
    .await;
    admin(&cluster, leader, "/admin/promote", json!({"id": 4})).await;
    admin(&cluster, leader, "/admin/transfer-leader", json!({"id": 4})).await;
    eventually(|| async {
        match cluster.wait_leader(&[1, 2, 3, 4]).await {
            4 => Ok(()),
            other => Err(format!("node {other} still leads")),
        }
    })
    .await;

    let wall_before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let body = json!({"clientid": 1, "adds": [{"group": "clock", "data": "after"}]});
    let added = tasks(cluster.write(4, "/update", &body).await.expect("write"));
    let behind = wall_before - added[0].timespec;
    assert!(
        behind < (idle / 3).as_millis() as i64,
        "the new leader's log time is {behind} ms behind the wall clock after {idle:?} idle"
    );
}

/// A learner registered with another member's Raft address: that member refuses the
/// messages meant for the learner (found from outside: it answered them, and the learner
/// promoted counted twice toward every majority), the learner's lag stays unknown, and
/// promotion is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_at_another_nodes_raft_address_is_refused_or_not_answered_for() {
    let cluster = TestCluster::start(3, "always")
        .with_joiner(4)
        .with_joiner(5);
    cluster.start_node(4);
    cluster.start_node(5);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    // A member's address: refused before anything is written.
    let members_addr = cluster.nodes[follower as usize - 1].raft_addr.clone();
    let refused = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/admin/add-learner",
            &json!({"id": 4, "api_addr": cluster.nodes[3].api_addr, "raft_addr": members_addr}),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("answered");
    assert_eq!(refused.status.as_u16(), 409, "{:?}", refused.body);
    let message = String::from_utf8_lossy(&refused.body).into_owned();
    assert!(
        message.contains(&format!("address {members_addr} is node {follower}'s")),
        "{message}"
    );
    // The address of a node that is no member (node 5, started alone): Raft traffic
    // for node 4 reaches it, and it does not answer for node 4.
    let wrong_raft_addr = cluster.nodes[4].raft_addr.clone();
    let status = admin(
        &cluster,
        leader,
        "/admin/add-learner",
        json!({"id": 4, "api_addr": cluster.nodes[3].api_addr, "raft_addr": wrong_raft_addr}),
    )
    .await;
    assert_eq!(status.learners, vec![4]);
    for i in 0..5 {
        let body = json!({"clientid": 1, "adds": [{"group": "typo", "data": format!("{i}")}]});
        tasks(
            cluster
                .write(leader, "/update", &body)
                .await
                .expect("write"),
        );
    }
    // Heartbeats and appends have had time to reach "node 4" many times over.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = cluster.status(leader).await.expect("status");
    let learner = status
        .nodes
        .iter()
        .find(|n| n.id == 4)
        .expect("node 4 listed");
    assert_eq!(learner.lag, None, "nobody answered as node 4: {status:?}");
    let refused = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/admin/promote",
            &json!({"id": 4}),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("answered");
    assert_eq!(refused.status.as_u16(), 409, "{:?}", refused.body);
    let message = String::from_utf8_lossy(&refused.body).into_owned();
    assert!(message.contains("has not caught up"), "{message}");
    let status = cluster.status(leader).await.expect("status");
    assert_eq!(status.voters, vec![1, 2, 3], "still three voters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_alone_joins_as_learner_is_promoted_and_removed() {
    let cluster = TestCluster::start(3, "always").with_joiner(4);
    cluster.start_node(4);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    tasks(
        cluster
            .write(
                follower,
                "/update",
                &json!({"clientid": 1, "adds": [{"group": "j", "data": "before"}]}),
            )
            .await
            .expect("write"),
    );

    // Added through a follower, which relays to the leader.
    let node4 = &cluster.nodes[3];
    let status = admin(
        &cluster,
        follower,
        "/admin/add-learner",
        json!({
            "id": 4, "api_addr": node4.api_addr, "raft_addr": node4.raft_addr
        }),
    )
    .await;
    assert_eq!(status.learners, vec![4]);
    cluster.wait_ready(&[4]).await;
    cluster.wait_converged(&[1, 2, 3, 4]).await;

    let status = admin(&cluster, leader, "/admin/promote", json!({"id": 4})).await;
    assert_eq!(status.voters, vec![1, 2, 3, 4]);
    assert!(status.learners.is_empty());

    let status = admin(&cluster, follower, "/admin/remove", json!({"id": 4})).await;
    assert_eq!(status.voters, vec![1, 2, 3]);
    assert!(
        status.nodes.iter().all(|n| n.id != 4),
        "node 4 left the membership"
    );

    // Leadership moves to the voter asked for.
    let target = (1..=3)
        .find(|&id| id != leader && id != follower)
        .expect("a third voter");
    admin(
        &cluster,
        leader,
        "/admin/transfer-leader",
        json!({"id": target}),
    )
    .await;
    assert_eq!(cluster.wait_leader_is(target).await, target);
    tasks(
        cluster
            .write(
                leader,
                "/update",
                &json!({"clientid": 1, "adds": [{"group": "j", "data": "after"}]}),
            )
            .await
            .expect("writes go on through the old leader, now a follower"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_json_answer_and_changes_nothing() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let added = tasks(
        cluster
            .write(
                1,
                "/update",
                &json!({"clientid": 1, "adds": [{"group": "g"}]}),
            )
            .await
            .expect("write"),
    );
    let get = |path: String| {
        let cluster = &cluster;
        async move {
            let response = cluster
                .client
                .get(cluster.api(1), &path, common::CALL_TIMEOUT)
                .await
                .expect("answered");
            let body: serde_json::Value =
                serde_json::from_slice(&response.body).expect("a JSON body");
            (response.status.as_u16(), body)
        }
    };
    for path in [
        "/task/+7",
        "/task/%FF",
        "/tasks/1,+2",
        "/tasks/1,",
        "/group/g?limit=-1",
        "/group/g?limit=1.5",
        "/group/g?owned=maybe",
        "/group/%C3",
    ] {
        let (status, body) = get(path.to_string()).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    let (status, body) = get("/group/g?owned=%74rue&_=cache-buster".to_string()).await;
    assert_eq!(
        status, 200,
        "percent-encoded values decode; unknown parameters are ignored: {body}"
    );
    assert_eq!(body.as_array().map(Vec::len), Some(1));
    // As lenient as the original service: `limit=0` and `limit=` are no limit, `owned`
    // takes any letter case, and an empty `owned` is absent.
    for path in [
        "/group/g?limit=0",
        "/group/g?limit=",
        "/group/g?owned=TRUE",
        "/group/g?owned=",
    ] {
        let (status, body) = get(path.to_string()).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(body.as_array().map(Vec::len), Some(1), "{path}: {body}");
    }
    let (status, _) = get(format!("/task/{}", added[0].id)).await;
    assert_eq!(status, 200);

    // What is ignored is still type-checked, and an id out of range says so.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let bodies = [
        format!(r#"{{"clientid": 1, "adds": [{{"group": "g", "id": {deep}}}]}}"#),
        r#"{"clientid": 1, "adds": [{"group": "g", "id": "7"}]}"#.to_string(),
        r#"{"clientid": 1, "deletes": [18446744073709551616]}"#.to_string(),
    ];
    for body in bodies {
        let response = cluster
            .client
            .send(
                cluster.api(1),
                axum::http::Method::POST,
                "/update",
                &[],
                body.clone().into(),
                common::CALL_TIMEOUT,
            )
            .await
            .expect("answered");
        let json: serde_json::Value = serde_json::from_slice(&response.body).expect("JSON");
        assert_eq!(response.status.as_u16(), 400, "{json}");
        let error = json["error"].as_str().unwrap_or_default();
        if body.contains("18446744073709551616") {
            assert!(error.contains("out of range"), "{error}");
        }
    }
    // A body is an object: serde's other form of a struct, an array of its fields in
    // order, is refused on every path that takes one.
    for (path, body) in [
        (
            "/update",
            r#"[1, [{"group": "arr"}], null, null, null, null]"#,
        ),
        ("/claim", r#" [1, "g", 1000, null]"#),
        ("/finish", r#"[1, 2]"#),
    ] {
        let response = cluster
            .client
            .send(
                cluster.api(1),
                axum::http::Method::POST,
                path,
                &[],
                body.to_string().into(),
                common::CALL_TIMEOUT,
            )
            .await
            .expect("answered");
        let json: serde_json::Value = serde_json::from_slice(&response.body).expect("JSON");
        assert_eq!(response.status.as_u16(), 400, "{path}: {json}");
        let error = json["error"].as_str().unwrap_or_default();
        assert!(error.contains("JSON object"), "{path}: {error}");
    }
    let (status, body) = get("/group/arr".to_string()).await;
    assert_eq!((status, body), (200, json!([])), "nothing was added");
    // A task sent back as it was read is accepted.
    let sent_back = json!({"clientid": 1, "updates": [{
        "id": added[0].id, "group": "g", "data": "again", "timespec": 0, "ownerid": 1
    }]});
    let again = tasks(
        cluster
            .write(1, "/update", &sent_back)
            .await
            .expect("processed"),
    );
    assert_eq!(again[0].data, "again");
    let added = again;

    let refused = cluster
        .write(
            1,
            "/update",
            &json!({"clientid": 1, "deletes": [added[0].id], "depends": [added[0].id]}),
        )
        .await
        .expect("processed");
    assert_eq!(
        refused,
        WriteResultJson::Errors {
            errors: vec![format!(
                "depends: task {} is named more than once in the request; name each id once",
                added[0].id
            )]
        }
    );
    let (status, _) = get(format!("/task/{}", added[0].id)).await;
    assert_eq!(status, 200, "the refused update changed nothing");
}

/// A backup without a recorded log form (snapshot format 6: an older build's, or one
/// taken before the record) restores with the form its new members read recorded in the
/// restored state itself, so that no entry recording it follows the restore and changes
/// the state every member is checked to hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_without_a_log_form_restores_with_one_recorded() {
    use store_sm::machine::AddTask;
    use store_sm::machine::Command;
    use store_sm::machine::LogTime;
    use store_sm::machine::Request;
    use store_sm::machine::TaskMachine;
    use store_sm::machine::UpdateRequest;

    let mut machine = TaskMachine::new();
    machine.apply(&Command {
        stamp: LogTime::from_millis(1_000),
        request_id: None,
        request: Request::Update(UpdateRequest {
            client: 1,
            adds: vec![AddTask::seed("g".to_string(), "d".to_string(), Some(0))],
            ..UpdateRequest::default()
        }),
    });
    let backup = store_sm::snapshot::encode_snapshot(&machine);
    assert_eq!(&backup[8..12], &6u32.to_le_bytes(), "format 6");

    let cluster = TestCluster::start(1, "never").with_joiner(2);
    start_empty(&cluster, 2).await;
    let response = restore_alone(&cluster, 2, backup).await;
    assert_eq!(
        response.status.as_u16(),
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let restored: rpc::admin::RestoreJson = serde_json::from_slice(&response.body).expect("JSON");
    // Long enough for the node to lead and, were the form not in the restored state,
    // to record it.
    cluster.wait_leader(&[2]).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let status = cluster.status(2).await.expect("a status");
    assert_eq!(
        status.log_form,
        raft_node::log_forms::LOG_FORMS_READ,
        "{status:?}"
    );
    let held = cluster.state_hash(2).await.expect("a hash");
    assert_eq!(held.state_hash, restored.restored_state_hash);
    assert!(
        held.applied_index >= Some(restored.applied_index),
        "{held:?}"
    );
}

/// A backup whose cluster recorded a form the new members do not all read (snapshot
/// format 8 into a build of form 3) is refused before anything is installed: installed,
/// it would stop every such member at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_on_a_newer_form_than_its_new_members_read_is_refused() {
    use store_sm::machine::Command;
    use store_sm::machine::LogTime;
    use store_sm::machine::Request;
    use store_sm::machine::TaskMachine;
    use store_sm::machine::constants::RULES_FORM;

    let mut machine = TaskMachine::new();
    machine.apply(&Command {
        stamp: LogTime::from_millis(1_000),
        request_id: None,
        request: Request::RaiseRulesForm(RULES_FORM),
    });
    let backup = store_sm::snapshot::encode_snapshot(&machine);
    assert_eq!(&backup[8..12], &8u32.to_le_bytes(), "format 8");

    let cluster = TestCluster::start(1, "never").with_joiner(2);
    cluster.set_env(2, raft_node::log_forms::ANNOUNCE_FORM_ENV, "3");
    start_empty(&cluster, 2).await;
    let response = restore_alone(&cluster, 2, backup).await;
    let body = String::from_utf8_lossy(&response.body);
    assert_eq!(response.status.as_u16(), 409, "{body}");
    assert!(
        body.contains("the backup records log entry form 4, and the new members read up to form 3"),
        "{body}"
    );
    let status = cluster.status(2).await.expect("a status");
    assert_eq!(status.applied_index, None, "nothing installed: {status:?}");
}

/// Starts node `id`, a joiner, and waits until it answers.
async fn start_empty(cluster: &TestCluster, id: u64) {
    cluster.start_node(id);
    eventually(|| async {
        cluster
            .status(id)
            .await
            .map(|_| ())
            .ok_or(format!("node {id} does not answer"))
    })
    .await;
}

/// Sends `backup` to node `id`'s `POST /admin/restore`, the new cluster being that
/// node alone.
async fn restore_alone(
    cluster: &TestCluster,
    id: u64,
    backup: Vec<u8>,
) -> rpc::client::HttpResponse {
    let node = &cluster.nodes[(id - 1) as usize];
    let members =
        json!({"members": [{"id": id, "api_addr": node.api_addr, "raft_addr": node.raft_addr}]});
    let header = (
        hyper::header::HeaderName::from_static(rpc::admin::RESTORE_MEMBERS_HEADER),
        hyper::header::HeaderValue::from_str(&members.to_string()).expect("header"),
    );
    cluster
        .client
        .send(
            cluster.api(id),
            hyper::Method::POST,
            "/admin/restore",
            std::slice::from_ref(&header),
            backup.into(),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("answered")
}
