//! Example-based tests of the seed's semantics. The property tests in
//! `tests/machine_model.rs` cover random sequences against a reference model.

use super::*;

const T0: Millis = 1_700_000_000_000;

fn add(group: &str, data: &str, timespec: Option<Millis>) -> AddTask {
    AddTask::seed(group, data, timespec)
}

/// Log time `ms` milliseconds after the epoch.
fn at(ms: Millis) -> LogTime {
    LogTime::from_millis(ms)
}

fn update_cmd(stamp_ms: Millis, update: UpdateRequest) -> Command {
    Command {
        stamp: at(stamp_ms),
        request_id: None,
        request: Request::Update(update),
    }
}

fn claim_cmd(stamp_ms: Millis, client: ClientId, group: &str, duration_ms: Millis) -> Command {
    Command {
        stamp: at(stamp_ms),
        request_id: None,
        request: Request::Claim(ClaimRequest {
            client,
            group: group.into(),
            duration_ms,
            depends: vec![],
        }),
    }
}

/// Client 1's claim in group `g` for 5 ms that names `depends`.
fn claim_depending_on(depends: Vec<TaskId>) -> ClaimRequest {
    ClaimRequest {
        client: 1,
        group: "g".into(),
        duration_ms: 5,
        depends,
    }
}

fn claim_command(claim: &ClaimRequest) -> Command {
    Command {
        stamp: at(T0),
        request_id: None,
        request: Request::Claim(claim.clone()),
    }
}

fn tasks_of(outcome: &Outcome) -> &[Task] {
    match outcome {
        Outcome::Tasks(tasks) => tasks,
        Outcome::Refused(refusals) => panic!("refused: {refusals:?}"),
        other => panic!("expected tasks, got {other:?}"),
    }
}

