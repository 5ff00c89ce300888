//! Property tests: the task machine against a plain reference model (`model/`) over
//! random command sequences of the seed API and the job layer, with the invariants of
//! ENGINEERING.md 3.1 checked after every step.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use store_sm::machine::*;
use store_sm::snapshot::decode_snapshot;
use store_sm::snapshot::encode_snapshot;
use store_sm::snapshot::state_hash;

mod model;

use model::Model;

const GROUPS: [&str; 3] = ["map", "reduce", "z"];

/// Ids from here on are symbolic: resolved against the model's state when the command
/// is applied (see [`resolve`]), so that most commands name tasks that exist.
const LIVE_ID: u64 = 1_000_000;
const LEASED_ID: u64 = 2_000_000;
const WAITING_ID: u64 = 3_000_000;
/// The client that is symbolic too: the owner of the first symbolic id.
const OWNER: i64 = 0;

fn id_strategy() -> impl Strategy<Value = u64> {
    // Some raw ids (existing, gone or far off), mostly live or leased tasks.
    prop_oneof![
        3 => 1u64..40,
        1 => 40u64..1000,
        3 => (0u64..50).prop_map(|n| LIVE_ID + n),
        3 => (0u64..50).prop_map(|n| LEASED_ID + n),
        2 => (0u64..50).prop_map(|n| WAITING_ID + n),
    ]
}

fn client_strategy() -> impl Strategy<Value = i64> + Clone {
    prop_oneof![3 => Just(OWNER), 2 => 1i64..4]
}

fn few_ids() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(id_strategy(), 1..3)]
}

/// The command with its symbolic ids and client resolved against `model`: `LIVE_ID + n`
/// is the n-th live task (modulo their number), `LEASED_ID + n` the n-th leased one,
/// `WAITING_ID + n` the n-th job version that its owner holds without a claim (scheduled
/// by its adder, put off, backing off: what only a legacy finish or fail may end), client
/// `OWNER` the owner of the first symbolic id.
fn resolve(command: &Command, model: &Model) -> Command {
    let live: Vec<&Task> = model.tasks.values().collect();
    let leased: Vec<&Task> = live.iter().copied().filter(|t| t.job.leased).collect();
    let waiting: Vec<&Task> = live
        .iter()
        .copied()
        .filter(|t| {
            t.job.key.is_some() && !t.job.leased && t.available_at.as_millis() > model.time_ms
        })
        .collect();
    let mut owner = None;
    let mut pick = |id: u64| {
        let (pool, n) = match id {
            id if id >= WAITING_ID => (&waiting, id - WAITING_ID),
            id if id >= LEASED_ID => (&leased, id - LEASED_ID),
            id if id >= LIVE_ID => (&live, id - LIVE_ID),
            id => return id,
        };
        match pool.get(n as usize % pool.len().max(1)) {
            Some(task) => {
                owner.get_or_insert(task.owner);
                task.id
            }
            None => id,
        }
    };
    let mut request = command.request.clone();
    let inner = match &mut request {
        Request::Scoped(scoped) => &mut *scoped.request,
        other => other,
    };
    let client = match inner {
        Request::Update(u) => {
            u.updates.iter_mut().for_each(|c| c.id = pick(c.id));
            u.deletes.iter_mut().for_each(|id| *id = pick(*id));
            u.depends.iter_mut().for_each(|id| *id = pick(*id));
            &mut u.client
        }
        Request::ClaimMany(m) | Request::WaitingClaimMany(m) => {
            m.claim.depends.iter_mut().for_each(|id| *id = pick(*id));
            &mut m.claim.client
        }
        Request::Claim(c) | Request::WaitingClaim(c) => {
            c.depends.iter_mut().for_each(|id| *id = pick(*id));
            &mut c.client
        }
        Request::Finish(f) | Request::LegacyFinish(f) => {
            f.id = pick(f.id);
            &mut f.client
        }
        Request::FinishMany(m) | Request::LegacyFinishMany(m) => {
            m.finishes
                .iter_mut()
                .for_each(|item| item.id = pick(item.id));
            &mut m.client
        }
        Request::Fail(f) | Request::LegacyFail(f) => {
            f.id = pick(f.id);
            &mut f.client
        }
        Request::FinishAndClaim(b) => {
            b.finish.id = pick(b.finish.id);
            b.next
                .claim
                .depends
                .iter_mut()
                .for_each(|id| *id = pick(*id));
            &mut b.finish.client
        }
        Request::Cancel(c) => &mut c.client,
        Request::Retry(r) => &mut r.client,
        Request::Settings(s) => &mut s.client,
        Request::LegacyUpdate(u) => &mut u.client,
        Request::TokenAdd(a) | Request::AuthBootstrap(a) => &mut a.client,
        Request::TokenRevoke(r) => &mut r.client,
        Request::Scoped(s) => unreachable!("the generator nests no scope: {s:?}"),
        Request::PassTime
        | Request::RaiseLogForm(_)
        | Request::RaiseRulesForm(_)
        | Request::Batch(_) => {
            return command.clone();
        }
    };
    if *client == OWNER {
        *client = owner.unwrap_or(1);
    }
    // The claim of a finish and claim is mostly by the finishing client, as sent.
    if let Request::FinishAndClaim(b) = inner
        && b.next.claim.client == OWNER
    {
        b.next.claim.client = b.finish.client;
    }
    Command {
        request,
        ..command.clone()
    }
}

