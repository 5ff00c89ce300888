//! Swarm testing: per seed, a random mix of faults (kill, crash with unsynced writes
//! lost, pause, partitions including an isolated leader, one-way cuts, loss and
//! latency, wall clocks jumping by minutes) while workers add, claim, renew, delete and
//! read; then the faults stop, the cluster must converge and serve within a bound, and
//! the history must pass every check.
//!
//! `MADSIM_TEST_SEED=S` replays one seed; `MADSIM_TEST_NUM=N` runs N seeds.

#![cfg(madsim)]

use std::collections::BTreeSet;
use std::time::Duration;

use madsim::rand::Rng;
use rpc::client::HttpClient;
use rpc::worker::TaskJson;
use sim_tests::cluster::CALL_TIMEOUT;
use sim_tests::cluster::SimCluster;
use sim_tests::workload::GROUP;
use sim_tests::workload::Workers;
use sim_tests::workload::check;

/// After the last fault, the cluster must agree on a leader and converge within this.
const LIVENESS_BOUND: Duration = Duration::from_secs(30);

/// Applies one random fault and says what it did; `down` tracks killed nodes and
/// `paused` paused ones so that at most a minority is ever out at once.
fn inject(
    cluster: &SimCluster,
    size: u64,
    down: &mut BTreeSet<u64>,
    paused: &mut BTreeSet<u64>,
) -> String {
    let mut rng = madsim::rand::thread_rng();
    let node = rng.gen_range(1..=size);
    let out = down.len() + paused.len();
    let minority = ((size - 1) / 2) as usize;
    match rng.gen_range(0..9) {
        0 if out < minority && !down.contains(&node) && !paused.contains(&node) => {
            cluster.kill(node);
            down.insert(node);
            format!("kill {node}")
        }
        1 if out < minority && !down.contains(&node) && !paused.contains(&node) => {
            cluster.crash(node);
            down.insert(node);
            format!("crash {node} (unsynced writes lost)")
        }
        2 if down.contains(&node) => {
            cluster.restart(node);
            down.remove(&node);
            format!("restart {node}")
        }
        3 if out < minority && !down.contains(&node) && !paused.contains(&node) => {
            cluster.pause(node);
            paused.insert(node);
            format!("pause {node}")
        }
        4 if paused.contains(&node) => {
            cluster.resume(node);
            paused.remove(&node);
            format!("resume {node}")
        }
        5 => {
            let alone: Vec<u64> = vec![node];
            let rest: Vec<u64> = (1..=size).filter(|&n| n != node).collect();
            cluster.partition(&[alone, rest]);
            format!("partition {{{node}}} from the rest")
        }
        6 => {
            let to = rng.gen_range(1..=size);
            if to != node {
                cluster.cut(node, to);
            }
            format!("cut {node} -> {to}")
        }
        7 => {
            let loss = rng.gen_range(0.0..0.2);
            cluster.degrade(
                loss,
                Duration::from_millis(1)..Duration::from_millis(rng.gen_range(2..200)),
            );
            format!("degrade: loss {loss:.2}")
        }
        8 => {
            let jump = rng.gen_range(-600_000..600_000);
            cluster.skew_clock(node, jump);
            format!("clock of {node} jumps {jump} ms")
        }
        _ => {
            cluster.heal();
            "heal".to_string()
        }
    }
}

#[madsim::test]
async fn swarm_of_faults_keeps_every_guarantee() {
    let size = if madsim::rand::thread_rng().gen_bool(0.5) {
        3
    } else {
        5
    };
    let cluster = SimCluster::start(size);
    let ids: Vec<u64> = (1..=size).collect();
    cluster
        .wait_leader(&ids, Duration::from_secs(10))
        .await
        .expect("a first leader");
    let addrs = cluster.api_addrs();
    let workers = cluster
        .on_client(async move { Workers::start(4, addrs) })
        .await;

    let (mut down, mut paused) = (BTreeSet::new(), BTreeSet::new());
    let mut faults = Vec::new();
    for _ in 0..12 {
        let pause_ms = madsim::rand::thread_rng().gen_range(300..2500);
        madsim::time::sleep(Duration::from_millis(pause_ms)).await;
        faults.push(inject(&cluster, size, &mut down, &mut paused));
    }
    madsim::time::sleep(Duration::from_secs(2)).await;
    cluster.heal();
    for node in down {
        cluster.restart(node);
    }
    for node in paused {
        cluster.resume(node);
    }
    let history = workers.stop().await;

    let leader = cluster.wait_leader(&ids, LIVENESS_BOUND).await;
    assert!(
        leader.is_some(),
        "no leader {LIVENESS_BOUND:?} after the faults: {faults:?}"
    );
    let hash = cluster.wait_converged(&ids, LIVENESS_BOUND).await;
    assert!(
        hash.is_some(),
        "replicas differ {LIVENESS_BOUND:?} after the faults: {faults:?}"
    );

    let addr = cluster.nodes[&1].api_addr();
    let final_tasks: Vec<TaskJson> = cluster
        .on_client(async move {
            HttpClient::new()
                .get(&addr, &format!("/group/{GROUP}?owned=1"), CALL_TIMEOUT)
                .await
                .expect("the cluster serves")
                .json(&addr)
                .expect("tasks")
        })
        .await;
    match check(&history, &final_tasks) {
        Ok(report) => println!(
            "{size} nodes, faults {faults:?}: {report:?}, {} reads, {} retries",
            history.reads, history.retries
        ),
        Err(problems) => panic!(
            "{} violations with faults {faults:?}:\n{}",
            problems.len(),
            problems.join("\n")
        ),
    }
}
