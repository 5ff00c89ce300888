//! Partition tests between real processes: 3 and 5 `rota-node` processes, each in its
//! own network namespace behind a bridge, with workers adding, claiming, renewing,
//! deleting and reading from another namespace, while the test partitions the network
//! (majority/minority, the leader isolated), loses packets one way, delays and loses
//! packets on nodes' links, `kill -9`s leaders and followers and SIGSTOPs the leader for
//! longer than the election timeout. Afterwards a checker verifies that no acknowledged
//! write was lost, no task version had two owners at once, ids are unique (and increase
//! in real-time order), and every node holds the same state hash.
//!
//! They need root (network namespaces, iptables); elsewhere they pass after printing
//! why they were skipped. `netns/mod.rs` describes the lab and its cleanup.
//! `cargo test -p cli --test partition -- --nocapture` shows every step.

mod common;
mod netns;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use netns::Lab;
use netns::workload::GROUP;
use netns::workload::JOB_GROUP;
use netns::workload::Workers;
use netns::workload::check;
use netns::workload::check_jobs;
use rpc::job::JobJson;
use rpc::job::JobPageJson;
use rpc::worker::TaskJson;

/// The default election timeout is 300-600 ms: a new leader within this, or the test fails.
const ELECTION_MAX: Duration = Duration::from_secs(10);

/// How long the leader stays SIGSTOPped: well past the 600 ms election timeout.
const PAUSE: Duration = Duration::from_millis(2500);

/// How long each network fault lasts.
const HOLD: Duration = Duration::from_millis(2000);

