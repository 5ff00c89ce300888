//! Keeps a node's log clock: follows the time of entries other leaders stamped, keeps the
//! clock record on disk, and catches a new leader's clock up after the whole cluster was
//! down (the reasoning is in [`crate::clock`]).

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use store_sm::machine::LogTime;
use store_sm::machine::Request;
use store_sm::raft_types::NodeId;

use crate::clock::ClockRecord;
use crate::clock::RESUME_FORGOTTEN_AFTER;
use crate::node::SharedNode;
use crate::storage::NodeSnapshots;

/// How often the clock record is rewritten. Its age never makes a catch-up unsafe (see
/// [`crate::clock`]); a record older than the outage only makes it smaller.
pub const CLOCK_RECORD_EVERY: Duration = Duration::from_secs(1);

/// Reads the record a node kept before it stopped; a missing or unreadable one means no
/// catch-up from this node, which is always safe.
pub fn load_record(notes: &NodeSnapshots) -> Option<ClockRecord> {
    match notes.load_note() {
        Ok(Some(bytes)) => match serde_json::from_slice(&bytes) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an unreadable clock record");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the clock record");
            None
        }
    }
}

fn save_record(node: &SharedNode, notes: &NodeSnapshots) {
    // The estimate, not the clock: a node that restarts twice in a row must not forget
    // the outage it learned of from its first record.
    let record = ClockRecord {
        log_ms: node.clock.estimate().as_millis(),
        ..node.clock.record()
    };
    let saved = serde_json::to_vec(&record)
        .map_err(std::io::Error::other)
        .and_then(|bytes| notes.save_note(&bytes));
    if let Err(e) = saved {
        tracing::warn!(error = %e, "cannot keep the clock record");
    }
}

/// Runs until Raft shuts down: sets the clock to the time of each entry this node applies
/// that another leader (or this node in an earlier term) stamped, rewrites the clock
/// record every [`CLOCK_RECORD_EVERY`], and starts [`catch_up`] (and the completion of
/// a membership change an earlier leader left joint) in each term this node leads.
pub async fn keep_log_time(node: SharedNode, notes: NodeSnapshots) {
    let mut metrics = node.raft.metrics();
    let mut seen_applied = None;
    let mut followed = None;
    let mut caught_up_term = None;
    let mut next_record = tokio::time::Instant::now();
    let mut leader_known_since = None;
    let mut resume_forgotten = false;
    tokio::spawn(pass_due_time(node.clone()));
    loop {
        let (stamped_here, applied, leading_term) = {
            let now = metrics.borrow_watched();
            // Checked on every wake-up (every apply on a follower): once done, done.
            if !resume_forgotten && now.current_leader.is_some() {
                let since = *leader_known_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= RESUME_FORGOTTEN_AFTER {
                    node.clock.forget_resume();
                    resume_forgotten = true;
                }
            }
            let leading = now.state == ServerState::Leader;
            let stamped_here = now.last_applied.is_some_and(|id| {
                let leader = id.committed_leader_id();
                leading && leader.term == now.current_term && leader.node_id == node.id()
            });
            (
                stamped_here,
                now.last_applied,
                leading.then_some(now.current_term),
            )
        };
        if !stamped_here && applied.is_some() && applied != seen_applied {
            // Only a new stamp moves the clock: an entry without one (a membership
            // change, a new leader's blank entry) leaves the machine's time where the
            // last command put it, which may be long ago on an idle cluster.
            let log_time = node.state.read(|s| s.machine.log_time());
            if log_time > LogTime::EPOCH && Some(log_time) != followed {
                if leading_term.is_some() {
                    // A new leader applying an earlier term's entries: never back, or
                    // it would undo its catch-up and stamp behind the time it settled.
                    node.clock.advance_to(log_time);
                } else {
                    node.clock.follow(log_time);
                }
                followed = Some(log_time);
            }
        }
        seen_applied = applied;
        if let Some(term) = leading_term.filter(|term| Some(*term) != caught_up_term) {
            caught_up_term = Some(term);
            tokio::spawn(catch_up(node.clone(), term));
            // Not about time, but due at the same moment: the start of a term this node
            // leads (see `Node::finish_interrupted_change`).
            let leader = node.clone();
            tokio::spawn(async move { leader.finish_interrupted_change().await });
        }
        if tokio::time::Instant::now() >= next_record {
            save_record(&node, &notes);
            next_record = tokio::time::Instant::now() + CLOCK_RECORD_EVERY;
        }
        tokio::select! {
            biased;
            changed = metrics.changed() => if changed.is_err() {
                save_record(&node, &notes);
                return;
            },
            () = tokio::time::sleep_until(next_record) => {}
        }
    }
}

/// A lease or a record's retention that ended this long ago with no entry applied since
/// is passed by a [`Request::PassTime`] entry: a busy leader's own commands pass it
/// sooner, and then none is proposed.
const DUE_GRACE: Duration = Duration::from_millis(10);

/// How long the leader waits, at most, before it looks for what falls due next (a
/// lease granted meanwhile may end sooner than what it saw).
const DUE_LOOK_MAX: Duration = Duration::from_millis(250);

