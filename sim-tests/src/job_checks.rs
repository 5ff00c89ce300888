//! Checks of the job group's history against the job guarantees of SPEC section 4,
//! judged in real time from what the workers saw, without a model: at most one success
//! per enqueue, no claim while the group is paused or at `max_running`, no dependant
//! claimed before its prerequisites succeeded, a cancelled task's owner refused,
//! attempts numbered 1, 2, 3 with none skipped or repeated, and dead tasks never handed
//! out. The linearizability search checks the same history against the machine; these
//! checks do not trust the machine, so a bug the machine and its model share, or a
//! group whose search gives up, is still caught.
//!
//! Every operation of the history has a definite answer (workers retry with one
//! request id until they know), so each check reasons only from operation intervals:
//! an operation took effect at one instant between its invocation and its answer.

use std::collections::BTreeMap;

use rpc::worker::TaskJson;

use crate::JOB_GROUP;
use crate::JOB_LEASE_MS;
use crate::JOB_MAX_ATTEMPTS;
use crate::JOB_MAX_RUNNING;
use crate::history::Answer;
use crate::history::Call;
use crate::history::History;
use crate::history::Op;

/// What the job checks counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct JobReport {
    /// Claims that handed out a job.
    pub claims: usize,
    /// Acknowledged successes.
    pub successes: usize,
    /// Acknowledged cancels.
    pub cancels: usize,
    /// Pauses and resumes.
    pub settings: usize,
}

/// A claim that handed out a job task version.
struct Claimed<'a> {
    op: &'a Op,
    task: &'a TaskJson,
}

/// The job group's operations, indexed for the checks.
#[derive(Default)]
struct JobHistory<'a> {
    /// Acknowledged adds by payload: payloads are unique in a run, and a job keeps its
    /// payload through retries, so a payload names one enqueue.
    adds: BTreeMap<&'a str, (&'a Op, &'a str, &'a [String])>,
    /// Acknowledged adds by key.
    adds_of_key: BTreeMap<&'a str, Vec<&'a Op>>,
    /// Claims in completion order.
    claims: Vec<Claimed<'a>>,
    /// Claimed version id to its claim's index in `claims`.
    claim_of: BTreeMap<u64, usize>,
    /// Finishes and failures of a version, whatever their answer.
    ends: BTreeMap<u64, Vec<&'a Op>>,
    /// Acknowledged successes by key.
    successes_of_key: BTreeMap<&'a str, Vec<&'a Op>>,
    /// Acknowledged cancels by key.
    cancels_of_key: BTreeMap<&'a str, Vec<&'a Op>>,
    /// Pauses (true) and resumes (false).
    settings: Vec<(&'a Op, bool)>,
}

/// Runs every job check on `history`; returns what it counted, or every violation.
pub fn check_jobs(history: &History) -> Result<JobReport, Vec<String>> {
    let mut problems = Vec::new();
    let jobs = index(history, &mut problems);
    check_one_success_per_enqueue(&jobs, &mut problems);
    check_paused(&jobs, &mut problems);
    check_max_running(&jobs, &mut problems);
    check_prerequisites(&jobs, &mut problems);
    check_cancelled_owner_refused(&jobs, &mut problems);
    check_attempts(&jobs, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(JobReport {
        claims: jobs.claims.len(),
        successes: jobs.successes_of_key.values().map(Vec::len).sum(),
        cancels: jobs.cancels_of_key.values().map(Vec::len).sum(),
        settings: jobs.settings.len(),
    })
}

fn index<'a>(history: &'a History, problems: &mut Vec<String>) -> JobHistory<'a> {
    let mut jobs = JobHistory::default();
    let ops = history.ops.iter().filter(|op| op.group == JOB_GROUP);
    for op in ops.clone() {
        match (&op.call, &op.result) {
            (Call::AddJob { data, key, after }, Answer::Tasks(_)) => {
                jobs.adds.insert(data, (op, key, after));
                jobs.adds_of_key.entry(key).or_default().push(op);
            }
            (Call::Claim { .. } | Call::CompleteAndClaim { .. }, Answer::Tasks(tasks)) => {
                for task in tasks {
                    jobs.claim_of.insert(task.id, jobs.claims.len());
                    jobs.claims.push(Claimed { op, task });
                }
            }
            (Call::Cancel { key }, Answer::Tasks(_)) => {
                jobs.cancels_of_key.entry(key).or_default().push(op);
            }
            (Call::Pause { paused }, _) => jobs.settings.push((op, *paused)),
            _ => {}
        }
    }
    // Ends after claims: a worker finishes only what a claim gave it, but the history is
    // in completion order across workers.
    for op in ops {
        let (ids, finish) = match &op.call {
            Call::Complete { id } | Call::CompleteAndClaim { id, .. } => {
                (std::slice::from_ref(id), true)
            }
            Call::CompleteMany { ids } => (ids.as_slice(), true),
            Call::FailJob { id } => (std::slice::from_ref(id), false),
            _ => continue,
        };
        for &id in ids {
            // A refused finish of many ended only the tasks its refusal names (gone or
            // cancelled); the others stayed held.
            if let (Call::CompleteMany { .. }, Answer::Refused(errors)) = (&op.call, &op.result)
                && !names_task(errors, id)
            {
                continue;
            }
            jobs.ends.entry(id).or_default().push(op);
            if !finish || !matches!(op.result, Answer::Tasks(_)) {
                continue;
            }
            match jobs.claim_of.get(&id).and_then(|&i| jobs.claims[i].task.key.as_deref()) {
                Some(key) => jobs.successes_of_key.entry(key).or_default().push(op),
                None => problems.push(format!(
                    "a finish of task {id} succeeded, but no claim handed out a job with that id: {op:?}"
                )),
            }
        }
    }
    jobs
}

