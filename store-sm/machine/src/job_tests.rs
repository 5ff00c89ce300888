//! Example-based tests of the job layer, one per rule of SPEC section 4 and issue 12.
//! The property tests in store-sm's `tests/machine_model.rs` cover random sequences.

use super::*;

const T0: Millis = 1_700_000_000_000;

struct Store {
    machine: TaskMachine,
    now: Millis,
}

impl Store {
    fn new() -> Self {
        Self {
            machine: TaskMachine::new(),
            now: T0,
        }
    }

    fn run(&mut self, request: Request) -> Outcome {
        self.now += 1;
        let outcome = self.machine.apply(&Command {
            stamp: LogTime::from_millis(self.now),
            request_id: None,
            request,
        });
        (*outcome).clone()
    }

    fn wait(&mut self, ms: Millis) {
        self.now += ms;
    }

    fn add(&mut self, adds: Vec<AddTask>) -> Outcome {
        self.run(Request::Update(UpdateRequest {
            client: 1,
            adds,
            ..UpdateRequest::default()
        }))
    }

    /// A seed update by `client` of task `id` to `data`, available at `timespec`.
    fn update_one(
        &mut self,
        client: ClientId,
        id: TaskId,
        data: &str,
        timespec: Option<Millis>,
    ) -> Outcome {
        self.run(Request::Update(UpdateRequest {
            client,
            updates: vec![UpdateTask {
                id,
                data: data.to_string(),
                timespec,
            }],
            ..UpdateRequest::default()
        }))
    }

    fn claim(&mut self, client: ClientId, group: &str) -> Option<Task> {
        match self.run(Request::Claim(ClaimRequest {
            client,
            group: group.into(),
            duration_ms: 1_000,
            depends: vec![],
        })) {
            Outcome::Tasks(tasks) => tasks.into_iter().next(),
            other => panic!("claim answered {other:?}"),
        }
    }

    fn finish(&mut self, client: ClientId, id: TaskId, result: Option<&str>) -> Outcome {
        self.run(Request::Finish(FinishRequest {
            client,
            id,
            result: result.map(String::from),
        }))
    }

    fn fail(&mut self, client: ClientId, id: TaskId, retry_in_ms: Option<Millis>) -> Outcome {
        self.run(Request::Fail(FailRequest {
            client,
            id,
            error: "boom\nsecond line".into(),
            retry_in_ms,
        }))
    }

    fn settings(&mut self, group: &str, change: SettingsChange) -> Outcome {
        self.run(Request::Settings(SettingsRequest {
            client: 1,
            group: group.into(),
            change,
        }))
    }

    fn state(&self, group: &str, key: &str) -> JobState {
        self.machine.job(group, key).expect("a record").state
    }
}

fn job(key: &str) -> AddTask {
    keyed(key, |_| {})
}

fn keyed(key: &str, tweak: impl FnOnce(&mut AddJob)) -> AddTask {
    let mut add = AddTask::seed("g", format!("data of {key}"), None);
    add.job.key = Some(key.into());
    tweak(&mut add.job);
    add
}