/// Runs until Raft shuts down: while this node leads, proposes a [`Request::PassTime`]
/// entry when a lease or a finished record's retention ended and no entry has passed
/// that time since. Reads already judge at the leader's clock; this puts the lapse in
/// the log, so that every watch sees it on an idle cluster too.
pub async fn pass_due_time(node: SharedNode) {
    let server = node.raft.server_metrics();
    loop {
        let leading = server.borrow_watched().state == ServerState::Leader;
        let mut wait = DUE_LOOK_MAX;
        if leading && node.check_member().is_ok() {
            let due = node.state.read(|s| s.machine.next_due());
            let now = node.clock.now();
            if let Some(due) = due {
                let late = u64::try_from(now.millis_since(due)).unwrap_or(0);
                if due <= now && Duration::from_millis(late) >= DUE_GRACE {
                    if let Err(e) = node.write(Request::PassTime, None).await {
                        tracing::debug!(error = %e, "could not pass due time");
                    }
                    wait = DUE_GRACE;
                } else {
                    let ahead = u64::try_from(due.millis_since(now)).unwrap_or(0);
                    wait = (Duration::from_millis(ahead) + DUE_GRACE).min(DUE_LOOK_MAX);
                }
            }
        }
        // Slept, not woken by the metrics: tokio's watch wakes its waiters in a random
        // order the simulation cannot replay, and a new leader looks within `wait`.
        tokio::time::sleep(wait).await;
        if server.borrow_watched().state == ServerState::Shutdown {
            return;
        }
    }
}

/// How long a new leader waits before it asks again when fewer than a majority of voters
/// answered with their estimates.
const CATCH_UP_RETRY: Duration = Duration::from_millis(50);

/// Settles a new leader's clock in `term`: moves it forward to the smallest estimate of
/// log time among a majority of voters (itself included), if that is ahead, then lets
/// [`crate::Node::write`] stamp commands. Asks again until a majority answers or this
/// node no longer leads in `term`.
///
/// No command may be stamped before: a stamp taken from a clock that a catch-up then
/// moves forward grants a lease that ends early in real time (a restarted leader stamps
/// from the old state it opened until its catch-up; the simulation found this).
pub async fn catch_up(node: SharedNode, term: u64) {
    while node.leading_term() == Some(term) {
        if let Some(target) = settled_estimate(&node).await {
            let before = node.clock.now();
            if target > before {
                node.clock.advance_to(target);
                tracing::info!(
                    by_ms = target.millis_since(before),
                    "log time caught up with an outage"
                );
            }
            node.clock_settled_term
                .fetch_max(term, std::sync::atomic::Ordering::AcqRel);
            return;
        }
        tokio::time::sleep(CATCH_UP_RETRY).await;
    }
}

/// A majority's smallest estimate at most this far ahead of a new leader's clock is taken
/// without waiting for the other voters: followers' clocks run a few milliseconds ahead
/// of a new leader's (they took the old leader's time later), and a voter that does not
/// answer (paused, cut off) would otherwise hold up the first writes by an RPC deadline.
const SETTLE_WITHOUT_ALL: Duration = Duration::from_millis(50);

/// The smallest estimate of log time among the voters that answer (this node's
/// included), or `None` if fewer than a majority answer within an RPC deadline.
///
/// Any majority has a node whose clock did not jump forward while only a minority's did
/// (see [`crate::clock`]), so a majority's answers suffice when they would move the clock
/// by little; a larger move waits for every voter's answer (each within an RPC deadline),
/// whose smallest also holds when more than a minority restarted with a wall clock that
/// jumped ahead while they were down (the simulation found such a run).
async fn settled_estimate(node: &SharedNode) -> Option<LogTime> {
    let (voters, peers): (Vec<NodeId>, Vec<(NodeId, String)>) = {
        let watch = node.raft.metrics();
        let metrics = watch.borrow_watched();
        let membership = metrics.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let peers = voters
            .iter()
            .filter(|id| **id != node.id())
            .filter_map(|id| membership.get_node(id).map(|n| (*id, n.raft_addr.clone())))
            .collect();
        (voters, peers)
    };
    let majority = voters.len() / 2 + 1;
    let mut asks: FuturesUnordered<_> = peers
        .into_iter()
        .map(|(id, addr)| {
            let peer = node.peer(id, addr);
            async move { (id, peer.clock_estimate().await) }
        })
        .collect();
    let mut smallest = node.clock.estimate();
    let mut answers = 1;
    loop {
        if answers >= majority {
            let near = smallest.millis_since(node.clock.now()) <= millis(SETTLE_WITHOUT_ALL);
            if near || asks.is_empty() {
                return Some(smallest);
            }
        }
        match asks.next().await {
            Some((_, Ok(estimate))) => {
                smallest = smallest.min(estimate);
                answers += 1;
            }
            Some((id, Err(e))) => tracing::debug!(peer = id, error = %e, "no clock estimate"),
            None => break,
        }
    }
    if answers >= majority {
        return Some(smallest);
    }
    tracing::info!(
        answers,
        voters = voters.len(),
        "log time not settled yet: no majority of clock estimates"
    );
    None
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
