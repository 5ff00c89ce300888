//! Linearizability of one group's history against the sequential task machine, by a
//! Wing-Gong search with memoisation (Lowe's refinement).
//!
//! The model is the real [`TaskMachine`], fed only the group's operations. It numbers
//! tasks its own way, so the search keeps a map from the ids the cluster returned to the
//! model's ids; that map must grow in increasing order along the linearization (ids are
//! issued in log order), which prunes most orders at once. A command's log time is read
//! back from its answer (an add's available time, a claim's or renewal's time less its
//! duration); an operation whose answer carries no time runs at the model's current
//! time, which is sound because log time only grows and availability only widens with it.
//!
//! Groups are checked separately to keep each search small: operations on different
//! groups never change each other's answers, except for the shared id counter, which
//! [`crate::history::check`] checks across groups.

use std::collections::HashSet;

use imbl::OrdMap;
use rpc::worker::TaskJson;
use store_sm::machine::AddJob;
use store_sm::machine::AddTask;
use store_sm::machine::CancelRequest;
use store_sm::machine::ClaimManyRequest;
use store_sm::machine::ClaimRequest;
use store_sm::machine::Command;
use store_sm::machine::FailRequest;
use store_sm::machine::FinishAndClaimRequest;
use store_sm::machine::FinishItem;
use store_sm::machine::FinishManyRequest;
use store_sm::machine::FinishRequest;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::SettingsChange;
use store_sm::machine::SettingsRequest;
use store_sm::machine::Task;
use store_sm::machine::TaskMachine;
use store_sm::machine::UpdateRequest;
use store_sm::machine::UpdateTask;

use crate::JOB_GROUP;
use crate::JOB_MAX_ATTEMPTS;
use crate::JOB_MAX_RUNNING;
use crate::history::Answer;
use crate::history::Call;
use crate::history::Op;

/// Search steps allowed per group before the check gives up as inconclusive.
pub const STEPS_MAX: u64 = 2_000_000;

/// Model id given to an observed id the model has not seen: no task has it.
const UNKNOWN_ID: u64 = u64::MAX;

/// How the check of one group ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A linearization exists; the search took this many steps.
    Linearizable {
        /// Operations placed and taken back, in total.
        steps: u64,
    },
    /// No order of the operations explains every answer.
    NotLinearizable {
        /// The longest prefix the search could explain, as operation descriptions.
        longest_prefix: usize,
        /// The operation the longest prefix could not be extended by, described.
        stuck_at: String,
    },
    /// The search hit [`STEPS_MAX`].
    GaveUp,
}

/// The model after a prefix of a linearization.
#[derive(Clone)]
struct ModelState {
    machine: TaskMachine,
    /// Observed id to model id.
    ids: OrdMap<u64, u64>,
    /// Highest observed id mapped so far.
    highest_observed: u64,
}

/// Checks `ops` (all of one group) for linearizability.
pub fn check_group(group: &str, ops: &[&Op]) -> Verdict {
    let mut ops: Vec<&Op> = ops.to_vec();
    ops.sort_by_key(|op| (op.invoked_us, op.completed_us));
    let n = ops.len();
    let mut done = vec![false; n];
    let mut done_count = 0;
    let mut bits = vec![0u64; n.div_ceil(64)];
    // Memoised on the operations placed and what their answers leave undetermined: the
    // job records and settings (a cancel and an add of the same key, or a pause and a
    // resume, answer alike in either order but leave different states), so that one
    // order never hides the other.
    let mut seen: HashSet<(Vec<u64>, u64)> = HashSet::new();
    // Each frame: the state before placing an op, the op placed, and where to resume.
    let mut stack: Vec<(ModelState, usize)> = Vec::new();
    let mut state = ModelState {
        machine: initial_machine(group),
        ids: OrdMap::new(),
        highest_observed: 0,
    };
    let mut next_candidate = 0;
    let mut steps = 0u64;
    let mut longest = (0, String::new());
    loop {
        if done_count == n {
            return Verdict::Linearizable { steps };
        }
        // An op may go next only if it began before every pending op's answer arrived.
        let horizon = ops
            .iter()
            .zip(&done)
            .filter(|(_, d)| !**d)
            .map(|(op, _)| op.completed_us)
            .min()
            .unwrap_or(u64::MAX);
        let mut placed = false;
        let mut candidate = next_candidate;
        while candidate < n && ops[candidate].invoked_us <= horizon {
            if !done[candidate] {
                steps += 1;
                if steps > STEPS_MAX {
                    return Verdict::GaveUp;
                }
                if let Some(after) = apply(group, &state, ops[candidate]) {
                    bits[candidate / 64] |= 1 << (candidate % 64);
                    if seen.insert((bits.clone(), job_fingerprint(&after.machine))) {
                        stack.push((std::mem::replace(&mut state, after), candidate));
                        done[candidate] = true;
                        done_count += 1;
                        placed = true;
                        break;
                    }
                    bits[candidate / 64] &= !(1 << (candidate % 64));
                } else if done_count >= longest.0 {
                    longest = (done_count, format!("{:?}", ops[candidate]));
                }
            }
            candidate += 1;
        }
        if placed {
            next_candidate = 0;
            continue;
        }
        let Some((before, undone)) = stack.pop() else {
            return Verdict::NotLinearizable {
                longest_prefix: longest.0,
                stuck_at: longest.1,
            };
        };
        state = before;
        done[undone] = false;
        done_count -= 1;
        bits[undone / 64] &= !(1 << (undone % 64));
        next_candidate = undone + 1;
    }
}

