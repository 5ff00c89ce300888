//! What simulated workers saw, and the checks of SPEC section 1 that their history
//! and the final state must pass. Plain data and pure functions: unit-tested in the
//! normal build, used by the simulation under madsim.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::fmt::Write as _;

use rpc::worker::TaskJson;
use store_sm::machine::constants::LOG_CLOCK_SLEW_RATE;

/// Largest correction of log time toward a node's wall clock, as a fraction of elapsed
/// time, doubled for the two leaders a lease may span.
pub const LEASE_SLEW: f64 = 2.0 * LOG_CLOCK_SLEW_RATE;

/// Scheduling slack in the real-time lease check: how far a lease may seem to end early
/// because a stamp is taken a little after the request was sent.
pub const LEASE_SLACK_US: u64 = 5_000;

/// One operation a worker finished, with the simulated times (µs since the run began)
/// at which it was first sent and its definite answer arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The worker (also its client id).
    pub worker: u64,
    /// The group it concerns.
    pub group: String,
    /// When it was first sent.
    pub invoked_us: u64,
    /// When its definite answer arrived.
    pub completed_us: u64,
    /// What it asked for.
    pub call: Call,
    /// The answer.
    pub result: Answer,
}

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// Add a task with this payload, if the `depends` tasks still exist.
    Add {
        /// Payload, unique in the run.
        data: String,
        /// Tasks of the same group that must exist (left untouched).
        depends: Vec<u64>,
    },
    /// Claim up to `count` tasks for this long (ms), waiting up to `wait_ms` for a task
    /// (0: answer at once).
    Claim {
        /// Lease length.
        duration_ms: i64,
        /// How long a blocking claim may wait for a task.
        wait_ms: u64,
        /// Most tasks to take (1: the seed's claim, sent without `count`).
        count: u32,
    },
    /// Renew task `id` for this long, keeping its payload.
    Renew {
        /// The owned version.
        id: u64,
        /// Its payload.
        data: String,
        /// New lease length.
        duration_ms: i64,
    },
    /// Delete task `id`.
    Delete {
        /// The owned version.
        id: u64,
    },
    /// Delete task `id` and add `follow_up` in the same transaction.
    Finish {
        /// The owned version.
        id: u64,
        /// Payload of the task that follows.
        follow_up: String,
    },
    /// A linearizable read of the whole group (`owned=1`).
    Read,
    /// Add a job with this payload and key that waits for the jobs `after` (`/update`).
    AddJob {
        /// Payload, unique in the run.
        data: String,
        /// The job's key, from a small pool so that keys collide.
        key: String,
        /// Keys of the group's jobs it waits for.
        after: Vec<String>,
    },
    /// Finish job task `id` with success (`/finish`).
    Complete {
        /// The claimed version.
        id: u64,
    },
    /// Finish job task `id` with success and, in the same write, claim one next job for
    /// `duration_ms` (`/finish` with `next`).
    CompleteAndClaim {
        /// The claimed version.
        id: u64,
        /// The next claim's lease length.
        duration_ms: i64,
    },
    /// Finish job tasks `ids` with success, all or none (`/finish/many`).
    CompleteMany {
        /// The claimed versions.
        ids: Vec<u64>,
    },
    /// Fail job task `id`, to be retried at once (`/fail` with `retry_in_ms` 0).
    FailJob {
        /// The claimed version.
        id: u64,
    },
    /// Cancel the job `key` (`/cancel`).
    Cancel {
        /// The job's key.
        key: String,
    },
    /// Pause or resume the group (`PUT /groups/{group}/settings`); answered as an empty
    /// list of tasks.
    Pause {
        /// Pause (true) or resume (false).
        paused: bool,
    },
}

/// A definite answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A write was done; these task versions were written (a claim may write none).
    Tasks(Vec<TaskJson>),
    /// A write was refused; nothing changed.
    Refused(Vec<String>),
    /// A read returned these tasks.
    Read(Vec<TaskJson>),
}

/// Everything the workers saw.
#[derive(Debug, Default)]
pub struct History {
    /// Operations with known outcomes, in completion order.
    pub ops: Vec<Op>,
    /// Stale reads that answered (not checked for freshness).
    pub stale_reads: u64,
    /// Calls that failed and were retried (timeouts, 503s, dropped connections).
    pub retries: u64,
    /// Finishes with `next` the leader did not take (a member not heard from), sent again
    /// without it.
    pub next_not_taken: u64,
    /// What the watchers saw, one stream per group.
    pub watches: Vec<WatchStream>,
}