async fn sleep(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// Starts every node and waits for a leader.
async fn form(lab: &Lab) -> u64 {
    for id in lab.ids() {
        lab.start(id);
    }
    for id in lab.ids() {
        lab.wait_up(id, Duration::from_secs(30)).await;
    }
    let leader = lab
        .wait_leader(&lab.ids(), &[], Duration::from_secs(30))
        .await;
    lab.say(&format!("node {leader} leads"));
    leader
}

/// Waits until the workers acknowledged `more` writes beyond what they had.
async fn progress(lab: &Lab, workers: &Workers, more: u64, what: &str) {
    let start = workers.acked();
    for _ in 0..300 {
        if workers.acked() >= start + more {
            lab.say(&format!("{} writes acknowledged so far", workers.acked()));
            return;
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the workers made no progress {what}: {} writes acknowledged in 30 s",
        workers.acked() - start
    );
}

/// The leader cut off from every other node (workers still reach it); the rest elect
/// another, then the network heals.
async fn isolate_leader(lab: &Lab, leader: u64) -> u64 {
    let rest = lab.others(&[leader]);
    lab.fault(
        "leader-isolated",
        &format!("node {leader} cut off from {rest:?}"),
    );
    lab.partition(&[&[leader], &rest]);
    let new = lab.wait_leader(&rest, &[leader], ELECTION_MAX).await;
    lab.say(&format!("node {new} leads the majority"));
    sleep(HOLD).await;
    assert_dropped(lab.heal(), "leader isolation");
    let follows = lab.wait_follows(leader, ELECTION_MAX).await;
    lab.say(&format!(
        "the old leader {leader} now follows node {follows}"
    ));
    lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await
}

/// Packets from `from` to `to` are lost; the other direction flows.
async fn one_way(lab: &Lab, from: u64, to: u64) {
    lab.fault(
        "one-way-loss",
        &format!("every packet from node {from} to node {to} dropped"),
    );
    lab.cut(from, to);
    sleep(HOLD).await;
    assert_dropped(lab.heal(), "one-way loss");
}

/// Loss and delay on the links of `ids`; the measured round trip shows the delay.
async fn degrade(lab: &Lab, ids: &[u64]) {
    let (loss, delay, jitter) = (10, Duration::from_millis(40), Duration::from_millis(25));
    lab.fault(
        "delay+loss",
        &format!(
            "nodes {ids:?}: {loss}% loss and {delay:?} ± {jitter:?} delay each way (iptables statistic + NFQUEUE)"
        ),
    );
    let before = lab.round_trip(ids[0], 5).await;
    for &id in ids {
        lab.degrade(id, loss, delay, jitter);
    }
    let during = lab.round_trip(ids[0], 9).await;
    lab.say(&format!(
        "median /health round trip to node {}: {before:?} before, {during:?} degraded",
        ids[0]
    ));
    let least = 2 * (delay - jitter);
    assert!(
        during.is_some_and(|rtt| rtt >= least),
        "the delay did not take effect: median round trip {during:?}, expected at least {least:?}"
    );
    sleep(HOLD + HOLD).await;
    let healed = lab.heal();
    assert!(
        healed.delayed > 0 && healed.dropped > 0,
        "delay and loss took no packet: {healed:?}"
    );
}

/// Short partitions of random minorities in a row (leadership may move at every one);
/// returns the leader after them.
async fn flap(lab: &Lab, rounds: u32) -> u64 {
    let mut rng = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut random = move |below: u64| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % below
    };
    let size = lab.spec.nodes;
    for _ in 0..rounds {
        let mut minority: Vec<u64> = Vec::new();
        let want = 1 + random((size - 1) / 2) as usize;
        while minority.len() < want {
            let id = 1 + random(size);
            if !minority.contains(&id) {
                minority.push(id);
            }
        }
        minority.sort_unstable();
        let rest = lab.others(&minority);
        let hold = Duration::from_millis(400 + random(800));
        lab.fault(
            "partition-flap",
            &format!("{minority:?} | {rest:?} for {hold:?}"),
        );
        lab.partition(&[&minority, &rest]);
        sleep(hold).await;
        assert_dropped(lab.heal(), "the partition");
        sleep(Duration::from_millis(300)).await;
    }
    lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await
}

fn assert_dropped(healed: netns::Healed, what: &str) {
    assert!(healed.dropped > 0, "{what} dropped no packet: {healed:?}");
}

/// `kill -9` of `victims` at once; the rest keep (or elect) a leader; restarts them.
async fn kill9(lab: &Lab, victims: &[u64], leader: u64) -> u64 {
    for &id in victims {
        let role = if id == leader { "leader" } else { "follower" };
        lab.fault("kill-9", &format!("node {id} ({role})"));
        lab.kill9(id);
    }
    let rest = lab.others(victims);
    let now = lab.wait_leader(&rest, victims, ELECTION_MAX).await;
    lab.say(&format!("node {now} leads without {victims:?}"));
    sleep(Duration::from_millis(1000)).await;
    for &id in victims {
        lab.start(id);
    }
    for &id in victims {
        lab.wait_up(id, Duration::from_secs(30)).await;
    }
    lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await
}

/// SIGSTOP of the leader past the election timeout: the others elect a new leader; after
/// SIGCONT the old one steps down and follows.
async fn pause_leader(lab: &Lab, leader: u64) -> u64 {
    lab.fault(
        "sigstop-leader",
        &format!("node {leader} stopped for {PAUSE:?} (election timeout 300-600 ms)"),
    );
    let rest = lab.others(&[leader]);
    let stopped = std::time::Instant::now();
    lab.signal(leader, "STOP");
    let new = lab.wait_leader(&rest, &[leader], ELECTION_MAX).await;
    lab.say(&format!(
        "node {new} elected {:?} after node {leader} stopped",
        stopped.elapsed()
    ));
    sleep(PAUSE.saturating_sub(stopped.elapsed())).await;
    lab.signal(leader, "CONT");
    let follows = lab.wait_follows(leader, ELECTION_MAX).await;
    lab.say(&format!(
        "node {leader} resumed, stepped down and follows node {follows}"
    ));
    lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await
}

/// Majority/minority partition: `minority` (which may hold the leader) against the rest.
async fn split(lab: &Lab, minority: &[u64], leader: u64) -> u64 {
    let majority = lab.others(minority);
    let kind = if minority.contains(&leader) {
        "partition-minority-with-leader"
    } else {
        "partition-minority"
    };
    lab.fault(kind, &format!("{minority:?} | {majority:?}"));
    lab.partition(&[minority, &majority]);
    let now = lab.wait_leader(&majority, minority, ELECTION_MAX).await;
    lab.say(&format!("node {now} leads the majority {majority:?}"));
    sleep(HOLD).await;
    assert_dropped(lab.heal(), "the partition");
    lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await
}

/// Every job record of the job group, by key, read page by page from `addr`.
async fn final_jobs(addr: &str) -> BTreeMap<String, JobJson> {
    let client = rpc::client::HttpClient::new();
    let mut jobs = BTreeMap::new();
    let mut after = String::new();
    loop {
        let path = format!("/jobs?group={JOB_GROUP}&limit=1000&after={after}");
        let page: JobPageJson = client
            .get(addr, &path, Duration::from_secs(5))
            .await
            .expect("the leader serves the job records")
            .success(addr)
            .expect("200")
            .json(addr)
            .expect("a page of jobs");
        jobs.extend(page.jobs.into_iter().map(|job| (job.key.clone(), job)));
        match page.next {
            Some(next) => after = next,
            None => return jobs,
        }
    }
}

/// Stops the workers, waits for the nodes to agree, and checks the history.
async fn finish(lab: &Lab, workers: Workers) {
    lab.heal();
    let leader = lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await;
    let history = workers.stop().await;
    let (index, hash, tasks) = lab.wait_converged(Duration::from_secs(60)).await;
    let addr = lab.spec.api(leader);
    let final_tasks: Vec<TaskJson> = rpc::client::HttpClient::new()
        .get(
            &addr,
            &format!("/group/{GROUP}?owned=1"),
            Duration::from_secs(5),
        )
        .await
        .expect("the leader serves the final listing")
        .success(&addr)
        .expect("200")
        .json(&addr)
        .expect("tasks");
    let jobs = final_jobs(&addr).await;
    let live_jobs = jobs.values().filter(|job| job.task.is_some()).count();
    assert_eq!(
        (final_tasks.len() + live_jobs) as u64,
        tasks,
        "the listings (tasks and live jobs) and the state hash count the same tasks"
    );
    match check_jobs(&history, &jobs) {
        Ok(report) => {
            lab.say(&format!("job checker: {report:?}"));
            assert!(
                report.added >= 5 && report.finished >= 1,
                "too little job work to prove anything: {report:?}"
            );
        }
        Err(problems) => panic!(
            "{} job violations after faults [{}]:\n{}",
            problems.len(),
            lab.faults_summary(),
            problems.join("\n")
        ),
    }
    match check(&history, &final_tasks) {
        Ok(report) => {
            lab.say(&format!("checker: {report:?}"));
            netns::out(&format!(
                "partition summary: {} nodes; faults injected: {}; checker: {} writes verified ({} adds, {} deletes/renews), {} claims checked ({} found nothing), {} refused, {} task versions with unique ids, {} payloads, 0 violations; {} reads, {} retries; state hashes equal on {} nodes at index {index} ({}..., {tasks} tasks)",
                lab.spec.nodes,
                lab.faults_summary(),
                report.writes,
                report.adds,
                report.writes - report.adds - report.claims,
                report.claims,
                report.empty_claims,
                report.refused,
                report.versions,
                report.payloads,
                history.reads,
                history.retries,
                lab.spec.nodes,
                &hash[..12.min(hash.len())],
            ));
            assert!(
                report.adds >= 50 && report.claims >= 20,
                "too little work to prove anything: {report:?}"
            );
        }
        Err(problems) => panic!(
            "{} violations after faults [{}]:\n{}",
            problems.len(),
            lab.faults_summary(),
            problems.join("\n")
        ),
    }
}

async fn three_node_scenario(lab: Arc<Lab>) {
    let leader = form(&lab).await;
    let workers = Workers::start(4, lab.api_addrs());
    progress(&lab, &workers, 30, "before the faults").await;

    let leader = isolate_leader(&lab, leader).await;
    progress(&lab, &workers, 10, "after the leader was isolated").await;

    let follower = lab.a_follower(leader);
    split(&lab, &[follower], leader).await;
    progress(&lab, &workers, 10, "after a follower was isolated").await;

    let leader = flap(&lab, 4).await;
    progress(&lab, &workers, 10, "after flapping partitions").await;

    let follower = lab.a_follower(leader);
    one_way(&lab, leader, follower).await;
    let leader = lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await;
    let follower = lab.a_follower(leader);
    one_way(&lab, follower, leader).await;
    progress(&lab, &workers, 10, "after one-way loss").await;

    let leader = lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await;
    degrade(&lab, &[leader]).await;
    progress(&lab, &workers, 10, "after delay and loss").await;

    let leader = lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await;
    let leader = kill9(&lab, &[leader], leader).await;
    let follower = lab.a_follower(leader);
    let leader = kill9(&lab, &[follower], leader).await;
    progress(&lab, &workers, 10, "after kill -9").await;

    pause_leader(&lab, leader).await;
    progress(&lab, &workers, 10, "after SIGSTOP/SIGCONT").await;

    finish(&lab, workers).await;
}

async fn five_node_scenario(lab: Arc<Lab>) {
    let leader = form(&lab).await;
    let workers = Workers::start(6, lab.api_addrs());
    progress(&lab, &workers, 30, "before the faults").await;

    // The leader and one follower on the minority side.
    let buddy = lab.a_follower(leader);
    let leader = split(&lab, &[leader, buddy], leader).await;
    progress(&lab, &workers, 10, "after a majority/minority partition").await;

    // Two followers on the minority side; the leader keeps its majority.
    let minority = lab.others(&[leader])[..2].to_vec();
    let leader = split(&lab, &minority, leader).await;

    isolate_leader(&lab, leader).await;
    progress(&lab, &workers, 10, "after the leader was isolated").await;

    let leader = flap(&lab, 4).await;
    progress(&lab, &workers, 10, "after flapping partitions").await;

    // The leader hears nothing from two followers, which still hear it.
    let deaf = lab.others(&[leader])[..2].to_vec();
    lab.fault(
        "one-way-loss",
        &format!("every packet from nodes {deaf:?} to the leader {leader} dropped"),
    );
    for &id in &deaf {
        lab.cut(id, leader);
    }
    sleep(HOLD).await;
    assert_dropped(lab.heal(), "one-way loss");
    progress(&lab, &workers, 10, "after one-way loss").await;

    let leader = lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await;
    let slow: Vec<u64> = lab
        .ids()
        .into_iter()
        .filter(|&id| id != leader)
        .take(1)
        .chain([leader])
        .collect();
    degrade(&lab, &slow).await;
    progress(&lab, &workers, 10, "after delay and loss").await;

    // The leader and a follower at once: a minority of five.
    let leader = lab.wait_leader(&lab.ids(), &[], ELECTION_MAX).await;
    let follower = lab.a_follower(leader);
    let leader = kill9(&lab, &[leader, follower], leader).await;
    progress(&lab, &workers, 10, "after kill -9").await;

    pause_leader(&lab, leader).await;
    progress(&lab, &workers, 10, "after SIGSTOP/SIGCONT").await;

    finish(&lab, workers).await;
}

#[test]
fn three_nodes_keep_every_guarantee_through_partitions_kills_and_pauses() {
    netns::run_test(
        "three_nodes_keep_every_guarantee_through_partitions_kills_and_pauses",
        3,
        three_node_scenario,
    );
}

#[test]
fn five_nodes_keep_every_guarantee_through_partitions_kills_and_pauses() {
    netns::run_test(
        "five_nodes_keep_every_guarantee_through_partitions_kills_and_pauses",
        5,
        five_node_scenario,
    );
}
