//! The checkers are tested: each known bug, planted alone, must make some seed of the
//! scenario that exposes it fail within [`SEEDS_TO_CATCH`] seeds.

#![cfg(madsim)]

use sim_tests::scenario::Scenario;
use sim_tests::scenario::run_seed;
use store_sm::planted::Bug;

/// Seeds each planted bug gets before the test calls it missed.
const SEEDS_TO_CATCH: u64 = 20;

fn caught_within(bug: Bug) -> Option<(u64, Vec<String>)> {
    let scenario = Scenario::exposing(bug);
    (1..=SEEDS_TO_CATCH).find_map(|seed| {
        run_seed(scenario, seed, Some(bug))
            .err()
            .map(|failure| (seed, failure.problems))
    })
}

fn assert_caught(bug: Bug) {
    match caught_within(bug) {
        Some((seed, problems)) => println!(
            "{bug}: caught by {} seed {seed}: {}",
            Scenario::exposing(bug),
            problems.first().map_or("", String::as_str)
        ),
        None => panic!(
            "planted bug {bug} went unnoticed by {} seeds of {}",
            SEEDS_TO_CATCH,
            Scenario::exposing(bug)
        ),
    }
}

#[test]
fn ack_before_sync_is_caught() {
    assert_caught(Bug::AckBeforeSync);
}

#[test]
fn follower_read_is_caught() {
    assert_caught(Bug::FollowerRead);
}

#[test]
fn wall_clock_lease_is_caught() {
    assert_caught(Bug::WallClockLease);
}

#[test]
fn id_reuse_is_caught() {
    assert_caught(Bug::IdReuse);
}

#[test]
fn partial_transaction_is_caught() {
    assert_caught(Bug::PartialTransaction);
}

#[test]
fn ignore_max_running_is_caught() {
    assert_caught(Bug::IgnoreMaxRunning);
}

#[test]
fn unfenced_finish_is_caught() {
    assert_caught(Bug::UnfencedFinish);
}

#[test]
fn watch_skip_is_caught() {
    assert_caught(Bug::WatchSkip);
}

#[test]
fn local_token_check_is_caught() {
    assert_caught(Bug::LocalTokenCheck);
}