fn refusals_of(outcome: &Outcome) -> Vec<String> {
    match outcome {
        Outcome::Refused(refusals) => refusals.iter().map(ToString::to_string).collect(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn adds(machine: &mut TaskMachine, client: ClientId, group: &str, n: usize) -> Vec<Task> {
    let update = UpdateRequest {
        client,
        adds: (0..n).map(|i| add(group, &format!("d{i}"), None)).collect(),
        ..Default::default()
    };
    tasks_of(&machine.apply(&update_cmd(T0, update))).to_vec()
}

#[test]
fn adds_get_increasing_ids_and_defaults() {
    let mut machine = TaskMachine::new();
    let update = UpdateRequest {
        client: 7,
        adds: vec![
            add("map", "a", None),
            add("map", "", Some(-60_000)),
            add("map", "c", Some(0)),
        ],
        ..Default::default()
    };
    let outcome = machine.apply(&update_cmd(T0, update));
    let tasks = tasks_of(&outcome);
    assert_eq!(tasks.iter().map(|t| t.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(
        tasks[0].available_at.as_millis(),
        T0,
        "missing timespec is now"
    );
    assert_eq!(
        tasks[1].available_at.as_millis(),
        T0 + 60_000,
        "negative timespec is now + |t|"
    );
    assert_eq!(tasks[2].available_at.as_millis(), 0, "zero is the epoch");
    assert!(tasks.iter().all(|t| t.owner == 7 && &*t.group == "map"));
    assert_eq!(machine.next_id(), 4);
}

#[test]
fn update_replaces_the_task_with_a_new_id_in_the_same_group() {
    let mut machine = TaskMachine::new();
    let [old] = adds(&mut machine, 1, "g", 1).try_into().expect("one task");
    let update = UpdateRequest {
        client: 2,
        adds: vec![add("other", "x", None)],
        updates: vec![UpdateTask {
            id: old.id,
            data: "new".into(),
            timespec: Some(-1000),
        }],
        ..Default::default()
    };
    let outcome = machine.apply(&update_cmd(T0 + 5, update));
    let tasks = tasks_of(&outcome);
    assert_eq!(tasks.len(), 2, "adds first, then updates");
    assert_eq!(&*tasks[0].group, "other");
    assert_eq!(&*tasks[1].group, "g", "an update never changes the group");
    assert_eq!(tasks[1].data, "new");
    assert_eq!(tasks[1].available_at.as_millis(), T0 + 5 + 1000);
    assert_eq!(tasks[1].owner, 2);
    assert!(tasks[1].id > tasks[0].id);
    assert!(machine.task(old.id).is_none(), "the old version is gone");
}

#[test]
fn owned_tasks_refuse_other_clients_until_they_expire() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 1);
    let claimed = tasks_of(&machine.apply(&claim_cmd(T0, 5, "g", 1000)))[0].clone();
    assert_eq!(claimed.owner, 5);
    assert_eq!(claimed.available_at.as_millis(), T0 + 1000);

    let delete = |client| UpdateRequest {
        client,
        deletes: vec![claimed.id],
        ..Default::default()
    };
    let outcome = machine.apply(&update_cmd(T0 + 999, delete(6)));
    assert_eq!(
        refusals_of(&outcome),
        [format!(
            "deletes: task {} is owned by client 5 until {}",
            claimed.id,
            T0 + 1000
        )]
    );
    assert!(
        machine.task(claimed.id).is_some(),
        "a refusal changes nothing"
    );
    let outcome = machine.apply(&update_cmd(T0 + 1000, delete(6)));
    assert_eq!(
        tasks_of(&outcome),
        [],
        "expired ownership lets anyone delete"
    );
}

#[test]
fn the_owner_may_renew_its_claim() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 1);
    let claimed = tasks_of(&machine.apply(&claim_cmd(T0, 5, "g", 1000)))[0].clone();
    let renew = UpdateRequest {
        client: 5,
        updates: vec![UpdateTask {
            id: claimed.id,
            data: claimed.data.clone(),
            timespec: Some(-1000),
        }],
        ..Default::default()
    };
    let renewed = tasks_of(&machine.apply(&update_cmd(T0 + 500, renew.clone())))[0].clone();
    assert_eq!(renewed.available_at.as_millis(), T0 + 1500);
    let stale = machine.apply(&update_cmd(T0 + 600, renew));
    assert_eq!(
        refusals_of(&stale),
        [format!("updates: task {} does not exist", claimed.id)],
        "the old id is a stale fencing token"
    );
}

#[test]
fn every_reason_is_reported_and_nothing_changes() {
    let mut machine = TaskMachine::new();
    let existing = adds(&mut machine, 1, "g", 2);
    let before = machine.tasks(&[existing[0].id, existing[1].id]);
    let update = UpdateRequest {
        client: 1,
        adds: vec![add("", "x", None), add("g", "y", Some(Millis::MIN))],
        updates: vec![UpdateTask {
            id: 99,
            data: String::new(),
            timespec: None,
        }],
        deletes: vec![existing[0].id, 98, existing[0].id],
        depends: vec![97],
    };
    let outcome = machine.apply(&update_cmd(T0, update));
    assert_eq!(
        refusals_of(&outcome),
        [
            format!(
                "deletes: task {} is named more than once in the request; name each id once",
                existing[0].id
            ),
            "adds: item 0 has no group; give every added task a non-empty group".to_string(),
            format!(
                "adds: item 1 has timespec {}, which is out of range",
                Millis::MIN
            ),
            "updates: task 99 does not exist".to_string(),
            "deletes: task 98 does not exist".to_string(),
            "depends: task 97 does not exist".to_string(),
        ]
    );
    assert_eq!(machine.tasks(&[existing[0].id, existing[1].id]), before);
    assert_eq!(machine.next_id(), 3, "a refused update consumes no ids");
}

#[test]
fn empty_and_depends_only_updates_are_refused() {
    let mut machine = TaskMachine::new();
    let [dep] = adds(&mut machine, 1, "g", 1).try_into().expect("one task");
    for depends in [vec![], vec![dep.id]] {
        let update = UpdateRequest {
            client: 1,
            depends,
            ..Default::default()
        };
        assert_eq!(
            refusals_of(&machine.apply(&update_cmd(T0, update))),
            ["the update has no adds, updates or deletes (depends alone changes nothing)"]
        );
    }
}

#[test]
fn depends_must_exist_and_stay_untouched() {
    let mut machine = TaskMachine::new();
    let [dep] = adds(&mut machine, 1, "g", 1).try_into().expect("one task");
    let update = UpdateRequest {
        client: 2,
        adds: vec![add("h", "", None)],
        depends: vec![dep.id],
        ..Default::default()
    };
    tasks_of(&machine.apply(&update_cmd(T0, update)));
    assert_eq!(machine.task(dep.id), Some(&dep));
}

#[test]
fn claim_takes_the_oldest_available_task_and_skips_its_depends() {
    let mut machine = TaskMachine::new();
    let update = UpdateRequest {
        client: 1,
        adds: vec![
            add("g", "late", Some(T0 - 10)),
            add("g", "early", Some(T0 - 20)),
            add("g", "owned", Some(T0 + 10_000)),
            add("g", "tie", Some(T0 - 20)),
        ],
        ..Default::default()
    };
    tasks_of(&machine.apply(&update_cmd(T0, update)));
    let claim = |machine: &mut TaskMachine, depends: Vec<TaskId>| {
        let command = Command {
            stamp: at(T0),
            request_id: None,
            request: Request::Claim(ClaimRequest {
                client: 3,
                group: "g".into(),
                duration_ms: 100,
                depends,
            }),
        };
        tasks_of(&machine.apply(&command)).to_vec()
    };
    // "early" (id 2) and "tie" (id 4) share a time: the smaller id goes first.
    // A claim that depends on id 2 must not take it.
    assert_eq!(claim(&mut machine, vec![2])[0].data, "tie");
    assert_eq!(claim(&mut machine, vec![])[0].data, "early");
    assert_eq!(claim(&mut machine, vec![])[0].data, "late");
    assert_eq!(claim(&mut machine, vec![]), [], "only owned tasks are left");
    assert_eq!(machine.group_len("g"), 4);
}

#[test]
fn claim_refusals() {
    let mut machine = TaskMachine::new();
    assert_eq!(
        refusals_of(&machine.apply(&claim_cmd(T0, 1, "", 0))),
        [
            "claim: group is missing or empty",
            "claim: duration 0 is not a positive number of milliseconds"
        ]
    );
    let claim = claim_depending_on(vec![42]);
    let command = claim_command(&claim);
    assert_eq!(
        refusals_of(&machine.apply(&command)),
        ["depends: task 42 does not exist"]
    );
    assert_eq!(
        tasks_of(&machine.apply(&claim_cmd(T0, 1, "nothing-here", 5))),
        []
    );
    // What a blocking claim asks before it waits: the same reasons, nothing applied.
    assert_eq!(
        machine
            .claim_refusals(&claim, 1, at(T0))
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["depends: task 42 does not exist"]
    );
    let fine = ClaimRequest {
        depends: vec![],
        ..claim.clone()
    };
    assert_eq!(machine.claim_refusals(&fine, 1, at(T0)), []);
    assert_eq!(machine.claim_refusals(&fine, 0, at(T0)).len(), 1, "count 0");
}

#[test]
fn a_missing_dependency_named_twice_is_reported_once() {
    let mut machine = TaskMachine::new();
    let command = claim_command(&claim_depending_on(vec![42, 42, 43]));
    let refusals = refusals_of(&machine.apply(&command));
    assert_eq!(
        refusals
            .iter()
            .filter(|r| r.as_str() == "depends: task 42 does not exist")
            .count(),
        1,
        "{refusals:?}"
    );
    assert!(
        refusals.contains(&"depends: task 43 does not exist".to_string()),
        "{refusals:?}"
    );
    assert!(
        refusals.iter().any(|r| r.contains("more than once")),
        "{refusals:?}"
    );
}

#[test]
fn groups_exist_only_while_they_hold_tasks() {
    let mut machine = TaskMachine::new();
    let tasks = adds(&mut machine, 1, "b", 2);
    adds(&mut machine, 1, "a", 1);
    assert_eq!(machine.groups(), [Arc::from("a"), Arc::from("b")]);
    let delete = UpdateRequest {
        client: 1,
        deletes: tasks.iter().map(|t| t.id).collect(),
        ..Default::default()
    };
    tasks_of(&machine.apply(&update_cmd(T0, delete)));
    assert_eq!(machine.groups(), [Arc::from("a")]);
    assert_eq!(machine.group_tasks("b", None, true, at(T0)), []);
}

#[test]
fn group_listing_honours_owned_and_limit() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 3);
    tasks_of(&machine.apply(&claim_cmd(T0, 2, "g", 1000)));
    assert_eq!(machine.group_tasks("g", None, false, at(T0)).len(), 2);
    assert_eq!(machine.group_tasks("g", None, true, at(T0)).len(), 3);
    assert_eq!(machine.group_tasks("g", Some(1), true, at(T0)).len(), 1);
    assert_eq!(
        machine.group_tasks("g", None, false, at(T0 + 1000)).len(),
        3,
        "expired"
    );
}

