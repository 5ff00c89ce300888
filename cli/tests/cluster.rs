//! `rota cluster ...` end to end with real node processes: forming a cluster, growing it
//! 3 -> 5 -> 3 while workers write, replacing a killed node, moving leadership, backup
//! under load and restore into a new cluster. `cargo test -p cli --test cluster --
//! --nocapture` prints each command with its output, as an operator would see it.

mod common;

use common::Fleet;
use common::Workers;
use common::assert_all_present;
use common::rota;
use rpc::admin::ClusterStatusJson;

fn status_json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

async fn leader_view(fleet: &Fleet, ids: &[u64]) -> ClusterStatusJson {
    let run = rota(&["cluster", "status", "--url", &fleet.urls(ids), "--json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    serde_json::from_value(status_json(&run.stdout)["cluster"].clone()).expect("status")
}

/// Starts nodes `ids` and forms a cluster of them with `rota cluster init`.
async fn form(fleet: &Fleet, ids: &[u64]) {
    for &id in ids {
        fleet.start(id);
    }
    for &id in ids {
        fleet.wait_up(id).await;
    }
    let members = ids
        .iter()
        .map(|&id| fleet.member(id))
        .collect::<Vec<_>>()
        .join(",");
    let run = rota(&[
        "cluster",
        "init",
        "--url",
        &fleet.api(ids[0]),
        "--initial-cluster",
        &members,
    ])
    .await;
    assert_eq!(run.code, 0, "init: {}", run.stderr);
    assert!(
        run.stdout.contains("initialised a cluster of"),
        "{}",
        run.stdout
    );
}

async fn restore(file: &str, members: &str, json: bool) -> common::Run {
    let mut args = vec![
        "cluster",
        "restore",
        "--file",
        file,
        "--initial-cluster",
        members,
    ];
    if json {
        args.push("--json");
    }
    rota(&args).await
}

/// `rota cluster VERB --url URL --id ID`, for the verbs that name one node.
async fn on_node(verb: &str, url: &str, id: u64) -> common::Run {
    rota(&["cluster", verb, "--url", url, "--id", &id.to_string()]).await
}

async fn add_learner(fleet: &Fleet, url: &str, id: u64) -> common::Run {
    rota(&[
        "cluster",
        "add-learner",
        "--url",
        url,
        "--id",
        &id.to_string(),
        "--api-addr",
        &fleet.api(id),
        "--raft-addr",
        &fleet.raft(id),
    ])
    .await
}

#[tokio::test]
async fn grow_three_to_five_and_back_while_workers_write() {
    let fleet = Fleet::new();
    form(&fleet, &[1, 2, 3]).await;
    let url = fleet.urls(&[1, 2, 3]);
    let workers = Workers::start(4, vec![fleet.api(1), fleet.api(2), fleet.api(3)], "grow");

    // A second init is refused: the nodes already form a cluster.
    let again = rota(&[
        "cluster",
        "init",
        "--url",
        &fleet.api(1),
        "--initial-cluster",
        &fleet.member(1),
    ])
    .await;
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(again.stderr.contains("already holds"), "{}", again.stderr);

    // Grow to five, one node at a time.
    for id in [4, 5] {
        fleet.start(id);
        fleet.wait_up(id).await;
        let run = add_learner(&fleet, &url, id).await;
        assert_eq!(run.code, 0, "add-learner {id}: {}", run.stderr);
        assert!(run.stdout.contains("as a learner"), "{}", run.stdout);
        let run = on_node("promote", &url, id).await;
        assert_eq!(run.code, 0, "promote {id}: {}", run.stderr);
        assert!(run.stdout.contains("is now a voter"), "{}", run.stdout);
    }
    let view = leader_view(&fleet, &[1]).await;
    assert_eq!(view.voters, vec![1, 2, 3, 4, 5]);

    // A member's id cannot be added again.
    let run = add_learner(&fleet, &url, 4).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("already a voter"), "{}", run.stderr);

    // Five nodes, one down: status shows it unreachable and the rest healthy.
    fleet.kill(5);
    let run = rota(&["cluster", "status", "--url", &url, "--json"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let health = &status_json(&run.stdout)["health"];
    assert_eq!(health["5"], "unreachable", "{health}");
    for id in 1..=4 {
        assert_eq!(health[id.to_string()], "ok", "{health}");
    }
    let table = rota(&["cluster", "status", "--url", &url]).await;
    assert!(table.stdout.contains("unreachable"), "{}", table.stdout);

    // Shrink back to three: the down node first, then node 4.
    for id in [5, 4] {
        let run = on_node("remove", &url, id).await;
        assert_eq!(run.code, 0, "remove {id}: {}", run.stderr);
        assert!(
            run.stdout.contains(&format!("removed node {id}")),
            "{}",
            run.stdout
        );
    }
    let view = leader_view(&fleet, &[1]).await;
    assert_eq!(view.voters, vec![1, 2, 3]);
    assert!(view.learners.is_empty());
    assert_eq!(view.retired, vec![4, 5]);

    // Ids are never reused, even with a fresh data directory.
    fleet.kill(4);
    let run = add_learner(&fleet, &url, 4).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("never reused"), "{}", run.stderr);

    // Snapshots on every remaining node.
    let run = rota(&["cluster", "snapshot", "--url", &url]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 3, "{}", run.stdout);

    let acked = workers.stop().await;
    assert!(
        acked.len() > 20,
        "the workers made progress: {}",
        acked.len()
    );
    fleet.wait_converged(&[1, 2, 3]).await;
    assert_all_present(&fleet.api(2), &acked).await;
}

#[tokio::test]
async fn replace_a_killed_node_with_a_new_id_and_move_leadership() {
    let fleet = Fleet::new();
    form(&fleet, &[1, 2, 3]).await;
    let url = fleet.urls(&[1, 2, 3]);
    let workers = Workers::start(2, vec![fleet.api(1), fleet.api(2)], "replace");
    let view = leader_view(&fleet, &[1]).await;
    let leader = view.leader.expect("a leader");
    let victim = if leader == 3 { 2 } else { 3 };
    let survivor = [1, 2, 3]
        .into_iter()
        .find(|&id| id != leader && id != victim)
        .expect("a third node");
    fleet.kill(victim);

    // With one of three down, removing a healthy voter would leave no majority.
    let run = on_node("remove", &url, survivor).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("refusing to remove"), "{}", run.stderr);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    assert_eq!(leader_view(&fleet, &[leader]).await.voters, vec![1, 2, 3]);

    // Removing the dead node is what the operator should do, and it is allowed.
    let run = on_node("remove", &url, victim).await;
    assert_eq!(run.code, 0, "{}", run.stderr);

    // Its replacement gets a new id and an empty data directory.
    fleet.start(4);
    fleet.wait_up(4).await;
    let run = add_learner(&fleet, &url, 4).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("added as a learner"), "{}", run.stdout);
    // Asked again, as a script that retries would: nothing changes, and it says so.
    let run = add_learner(&fleet, &url, 4).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("already a learner"), "{}", run.stdout);
    let run = on_node("promote", &url, 4).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = on_node("promote", &url, 4).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("already a voter; nothing to do"),
        "{}",
        run.stdout
    );

    // Leadership moves to the new node, then back.
    let url = fleet.urls(&[leader, survivor, 4]);
    let run = on_node("transfer-leader", &url, 4).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("node 4 leads"), "{}", run.stdout);
    assert_eq!(leader_view(&fleet, &[survivor]).await.leader, Some(4));
    let run = on_node("transfer-leader", &url, leader).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = on_node("transfer-leader", &url, 9).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("not a voter"), "{}", run.stderr);

    let acked = workers.stop().await;
    let mut members = vec![leader, survivor, 4];
    members.sort_unstable();
    assert_eq!(leader_view(&fleet, &[4]).await.voters, members);
    fleet.wait_converged(&members).await;
    assert_all_present(&fleet.api(4), &acked).await;
}