/// Whether a refusal's `errors` name task `id` (`... task 12 is not held ...`).
pub fn names_task(errors: &[String], id: u64) -> bool {
    let named = format!("task {id} ");
    errors.iter().any(|e| e.contains(&named))
}

/// Whether some operation of `ops` may have taken effect strictly between `a` and `b`,
/// in whichever order `a` and `b` took effect.
fn one_may_fall_between(ops: Option<&Vec<&Op>>, a: &Op, b: &Op) -> bool {
    let from = a.invoked_us.min(b.invoked_us);
    let to = a.completed_us.max(b.completed_us);
    ops.into_iter()
        .flatten()
        .any(|op| op.invoked_us < to && op.completed_us > from)
}

/// Two successes of one key need a new enqueue (an add of the key) between them.
fn check_one_success_per_enqueue(jobs: &JobHistory<'_>, problems: &mut Vec<String>) {
    for (key, successes) in &jobs.successes_of_key {
        for (i, first) in successes.iter().enumerate() {
            for second in &successes[i + 1..] {
                if !one_may_fall_between(jobs.adds_of_key.get(key), first, second) {
                    problems.push(format!(
                        "job {key:?} succeeded twice with no add of the key between: {first:?} and {second:?}"
                    ));
                }
            }
        }
    }
}

/// A claim may hand out a job after a pause only if a resume may fall between them.
fn check_paused(jobs: &JobHistory<'_>, problems: &mut Vec<String>) {
    let resumes: Vec<&Op> = jobs
        .settings
        .iter()
        .filter(|(_, paused)| !paused)
        .map(|(op, _)| *op)
        .collect();
    for claim in &jobs.claims {
        let pause_before = jobs
            .settings
            .iter()
            .filter(|(op, paused)| *paused && op.completed_us < claim.op.invoked_us)
            .find(|(pause, _)| {
                !resumes.iter().any(|resume| {
                    resume.invoked_us < claim.op.completed_us
                        && resume.completed_us > pause.invoked_us
                })
            });
        if let Some((pause, _)) = pause_before {
            problems.push(format!(
                "job task {} claimed while the group was paused: paused by {pause:?}, claimed by {:?}",
                claim.task.id, claim.op
            ));
        }
    }
}