#[test]
fn time_never_goes_back() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 1);
    let claimed = tasks_of(&machine.apply(&claim_cmd(T0 + 50, 1, "g", 10)))[0].clone();
    assert_eq!(claimed.available_at.as_millis(), T0 + 60);
    // A new leader whose clock is behind stamps an earlier time: log time stays.
    let again = machine.apply(&claim_cmd(T0, 2, "g", 10));
    assert_eq!(tasks_of(&again), []);
    assert_eq!(machine.log_time().as_millis(), T0 + 50);
}

#[test]
fn a_retried_request_returns_its_first_outcome_and_applies_once() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 2);
    let mut command = claim_cmd(T0, 9, "g", 1000);
    command.request_id = Some("req-1".into());
    let first = machine.apply(&command);
    let second = machine.apply(&command);
    assert_eq!(first, second);
    assert_eq!(
        machine.group_tasks("g", None, false, at(T0)).len(),
        1,
        "claimed once"
    );

    let mut other_client = claim_cmd(T0, 10, "g", 1000);
    other_client.request_id = Some("req-1".into());
    assert_ne!(machine.apply(&other_client), first, "ids are per client");

    command.request_id = Some("x".repeat(REQUEST_ID_BYTES_MAX + 1));
    assert_eq!(
        refusals_of(&machine.apply(&command)),
        [format!(
            "requestid is 65 bytes long; the limit is {REQUEST_ID_BYTES_MAX}"
        )]
    );
}