fn timespec_strategy() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        3 => Just(None),
        2 => (-5_000i64..0).prop_map(Some),
        1 => (0i64..20_000).prop_map(Some),
    ]
}

fn group_strategy() -> impl Strategy<Value = String> {
    prop_oneof![10 => prop::sample::select(&GROUPS[..]).prop_map(String::from), 1 => Just(String::new())]
}

const KEYS: [&str; 5] = ["k1", "k2", "k3", "k4", "k5"];

fn key_strategy() -> impl Strategy<Value = String> {
    prop::sample::select(&KEYS[..]).prop_map(String::from)
}

fn job_strategy() -> impl Strategy<Value = AddJob> {
    let keyed = (
        key_strategy(),
        prop_oneof![
            1 => Just(OnConflict::Refuse),
            2 => Just(OnConflict::Keep),
            2 => Just(OnConflict::Resubmit)
        ],
        prop_oneof![2 => Just(vec![]), 1 => prop::collection::vec(key_strategy(), 1..3)],
        prop_oneof![3 => Just(0i64), 1 => -2i64..3],
        prop_oneof![2 => Just(None), 1 => (0u32..4).prop_map(Some)],
        prop_oneof![4 => Just(None), 1 => (1i64..3_000).prop_map(Some)],
    )
        .prop_map(
            |(key, on_conflict, after, priority, max_attempts, every_ms)| AddJob {
                key: Some(key),
                on_conflict,
                after,
                priority,
                max_attempts,
                every_ms,
            },
        );
    let prioritised = (-2i64..3).prop_map(|priority| AddJob {
        priority,
        ..AddJob::default()
    });
    let odd = prop_oneof![
        Just(AddJob {
            after: vec!["k1".into()],
            ..AddJob::default()
        }),
        Just(AddJob {
            key: Some(String::new()),
            ..AddJob::default()
        }),
    ];
    prop_oneof![4 => Just(AddJob::default()), 4 => keyed, 1 => prioritised, 1 => odd]
}

