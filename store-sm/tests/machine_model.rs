//! Property tests: the task machine against a plain reference model over random command
//! sequences, with the invariants of ENGINEERING.md 3.1 checked after every step.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use store_sm::machine::*;
use store_sm::snapshot::decode_snapshot;
use store_sm::snapshot::encode_snapshot;
use store_sm::snapshot::state_hash;

/// The seed's semantics written the obvious way: a map and linear scans.
#[derive(Clone, Debug, Default)]
struct Model {
    next_id: u64,
    time_ms: i64,
    tasks: BTreeMap<u64, Task>,
    seen: BTreeMap<(i64, String), Outcome>,
}

impl Model {
    fn new() -> Self {
        Self {
            next_id: 1,
            ..Self::default()
        }
    }

    fn apply(&mut self, command: &Command) -> Outcome {
        self.time_ms = self.time_ms.max(command.stamp.as_millis());
        let now = self.time_ms;
        let client = match &command.request {
            Request::Update(u) => u.client,
            Request::Claim(c) => c.client,
        };
        let key = command.request_id.clone().map(|id| (client, id));
        if let Some(first) = key.as_ref().and_then(|key| self.seen.get(key)) {
            return first.clone();
        }
        let outcome = match &command.request {
            Request::Update(u) => self.update(u, now),
            Request::Claim(c) => self.claim(c, now),
        };
        if let Some(key) = key {
            self.seen.insert(key, outcome.clone());
        }
        outcome
    }

    fn resolve(timespec: Option<i64>, now: i64) -> i64 {
        match timespec {
            None => now,
            Some(t) if t < 0 => now - t,
            Some(t) => t,
        }
    }

    fn modifiable(&self, list: ListName, id: u64, client: i64, now: i64) -> Option<Refusal> {
        match self.tasks.get(&id) {
            None => Some(Refusal::Missing { list, id }),
            Some(t) if t.available_at.as_millis() > now && t.owner != client => {
                Some(Refusal::Owned {
                    list,
                    id,
                    owner: t.owner,
                    available_at: t.available_at,
                })
            }
            Some(_) => None,
        }
    }

    fn missing_depends(&self, depends: &[u64]) -> Vec<Refusal> {
        depends
            .iter()
            .filter(|id| !self.tasks.contains_key(id))
            .map(|&id| Refusal::Missing {
                list: ListName::Depends,
                id,
            })
            .collect()
    }

    fn new_task(&mut self, group: &str, data: &str, at_ms: i64, owner: i64) -> Task {
        let task = Task {
            id: self.next_id,
            group: Arc::from(group),
            data: data.to_string(),
            available_at: LogTime::from_millis(at_ms),
            owner,
        };
        self.next_id += 1;
        self.tasks.insert(task.id, task.clone());
        task
    }

    fn update(&mut self, u: &UpdateRequest, now: i64) -> Outcome {
        let mut refusals = vec![];
        if u.adds.is_empty() && u.updates.is_empty() && u.deletes.is_empty() {
            refusals.push(Refusal::NothingToDo);
        }
        let named = u
            .updates
            .iter()
            .map(|c| (ListName::Updates, c.id))
            .chain(u.deletes.iter().map(|&id| (ListName::Deletes, id)))
            .chain(u.depends.iter().map(|&id| (ListName::Depends, id)));
        refusals.extend(duplicate_refusals(named));
        for (index, add) in u.adds.iter().enumerate() {
            if add.group.is_empty() {
                refusals.push(Refusal::MissingGroup { index });
            }
        }
        for change in &u.updates {
            refusals.extend(self.modifiable(ListName::Updates, change.id, u.client, now));
        }
        for &id in &u.deletes {
            refusals.extend(self.modifiable(ListName::Deletes, id, u.client, now));
        }
        refusals.extend(self.missing_depends(&u.depends));
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut out = vec![];
        for add in &u.adds {
            let at = Self::resolve(add.timespec, now);
            out.push(self.new_task(&add.group, &add.data, at, u.client));
        }
        for change in &u.updates {
            let old = self.tasks.remove(&change.id).expect("checked");
            let at = Self::resolve(change.timespec, now);
            out.push(self.new_task(&old.group, &change.data, at, u.client));
        }
        for id in &u.deletes {
            self.tasks.remove(id);
        }
        Outcome::Tasks(out)
    }