#[test]
fn oversized_requests_are_refused_whole() {
    let mut machine = TaskMachine::new();
    let update = UpdateRequest {
        client: 1,
        deletes: (0..=REQUEST_ITEMS_MAX as u64).collect(),
        ..Default::default()
    };
    assert_eq!(
        refusals_of(&machine.apply(&update_cmd(T0, update))),
        [format!(
            "the request names {} tasks; the limit is {REQUEST_ITEMS_MAX}, split it",
            REQUEST_ITEMS_MAX + 1
        )]
    );
}

#[test]
fn a_claim_is_granted_up_to_the_longest_duration_and_refused_beyond() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 1);
    let longest = tasks_of(&machine.apply(&claim_cmd(T0, 2, "g", CLAIM_DURATION_MS_MAX))).to_vec();
    assert_eq!(
        longest[0].available_at.as_millis(),
        T0 + CLAIM_DURATION_MS_MAX
    );
    assert_eq!(
        refusals_of(&machine.apply(&claim_cmd(T0, 2, "g", CLAIM_DURATION_MS_MAX + 1))),
        [format!(
            "claim: duration {} is longer than the limit of {CLAIM_DURATION_MS_MAX} milliseconds",
            CLAIM_DURATION_MS_MAX + 1
        )]
    );
}

/// The checks after apply run in debug builds: a machine whose group index lost its
/// tasks is caught at the next command.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "the group indexes name 0 tasks, the task map holds 2")]
fn apply_asserts_that_the_indexes_hold_every_task() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 2);
    machine.groups = OrdMap::new();
    machine.apply(&claim_cmd(T0, 1, "g", 10));
}