#[tokio::test]
async fn backup_under_load_restores_into_a_new_cluster_above_every_issued_id() {
    let source = Fleet::new();
    form(&source, &[1, 2, 3]).await;
    let url = source.urls(&[1, 2, 3]);
    let workers = Workers::start(4, vec![source.api(1), source.api(2), source.api(3)], "load");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rota.snapshot");
    let file_arg = file.to_str().expect("utf-8");
    let started = std::time::Instant::now();
    let run = rota(&[
        "cluster", "backup", "--url", &url, "--out", file_arg, "--json",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let backup = status_json(&run.stdout);
    let backup_hash = backup["state_hash"].as_str().expect("hash").to_string();
    // An existing backup is never overwritten by mistake.
    let again = rota(&["cluster", "backup", "--url", &url, "--out", file_arg]).await;
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(again.stderr.contains("--force"), "{}", again.stderr);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let acked_before: Vec<u64> = workers
        .acked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, at)| *at < started)
        .map(|(id, _)| *id)
        .collect();
    let acked = workers.stop().await;
    assert!(!acked_before.is_empty(), "the backup ran under load");

    // A new cluster of three empty nodes.
    let target = Fleet::new();
    for id in [1, 2, 3] {
        target.start(id);
    }
    for id in [1, 2, 3] {
        target.wait_up(id).await;
    }
    let members = [1, 2, 3].map(|id| target.member(id)).join(",");

    // A damaged file is refused before anything is sent.
    let damaged = dir.path().join("damaged.snapshot");
    let mut bytes = std::fs::read(&file).expect("backup");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&damaged, bytes).expect("write");
    let run = restore(damaged.to_str().expect("utf-8"), &members, false).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("corrupt"), "{}", run.stderr);

    let run = restore(file_arg, &members, true).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = status_json(&run.stdout);
    assert_eq!(report["backup_state_hash"], backup_hash.as_str());
    let restored_hash = report["restored_state_hash"].as_str().expect("hash");
    for id in ["1", "2", "3"] {
        assert_eq!(report["members"][id]["state_hash"], restored_hash);
    }
    assert_eq!(target.wait_converged(&[1, 2, 3]).await, restored_hash);
    // The new cluster's time is the restore's, not the backup's (SPEC 1.7: leases and
    // available times judged as the old cluster would judge them now).
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let log_time = report["log_time"].as_i64().expect("log_time");
    assert!(
        (wall_ms - log_time).abs() < 60_000,
        "log time {log_time}, wall clock {wall_ms}"
    );

    // Everything acknowledged before the backup began is in the new cluster, and
    // nothing that the source never held.
    assert_all_present(&target.api(2), &acked_before).await;
    let restored_tasks = report["tasks"].as_u64().expect("tasks");
    assert!(
        restored_tasks as usize <= acked.len() + 4,
        "{restored_tasks}"
    );

    // Restoring again into the now-populated cluster is refused.
    let run = restore(file_arg, &members, false).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("already holds"), "{}", run.stderr);

    // The new cluster serves writes after the restored ids, and survives a restart.
    let run = rota(&[
        "task",
        "add",
        "--url",
        &target.urls(&[1, 2, 3]),
        "--group",
        "load",
        "--data",
        "after restore",
        "--json",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let new_id = status_json(&run.stdout)[0]["id"].as_u64().expect("id");
    // Above every id the source acknowledged, also after the backup (SPEC 1.1).
    let highest = acked.iter().max().copied().unwrap_or(0);
    assert!(
        highest < new_id,
        "new id {new_id}, the source issued {highest}"
    );
    assert!(report["next_id"].as_u64().expect("next_id") <= new_id);
    target.kill(1);
    target.start(1);
    target.wait_up(1).await;
    target.wait_converged(&[1, 2, 3]).await;
    assert_all_present(&target.api(1), &[new_id]).await;
}