/// A digest of the model's job records (key, state, task, run, attempts) and group
/// settings: constant for a group without jobs. `DefaultHasher::new` has fixed keys, so runs replay.
fn job_fingerprint(machine: &TaskMachine) -> u64 {
    use std::hash::Hash;
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for record in machine.iter_jobs() {
        (
            &record.key,
            record.state,
            record.task,
            record.run,
            record.attempts,
        )
            .hash(&mut hasher);
    }
    for (group, settings) in machine.configured_groups() {
        (group, settings.paused, settings.max_running).hash(&mut hasher);
    }
    hasher.finish()
}

/// The model before any operation: empty, with the job group's settings as the
/// simulation sets them before its workers start.
fn initial_machine(group: &str) -> TaskMachine {
    let mut machine = TaskMachine::new();
    if group == JOB_GROUP {
        machine.apply(&Command {
            stamp: LogTime::EPOCH,
            request_id: None,
            request: Request::Settings(SettingsRequest {
                client: 0,
                group: group.to_string(),
                change: SettingsChange {
                    max_running: Some(JOB_MAX_RUNNING),
                    max_attempts: Some(JOB_MAX_ATTEMPTS),
                    ..SettingsChange::default()
                },
            }),
        });
    }
    machine
}

/// The model after `op`, or `None` if the model's answer differs from the observed one.
fn apply(group: &str, state: &ModelState, op: &Op) -> Option<ModelState> {
    let client = op.worker as i64;
    let to_model = |id: u64| state.ids.get(&id).copied().unwrap_or(UNKNOWN_ID);
    let written = match &op.result {
        Answer::Tasks(tasks) => Some(tasks.as_slice()),
        _ => None,
    };
    let stamp = |duration_ms: i64| {
        written
            .and_then(|tasks| tasks.first())
            .map_or(0, |t| t.timespec - duration_ms)
    };
    let (request, stamp_ms) = match &op.call {
        Call::Read => return read_matches(group, state, &op.result).then(|| state.clone()),
        Call::Add { data, depends } => (
            Request::Update(UpdateRequest {
                client,
                adds: vec![AddTask::seed(group, data.clone(), None)],
                depends: depends.iter().map(|&id| to_model(id)).collect(),
                ..UpdateRequest::default()
            }),
            stamp(0),
        ),
        Call::Claim {
            duration_ms, count, ..
        } => (
            ClaimManyRequest {
                claim: ClaimRequest {
                    client,
                    group: group.to_string(),
                    duration_ms: *duration_ms,
                    depends: Vec::new(),
                },
                count: *count,
            }
            .to_request(false),
            stamp(*duration_ms),
        ),
        Call::Renew {
            id,
            data,
            duration_ms,
        } => (
            Request::Update(UpdateRequest {
                client,
                updates: vec![UpdateTask {
                    id: to_model(*id),
                    data: data.clone(),
                    timespec: Some(-duration_ms),
                }],
                ..UpdateRequest::default()
            }),
            stamp(*duration_ms),
        ),
        Call::Delete { id } => (
            Request::Update(UpdateRequest {
                client,
                deletes: vec![to_model(*id)],
                ..UpdateRequest::default()
            }),
            0,
        ),
        Call::AddJob { data, key, after } => {
            let mut add = AddTask::seed(group, data.clone(), None);
            add.job = AddJob {
                key: Some(key.clone()),
                after: after.clone(),
                ..AddJob::default()
            };
            (
                Request::Update(UpdateRequest {
                    client,
                    adds: vec![add],
                    ..UpdateRequest::default()
                }),
                stamp(0),
            )
        }
        Call::Complete { id } => (
            Request::Finish(FinishRequest {
                client,
                id: to_model(*id),
                result: None,
            }),
            0,
        ),
        Call::CompleteAndClaim { id, duration_ms } => (
            Request::FinishAndClaim(FinishAndClaimRequest {
                finish: FinishRequest {
                    client,
                    id: to_model(*id),
                    result: None,
                },
                next: ClaimManyRequest {
                    claim: ClaimRequest {
                        client,
                        group: group.to_string(),
                        duration_ms: *duration_ms,
                        depends: Vec::new(),
                    },
                    count: 1,
                },
            }),
            stamp(*duration_ms),
        ),
        Call::CompleteMany { ids } => (
            Request::FinishMany(FinishManyRequest {
                client,
                finishes: ids
                    .iter()
                    .map(|&id| FinishItem {
                        id: to_model(id),
                        result: None,
                    })
                    .collect(),
            }),
            0,
        ),
        // Retried at once, so the retry's available time is the command's log time.
        Call::FailJob { id } => (
            Request::Fail(FailRequest {
                client,
                id: to_model(*id),
                error: "simulated failure".into(),
                retry_in_ms: Some(0),
            }),
            stamp(0),
        ),
        Call::Pause { paused } => (
            Request::Settings(SettingsRequest {
                client,
                group: group.to_string(),
                change: SettingsChange {
                    paused: Some(*paused),
                    ..SettingsChange::default()
                },
            }),
            0,
        ),
        Call::Cancel { key } => (
            Request::Cancel(CancelRequest {
                client,
                group: group.to_string(),
                keys: vec![key.clone()],
            }),
            0,
        ),
        Call::Finish { id, follow_up } => (
            Request::Update(UpdateRequest {
                client,
                adds: vec![AddTask::seed(group, follow_up.clone(), None)],
                deletes: vec![to_model(*id)],
                ..UpdateRequest::default()
            }),
            stamp(0),
        ),
    };
    let mut next = state.clone();
    let outcome = next.machine.apply(&Command {
        stamp: LogTime::from_millis(stamp_ms),
        request_id: None,
        request,
    });
    match (&*outcome, &op.result) {
        (Outcome::Refused(_), Answer::Refused(_)) => Some(next),
        (Outcome::Settings(_), Answer::Tasks(tasks)) if tasks.is_empty() => Some(next),
        (Outcome::Tasks(model), Answer::Tasks(observed)) if model.len() == observed.len() => {
            for (model, observed) in model.iter().zip(observed) {
                if !same_task(model, observed) || observed.id <= next.highest_observed {
                    return None;
                }
                next.ids.insert(observed.id, model.id);
                next.highest_observed = observed.id;
            }
            Some(next)
        }
        _ => None,
    }
}