#[test]
fn a_request_id_reused_for_another_request_is_refused_and_changes_nothing() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 2);
    let mut claim = claim_cmd(T0, 9, "g", 1000);
    claim.request_id = Some("req-1".into());
    let first = machine.apply(&claim);
    let mut other = claim_cmd(T0, 9, "g", 5000);
    other.request_id = Some("req-1".into());
    let before = machine.clone();
    assert_eq!(
        refusals_of(&machine.apply(&other)),
        [
            "requestid \"req-1\" was used for a different request of this client; a retry must send the same request, a new request needs a fresh requestid"
        ]
    );
    assert_eq!(
        machine.group_tasks("g", None, false, at(T0)).len(),
        before.group_tasks("g", None, false, at(T0)).len()
    );
    // The same request still gets its first outcome, waiting or not.
    assert_eq!(machine.apply(&claim), first);
    let waiting = Command {
        request: match &claim.request {
            Request::Claim(c) => Request::WaitingClaim(c.clone()),
            other => other.clone(),
        },
        ..claim.clone()
    };
    assert_eq!(machine.apply(&waiting), first);
}

#[test]
fn paging_a_group_by_cursor_visits_every_task_once_in_listing_order() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 7);
    // Some later, some claimed, so the order is not the id order.
    let update = UpdateRequest {
        client: 1,
        adds: (0..5)
            .map(|i| add("g", &format!("later{i}"), Some(-(5_000 - 100 * i))))
            .collect(),
        ..Default::default()
    };
    machine.apply(&update_cmd(T0, update));
    machine.apply(&claim_cmd(T0, 2, "g", 60_000));
    for include_owned in [true, false] {
        let all: Vec<TaskId> = machine
            .iter_group("g", include_owned, at(T0))
            .map(|t| t.id)
            .collect();
        let mut paged = Vec::new();
        let mut after = None;
        loop {
            let page: Vec<&Task> = machine
                .iter_group_after("g", include_owned, at(T0), after)
                .take(3)
                .collect();
            let Some(last) = page.last() else { break };
            after = Some((last.available_at, last.id));
            paged.extend(page.iter().map(|t| t.id));
        }
        assert_eq!(paged, all, "include_owned {include_owned}");
    }
    assert_eq!(
        machine
            .iter_group_after("g", false, at(T0), Some((LogTime::MAX, TaskId::MAX)))
            .count(),
        0,
        "a cursor past the end"
    );
}

fn claim_many_cmd(stamp_ms: Millis, client: ClientId, group: &str, count: u32) -> Command {
    Command {
        stamp: at(stamp_ms),
        request_id: None,
        request: Request::ClaimMany(ClaimManyRequest {
            claim: ClaimRequest {
                client,
                group: group.into(),
                duration_ms: 1_000,
                depends: vec![],
            },
            count,
        }),
    }
}

#[test]
fn a_claim_with_count_takes_what_successive_claims_would() {
    let mut batch = TaskMachine::new();
    let mut single = TaskMachine::new();
    let added = adds(&mut batch, 1, "g", 5);
    adds(&mut single, 1, "g", 5);

    let outcome = batch.apply(&claim_many_cmd(T0 + 10, 9, "g", 3));
    let claimed = tasks_of(&outcome);
    let one_by_one: Vec<Task> = (0..3)
        .map(|_| tasks_of(&single.apply(&claim_cmd(T0 + 10, 9, "g", 1_000)))[0].clone())
        .collect();
    assert_eq!(
        claimed,
        one_by_one.as_slice(),
        "the same tasks, ids and leases"
    );
    let sources: Vec<&str> = claimed.iter().map(|t| &*t.data).collect();
    assert_eq!(sources, ["d0", "d1", "d2"], "oldest first");
    assert!(claimed.iter().all(|t| t.owner == 9 && t.id > added[4].id));
    assert_eq!(state_hash_of(&batch), state_hash_of(&single));

    let rest = batch.apply(&claim_many_cmd(T0 + 10, 9, "g", 10));
    assert_eq!(tasks_of(&rest).len(), 2, "fewer when fewer are available");
    let none = batch.apply(&claim_many_cmd(T0 + 10, 9, "g", 10));
    assert!(tasks_of(&none).is_empty(), "none left");
}