    fn claim(&mut self, c: &ClaimRequest, now: i64) -> Outcome {
        let mut refusals = vec![];
        if c.group.is_empty() {
            refusals.push(Refusal::ClaimWithoutGroup);
        }
        if c.duration_ms <= 0 {
            refusals.push(Refusal::InvalidDuration {
                duration_ms: c.duration_ms,
            });
        }
        refusals.extend(duplicate_refusals(
            c.depends.iter().map(|&id| (ListName::Depends, id)),
        ));
        refusals.extend(self.missing_depends(&c.depends));
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let pick = self
            .tasks
            .values()
            .filter(|t| {
                *t.group == *c.group
                    && t.available_at.as_millis() <= now
                    && !c.depends.contains(&t.id)
            })
            .min_by_key(|t| (t.available_at, t.id))
            .cloned();
        match pick {
            None => Outcome::Tasks(vec![]),
            Some(old) => {
                self.tasks.remove(&old.id);
                let task = self.new_task(&old.group, &old.data, now + c.duration_ms, c.client);
                Outcome::Tasks(vec![task])
            }
        }
    }
}

/// One refusal per id named more than once, in order of its second mention.
fn duplicate_refusals(named: impl Iterator<Item = (ListName, u64)>) -> Vec<Refusal> {
    let mut counted = BTreeSet::new();
    let mut reported = BTreeSet::new();
    named
        .filter(|&(_, id)| !counted.insert(id) && reported.insert(id))
        .map(|(list, id)| Refusal::Duplicate { list, id })
        .collect()
}

const GROUPS: [&str; 3] = ["map", "reduce", "z"];

fn id_strategy() -> impl Strategy<Value = u64> {
    // Mostly ids that exist or existed recently; sometimes far-off ones.
    prop_oneof![8 => 1u64..40, 1 => 40u64..1000]
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

fn request_strategy() -> impl Strategy<Value = Request> {
    let client = 1i64..4;
    let add = (group_strategy(), "[a-c]{0,3}", timespec_strategy()).prop_map(
        |(group, data, timespec)| AddTask {
            group,
            data,
            timespec,
        },
    );
    let change = (id_strategy(), "[a-c]{0,3}", timespec_strategy())
        .prop_map(|(id, data, timespec)| UpdateTask { id, data, timespec });
    let update = (
        client.clone(),
        prop::collection::vec(add, 0..4),
        prop::collection::vec(change, 0..3),
        prop::collection::vec(id_strategy(), 0..3),
        prop::collection::vec(id_strategy(), 0..2),
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
        prop::collection::vec(id_strategy(), 0..2),
    )
        .prop_map(|(client, group, duration_ms, depends)| {
            Request::Claim(ClaimRequest {
                client,
                group,
                duration_ms,
                depends,
            })
        });
    prop_oneof![3 => update, 2 => claim]
}

fn commands_strategy() -> impl Strategy<Value = Vec<Command>> {
    let step = (
        prop_oneof![8 => 0i64..2_000, 1 => -3_000i64..0],
        prop_oneof![4 => Just(None), 1 => (0u8..6).prop_map(|n| Some(format!("req-{n}")))],
        request_strategy(),
    );
    prop::collection::vec(step, 1..120).prop_map(|steps| {
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
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn machine_matches_the_reference_model(commands in commands_strategy()) {
        let mut machine = TaskMachine::new();
        let mut model = Model::new();
        let mut issued = BTreeSet::new();
        for (step, command) in commands.iter().enumerate() {
            let before = machine.clone();
            let next_id_before = machine.next_id();
            let replayed = command.request_id.as_ref().is_some_and(|id| {
                model.seen.contains_key(&(command.request.client(), id.clone()))
            });
            let outcome = machine.apply(command);
            let expected = model.apply(command);
            prop_assert_eq!(&*outcome, &expected, "step {}: {:?}", step, command);

            match &*outcome {
                Outcome::Tasks(_) if replayed => {
                    prop_assert_eq!(machine.next_id(), next_id_before, "a retry applies nothing");
                }
                Outcome::Tasks(tasks) => {
                    for task in tasks {
                        prop_assert!(task.id >= next_id_before, "id {} reused or not increasing", task.id);
                        prop_assert!(issued.insert(task.id), "id {} issued twice", task.id);
                    }
                    let ids: Vec<u64> = tasks.iter().map(|t| t.id).collect();
                    prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in order: {:?}", ids);
                }
                Outcome::Refused(_) => {
                    // All or nothing: a refusal leaves every task and the id counter alone.
                    prop_assert_eq!(machine.next_id(), before.next_id());
                    prop_assert!(machine.iter_tasks().eq(before.iter_tasks()));
                }
            }
            check_state(&machine, &model)?;

            if step % 16 == 0 {
                let restored = decode_snapshot(&encode_snapshot(&machine)).expect("round trip");
                prop_assert_eq!(state_hash(&restored), state_hash(&machine));
                check_state(&restored, &model)?;
            }
        }

        // Determinism: the same log applied again gives the same state hash.
        let mut replay = TaskMachine::new();
        for command in &commands {
            replay.apply(command);
        }
        prop_assert_eq!(state_hash(&replay), state_hash(&machine));
    }
}
