//! Each scenario once per test run under madsim's own harness, so that
//! `MADSIM_TEST_SEED=S` replays a seed and `MADSIM_TEST_CHECK_DETERMINISM=1` checks that
//! two runs of one seed draw the same random numbers. The `sim` runner runs the many
//! seeds (`scripts/sim --seeds 100`).

#![cfg(madsim)]

use sim_tests::scenario::Scenario;
use sim_tests::scenario::run;

async fn passes(scenario: Scenario) {
    match run(scenario).await {
        Ok(report) => println!(
            "{scenario}: {} nodes, faults {:?}: {:?}; digest {}",
            report.nodes, report.faults, report.check, report.digest
        ),
        Err(failure) => panic!(
            "{scenario} failed with faults {:?}:\n{}",
            failure.faults,
            failure.problems.join("\n")
        ),
    }
}

#[madsim::test]
async fn swarm() {
    passes(Scenario::Swarm).await;
}

#[madsim::test]
async fn partition() {
    passes(Scenario::Partition).await;
}

#[madsim::test]
async fn crash() {
    passes(Scenario::Crash).await;
}

#[madsim::test]
async fn clock() {
    passes(Scenario::Clock).await;
}

#[madsim::test]
async fn membership() {
    passes(Scenario::Membership).await;
}