/// Every task's id, owner and available time, in id order.
fn state_hash_of(machine: &TaskMachine) -> Vec<(TaskId, ClientId, Millis)> {
    machine
        .iter_tasks()
        .map(|t| (t.id, t.owner, t.available_at.as_millis()))
        .collect()
}

#[test]
fn a_claim_count_out_of_bounds_is_refused_and_changes_nothing() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 2);
    let before = state_hash_of(&machine);
    for count in [0, constants::CLAIM_COUNT_MAX + 1] {
        let outcome = machine.apply(&claim_many_cmd(T0 + 10, 9, "g", count));
        assert_eq!(
            refusals_of(&outcome),
            vec![format!(
                "claim: count {count} is not between 1 and {}",
                constants::CLAIM_COUNT_MAX
            )]
        );
    }
    assert_eq!(state_hash_of(&machine), before);
}

#[test]
fn a_claim_with_count_stops_at_its_data_limit() {
    let mut machine = TaskMachine::new();
    let big = "x".repeat(constants::CLAIM_DATA_BYTES_MAX / 2 + 1);
    let update = UpdateRequest {
        client: 1,
        adds: (0..4).map(|_| add("g", &big, None)).collect(),
        ..Default::default()
    };
    tasks_of(&machine.apply(&update_cmd(T0, update)));
    let outcome = machine.apply(&claim_many_cmd(T0 + 10, 9, "g", 4));
    assert_eq!(tasks_of(&outcome).len(), 2, "the second reaches the limit");
}

#[test]
fn a_retried_claim_with_count_gets_its_first_tasks_and_a_waiting_one_may_find_nothing_first() {
    let mut machine = TaskMachine::new();
    let mut waiting = claim_many_cmd(T0 + 10, 9, "g", 2);
    waiting.request = match waiting.request {
        Request::ClaimMany(many) => Request::WaitingClaimMany(many),
        other => other,
    };
    waiting.request_id = Some("w".into());
    assert!(tasks_of(&machine.apply(&waiting)).is_empty());
    adds(&mut machine, 1, "g", 3);
    let first = machine.apply(&waiting);
    assert_eq!(
        tasks_of(&first).len(),
        2,
        "proposed again under the same id"
    );
    let again = machine.apply(&waiting);
    assert_eq!(
        first, again,
        "a retry gets the first outcome and claims nothing more"
    );
    let left = machine.apply(&claim_many_cmd(T0 + 10, 9, "g", 5));
    assert_eq!(tasks_of(&left).len(), 1);
}

#[test]
fn a_restored_cluster_starts_at_its_own_time_with_ids_above_a_time_floor() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 2);
    let claimed = tasks_of(&machine.apply(&claim_cmd(T0, 5, "g", 60_000)))[0].clone();
    let backed_up_next = machine.next_id();
    machine.raise_log_form(3);

    let restored_at = T0 + 3_600_000;
    machine.start_restored_cluster(at(restored_at));
    assert_eq!(machine.log_time().as_millis(), restored_at);
    assert_eq!(machine.log_form(), 3, "kept, as the rest of the state");
    let floor = u64::try_from(restored_at).expect("positive") * constants::RESTORED_IDS_PER_MS;
    assert_eq!(machine.next_id(), floor);
    assert!(floor > backed_up_next);

    // The lease the backup held ended before the restore, so the task is free again,
    // and its next version's id is above the floor.
    let again = tasks_of(&machine.apply(&claim_cmd(restored_at, 6, "g", 1000)))[0].clone();
    assert_eq!(again.group, claimed.group);
    assert!(again.id >= floor, "id {} under the floor {floor}", again.id);

    // A second restore with a clock behind moves neither time nor ids back.
    let next = machine.next_id();
    machine.start_restored_cluster(at(T0));
    assert_eq!(machine.log_time().as_millis(), restored_at);
    assert_eq!(machine.next_id(), next);
}