fn job_request_strategy() -> impl Strategy<Value = Request> {
    let client = client_strategy();
    // Now and then the form builds before the claimed-version rule logged, which the
    // machine still applies with their rule.
    let legacy = || prop_oneof![4 => Just(false), 1 => Just(true)];
    let finish = (
        client.clone(),
        id_strategy(),
        prop::option::of("[x-z]{0,2}"),
        legacy(),
    )
        .prop_map(|(client, id, result, legacy)| {
            let finish = FinishRequest { client, id, result };
            if legacy {
                Request::LegacyFinish(finish)
            } else {
                Request::Finish(finish)
            }
        });
    let item = (id_strategy(), prop::option::of("[x-z]{0,2}"))
        .prop_map(|(id, result)| FinishItem { id, result });
    let finish_many = (
        client.clone(),
        prop_oneof![1 => Just(vec![]), 8 => prop::collection::vec(item, 1..4)],
        legacy(),
    )
        .prop_map(|(client, finishes, legacy)| {
            let many = FinishManyRequest { client, finishes };
            if legacy {
                Request::LegacyFinishMany(many)
            } else {
                Request::FinishMany(many)
            }
        });
    let fail = (
        client.clone(),
        id_strategy(),
        "[e-f]{0,2}",
        prop_oneof![2 => Just(None), 1 => (0i64..3_000).prop_map(Some), 1 => Just(Some(-1))],
        legacy(),
    )
        .prop_map(|(client, id, error, retry_in_ms, legacy)| {
            let fail = FailRequest {
                client,
                id,
                error,
                retry_in_ms,
            };
            if legacy {
                Request::LegacyFail(fail)
            } else {
                Request::Fail(fail)
            }
        });
    let finish_and_claim = (
        client.clone(),
        id_strategy(),
        prop::option::of("[x-z]{0,2}"),
        prop_oneof![8 => Just(OWNER), 1 => 1i64..4],
        group_strategy(),
        prop_oneof![6 => 500i64..5_000, 1 => Just(0i64)],
        prop_oneof![3 => Just(1u32), 1 => 0u32..4],
        prop_oneof![8 => Just(vec![]), 1 => prop::collection::vec(id_strategy(), 1..2)],
    )
        .prop_map(
            |(client, id, result, claimer, group, duration_ms, count, depends)| {
                Request::FinishAndClaim(FinishAndClaimRequest {
                    finish: FinishRequest { client, id, result },
                    next: ClaimManyRequest {
                        claim: ClaimRequest {
                            client: claimer,
                            group,
                            duration_ms,
                            depends,
                        },
                        count,
                    },
                })
            },
        );
    let keys = || prop_oneof![1 => Just(vec![]), 6 => prop::collection::vec(key_strategy(), 1..2), 1 => prop::collection::vec(key_strategy(), 2..4)];
    let cancel = (client.clone(), group_strategy(), keys()).prop_map(|(client, group, keys)| {
        Request::Cancel(CancelRequest {
            client,
            group,
            keys,
        })
    });
    let retry = (client.clone(), group_strategy(), keys()).prop_map(|(client, group, keys)| {
        Request::Retry(RetryRequest {
            client,
            group,
            keys,
        })
    });
    let change = (
        prop::option::of(0u32..3),
        prop::option::of(any::<bool>()),
        prop::option::of(0u32..3),
        prop::option::of((0i64..2_000, 900u32..3_000, 0i64..5_000).prop_map(
            |(base_ms, factor_milli, max_ms)| Backoff {
                base_ms,
                factor_milli,
                max_ms,
            },
        )),
        prop::option::of(prop_oneof![0i64..10_000, Just(-1)]),
    )
        .prop_map(
            |(max_running, paused, max_attempts, backoff, retention_ms)| SettingsChange {
                max_running,
                paused,
                max_attempts,
                backoff,
                retention_ms,
            },
        );
    let settings = (client, group_strategy(), change).prop_map(|(client, group, change)| {
        Request::Settings(SettingsRequest {
            client,
            group,
            change,
        })
    });
    // Boxed: the unboxed union's value tree outgrows a test thread's stack in debug builds.
    prop_oneof![3 => finish.boxed(), 2 => finish_many.boxed(), 2 => fail.boxed(), 2 => finish_and_claim.boxed(), 2 => cancel.boxed(), 1 => retry.boxed(), 1 => settings.boxed()]
        .boxed()
}