/// One watcher's view of a group's changes, as `GET /watch` pages gave them through any
/// node, each asked after the previous page's revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchStream {
    /// The group watched.
    pub group: String,
    /// Runs of pages with no forgotten revision between them, in the order seen.
    pub segments: Vec<Vec<WatchSeen>>,
}

/// One change as a watch page gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSeen {
    /// The log index of the entry that made it.
    pub revision: u64,
    /// A task version written: its id; `None` for any other change.
    pub task: Option<u64>,
}

impl History {
    /// One line per operation, for the trace and its digest.
    pub fn trace_lines(&self) -> impl Iterator<Item = String> + '_ {
        self.ops.iter().map(|op| {
            let mut line = format!(
                "{}..{} w{} {} {:?} -> ",
                op.invoked_us, op.completed_us, op.worker, op.group, op.call
            );
            match &op.result {
                Answer::Tasks(tasks) | Answer::Read(tasks) => {
                    for task in tasks {
                        let _ = write!(line, "{}@{}/{} ", task.id, task.timespec, task.ownerid);
                    }
                }
                Answer::Refused(reasons) => line.push_str(&reasons.join("; ")),
            }
            line
        })
    }
}

/// What the checks counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Acknowledged writes checked.
    pub writes: usize,
    /// Refused writes whose effects were looked for.
    pub refused: usize,
    /// Task versions written.
    pub versions: usize,
    /// Claims checked for a second owner, in log time and in real time.
    pub claims: usize,
    /// Payloads whose final state was checked.
    pub payloads: usize,
    /// Acknowledged claims (with `count`) that took more than one task.
    pub claims_of_several: usize,
}

/// One payload's acknowledged versions, each with the operation that wrote it.
type Lineage<'a> = Vec<(&'a TaskJson, &'a Op)>;

/// Checks a history against the final state (`final_tasks`, every task of every group):
/// ids unique and increasing in real-time order; no acknowledged write lost; no deleted
/// task back; the latest version of every payload is the one that remains; nothing of a
/// refused write ever seen; no task version with two owners at once, judged in log time
/// and, allowing the stated slew, in real time. Returns what it checked, or every
/// violation found.
pub fn check(history: &History, final_tasks: &[TaskJson]) -> Result<CheckReport, Vec<String>> {
    let mut problems = Vec::new();
    let mut report = CheckReport::default();
    let mut writers: BTreeMap<u64, &Op> = BTreeMap::new();
    let mut lineage: BTreeMap<&str, Lineage<'_>> = BTreeMap::new();
    let mut deleted_ids = BTreeSet::new();
    let mut refused_payloads = BTreeMap::new();
    for op in &history.ops {
        match &op.result {
            Answer::Tasks(tasks) => {
                report.writes += 1;
                if matches!(op.call, Call::Claim { .. }) && tasks.len() > 1 {
                    report.claims_of_several += 1;
                }
                if let Call::Delete { id } | Call::Finish { id, .. } = op.call {
                    deleted_ids.insert(id);
                }
                if op.group == crate::JOB_GROUP {
                    // Jobs end by finish, death or cancel, not by the deletes these
                    // payload checks follow; the linearizability check covers them.
                    report.versions += tasks.len();
                    for task in tasks {
                        if let Some(other) = writers.insert(task.id, op) {
                            problems.push(format!(
                                "task id {} written by two acknowledged writes: {other:?} and {op:?}",
                                task.id
                            ));
                        }
                    }
                    continue;
                }
                for task in tasks {
                    report.versions += 1;
                    if let Some(other) = writers.insert(task.id, op) {
                        problems.push(format!(
                            "task id {} written by two acknowledged writes: {other:?} and {op:?}",
                            task.id
                        ));
                    }
                    lineage.entry(&task.data).or_default().push((task, op));
                }
            }
            Answer::Refused(_) => {
                report.refused += 1;
                if let Call::Add { data, .. }
                | Call::Finish {
                    follow_up: data, ..
                } = &op.call
                {
                    refused_payloads.insert(data.as_str(), op);
                }
            }
            Answer::Read(_) => {}
        }
    }
    check_id_order(history, &mut problems);

    // Nothing a refused write would have added may ever be seen.
    let seen = history
        .ops
        .iter()
        .filter_map(|op| match &op.result {
            Answer::Read(tasks) => Some(tasks.iter()),
            _ => None,
        })
        .flatten()
        .chain(final_tasks);
    for task in seen {
        if let Some(op) = refused_payloads.get(task.data.as_str()) {
            problems.push(format!(
                "task {} holds payload {:?} of a refused write: {op:?}",
                task.id, task.data
            ));
            refused_payloads.remove(task.data.as_str());
        }
    }

    let final_by_data: BTreeMap<&str, &TaskJson> =
        final_tasks.iter().map(|t| (t.data.as_str(), t)).collect();
    for (data, versions) in &mut lineage {
        report.payloads += 1;
        versions.sort_by_key(|(task, _)| task.id);
        check_final(data, versions, &final_by_data, &deleted_ids, &mut problems);
        for pair in versions.windows(2) {
            if let Call::Claim { duration_ms, .. } = pair[1].1.call {
                report.claims += 1;
                check_claim(data, pair[0], pair[1], duration_ms, &mut problems);
            }
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(problems)
    }
}

/// A write that finished before another began must have lower ids.
fn check_id_order(history: &History, problems: &mut Vec<String>) {
    let spans: Vec<IdSpan> = history
        .ops
        .iter()
        .filter_map(|op| match &op.result {
            Answer::Tasks(tasks) => IdSpan::of(op.invoked_us, op.completed_us, tasks),
            _ => None,
        })
        .collect();
    problems.extend(id_order_violations(spans));
}

/// When an acknowledged write was sent and answered (µs), and the ids it wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IdSpan {
    /// Sent.
    pub invoked_us: u64,
    /// Answered.
    pub completed_us: u64,
    /// Lowest id written.
    pub low: u64,
    /// Highest id written.
    pub high: u64,
}