#[test]
fn pass_time_applies_what_fell_due_and_next_due_names_it() {
    let mut machine = TaskMachine::new();
    adds(&mut machine, 1, "g", 1);
    assert_eq!(machine.next_due(), None);
    let claimed = tasks_of(&machine.apply(&claim_cmd(T0, 5, "g", 1000)))[0].clone();
    assert_eq!(machine.next_due(), Some(at(T0 + 1000)));
    let pass = Command {
        stamp: at(T0 + 1000),
        request_id: None,
        request: Request::PassTime,
    };
    assert_eq!(tasks_of(&machine.apply(&pass)), []);
    assert_eq!(machine.next_due(), None, "the lease lapsed");
    let task = machine.task(claimed.id).expect("still there, free again");
    assert_eq!(task.available_at, at(T0 + 1000));
    assert_eq!(machine.log_time(), at(T0 + 1000));
}

/// From form 4 on, a retry within the keep time is answered from the dedup table
/// however many outcomes arrived since; below it, as older builds did, the oldest went
/// past the count limit, and a late retry applied again.
#[test]
fn a_retry_within_the_keep_time_applies_once_at_any_rate() {
    let remembered = Arc::new(Outcome::Tasks(vec![]));
    let entries = constants::DEDUP_ENTRIES_MAX + 10;
    let restored = || {
        let dedup = (0..entries).map(|n| {
            (
                (5, Arc::from(n.to_string())),
                at(T0),
                Arc::clone(&remembered),
                None,
            )
        });
        TaskMachine::from_parts(
            2,
            at(T0),
            [],
            dedup,
            [],
            JobParts::default(),
            AuthParts::default(),
        )
        .expect("valid parts")
    };
    let with_id = |stamp_ms: Millis, id: &str| Command {
        request_id: Some(id.to_string()),
        ..update_cmd(
            stamp_ms,
            UpdateRequest {
                client: 5,
                adds: vec![add("g", "d", None)],
                ..UpdateRequest::default()
            },
        )
    };
    let keep = constants::DEDUP_KEEP_MS;
    for form in [3, constants::DEDUP_KEEP_FORM] {
        let mut machine = restored();
        machine.raise_log_form(form);
        assert_eq!(tasks_of(&machine.apply(&with_id(T0 + 1, "new"))).len(), 1);
        let retried = machine.apply(&with_id(T0 + keep, "0"));
        if form >= constants::DEDUP_KEEP_FORM {
            assert_eq!(retried, remembered, "answered, not applied again");
            assert_eq!(machine.dedup().len(), entries + 1);
            assert_eq!(machine.task_count(), 1);
            // Past the keep time, the count limit holds again.
            machine.apply(&with_id(T0 + keep + 1, "later"));
            assert_eq!(machine.dedup().len(), constants::DEDUP_ENTRIES_MAX);
        } else {
            assert_eq!(tasks_of(&retried).len(), 1, "forgotten: applied again");
            assert_eq!(machine.task_count(), 2);
        }
    }
}

/// Form 4 and later change the machine's rules, so they are recorded only with
/// `RaiseRulesForm`, which older builds cannot read; the older entry stops below them.
#[test]
fn only_the_rules_entry_records_a_rules_form() {
    let mut machine = TaskMachine::new();
    let raise = |stamp_ms: Millis, request: Request| Command {
        stamp: at(stamp_ms),
        request_id: None,
        request,
    };
    machine.apply(&raise(T0, Request::RaiseLogForm(constants::RULES_FORM + 1)));
    assert_eq!(machine.log_form(), constants::RULES_FORM - 1);
    machine.apply(&raise(
        T0 + 1,
        Request::RaiseRulesForm(constants::RULES_FORM),
    ));
    assert_eq!(machine.log_form(), constants::RULES_FORM);
    machine.apply(&raise(T0 + 2, Request::RaiseLogForm(2)));
    assert_eq!(machine.log_form(), constants::RULES_FORM, "never lowered");
}