fn request_strategy() -> impl Strategy<Value = Request> {
    let client = client_strategy();
    let add = (
        group_strategy(),
        "[a-c]{0,3}",
        timespec_strategy(),
        job_strategy(),
    )
        .prop_map(|(group, data, timespec, job)| AddTask {
            group,
            data,
            timespec,
            job,
        });
    let change = (id_strategy(), "[a-c]{0,3}", timespec_strategy())
        .prop_map(|(id, data, timespec)| UpdateTask { id, data, timespec });
    let update = (
        client.clone(),
        prop::collection::vec(add, 0..4),
        prop::collection::vec(change, 0..2),
        few_ids(),
        few_ids(),
    )
        .prop_map(|(client, adds, updates, deletes, depends)| {
            Request::Update(UpdateRequest {
                client,
                adds,
                updates,
                deletes,
                depends,
            })
        });
    let claim = (
        client,
        group_strategy(),
        prop_oneof![10 => 1i64..5_000, 1 => -10i64..=0],
        few_ids(),
        prop::bool::weighted(0.25),
        // A claim of one task in the seed's form, or one with a count (0 is refused).
        prop_oneof![6 => Just(None), 3 => (1u32..5).prop_map(Some), 1 => Just(Some(0))],
    )
        .prop_map(|(client, group, duration_ms, depends, waiting, count)| {
            let claim = ClaimRequest {
                client,
                group,
                duration_ms,
                depends,
            };
            match (count, waiting) {
                (None, true) => Request::WaitingClaim(claim),
                (None, false) => Request::Claim(claim),
                (Some(count), true) => Request::WaitingClaimMany(ClaimManyRequest { claim, count }),
                (Some(count), false) => Request::ClaimMany(ClaimManyRequest { claim, count }),
            }
        });
    let plain = prop_oneof![3 => update, 3 => claim, 2 => job_request_strategy()];
    // A quarter of the requests come from worker tokens limited to some groups.
    let prefixes = prop::collection::vec(prop::sample::select(&PREFIXES[..]), 1..3);
    let scope = prop_oneof![3 => Just(None), 1 => prefixes.prop_map(Some)];
    let scoped = (plain, scope).prop_map(|(request, scope)| match scope {
        None => request,
        Some(groups) => Request::Scoped(ScopedRequest {
            groups: groups.into_iter().map(String::from).collect(),
            request: Box::new(request),
        }),
    });
    prop_oneof![
        20 => scoped,
        1 => token_request_strategy(),
        1 => Just(Request::PassTime),
        // Forms from 4 on change rules: the leader records them in their own variant.
        1 => (0u32..6).prop_map(|form| if form >= 4 {
            Request::RaiseRulesForm(form)
        } else {
            Request::RaiseLogForm(form)
        }),
    ]
}

/// Prefixes of worker tokens: whole group names, parts of them and none of them.
const PREFIXES: [&str; 5] = ["map", "ma", "re", "z", "q"];

/// Token ids: valid ones (often the same, so that adds collide and revokes find one)
/// and an invalid one.
const TOKEN_IDS: [&str; 3] = ["00000000000000a1", "00000000000000b2", "not-hex"];

fn token_request_strategy() -> impl Strategy<Value = Request> {
    let add = (
        prop::sample::select(&TOKEN_IDS[..]),
        prop_oneof![Just(Role::Worker), Just(Role::Reader), Just(Role::Admin)],
        prop_oneof![2 => Just(vec![]), 1 => Just(vec!["map".to_string()])],
        prop::bool::weighted(0.3),
    )
        .prop_map(|(id, role, groups, bootstrap)| {
            let add = TokenAddRequest {
                client: 9,
                id: id.into(),
                name: "ci".into(),
                role,
                groups,
                secret_hash: "ab".repeat(32),
            };
            if bootstrap {
                Request::AuthBootstrap(add)
            } else {
                Request::TokenAdd(add)
            }
        });
    let revoke = prop::sample::select(&TOKEN_IDS[..]).prop_map(|id| {
        Request::TokenRevoke(TokenRevokeRequest {
            client: 9,
            id: id.into(),
        })
    });
    prop_oneof![2 => add, 1 => revoke]
}

fn commands_strategy() -> impl Strategy<Value = Vec<Command>> {
    let step = (
        prop_oneof![8 => 0i64..2_000, 1 => -3_000i64..0],
        prop_oneof![4 => Just(None), 1 => (0u8..6).prop_map(|n| Some(format!("req-{n}")))],
        request_strategy(),
    );
    prop::collection::vec(step, 1..160).prop_map(|steps| {
        let mut stamp = 1_700_000_000_000i64;
        steps
            .into_iter()
            .map(|(delta, request_id, request)| {
                stamp += delta;
                Command {
                    stamp: LogTime::from_millis(stamp),
                    request_id,
                    request,
                }
            })
            .collect()
    })
}