impl IdSpan {
    /// The span of a write that wrote `tasks`; `None` if it wrote none.
    pub fn of(invoked_us: u64, completed_us: u64, tasks: &[TaskJson]) -> Option<Self> {
        Some(Self {
            invoked_us,
            completed_us,
            low: tasks.iter().map(|t| t.id).min()?,
            high: tasks.iter().map(|t| t.id).max()?,
        })
    }
}

/// Every write whose ids are not above those of a write answered before it was sent.
pub fn id_order_violations(mut spans: Vec<IdSpan>) -> Vec<String> {
    spans.sort_unstable();
    let mut completions: Vec<(u64, u64)> = spans.iter().map(|s| (s.completed_us, s.high)).collect();
    completions.sort_unstable();
    // Highest id among writes completed before each point, as a running maximum.
    let mut running = Vec::with_capacity(completions.len());
    let mut high_so_far = 0;
    for &(completed, high) in &completions {
        high_so_far = high_so_far.max(high);
        running.push((completed, high_so_far));
    }
    let mut problems = Vec::new();
    for span in &spans {
        let before = running.partition_point(|&(completed, _)| completed < span.invoked_us);
        if before > 0 && running[before - 1].1 >= span.low {
            problems.push(format!(
                "id {} written at {} µs is not above id {} acknowledged before",
                span.low,
                span.invoked_us,
                running[before - 1].1
            ));
        }
    }
    problems
}

/// The payload's latest acknowledged version is what the store holds, unless deleted.
fn check_final(
    data: &str,
    versions: &Lineage<'_>,
    final_by_data: &BTreeMap<&str, &TaskJson>,
    deleted_ids: &BTreeSet<u64>,
    problems: &mut Vec<String>,
) {
    let latest = versions.last().map(|(task, _)| *task);
    let was_deleted = versions.iter().any(|(t, _)| deleted_ids.contains(&t.id));
    problems.extend(final_state_violation(
        data,
        latest,
        was_deleted,
        final_by_data.get(data).copied(),
    ));
}

/// What is wrong, if anything, with payload `data` holding `found` in the final state,
/// when `latest` is its last acknowledged version and `was_deleted` says whether an
/// acknowledged delete removed one of its versions.
pub fn final_state_violation(
    data: &str,
    latest: Option<&TaskJson>,
    was_deleted: bool,
    found: Option<&TaskJson>,
) -> Option<String> {
    match (found, latest, was_deleted) {
        (Some(found), _, true) => Some(format!(
            "payload {data:?} was deleted but task {} holds it",
            found.id
        )),
        (Some(found), Some(latest), false) if found.id != latest.id => Some(format!(
            "payload {data:?}: the store holds version {} but the latest acknowledged is {}",
            found.id, latest.id
        )),
        (None, Some(latest), false) => Some(format!(
            "payload {data:?}: acknowledged version {} is lost",
            latest.id
        )),
        _ => None,
    }
}