fn same_task(model: &Task, observed: &TaskJson) -> bool {
    model.data == observed.data
        && model.available_at.as_millis() == observed.timespec
        && model.owner == observed.ownerid
        && model.job.key.as_deref() == observed.key.as_deref()
        && model.job.attempt == observed.attempt
        && model.job.priority == observed.priority
}

/// Whether a read of the whole group returned exactly the model's tasks.
fn read_matches(group: &str, state: &ModelState, answer: &Answer) -> bool {
    let Answer::Read(observed) = answer else {
        return false;
    };
    let mut observed_ids: Vec<u64> = Vec::with_capacity(observed.len());
    for task in observed {
        match state.ids.get(&task.id) {
            Some(&model_id) => observed_ids.push(model_id),
            None => return false,
        }
    }
    observed_ids.sort_unstable();
    let mut model_ids: Vec<u64> = state
        .machine
        .iter_group(group, true, LogTime::EPOCH)
        .map(|t| t.id)
        .collect();
    model_ids.sort_unstable();
    observed_ids == model_ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::fixtures::*;

    fn add(worker: u64, span: (u64, u64), id: u64, data: &str, at: i64) -> Op {
        let call = Call::Add {
            data: data.into(),
            depends: Vec::new(),
        };
        op(
            worker,
            span,
            call,
            Answer::Tasks(vec![task(id, data, at, worker as i64)]),
        )
    }

    fn read(span: (u64, u64), tasks: Vec<TaskJson>) -> Op {
        op(9, span, Call::Read, Answer::Read(tasks))
    }

    fn verdict(ops: &[Op]) -> Verdict {
        check_group("g", &ops.iter().collect::<Vec<_>>())
    }

    fn job_task(id: u64, data: &str, at: i64, owner: i64, attempt: u32) -> TaskJson {
        TaskJson {
            key: Some("k".into()),
            attempt,
            ..task(id, data, at, owner)
        }
    }

    #[test]
    fn a_cancel_concurrent_with_an_add_of_its_key_may_go_first() {
        // The second cancel finds the job already cancelled only if it goes before the
        // add of "b"; the claim of "b" then says it did. Both orders answer alike, so a
        // search that remembered only which operations it placed would try the add
        // first, fail at the claim, and never try the cancel first.
        let add_job = |worker: u64, span, id, data: &str, at| {
            let call = Call::AddJob {
                data: data.into(),
                key: "k".into(),
                after: Vec::new(),
            };
            let answer = Answer::Tasks(vec![job_task(id, data, at, worker as i64, 0)]);
            op(worker, span, call, answer)
        };
        let cancel = |span| {
            op(
                3,
                span,
                Call::Cancel { key: "k".into() },
                Answer::Tasks(vec![]),
            )
        };
        let claim = op(
            4,
            (200, 300),
            Call::Claim {
                duration_ms: 1_000,
                wait_ms: 0,
                count: 1,
            },
            Answer::Tasks(vec![job_task(3, "b", 3_000, 4, 1)]),
        );
        let ops = [
            add_job(1, (0, 10), 1, "a", 1_000),
            cancel((20, 30)),
            add_job(2, (40, 100), 2, "b", 1_500),
            cancel((40, 100)),
            claim,
        ];
        assert!(
            matches!(verdict(&ops), Verdict::Linearizable { .. }),
            "{:?}",
            verdict(&ops)
        );
    }

    #[test]
    fn concurrent_adds_and_a_read_between_them_linearize() {
        // The read overlaps both adds and sees only b: add b, read, add a explains it.
        let ops = [
            add(1, (0, 100), 7, "a", 1_000),
            add(2, (10, 50), 5, "b", 1_000),
            read((20, 60), vec![task(5, "b", 1_000, 2)]),
        ];
        assert!(matches!(verdict(&ops), Verdict::Linearizable { .. }));
    }

    #[test]
    fn a_stale_read_is_not_linearizable() {
        // The add finished before the read began, yet the read misses it.
        let ops = [add(1, (0, 10), 1, "a", 1_000), read((20, 30), vec![])];
        assert!(matches!(verdict(&ops), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn two_claims_of_one_task_are_not_linearizable() {
        let claim = |worker, span, id| {
            op(
                worker,
                span,
                Call::Claim {
                    duration_ms: 500,
                    wait_ms: 0,
                    count: 1,
                },
                Answer::Tasks(vec![task(id, "a", 1_500, worker as i64)]),
            )
        };
        let one_claim = [add(1, (0, 10), 1, "a", 1_000), claim(2, (20, 30), 2)];
        assert!(matches!(verdict(&one_claim), Verdict::Linearizable { .. }));
        let both = [
            add(1, (0, 10), 1, "a", 1_000),
            claim(2, (20, 30), 2),
            claim(3, (25, 40), 3),
        ];
        assert!(matches!(verdict(&both), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn a_renewal_of_a_stale_id_that_succeeds_is_not_linearizable() {
        let ops = [
            add(1, (0, 10), 1, "a", 1_000),
            op(1, (20, 30), Call::Delete { id: 1 }, Answer::Tasks(vec![])),
            op(
                1,
                (40, 50),
                Call::Renew {
                    id: 1,
                    data: "a".into(),
                    duration_ms: 100,
                },
                Answer::Tasks(vec![task(2, "a", 1_100, 1)]),
            ),
        ];
        assert!(matches!(verdict(&ops), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn an_add_depending_on_a_deleted_task_must_be_refused() {
        let depending = |result| {
            let call = Call::Add {
                data: "b".into(),
                depends: vec![1],
            };
            op(2, (40, 50), call, result)
        };
        let deleted = op(1, (20, 30), Call::Delete { id: 1 }, Answer::Tasks(vec![]));
        let refused = [
            add(1, (0, 10), 1, "a", 1_000),
            deleted.clone(),
            depending(Answer::Refused(vec!["depends: 1 is missing".into()])),
        ];
        assert!(matches!(verdict(&refused), Verdict::Linearizable { .. }));
        let accepted = [
            add(1, (0, 10), 1, "a", 1_000),
            deleted,
            depending(Answer::Tasks(vec![task(2, "b", 1_000, 2)])),
        ];
        assert!(matches!(
            verdict(&accepted),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_refused_transaction_leaves_no_trace_in_the_model() {
        let ops = [
            op(
                1,
                (0, 10),
                Call::Finish {
                    id: 42,
                    follow_up: "next".into(),
                },
                Answer::Refused(vec!["missing".into()]),
            ),
            read((20, 30), vec![task(1, "next", 1_000, 1)]),
        ];
        assert!(matches!(verdict(&ops), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn many_concurrent_workers_stay_within_the_step_budget() {
        // 4 workers, each adding 200 tasks with overlapping calls; ids follow log order.
        let mut ops = Vec::new();
        let mut id = 0;
        for round in 0..200u64 {
            for worker in 1..=4u64 {
                id += 1;
                let start = round * 100 + worker;
                ops.push(add(
                    worker,
                    (start, start + 150),
                    id,
                    &format!("w{worker}-{round}"),
                    1_000,
                ));
            }
        }
        assert!(matches!(verdict(&ops), Verdict::Linearizable { .. }));
    }
}