fn refusals(outcome: &Outcome) -> Vec<String> {
    match outcome {
        Outcome::Refused(refusals) => refusals.iter().map(ToString::to_string).collect(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The refusal of a finish or fail (`list`) of a job's task `id` that was not claimed.
fn not_claimed(id: TaskId, key: &str, list: &str) -> String {
    format!(
        "{list}: task {id} of job {key:?} is waiting to run, not claimed: only a claim's lease can be finished or failed; claim it first (POST /claim)"
    )
}

fn tasks(outcome: Outcome) -> Vec<Task> {
    match outcome {
        Outcome::Tasks(tasks) => tasks,
        other => panic!("expected tasks, got {other:?}"),
    }
}

#[test]
fn a_live_key_is_refused_kept_or_resubmitted() {
    let mut store = Store::new();
    let first = tasks(store.add(vec![job("k")])).remove(0);
    let again = store.add(vec![job("k")]);
    assert_eq!(
        refusals(&again),
        vec![format!(
            "adds: item 0 has key \"k\", which live task {} of the group holds; set on_conflict to \"keep\" or \"resubmit\" to enqueue idempotently",
            first.id
        )]
    );
    let kept = tasks(store.add(vec![keyed("k", |j| j.on_conflict = OnConflict::Keep)]));
    assert_eq!(kept, vec![first.clone()], "keep answers the live task");

    // Resubmit while running: one more run after the success, with the new data.
    let claimed = store.claim(7, "g").expect("claimable");
    let mut resubmit = keyed("k", |j| j.on_conflict = OnConflict::Resubmit);
    resubmit.data = "new data".into();
    tasks(store.add(vec![resubmit]));
    tasks(store.finish(7, claimed.id, Some("1")));
    let record = store.machine.job("g", "k").expect("record");
    assert_eq!((record.state, record.run), (JobState::Waiting, 2));
    let rerun = store.claim(7, "g").expect("the resubmitted run");
    assert_eq!((rerun.data.as_str(), rerun.job.attempt), ("new data", 1));

    // A key twice in one request is refused; a seed add is untouched by all this.
    let twice = store.add(vec![job("x"), job("x")]);
    assert_eq!(
        refusals(&twice),
        vec!["adds: item 1 adds key \"x\" a second time"]
    );
    let plain = tasks(store.add(vec![AddTask::seed("g", "seed", None)])).remove(0);
    assert!(plain.job.is_plain());
}

#[test]
fn lost_attempts_count_and_the_last_one_makes_the_job_dead() {
    let mut store = Store::new();
    tasks(store.add(vec![keyed("k", |j| j.max_attempts = Some(2))]));
    let first = store.claim(7, "g").expect("claimable");
    assert_eq!(first.job.attempt, 1);
    store.wait(2_000);
    let second = store
        .claim(8, "g")
        .expect("claimable again after the lapse");
    assert_eq!(second.job.attempt, 2);
    let record = store.machine.job("g", "k").expect("record");
    assert_eq!(record.history[0].end, Some(AttemptEnd::Lost));
    store.wait(2_000);
    assert!(
        store.claim(8, "g").is_none(),
        "a dead job is never handed out"
    );
    assert_eq!(store.state("g", "k"), JobState::Dead);
    let dead = store.machine.job("g", "k").expect("record");
    assert_eq!(dead.data.as_deref(), Some("data of k"));
    assert!(
        dead.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("attempt 2 was lost"))
    );

    // Retry re-drives it with a fresh budget; attempts keep counting.
    let retried = tasks(store.run(Request::Retry(RetryRequest {
        client: 1,
        group: "g".into(),
        keys: vec!["k".into()],
    })));
    assert_eq!(retried.len(), 1);
    let third = store.claim(9, "g").expect("claimable after retry");
    assert_eq!(third.job.attempt, 3);
}

#[test]
fn a_job_that_dies_by_a_lapsed_lease_finished_when_the_lease_ended() {
    let mut store = Store::new();
    tasks(store.add(vec![keyed("k", |j| j.max_attempts = Some(1))]));
    let claimed = store.claim(7, "g").expect("claimable");
    let end = claimed.available_at;
    // Read on an idle cluster at two later times, then after a command applies the lapse:
    // the same time each way, the lease's end.
    let read_at = |store: &Store, ms: Millis| {
        let view = store.machine.as_of(LogTime::from_millis(ms));
        let record = view.job("g", "k").expect("record").clone();
        assert_eq!(record.state, JobState::Dead);
        record.finished_at
    };
    assert_eq!(read_at(&store, end.as_millis() + 700), Some(end));
    assert_eq!(read_at(&store, end.as_millis() + 5_000), Some(end));
    store.wait(3_000);
    assert!(store.claim(8, "g").is_none());
    let record = store.machine.job("g", "k").expect("record");
    assert_eq!(record.finished_at, Some(end));
}

#[test]
fn finish_and_fail_are_fenced_and_fail_backs_off() {
    let mut store = Store::new();
    tasks(store.add(vec![job("k")]));
    let claimed = store.claim(7, "g").expect("claimable");
    assert_eq!(
        refusals(&store.finish(8, claimed.id, None)),
        vec![format!(
            "finish: task {} is not held by this client (owner 7, lease ends {}); claim it again",
            claimed.id, claimed.available_at
        )]
    );
    let retry = tasks(store.fail(7, claimed.id, None)).remove(0);
    assert_eq!(store.state("g", "k"), JobState::Failed);
    let delay = retry.available_at.as_millis() - store.now;
    assert!(
        (500..=1_000).contains(&delay),
        "base back-off with equal jitter: {delay}"
    );
    assert!(
        refusals(&store.finish(7, claimed.id, None))[0].contains("does not exist"),
        "the old id is stale"
    );
    store.wait(1_000);
    let again = store.claim(7, "g").expect("claimable after the back-off");
    tasks(store.finish(7, again.id, Some("{\"ok\":true}")));
    let record = store.machine.job("g", "k").expect("record");
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!(record.result.as_deref(), Some("{\"ok\":true}"));
    assert_eq!(record.attempts, 2);
    assert_eq!(
        record.history[0].end,
        Some(AttemptEnd::Failed("boom\nsecond line".into()))
    );
}

#[test]
fn only_a_claimed_version_of_a_job_can_be_finished_or_failed() {
    let mut store = Store::new();
    // Scheduled by its adder, who owns it until it is due.
    let scheduled = tasks(store.add(vec![AddTask {
        timespec: Some(-60_000),
        ..job("later")
    }]))
    .remove(0);
    assert_eq!(
        refusals(&store.finish(1, scheduled.id, Some("never ran"))),
        vec![not_claimed(scheduled.id, "later", "finish")]
    );
    assert_eq!(
        refusals(&store.fail(1, scheduled.id, None)),
        vec![not_claimed(scheduled.id, "later", "fail")]
    );
    // Made someone's own by a seed update that puts it off: still waiting.
    let waiting = tasks(store.add(vec![job("w")])).remove(0);
    let put_off = tasks(store.update_one(2, waiting.id, &waiting.data, Some(-60_000))).remove(0);
    assert_eq!(
        refusals(&store.finish(2, put_off.id, None)),
        vec![not_claimed(put_off.id, "w", "finish")]
    );
    // Backing off after a failure: its failing worker owns the retry until it is due.
    tasks(store.add(vec![job("r")]));
    let claimed = store
        .claim(7, "g")
        .filter(|t| t.job.key.as_deref() == Some("r"))
        .expect("r is the only available job");
    let retry = tasks(store.fail(7, claimed.id, Some(60_000))).remove(0);
    assert_eq!(
        refusals(&store.finish(7, retry.id, None)),
        vec![not_claimed(retry.id, "r", "finish")]
    );
    assert_eq!(
        refusals(&store.fail(7, retry.id, None)),
        vec![not_claimed(retry.id, "r", "fail")]
    );
    for (key, state) in [
        ("later", JobState::Waiting),
        ("w", JobState::Waiting),
        ("r", JobState::Failed),
    ] {
        let record = store.machine.job("g", key).expect("a record");
        assert_eq!(record.state, state, "{key}");
        assert!(record.result.is_none(), "{key}");
    }
    assert_eq!(store.machine.job("g", "r").expect("r").history.len(), 1);

    // A holder whose lease lapsed and who took the task back with a late renewal before
    // anybody claimed it may still finish it (as its seed delete may).
    tasks(store.add(vec![keyed("slow", |j| j.max_attempts = Some(3))]));
    store.wait(120_000);
    let slow = store
        .claim(9, "g")
        .filter(|t| t.job.key.as_deref() == Some("slow"))
        .expect("slow is the one available job");
    store.wait(5_000);
    let renewed = tasks(store.update_one(9, slow.id, &slow.data, Some(-1_000))).remove(0);
    tasks(store.finish(9, renewed.id, Some("late but done")));
    let record = store.machine.job("g", "slow").expect("slow");
    assert_eq!(record.state, JobState::Succeeded, "{record:?}");
    assert_eq!(record.result.as_deref(), Some("late but done"));
}

/// A worker's cycle in one command: the finish, then the claim of the next task.
#[test]
fn a_finish_and_claim_finishes_then_claims_all_or_nothing() {
    let mut store = Store::new();
    tasks(store.add(vec![job("a"), job("b")]));
    let a = store.claim(7, "g").expect("a");
    let both = |id: TaskId, client: ClientId| {
        Request::FinishAndClaim(FinishAndClaimRequest {
            finish: FinishRequest {
                client,
                id,
                result: Some("done".into()),
            },
            next: ClaimManyRequest {
                claim: ClaimRequest {
                    client,
                    group: "g".into(),
                    duration_ms: 1_000,
                    depends: vec![],
                },
                count: 1,
            },
        })
    };
    // Not the holder: refused, and nothing claimed either.
    assert_eq!(refusals(&store.run(both(a.id, 8))).len(), 1);
    assert_eq!(store.state("g", "b"), JobState::Waiting);
    let next = tasks(store.run(both(a.id, 7)));
    assert_eq!(store.state("g", "a"), JobState::Succeeded);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job.key.as_deref(), Some("b"));
    assert_eq!(
        (next[0].owner, store.state("g", "b")),
        (7, JobState::Running)
    );
    // Nothing left to claim: the finish still happens.
    assert_eq!(tasks(store.run(both(next[0].id, 7))), vec![]);
    assert_eq!(store.state("g", "b"), JobState::Succeeded);
    // The claim is the finishing client's own, and names no depends.
    tasks(store.add(vec![job("c")]));
    let c = store.claim(7, "g").expect("c");
    let Request::FinishAndClaim(mut other) = both(c.id, 7) else {
        unreachable!()
    };
    other.next.claim.client = 9;
    other.next.claim.depends = vec![c.id];
    let refused = refusals(&store.run(Request::FinishAndClaim(other)));
    assert!(refused[0].contains("another client"), "{refused:?}");
    assert!(refused[1].contains("depends"), "{refused:?}");
    assert_eq!(store.state("g", "c"), JobState::Running);
}

/// Entries of builds before the claimed-version rule apply with their rule, so that a
/// replay, or a cluster in the middle of a rolling upgrade, agrees on their outcome.
#[test]
fn legacy_finish_and_fail_keep_the_rule_of_the_builds_that_logged_them() {
    let mut store = Store::new();
    let scheduled = |store: &mut Store, key: &str| {
        tasks(store.add(vec![AddTask {
            timespec: Some(-60_000),
            ..job(key)
        }]))
        .remove(0)
    };
    let a = scheduled(&mut store, "a");
    assert!(matches!(store.finish(1, a.id, None), Outcome::Refused(_)));
    let legacy_finish = Request::LegacyFinish(FinishRequest {
        client: 1,
        id: a.id,
        result: Some("ran elsewhere".into()),
    });
    assert_eq!(tasks(store.run(legacy_finish)), vec![]);
    assert_eq!(store.state("g", "a"), JobState::Succeeded);

    let b = scheduled(&mut store, "b");
    let c = scheduled(&mut store, "c");
    let finish_many = |store: &mut Store, legacy: bool| {
        let many = FinishManyRequest {
            client: 1,
            finishes: [b.id, c.id]
                .map(|id| FinishItem { id, result: None })
                .to_vec(),
        };
        store.run(if legacy {
            Request::LegacyFinishMany(many)
        } else {
            Request::FinishMany(many)
        })
    };
    assert_eq!(refusals(&finish_many(&mut store, false)).len(), 2);
    assert_eq!(tasks(finish_many(&mut store, true)), vec![]);
    assert_eq!(store.state("g", "b"), JobState::Succeeded);
    assert_eq!(store.state("g", "c"), JobState::Succeeded);

    let d = scheduled(&mut store, "d");
    assert!(matches!(store.fail(1, d.id, None), Outcome::Refused(_)));
    let legacy_fail = Request::LegacyFail(FailRequest {
        client: 1,
        id: d.id,
        error: "gave up".into(),
        retry_in_ms: Some(60_000),
    });
    let retry = tasks(store.run(legacy_fail)).remove(0);
    assert_eq!(retry.owner, 1);
    assert_eq!(store.state("g", "d"), JobState::Failed);
    // The legacy rule is the owner's: anybody else is still refused.
    let other = scheduled(&mut store, "e");
    let stranger = Request::LegacyFinish(FinishRequest {
        client: 9,
        id: other.id,
        result: None,
    });
    assert!(matches!(store.run(stranger), Outcome::Refused(_)));
}

#[test]
fn backoff_grows_to_its_maximum_and_jitter_is_deterministic() {
    let backoff = Backoff {
        base_ms: 100,
        factor_milli: 2_000,
        max_ms: 1_000,
    };
    let delays: Vec<Millis> = (1..=6).map(|n| backoff.delay_ms(n)).collect();
    assert_eq!(delays, vec![100, 200, 400, 800, 1_000, 1_000]);
    assert_eq!(backoff.jittered_ms(3, 42), backoff.jittered_ms(3, 42));
    assert!(
        (0..1_000)
            .map(|seed| backoff.jittered_ms(3, seed))
            .all(|d| (200..=400).contains(&d))
    );
}

#[test]
fn cancel_halts_a_running_job_and_its_owner_is_told() {
    let mut store = Store::new();
    tasks(store.add(vec![job("k")]));
    let claimed = store.claim(7, "g").expect("claimable");
    tasks(store.run(Request::Cancel(CancelRequest {
        client: 1,
        group: "g".into(),
        keys: vec!["k".into()],
    })));
    assert_eq!(store.state("g", "k"), JobState::Cancelled);
    let renewal = store.update_one(7, claimed.id, "", Some(-1_000));
    assert_eq!(
        refusals(&renewal),
        vec![format!(
            "updates: task {} was cancelled (job \"k\"); stop working on it",
            claimed.id
        )]
    );
    assert!(refusals(&store.finish(7, claimed.id, None))[0].contains("was cancelled"));
    assert_eq!(store.machine.running_in_group("g"), 0);
}

#[test]
fn dependants_wait_for_success_and_are_cancelled_with_their_prerequisite() {
    let mut store = Store::new();
    tasks(store.add(vec![
        job("a"),
        keyed("b", |j| j.after = vec!["a".into()]),
        keyed("c", |j| j.after = vec!["b".into()]),
    ]));
    let a = store.claim(7, "g").expect("a");
    assert!(store.claim(7, "g").is_none(), "b waits for a");
    tasks(store.finish(7, a.id, None));
    let b = store.claim(7, "g").expect("b, now that a succeeded");
    assert_eq!(b.data, "data of b");
    tasks(store.run(Request::Cancel(CancelRequest {
        client: 1,
        group: "g".into(),
        keys: vec!["b".into()],
    })));
    assert_eq!(store.state("g", "c"), JobState::Cancelled);
    let reason = store.machine.job("g", "c").and_then(|r| r.reason.clone());
    assert_eq!(reason.as_deref(), Some("prerequisite \"b\" was cancelled"));

    let bad = store.add(vec![
        keyed("d", |j| j.after = vec!["d".into()]),
        keyed("e", |j| {
            j.after = vec!["nope".into(), "b".into(), "f".into()]
        }),
        job("f"),
    ]);
    assert_eq!(
        refusals(&bad),
        vec![
            "adds[0].after[0]: names the task's own key; a task cannot wait for itself".to_string(),
            "adds: item 1 names key \"nope\" in after, which is neither a live or succeeded job of the group nor added earlier in this request".to_string(),
            "adds: item 1 names key \"b\" in after, which ended cancelled and can never succeed; add it again first".to_string(),
            "adds: item 1 names key \"f\" in after, which is neither a live or succeeded job of the group nor added earlier in this request".to_string(),
        ],
        "a later add of the same request cannot be named: no cycles"
    );
}

#[test]
fn a_recurring_job_comes_back_after_its_interval() {
    let mut store = Store::new();
    tasks(store.add(vec![keyed("tick", |j| j.every_ms = Some(60_000))]));
    let first = store.claim(7, "g").expect("first run");
    tasks(store.finish(7, first.id, Some("1")));
    let record = store.machine.job("g", "tick").expect("record");
    assert_eq!((record.state, record.run), (JobState::Waiting, 2));
    let next = store
        .machine
        .task(record.task.expect("next run"))
        .expect("task");
    assert_eq!(next.available_at.as_millis(), store.now + 60_000);
    let next_id = next.id;
    assert!(store.claim(7, "g").is_none(), "not before its interval");
    assert!(
        refusals(&store.finish(7, next_id, None))[0].contains("is waiting to run, not claimed"),
        "a run is never skipped by finishing it before it ran"
    );
    store.wait(60_000);
    assert!(store.claim(7, "g").is_some());
}

#[test]
fn max_running_and_pause_hold_claims_back() {
    let mut store = Store::new();
    tasks(store.add(vec![job("a"), job("b"), job("c")]));
    let Outcome::Settings(settings) = store.settings(
        "g",
        SettingsChange {
            max_running: Some(2),
            ..SettingsChange::default()
        },
    ) else {
        panic!("settings")
    };
    assert_eq!(settings.max_running, 2);
    assert!(store.claim(7, "g").is_some());
    assert!(store.claim(7, "g").is_some());
    assert!(store.claim(7, "g").is_none(), "two are running");
    store.wait(2_000);
    store.settings(
        "g",
        SettingsChange {
            paused: Some(true),
            ..SettingsChange::default()
        },
    );
    assert!(store.claim(7, "g").is_none(), "paused");
    tasks(store.add(vec![job("d")]));
    store.settings(
        "g",
        SettingsChange {
            paused: Some(false),
            max_running: Some(0),
            ..SettingsChange::default()
        },
    );
    assert!(store.claim(7, "g").is_some(), "resumed");
    let bad = store.settings(
        "g",
        SettingsChange {
            retention_ms: Some(-1),
            ..SettingsChange::default()
        },
    );
    assert_eq!(
        refusals(&bad),
        vec![format!(
            "retention_ms: -1 is not between 0 and {}",
            constants::JOB_RETENTION_MS_MAX
        )]
    );
}

/// Jobs a and b in a group of `max_running` 1 on log `form`; client 9's lease on a, as
/// claimed, lapsed 4 s ago.
fn lapsed_in_a_group_of_one(form: u32) -> (Store, Task) {
    let mut store = Store::new();
    store.machine.raise_log_form(form);
    tasks(store.add(vec![job("a"), job("b")]));
    store.settings(
        "g",
        SettingsChange {
            max_running: Some(1),
            ..SettingsChange::default()
        },
    );
    let a = store.claim(9, "g").expect("a is claimed");
    store.wait(5_000);
    (store, a)
}

/// The lapsed holder's late renewal takes the lease back: from form 4 on it runs again
/// and counts toward `max_running`; below, as older builds applied, it did not.
#[test]
fn a_late_renewal_that_takes_a_lease_back_counts_toward_max_running() {
    for form in [3, 4] {
        let (mut store, a) = lapsed_in_a_group_of_one(form);
        let renewed = tasks(store.update_one(9, a.id, &a.data, Some(-60_000))).remove(0);
        let record = store.machine.job("g", "a").expect("a");
        let attempt = record.history.last().expect("an attempt");
        if form >= constants::RETAKEN_LEASE_FORM {
            assert!(renewed.job.leased, "form {form}");
            assert_eq!(record.state, JobState::Running);
            assert_eq!((&attempt.end, attempt.ended_at), (&None, None));
            assert_eq!(
                (record.attempts, attempt.number),
                (1, 1),
                "the same attempt"
            );
            assert_eq!(store.machine.running_in_group("g"), 1);
            assert!(store.claim(7, "g").is_none(), "a is running again");
            // Renewed again, the lease stays a lease; given back, the attempt ends.
            let again = tasks(store.update_one(9, renewed.id, &a.data, Some(-60_000))).remove(0);
            assert!(again.job.leased);
            tasks(store.finish(9, again.id, None));
            assert_eq!(store.state("g", "a"), JobState::Succeeded);
            assert_eq!(store.machine.running_in_group("g"), 0);
        } else {
            assert!(!renewed.job.leased, "form {form}");
            assert_eq!(record.state, JobState::Waiting);
            assert_eq!(attempt.end, Some(AttemptEnd::Lost));
            assert_eq!(store.machine.running_in_group("g"), 0);
            assert!(store.claim(7, "g").is_some(), "b escapes the limit");
        }
    }
}

/// A late renewal is refused while the group runs its max_running tasks: another
/// worker claimed in the meantime, and the limit may stand for "one at a time".
#[test]
fn a_late_renewal_is_refused_while_the_group_is_at_max_running() {
    let (mut store, a) = lapsed_in_a_group_of_one(constants::RETAKEN_LEASE_FORM);
    let b = store.claim(7, "g").expect("b is claimed once a lapsed");
    assert_eq!(b.job.key.as_deref(), Some("b"));
    let late = store.update_one(9, a.id, &a.data, Some(-60_000));
    assert_eq!(
        refusals(&late),
        vec![format!(
            "updates: task {} is no longer held: this client's lease on it ended at {} (log time, ms), and its group runs its max_running of 1 tasks already, so the lease was not taken back; stop working on it, and claim it again later",
            a.id, a.available_at
        )]
    );
    assert_eq!(store.machine.running_in_group("g"), 1);
    assert_eq!(store.state("g", "a"), JobState::Waiting);
    // Once b is done, the holder may take a back; naming it twice is refused as that.
    tasks(store.finish(7, b.id, None));
    let twice = store.run(Request::Update(UpdateRequest {
        client: 9,
        updates: vec![
            UpdateTask {
                id: a.id,
                data: String::new(),
                timespec: Some(-60_000),
            };
            2
        ],
        ..UpdateRequest::default()
    }));
    assert_eq!(
        refusals(&twice),
        vec![format!(
            "updates: task {} is named more than once in the request; name each id once",
            a.id
        )]
    );
    let renewed = tasks(store.update_one(9, a.id, &a.data, Some(-60_000))).remove(0);
    assert!(renewed.job.leased);
    assert_eq!(store.machine.running_in_group("g"), 1);
}

/// Only the very version whose lease lapsed counts as the holder's: not the task a
/// `/retry` made for the dead job, even in the hands of the client that lost it.
#[test]
fn a_retried_job_is_not_the_lapsed_holders_to_take_back_or_finish() {
    for form in [3, 4] {
        let mut store = Store::new();
        store.machine.raise_log_form(form);
        tasks(store.add(vec![keyed("a", |j| j.max_attempts = Some(1))]));
        store.claim(9, "g").expect("a is claimed");
        store.wait(5_000);
        store.run(Request::PassTime);
        assert_eq!(store.state("g", "a"), JobState::Dead);
        let retried = tasks(store.run(Request::Retry(RetryRequest {
            client: 9,
            group: "g".into(),
            keys: vec!["a".into()],
        })))
        .remove(0);
        let put_off =
            tasks(store.update_one(9, retried.id, &retried.data, Some(-60_000))).remove(0);
        let finished = store.finish(9, put_off.id, None);
        if form >= constants::RETAKEN_LEASE_FORM {
            assert!(!put_off.job.leased, "a retry's task is not a lease");
            assert_eq!(store.state("g", "a"), JobState::Waiting);
            assert_eq!(
                refusals(&finished),
                vec![not_claimed(put_off.id, "a", "finish")]
            );
        } else {
            // As older builds applied: the client whose attempt was lost last finished it.
            tasks(finished);
            assert_eq!(store.state("g", "a"), JobState::Succeeded);
        }
    }
}

/// Another client's update of a lapsed lease, or the holder's update to a time already
/// passed, takes nothing back.
#[test]
fn only_the_holder_renewing_into_the_future_takes_a_lapsed_lease_back() {
    for (client, timespec) in [(8, Some(-60_000)), (9, Some(0)), (9, None)] {
        let mut store = Store::new();
        store.machine.raise_log_form(constants::RETAKEN_LEASE_FORM);
        tasks(store.add(vec![job("a")]));
        let a = store.claim(9, "g").expect("a is claimed");
        store.wait(5_000);
        let updated = tasks(store.update_one(client, a.id, &a.data, timespec)).remove(0);
        let what = format!("client {client}, timespec {timespec:?}");
        assert!(!updated.job.leased, "{what}");
        assert_eq!(store.state("g", "a"), JobState::Waiting, "{what}");
        assert_eq!(store.machine.running_in_group("g"), 0, "{what}");
    }
}

/// A job takes at most `JOB_DEPENDANTS_MAX` dependants, counting those of the same
/// request, from form 4 on; older builds took more.
#[test]
fn a_job_takes_a_bounded_number_of_dependants() {
    let waiting_for_root = |from: usize, to: usize| -> Vec<AddTask> {
        (from..to)
            .map(|n| keyed(&format!("d{n}"), |j| j.after = vec!["root".into()]))
            .collect()
    };
    let max = constants::JOB_DEPENDANTS_MAX;
    for form in [3, 4] {
        let mut store = Store::new();
        store.machine.raise_log_form(form);
        tasks(store.add(vec![job("root")]));
        for start in (0..max - 2).step_by(4_000) {
            tasks(store.add(waiting_for_root(start, (start + 4_000).min(max - 2))));
        }
        // Two more in one request fill it; a third in that request is one too many.
        let over = store.add(waiting_for_root(max - 2, max + 1));
        if form >= constants::DEPENDANTS_LIMIT_FORM {
            assert_eq!(
                refusals(&over),
                vec![format!(
                    "adds[2].after: job \"root\" already has {max} jobs waiting for it, the most; make the others wait for jobs that wait for it"
                )]
            );
            tasks(store.add(waiting_for_root(max - 2, max)));
            let record = store.machine.job("g", "root").expect("root");
            assert_eq!(record.dependants.len(), max);
            assert_eq!(
                refusals(&store.add(waiting_for_root(max, max + 1))).len(),
                1
            );
            tasks(store.add(vec![job("other")]));
        } else {
            assert_eq!(tasks(over).len(), 3, "form {form}");
        }
    }
}

#[test]
fn priority_comes_before_age_and_listing_keeps_the_seed_order() {
    let mut store = Store::new();
    let added = tasks(store.add(vec![AddTask::seed("g", "old", Some(0)), {
        let mut urgent = AddTask::seed("g", "urgent", Some(5));
        urgent.job.priority = 9;
        urgent
    }]));
    assert_eq!(store.claim(7, "g").expect("one").data, "urgent");
    let listed: Vec<_> = store
        .machine
        .group_tasks("g", None, true, LogTime::from_millis(store.now))
        .into_iter()
        .map(|t| t.data)
        .collect();
    assert_eq!(
        listed,
        vec!["old", "urgent"],
        "seed order: available time, then id"
    );
    assert_eq!(added.len(), 2);
}

#[test]
fn finished_records_are_dropped_after_the_retention() {
    let mut store = Store::new();
    store.settings(
        "g",
        SettingsChange {
            retention_ms: Some(10_000),
            ..SettingsChange::default()
        },
    );
    tasks(store.add(vec![job("k")]));
    let claimed = store.claim(7, "g").expect("claimable");
    tasks(store.finish(7, claimed.id, None));
    store.wait(9_000);
    store.claim(7, "g");
    assert!(
        store.machine.job("g", "k").is_some(),
        "kept within the retention"
    );
    store.wait(1_000);
    store.claim(7, "g");
    assert!(store.machine.job("g", "k").is_none(), "dropped after it");
    assert!(
        tasks(store.add(vec![job("k")])).len() == 1,
        "the key is free again"
    );
}

#[test]
fn a_job_is_read_by_the_id_its_add_answered_until_its_record_is_dropped() {
    let mut store = Store::new();
    store.settings(
        "g",
        SettingsChange {
            retention_ms: Some(10_000),
            ..SettingsChange::default()
        },
    );
    let added = tasks(store.add(vec![job("k")]))[0].id;
    let key_of = |machine: &TaskMachine, id| machine.job_by_id(id).map(|r| r.key.to_string());
    assert_eq!(key_of(&store.machine, added), Some("k".into()));
    let claimed = store.claim(7, "g").expect("claimable");
    assert_eq!(
        key_of(&store.machine, claimed.id),
        Some("k".into()),
        "the live version"
    );
    tasks(store.finish(7, claimed.id, Some("42")));
    let record = store
        .machine
        .job_by_id(added)
        .expect("read by id after it finished");
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!(record.result.as_deref(), Some("42"));
    assert_eq!(
        key_of(&store.machine, claimed.id),
        None,
        "a replaced version"
    );

    // A new run gets a new id; the old one names no job any more.
    let again = tasks(store.add(vec![job("k")]))[0].id;
    assert_eq!(key_of(&store.machine, again), Some("k".into()));
    assert_eq!(key_of(&store.machine, added), None, "an earlier run's id");
    let claimed = store.claim(7, "g").expect("claimable");
    tasks(store.finish(7, claimed.id, None));

    store.wait(10_000);
    store.claim(7, "g");
    assert!(store.machine.job("g", "k").is_none(), "dropped");
    assert_eq!(key_of(&store.machine, again), None);
    assert!(
        store.machine.job_ids.is_empty(),
        "no id outlives its record"
    );

    let seed = tasks(store.add(vec![AddTask::seed("g", "plain", None)]))[0].id;
    assert_eq!(key_of(&store.machine, seed), None, "a seed task is no job");
}

#[test]
fn a_seed_worker_deleting_its_task_after_the_lease_lapsed_finishes_the_job() {
    let mut store = Store::new();
    tasks(store.add(vec![job("k")]));
    let claimed = store.claim(7, "g").expect("claimable");
    store.wait(2_000);
    tasks(store.run(Request::Update(UpdateRequest {
        client: 7,
        deletes: vec![claimed.id],
        ..UpdateRequest::default()
    })));
    assert_eq!(store.state("g", "k"), JobState::Succeeded);

    // Anyone else's delete cancels.
    tasks(store.add(vec![job("other")]));
    let other = store
        .machine
        .job("g", "other")
        .and_then(|r| r.task)
        .expect("task");
    tasks(store.run(Request::Update(UpdateRequest {
        client: 9,
        deletes: vec![other],
        ..UpdateRequest::default()
    })));
    assert_eq!(store.state("g", "other"), JobState::Cancelled);
}

#[test]
fn reads_as_of_a_later_time_see_a_lapsed_lease_before_any_command() {
    let mut store = Store::new();
    tasks(store.add(vec![keyed("k", |j| j.max_attempts = Some(1))]));
    store.claim(7, "g").expect("claimable");
    let later = LogTime::from_millis(store.now + 5_000);
    let view = store.machine.as_of(later);
    assert_eq!(view.job("g", "k").map(|r| r.state), Some(JobState::Dead));
    assert_eq!(view.running_in_group("g"), 0);
    assert_eq!(
        store.state("g", "k"),
        JobState::Running,
        "the machine itself is untouched"
    );
}

#[test]
fn the_change_journal_lists_what_each_command_changed() {
    let g: GroupName = Arc::from("g");
    let job_change = |key: &str| Change::Job {
        group: Arc::clone(&g),
        key: Arc::from(key),
    };
    let mut store = Store::new();
    let seed = tasks(store.add(vec![AddTask::seed("g", "seed", None)])).remove(0);
    assert_eq!(store.machine.changes(), [Change::TaskWritten(seed.id)]);

    // A record may be touched more than once by one command: readers take the last.
    let first = tasks(store.add(vec![job("k")])).remove(0);
    let changes = store.machine.changes();
    assert!(changes.contains(&job_change("k")), "{changes:?}");
    assert!(
        changes.contains(&Change::TaskWritten(first.id)),
        "{changes:?}"
    );
    assert!(
        changes
            .iter()
            .all(|c| *c == job_change("k") || *c == Change::TaskWritten(first.id)),
        "{changes:?}"
    );

    // A refusal changes nothing, and says so.
    refusals(&store.add(vec![job("k")]));
    assert_eq!(store.machine.changes(), []);

    let claimed = store.claim(7, "g").expect("claimable");
    let removed = Change::TaskRemoved {
        group: Arc::clone(&g),
        id: seed.id,
    };
    assert!(store.machine.changes().contains(&removed));
    assert!(
        store
            .machine
            .changes()
            .contains(&Change::TaskWritten(claimed.id))
    );

    store.settings(
        "g",
        SettingsChange {
            paused: Some(true),
            ..SettingsChange::default()
        },
    );
    assert_eq!(store.machine.changes(), [Change::Settings(Arc::clone(&g))]);
    store.settings(
        "g",
        SettingsChange {
            paused: Some(false),
            ..SettingsChange::default()
        },
    );

    // A job lease that lapses shows in the journal of the next command, whatever it is.
    let job_task = store.claim(8, "g").expect("the job");
    assert_eq!(job_task.job.key.as_deref(), Some("k"));
    store.wait(5_000);
    store.add(vec![AddTask::seed("other", "x", None)]);
    assert!(
        store.machine.changes().contains(&job_change("k")),
        "{:?}",
        store.machine.changes()
    );
}

#[test]
fn claimable_counts_follow_the_claim_rules() {
    let mut store = Store::new();
    let none = store
        .machine
        .claimable_count("g", LogTime::from_millis(store.now), 10);
    assert_eq!(none, 0);
    store.add(vec![job("a"), job("b"), job("c")]);
    let later = AddTask::seed("g", "later", Some(-60_000));
    store.add(vec![later]);
    let now = || LogTime::from_millis(T0 + 100);
    assert_eq!(store.machine.claimable_count("g", now(), 10), 3);
    assert_eq!(store.machine.claimable_count("g", now(), 2), 2);
    assert_eq!(
        store.machine.next_claimable_after("g", now()),
        Some(LogTime::from_millis(T0 + 2 + 60_000))
    );

    // max_running 2 with one lease: one more claim gets a task.
    store.settings(
        "g",
        SettingsChange {
            max_running: Some(2),
            ..SettingsChange::default()
        },
    );
    store.claim(7, "g").expect("a job");
    assert_eq!(store.machine.claimable_count("g", now(), 10), 1);
    // The lease lapses after a second: seen as ended by a machine as of then.
    let after_lease = LogTime::from_millis(store.now + 2_000);
    let view = store.machine.as_of(after_lease);
    assert_eq!(view.claimable_count("g", after_lease, 10), 2);

    store.settings(
        "g",
        SettingsChange {
            paused: Some(true),
            ..SettingsChange::default()
        },
    );
    assert_eq!(store.machine.claimable_count("g", now(), 10), 0);
}

#[test]
fn a_waiting_claim_forgets_finding_nothing_and_remembers_a_task() {
    let mut machine = TaskMachine::new();
    let claim = |machine: &mut TaskMachine, at: Millis| {
        machine.apply(&Command {
            stamp: LogTime::from_millis(at),
            request_id: Some("r".into()),
            request: Request::WaitingClaim(ClaimRequest {
                client: 7,
                group: "g".into(),
                duration_ms: 1_000,
                depends: vec![],
            }),
        })
    };
    assert_eq!(*claim(&mut machine, T0), Outcome::Tasks(vec![]));
    assert!(
        machine.dedup().is_empty(),
        "finding nothing is not remembered"
    );
    machine.apply(&Command {
        stamp: LogTime::from_millis(T0 + 1),
        request_id: None,
        request: Request::Update(UpdateRequest {
            client: 1,
            adds: vec![AddTask::seed("g", "x", None)],
            ..UpdateRequest::default()
        }),
    });
    let first = claim(&mut machine, T0 + 2);
    let Outcome::Tasks(tasks) = &*first else {
        panic!("{first:?}")
    };
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        claim(&mut machine, T0 + 3),
        first,
        "a retry gets the same task"
    );
}