/// A claim by another client may only take a task once its owner's lease ended: in log
/// time (the stamps) and in real time (the lease began no earlier than the owner's
/// request was sent, so it cannot end before `sent + duration`, less the slew).
fn check_claim(
    data: &str,
    (before, owner_op): (&TaskJson, &Op),
    (after, claim_op): (&TaskJson, &Op),
    duration_ms: i64,
    problems: &mut Vec<String>,
) {
    if before.ownerid == after.ownerid {
        return;
    }
    let claimed_at = after.timespec - duration_ms;
    if claimed_at < before.timespec {
        problems.push(format!(
            "payload {data:?}: client {} claimed version {} at log time {claimed_at} while client {} owned version {} until {}",
            after.ownerid, after.id, before.ownerid, before.id, before.timespec
        ));
    }
    let owner_lease_ms = match owner_op.call {
        Call::Claim { duration_ms, .. } | Call::Renew { duration_ms, .. } => duration_ms,
        _ => return,
    };
    let lease_us = (owner_lease_ms.max(0) as u64) * 1000;
    let slack_us = (lease_us as f64 * LEASE_SLEW) as u64 + LEASE_SLACK_US;
    let earliest_end = owner_op.invoked_us + lease_us.saturating_sub(slack_us);
    if claim_op.completed_us < earliest_end {
        problems.push(format!(
            "payload {data:?}: client {} held version {} from {} µs for {owner_lease_ms} ms, but client {} had claimed it by {} µs (real time)",
            before.ownerid, before.id, owner_op.invoked_us, after.ownerid, claim_op.completed_us
        ));
    }
}

/// Histories written by hand, for the checkers' tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A task version of group `g`.
    pub fn task(id: u64, data: &str, timespec: i64, owner: i64) -> TaskJson {
        TaskJson {
            id,
            group: "g".into(),
            data: data.into(),
            timespec,
            ownerid: owner,
            key: None,
            priority: 0,
            attempt: 0,
        }
    }

    /// An operation on group `g` between `span.0` and `span.1` µs.
    pub fn op(worker: u64, span: (u64, u64), call: Call, result: Answer) -> Op {
        Op {
            worker,
            group: "g".into(),
            invoked_us: span.0,
            completed_us: span.1,
            call,
            result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    fn add(worker: u64, span: (u64, u64), id: u64, data: &str) -> Op {
        let call = Call::Add {
            data: data.into(),
            depends: Vec::new(),
        };
        let result = Answer::Tasks(vec![task(id, data, 0, worker as i64)]);
        op(worker, span, call, result)
    }

    #[test]
    fn a_clean_history_passes_and_is_counted() {
        let history = History {
            ops: vec![
                add(1, (0, 10), 1, "a"),
                add(2, (20, 30), 2, "b"),
                op(
                    2,
                    (40, 50),
                    Call::Claim {
                        duration_ms: 100,
                        wait_ms: 0,
                        count: 1,
                    },
                    Answer::Tasks(vec![task(3, "a", 100, 2)]),
                ),
            ],
            ..History::default()
        };
        let report =
            check(&history, &[task(2, "b", 0, 2), task(3, "a", 100, 2)]).expect("no violation");
        assert_eq!((report.writes, report.claims, report.payloads), (3, 1, 2));
    }

    #[test]
    fn a_lost_write_and_an_id_going_back_are_reported() {
        let history = History {
            ops: vec![add(1, (0, 10), 5, "a"), add(2, (20, 30), 4, "b")],
            ..History::default()
        };
        let problems = check(&history, &[task(4, "b", 0, 2)]).expect_err("violations");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("is lost")));
        assert!(problems.iter().any(|p| p.contains("is not above")));
    }

    #[test]
    fn a_refused_payload_seen_later_is_reported() {
        let history = History {
            ops: vec![op(
                1,
                (0, 10),
                Call::Finish {
                    id: 9,
                    follow_up: "next".into(),
                },
                Answer::Refused(vec!["id 9 is missing".into()]),
            )],
            ..History::default()
        };
        let problems = check(&history, &[task(10, "next", 0, 1)]).expect_err("violation");
        assert!(problems[0].contains("refused write"), "{problems:?}");
    }

    #[test]
    fn a_lease_taken_early_in_real_time_is_reported_even_when_log_time_agrees() {
        // Client 1 claims at 1 s for 3 s; client 2 takes the task 1 s later, with a log
        // time stamp that (by a leader's jumped clock) lies after the lease.
        let history = History {
            ops: vec![
                add(1, (0, 10), 1, "a"),
                op(
                    1,
                    (1_000_000, 1_000_100),
                    Call::Claim {
                        duration_ms: 3000,
                        wait_ms: 0,
                        count: 1,
                    },
                    Answer::Tasks(vec![task(2, "a", 4_000, 1)]),
                ),
                op(
                    2,
                    (2_000_000, 2_000_100),
                    Call::Claim {
                        duration_ms: 3000,
                        wait_ms: 0,
                        count: 1,
                    },
                    Answer::Tasks(vec![task(3, "a", 600_000, 2)]),
                ),
            ],
            ..History::default()
        };
        let problems = check(&history, &[task(3, "a", 600_000, 2)]).expect_err("violation");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("real time"), "{problems:?}");
    }
}