/// While more than `max_running` job tasks are certainly held at one instant, a claim
/// ignored the limit. A task is certainly held from its claim's answer until the first
/// invocation of anything that may release it: its finish or failure, a cancel of its
/// key that may come after the claim, or (well before) its lease's end.
fn check_max_running(jobs: &JobHistory<'_>, problems: &mut Vec<String>) {
    let held: Vec<(u64, u64, &Claimed<'_>)> = jobs
        .claims
        .iter()
        .map(|claim| {
            let from = claim.op.completed_us;
            let lease_end = claim.op.completed_us + (JOB_LEASE_MS as u64) * 1000 / 2;
            let ended = jobs.ends.get(&claim.task.id).into_iter().flatten();
            let cancelled = claim
                .task
                .key
                .as_deref()
                .and_then(|key| jobs.cancels_of_key.get(key))
                .into_iter()
                .flatten()
                .filter(|cancel| cancel.completed_us > claim.op.invoked_us);
            let until = ended
                .chain(cancelled)
                .map(|op| op.invoked_us)
                .fold(lease_end, u64::min);
            (from, until, claim)
        })
        .collect();
    for &(at, _, claim) in &held {
        let holding: Vec<u64> = held
            .iter()
            .filter(|(from, until, _)| *from <= at && at < *until)
            .map(|(_, _, c)| c.task.id)
            .collect();
        if holding.len() > JOB_MAX_RUNNING as usize {
            problems.push(format!(
                "{} job tasks {holding:?} held at once at {at} µs, over max_running {JOB_MAX_RUNNING}; the last claim: {:?}",
                holding.len(),
                claim.op
            ));
            return;
        }
    }
}

/// A job is handed out only after a success of each key it waits for.
fn check_prerequisites(jobs: &JobHistory<'_>, problems: &mut Vec<String>) {
    for claim in &jobs.claims {
        let Some((_, _, after)) = jobs.adds.get(claim.task.data.as_str()) else {
            continue;
        };
        for prerequisite in after.iter() {
            let succeeded_before = jobs
                .successes_of_key
                .get(prerequisite.as_str())
                .into_iter()
                .flatten()
                .any(|success| success.invoked_us < claim.op.completed_us);
            if !succeeded_before {
                problems.push(format!(
                    "job {:?} claimed before its prerequisite {prerequisite:?} succeeded: {:?}",
                    claim.task.key, claim.op
                ));
            }
        }
    }
}

/// After a cancel of its key, the owner of a task claimed before the cancel is refused
/// on its next finish or failure (unless that began before the cancel answered).
fn check_cancelled_owner_refused(jobs: &JobHistory<'_>, problems: &mut Vec<String>) {
    for claim in &jobs.claims {
        let Some(key) = claim.task.key.as_deref() else {
            continue;
        };
        let ends = jobs.ends.get(&claim.task.id).map_or(&[][..], Vec::as_slice);
        for cancel in jobs.cancels_of_key.get(key).into_iter().flatten() {
            if claim.op.completed_us >= cancel.invoked_us
                || ends.iter().any(|end| end.invoked_us < cancel.completed_us)
            {
                continue;
            }
            for end in ends {
                if !matches!(end.result, Answer::Refused(_)) {
                    problems.push(format!(
                        "the owner of job task {} wrote after its key {key:?} was cancelled ({cancel:?}) and was not refused: {end:?}",
                        claim.task.id
                    ));
                }
            }
        }
    }
}

/// One enqueue's claims carry attempts 1, 2, 3... each once, in real-time order, and
/// never more than `max_attempts` (a job that used them all is dead, never handed out).
fn check_attempts(jobs: &JobHistory<'_>, problems: &mut Vec<String>) {
    let mut by_enqueue: BTreeMap<&str, Vec<&Claimed<'_>>> = BTreeMap::new();
    for claim in &jobs.claims {
        by_enqueue.entry(&claim.task.data).or_default().push(claim);
    }
    for (data, mut claims) in by_enqueue {
        claims.sort_by_key(|c| c.task.attempt);
        let attempts: Vec<u32> = claims.iter().map(|c| c.task.attempt).collect();
        let expected: Vec<u32> = (1..=claims.len() as u32).collect();
        if attempts != expected {
            problems.push(format!(
                "job with payload {data:?} was handed out with attempts {attempts:?}, expected {expected:?}"
            ));
            continue;
        }
        if attempts.len() > JOB_MAX_ATTEMPTS as usize {
            problems.push(format!(
                "job with payload {data:?} was handed out {} times, over max_attempts {JOB_MAX_ATTEMPTS}: a dead job was claimed",
                attempts.len()
            ));
        }
        for pair in claims.windows(2) {
            if pair[1].op.completed_us < pair[0].op.invoked_us {
                problems.push(format!(
                    "job with payload {data:?}: attempt {} was handed out before attempt {}: {:?} then {:?}",
                    pair[1].task.attempt, pair[0].task.attempt, pair[1].op, pair[0].op
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::fixtures::op;
    use crate::history::fixtures::task;

    fn in_jobs(mut op: Op) -> Op {
        op.group = JOB_GROUP.into();
        op
    }

    fn job(id: u64, data: &str, key: &str, owner: i64, attempt: u32) -> TaskJson {
        TaskJson {
            key: Some(key.into()),
            attempt,
            group: JOB_GROUP.into(),
            ..task(id, data, 0, owner)
        }
    }

    fn add(span: (u64, u64), id: u64, data: &str, key: &str, after: &[&str]) -> Op {
        let call = Call::AddJob {
            data: data.into(),
            key: key.into(),
            after: after.iter().map(|k| k.to_string()).collect(),
        };
        in_jobs(op(
            1,
            span,
            call,
            Answer::Tasks(vec![job(id, data, key, 1, 0)]),
        ))
    }

    fn claim(worker: u64, span: (u64, u64), id: u64, data: &str, key: &str, attempt: u32) -> Op {
        let call = Call::Claim {
            duration_ms: JOB_LEASE_MS,
            wait_ms: 0,
            count: 1,
        };
        let answer = Answer::Tasks(vec![job(id, data, key, worker as i64, attempt)]);
        in_jobs(op(worker, span, call, answer))
    }

    fn complete(worker: u64, span: (u64, u64), id: u64, refused: bool) -> Op {
        let answer = if refused {
            Answer::Refused(vec!["cancelled".into()])
        } else {
            Answer::Tasks(Vec::new())
        };
        in_jobs(op(worker, span, Call::Complete { id }, answer))
    }

    fn fail(worker: u64, span: (u64, u64), id: u64) -> Op {
        in_jobs(op(
            worker,
            span,
            Call::FailJob { id },
            Answer::Tasks(Vec::new()),
        ))
    }

    fn cancel(span: (u64, u64), key: &str) -> Op {
        let call = Call::Cancel { key: key.into() };
        in_jobs(op(3, span, call, Answer::Tasks(Vec::new())))
    }

    fn pause(span: (u64, u64), paused: bool) -> Op {
        in_jobs(op(
            4,
            span,
            Call::Pause { paused },
            Answer::Tasks(Vec::new()),
        ))
    }

    fn problems(ops: Vec<Op>) -> Vec<String> {
        check_jobs(&History {
            ops,
            ..History::default()
        })
        .expect_err("a violation")
    }

    fn passes(ops: Vec<Op>) -> JobReport {
        check_jobs(&History {
            ops,
            ..History::default()
        })
        .expect("no violation")
    }

    #[test]
    fn a_clean_job_life_passes_and_is_counted() {
        let report = passes(vec![
            add((0, 10), 1, "a", "k", &[]),
            pause((12, 14), true),
            pause((15, 18), false),
            claim(2, (20, 30), 2, "a", "k", 1),
            fail(2, (40, 50), 2),
            claim(2, (60, 70), 3, "a", "k", 2),
            complete(2, (80, 90), 3, false),
            add((100, 110), 4, "b", "k", &[]),
            add((100, 110), 5, "c", "then", &["k"]),
            claim(2, (120, 130), 6, "b", "k", 1),
            complete(2, (140, 150), 6, false),
            claim(2, (160, 170), 7, "c", "then", 1),
        ]);
        assert_eq!(
            report,
            JobReport {
                claims: 4,
                successes: 2,
                cancels: 0,
                settings: 2,
            }
        );
    }

    #[test]
    fn two_successes_of_one_enqueue_are_caught() {
        let found = problems(vec![
            add((0, 10), 1, "a", "k", &[]),
            claim(2, (20, 30), 2, "a", "k", 1),
            complete(2, (40, 50), 2, false),
            claim(3, (60, 70), 3, "a2", "k", 1),
            complete(3, (80, 90), 3, false),
        ]);
        assert!(found[0].contains("succeeded twice"), "{found:?}");
    }

    #[test]
    fn a_finish_of_many_counts_a_success_per_job_and_is_checked_like_one() {
        let two_keys = |second_success: bool| {
            let mut ops = vec![
                add((0, 10), 1, "a", "k", &[]),
                add((0, 10), 2, "b", "j", &[]),
                claim(2, (20, 30), 3, "a", "k", 1),
                claim(2, (20, 30), 4, "b", "j", 1),
                in_jobs(op(
                    2,
                    (40, 50),
                    Call::CompleteMany { ids: vec![3, 4] },
                    Answer::Tasks(Vec::new()),
                )),
            ];
            if second_success {
                ops.push(claim(3, (60, 70), 5, "a2", "k", 1));
                ops.push(complete(3, (80, 90), 5, false));
            }
            ops
        };
        assert_eq!(passes(two_keys(false)).successes, 2);
        let found = problems(two_keys(true));
        assert!(found[0].contains("succeeded twice"), "{found:?}");
    }

    #[test]
    fn a_claim_while_paused_is_caught_unless_a_resume_may_fall_between() {
        let history = |resume_at: (u64, u64)| {
            vec![
                add((0, 10), 1, "a", "k", &[]),
                pause((12, 14), true),
                pause(resume_at, false),
                claim(2, (20, 30), 2, "a", "k", 1),
            ]
        };
        passes(history((25, 40)));
        let found = problems(history((35, 40)));
        assert!(found[0].contains("paused"), "{found:?}");
    }

    #[test]
    fn more_held_than_max_running_is_caught() {
        let mut ops = Vec::new();
        for i in 0..=u64::from(JOB_MAX_RUNNING) {
            let data = format!("d{i}");
            let key = format!("k{i}");
            ops.push(add((0, 10), 1 + i, &data, &key, &[]));
            ops.push(claim(2 + i, (20 + i, 30 + i), 10 + i, &data, &key, 1));
        }
        let found = problems(ops.clone());
        assert!(found[0].contains("over max_running"), "{found:?}");
        // A finish invoked before the last claim answered may have freed a slot.
        ops.push(complete(2, (31, 60), 10, false));
        passes(ops);
    }

    #[test]
    fn a_dependant_claimed_before_its_prerequisite_succeeded_is_caught() {
        let found = problems(vec![
            add((0, 10), 1, "a", "first", &[]),
            add((0, 10), 2, "b", "then", &["first"]),
            claim(2, (20, 30), 3, "b", "then", 1),
            claim(3, (40, 50), 4, "a", "first", 1),
            complete(3, (60, 70), 4, false),
        ]);
        assert!(found[0].contains("prerequisite"), "{found:?}");
    }

    #[test]
    fn an_owner_not_refused_after_a_cancel_is_caught() {
        let history = |refused: bool| {
            vec![
                add((0, 10), 1, "a", "k", &[]),
                claim(2, (20, 30), 2, "a", "k", 1),
                cancel((40, 50), "k"),
                complete(2, (60, 70), 2, refused),
            ]
        };
        passes(history(true));
        let found = problems(history(false));
        assert!(found[0].contains("was cancelled"), "{found:?}");
    }

    #[test]
    fn a_finish_concurrent_with_the_cancel_may_succeed() {
        passes(vec![
            add((0, 10), 1, "a", "k", &[]),
            claim(2, (20, 30), 2, "a", "k", 1),
            cancel((40, 50), "k"),
            complete(2, (45, 70), 2, false),
        ]);
    }

    #[test]
    fn skipped_repeated_and_dead_attempts_are_caught() {
        let skipped = problems(vec![
            add((0, 10), 1, "a", "k", &[]),
            claim(2, (20, 30), 2, "a", "k", 1),
            fail(2, (40, 50), 2),
            claim(2, (60, 70), 3, "a", "k", 3),
        ]);
        assert!(skipped[0].contains("attempts [1, 3]"), "{skipped:?}");
        let repeated = problems(vec![
            add((0, 10), 1, "a", "k", &[]),
            claim(2, (20, 30), 2, "a", "k", 1),
            fail(2, (40, 50), 2),
            claim(2, (60, 70), 3, "a", "k", 1),
        ]);
        assert!(repeated[0].contains("attempts [1, 1]"), "{repeated:?}");
        let mut ops = vec![add((0, 10), 1, "a", "k", &[])];
        for attempt in 1..=JOB_MAX_ATTEMPTS + 1 {
            let at = 100 * u64::from(attempt);
            let id = 1 + u64::from(attempt);
            ops.push(claim(2, (at, at + 10), id, "a", "k", attempt));
            ops.push(fail(2, (at + 20, at + 30), id));
        }
        let dead = problems(ops);
        assert!(dead[0].contains("a dead job was claimed"), "{dead:?}");
    }
}