#[test]
fn finish_many_ends_every_claim_or_none() {
    let mut store = Store::new();
    tasks(store.add(vec![job("a"), job("b"), job("c")]));
    let a = store.claim(7, "g").expect("a");
    let b = store.claim(7, "g").expect("b");
    let c = store.claim(8, "g").expect("c");
    let many = |client, items: &[(TaskId, Option<&str>)]| {
        Request::FinishMany(FinishManyRequest {
            client,
            finishes: items
                .iter()
                .map(|(id, result)| FinishItem {
                    id: *id,
                    result: result.map(String::from),
                })
                .collect(),
        })
    };

    // One task held by another client refuses the whole request, naming it.
    let refused = store.run(many(7, &[(a.id, None), (c.id, None), (b.id, None)]));
    assert_eq!(
        refusals(&refused),
        vec![format!(
            "finish: task {} is not held by this client (owner 8, lease ends {}); claim it again",
            c.id, c.available_at
        )]
    );
    assert_eq!(store.state("g", "a"), JobState::Running, "nothing changed");
    assert_eq!(store.state("g", "b"), JobState::Running, "nothing changed");

    // Named twice, none at all, too many: refused as invalid.
    let twice = store.run(many(7, &[(a.id, None), (a.id, None)]));
    assert_eq!(
        refusals(&twice),
        vec![format!(
            "finishes: names task {} twice; name each task once",
            a.id
        )]
    );
    assert_eq!(
        refusals(&store.run(many(7, &[]))),
        vec!["finishes: names 0 tasks; name from 1 to 1000".to_string()]
    );
    let too_many: Vec<(TaskId, Option<&str>)> = (0..=1_000u64).map(|n| (n + 1, None)).collect();
    assert_eq!(
        refusals(&store.run(many(7, &too_many))),
        vec!["finishes: names 1001 tasks; name from 1 to 1000".to_string()]
    );

    // All held: each job succeeds with its own result.
    tasks(store.run(many(7, &[(a.id, Some("1")), (b.id, None)])));
    let record = store.machine.job("g", "a").expect("record a");
    assert_eq!(record.state, JobState::Succeeded);
    assert_eq!(record.result.as_deref(), Some("1"));
    assert_eq!(store.state("g", "b"), JobState::Succeeded);
    assert!(store.machine.task(a.id).is_none() && store.machine.task(b.id).is_none());
    assert_eq!(
        store.state("g", "c"),
        JobState::Running,
        "c was never named"
    );
}