/// Checks the machine against the model and the structural invariants.
fn check_state(machine: &TaskMachine, model: &Model) -> Result<(), TestCaseError> {
    let tasks: Vec<Task> = machine.iter_tasks().cloned().collect();
    let expected: Vec<Task> = model.tasks.values().cloned().collect();
    prop_assert_eq!(tasks, expected);
    prop_assert_eq!(machine.next_id(), model.next_id);
    prop_assert_eq!(machine.log_time().as_millis(), model.time_ms);
    prop_assert_eq!(machine.log_form(), model.log_form);
    let groups: BTreeSet<String> = model.tasks.values().map(|t| t.group.to_string()).collect();
    let machine_groups: Vec<String> = machine.groups().iter().map(|g| g.to_string()).collect();
    prop_assert_eq!(machine_groups, groups.iter().cloned().collect::<Vec<_>>());
    for group in &groups {
        let mut in_group: Vec<Task> = model
            .tasks
            .values()
            .filter(|t| &*t.group == group)
            .cloned()
            .collect();
        in_group.sort_by_key(|t| (t.available_at, t.id));
        prop_assert_eq!(
            machine.group_tasks(group, None, true, LogTime::from_millis(model.time_ms)),
            in_group.clone()
        );
        let available: Vec<Task> = in_group
            .into_iter()
            .filter(|t| t.available_at.as_millis() <= model.time_ms)
            .collect();
        prop_assert_eq!(
            machine.group_tasks(group, None, false, LogTime::from_millis(model.time_ms)),
            available
        );
    }
    prop_assert!(machine.iter_tasks().all(|t| t.id < machine.next_id()));
    let records: Vec<&JobRecord> = machine.iter_jobs().collect();
    let expected: Vec<&JobRecord> = model.records.values().collect();
    prop_assert_eq!(records, expected);
    // Reads by id: a job's id, its live task and the version a cancel removed name it;
    // every other id (a seed task's, an earlier run's, a dropped record's) names none.
    let mut named: BTreeMap<u64, &JobRecord> = BTreeMap::new();
    for record in model.records.values() {
        for id in [record.id, record.task, record.cancelled_task]
            .into_iter()
            .flatten()
        {
            named.insert(id, record);
        }
    }
    for id in 1..=machine.next_id() {
        prop_assert_eq!(machine.job_by_id(id), named.get(&id).copied(), "id {}", id);
    }
    let settings: Vec<(String, GroupSettings)> = machine
        .configured_groups()
        .map(|(group, settings)| (group.to_string(), *settings))
        .collect();
    let expected: Vec<(String, GroupSettings)> = model
        .settings
        .iter()
        .map(|(g, s)| (g.clone(), *s))
        .collect();
    prop_assert_eq!(settings, expected);
    for group in GROUPS {
        let running = model
            .tasks
            .values()
            .filter(|t| &*t.group == group && t.job.leased)
            .count();
        prop_assert_eq!(machine.running_in_group(group), running);
        for state in JobState::ALL {
            let keys: Vec<String> = machine
                .jobs(group, Some(state), None)
                .map(|r| r.key.to_string())
                .collect();
            let expected: Vec<String> = model
                .records
                .values()
                .filter(|r| &*r.group == group && r.state == state)
                .map(|r| r.key.to_string())
                .collect();
            prop_assert_eq!(keys, expected);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn machine_matches_the_reference_model(commands in commands_strategy()) {
        matches_the_model(&commands)?;
    }

    /// Timespecs whose time does not fit in 64 bits, in adds and updates beside every
    /// other kind of item: refused, naming each, exactly as the model says.
    #[test]
    fn timespecs_out_of_range_are_refused_as_the_model_says(
        commands in commands_strategy().prop_map(with_far_timespecs)
    ) {
        matches_the_model(&commands)?;
    }
}

/// Sets a timespec past the end of representable time on every third update's first
/// add and first change (i64::MIN, whose distance from now has no positive form, and
/// -i64::MAX, which overflows added to any positive now).
fn with_far_timespecs(mut commands: Vec<Command>) -> Vec<Command> {
    for (n, command) in commands.iter_mut().enumerate() {
        let update = match &mut command.request {
            Request::Update(update) | Request::LegacyUpdate(update) => update,
            Request::Scoped(scoped) => match scoped.request.as_mut() {
                Request::Update(update) | Request::LegacyUpdate(update) => update,
                _ => continue,
            },
            _ => continue,
        };
        if n % 3 != 0 {
            continue;
        }
        if let Some(add) = update.adds.first_mut() {
            add.timespec = Some(i64::MIN);
        }
        if let Some(change) = update.updates.first_mut() {
            change.timespec = Some(-i64::MAX);
        }
    }
    commands
}

/// Applies `commands` to the machine and the model, checking at every step that they
/// agree, that ids are issued once and in order, that a refusal changes nothing, and
/// that snapshots and a replay give the same state.
fn matches_the_model(commands: &[Command]) -> Result<(), TestCaseError> {
    let mut machine = TaskMachine::new();
    let mut model = Model::new();
    let mut issued = BTreeSet::new();
    let mut applied = Vec::with_capacity(commands.len());
    let mut outcomes = Vec::with_capacity(commands.len());
    let mut changes = Vec::with_capacity(commands.len());
    for (step, command) in commands.iter().enumerate() {
        let command = &resolve(command, &model);
        applied.push(command.clone());
        let before = machine.clone();
        let next_id_before = machine.next_id();
        let replayed = command.request_id.as_ref().is_some_and(|id| {
            model
                .seen
                .contains_key(&(command.request.client(), id.clone()))
        });
        let outcome = machine.apply(command);
        let expected = model.apply(command);
        prop_assert_eq!(&*outcome, &expected, "step {}: {:?}", step, command);
        outcomes.push(Arc::clone(&outcome));
        changes.push(machine.changes().to_vec());

        match &*outcome {
            Outcome::Tasks(_) if replayed => {
                prop_assert_eq!(machine.next_id(), next_id_before, "a retry applies nothing");
            }
            Outcome::Tasks(tasks) => {
                // An add whose key is live and kept answers the live task: an old id.
                let (kept, new): (Vec<&Task>, Vec<&Task>) =
                    tasks.iter().partition(|task| task.id < next_id_before);
                for task in kept {
                    prop_assert!(
                        matches!(command.request.unscoped(), Request::Update(u)
                            if u.adds.iter().any(|a| a.job.on_conflict != OnConflict::Refuse)),
                        "id {} reused",
                        task.id
                    );
                }
                for task in &new {
                    prop_assert!(issued.insert(task.id), "id {} issued twice", task.id);
                }
                let ids: Vec<u64> = new.iter().map(|t| t.id).collect();
                prop_assert!(
                    ids.windows(2).all(|w| w[0] < w[1]),
                    "ids in order: {:?}",
                    ids
                );
                // A worker token's request writes only in its groups.
                if let Request::Scoped(scoped) = &command.request {
                    for task in tasks {
                        prop_assert!(
                            scoped
                                .groups
                                .iter()
                                .any(|p| task.group.starts_with(p.as_str())),
                            "a request limited to {:?} wrote task {} of group {:?}",
                            scoped.groups,
                            task.id,
                            task.group
                        );
                    }
                }
            }
            Outcome::Refused(_) => {
                // All or nothing: a refusal writes no task and uses no id. (Time still
                // passes: a lapsed lease may have made a job dead.)
                prop_assert_eq!(machine.next_id(), before.next_id());
                for task in machine.iter_tasks() {
                    let old = before.task(task.id);
                    prop_assert!(
                        old.is_some_and(|old| (old.available_at, old.owner, &old.data)
                            == (task.available_at, task.owner, &task.data)),
                        "a refused command changed task {}",
                        task.id
                    );
                }
            }
            Outcome::Settings(_) | Outcome::Token(_) => {
                prop_assert_eq!(machine.next_id(), before.next_id());
            }
            Outcome::Batch(_) => prop_assert!(false, "no generated request is a batch"),
        }
        let tokens: Vec<&TokenRecord> = machine.tokens().collect();
        prop_assert_eq!(tokens, model.tokens.values().collect::<Vec<_>>());
        prop_assert_eq!(machine.auth_bootstrapped(), model.bootstrapped);
        check_state(&machine, &model)?;

        if step % 16 == 0 {
            let restored = decode_snapshot(&encode_snapshot(&machine)).expect("round trip");
            prop_assert_eq!(state_hash(&restored), state_hash(&machine));
            check_state(&restored, &model)?;
        }
    }

    // Determinism: the same log applied again gives the same state hash.
    let mut replay = TaskMachine::new();
    for command in &applied {
        replay.apply(command);
    }
    prop_assert_eq!(state_hash(&replay), state_hash(&machine));
    batched_replay_matches(&applied, &outcomes, &changes, &machine)
}

/// Group commit changes nothing: `applied` again, in batches of 1 to 7 commands, gives
/// each command the `outcomes` and `changes` it had alone and ends in `machine`'s state.
fn batched_replay_matches(
    applied: &[Command],
    outcomes: &[Arc<Outcome>],
    changes: &[Vec<Change>],
    machine: &TaskMachine,
) -> Result<(), TestCaseError> {
    let mut batched = TaskMachine::new();
    let mut start = 0;
    for size in (1..=7).cycle() {
        if start >= applied.len() {
            break;
        }
        let end = (start + size).min(applied.len());
        let batch = Command {
            stamp: applied[start].stamp,
            request_id: None,
            request: Request::Batch(applied[start..end].to_vec()),
        };
        let outcome = batched.apply(&batch);
        prop_assert_eq!(&*outcome, &Outcome::Batch(outcomes[start..end].to_vec()));
        let expected_changes = changes[start..end].concat();
        prop_assert_eq!(batched.changes(), expected_changes.as_slice());
        start = end;
    }
    prop_assert_eq!(state_hash(&batched), state_hash(machine));
    Ok(())
}

/// A legacy finish or fail in the form new builds log, which refuses a job's version
/// that is not claimed; `None` for any other command.
fn claimed_only_form(command: &Command) -> Option<Command> {
    let request = match &command.request {
        Request::LegacyFinish(f) => Request::Finish(f.clone()),
        Request::LegacyFinishMany(m) => Request::FinishMany(m.clone()),
        Request::LegacyFail(f) => Request::Fail(f.clone()),
        _ => return None,
    };
    Some(Command {
        request,
        ..command.clone()
    })
}

/// The generator reaches every command's success and every job state and attempt end,
/// so the model test above is not comparing refusals only.
#[test]
fn the_generator_reaches_every_part_of_the_job_layer() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut reached = BTreeSet::new();
    let not_claimed = |r: &Refusal| matches!(r, Refusal::NotClaimed { .. });
    for _ in 0..1_500 {
        let commands = commands_strategy()
            .new_tree(&mut runner)
            .expect("a tree")
            .current();
        let mut model = Model::new();
        for command in &commands {
            let command = resolve(command, &model);
            let kind = format!("{:?}", command.request);
            let kind = kind.split('(').next().unwrap_or_default().to_string();
            if let Some(strict) = claimed_only_form(&command) {
                let refused = model.clone().apply(&strict);
                if let Outcome::Refused(refusals) = &refused
                    && refusals.iter().any(not_claimed)
                {
                    reached.insert(format!("{kind} of an unclaimed version"));
                }
            }
            let outcome = model.apply(&command);
            if !outcome.is_refused() {
                reached.insert(format!("{kind} applied"));
            }
            if let Outcome::Refused(refusals) = &outcome
                && refusals.iter().any(not_claimed)
            {
                reached.insert(format!("{kind} refused as not claimed"));
            }
        }
        for record in model.records.values() {
            reached.insert(format!("state {}", record.state));
            for attempt in &record.history {
                let end = format!("{:?}", attempt.end);
                reached.insert(format!(
                    "end {}",
                    end.split('(')
                        .nth(1)
                        .unwrap_or("open")
                        .trim_end_matches(')')
                ));
            }
        }
    }
    for expected in [
        "Update applied",
        "Claim applied",
        "Finish applied",
        "FinishMany applied",
        "Fail applied",
        "LegacyFinish applied",
        "LegacyFinishMany applied",
        "LegacyFail applied",
        "FinishAndClaim applied",
        "FinishAndClaim refused as not claimed",
        "Finish refused as not claimed",
        "Fail refused as not claimed",
        "LegacyFinish of an unclaimed version",
        "LegacyFail of an unclaimed version",
        "Cancel applied",
        "Retry applied",
        "Settings applied",
        "state waiting",
        "state running",
        "state failed",
        "state succeeded",
        "state dead",
        "state cancelled",
        "end Succeeded",
        "end Failed",
        "end Lost",
        "end Released",
        "end Cancelled",
    ] {
        assert!(
            reached.contains(expected),
            "never reached: {expected}; reached {reached:?}"
        );
    }
}
