//! Invariants asserted after every apply in debug and simulation builds (the `sim`
//! profile keeps debug assertions), in TigerBeetle's habit of checking state after
//! each change. Each check costs what the command touched, or O(groups); none walks
//! every task.

use imbl::OrdMap;

use super::Command;
use super::Effect;
use super::GroupIndex;
use super::GroupName;
use super::LogTime;
use super::Outcome;
use super::Request;
use super::Task;
use super::TaskId;
use super::TaskMachine;

/// The state before a command, as far as the checks need it. O(1) to take: the maps are
/// persistent, so these are shared copies.
pub(crate) struct Before {
    log_time: LogTime,
    next_id: TaskId,
    tasks: OrdMap<TaskId, Task>,
    groups: OrdMap<GroupName, GroupIndex>,
}

impl Before {
    pub(crate) fn of(machine: &TaskMachine) -> Self {
        Self {
            log_time: machine.log_time,
            next_id: machine.next_id,
            tasks: machine.tasks.clone(),
            groups: machine.groups.clone(),
        }
    }
}

impl TaskMachine {
    /// Panics, naming the broken invariant, unless the machine is consistent after
    /// `command` moved it from `before` to now with `outcome` and `effect`.
    pub(crate) fn assert_invariants(
        &self,
        before: &Before,
        command: &Command,
        outcome: &Outcome,
        effect: Effect,
    ) {
        assert!(
            self.log_time >= before.log_time,
            "log time went back from {} to {}",
            before.log_time,
            self.log_time
        );
        self.assert_indexes_count_every_task();
        match (&effect, outcome, command.request.unscoped()) {
            (Effect::Unchanged, _, _) => self.assert_unchanged(before),
            (
                Effect::Updated,
                Outcome::Tasks(written),
                Request::Update(update) | Request::LegacyUpdate(update),
            ) => {
                let removed = update.updates.iter().map(|change| change.id);
                let removed = removed.chain(update.deletes.iter().copied());
                self.assert_written(before, written);
                self.assert_removed(before, removed);
            }
            (Effect::Job, Outcome::Tasks(written), Request::FinishAndClaim(both)) => {
                assert!(
                    written.len() <= both.next.count as usize,
                    "a finish claiming up to {} tasks wrote {}",
                    both.next.count,
                    written.len()
                );
                self.assert_written(before, written);
                self.assert_removed(before, [both.finish.id]);
            }
            (Effect::Job, Outcome::Tasks(written), _) => self.assert_written(before, written),
            (Effect::Job, Outcome::Settings(_), Request::Settings(_)) => {}
            (
                Effect::Auth,
                Outcome::Token(_),
                Request::TokenAdd(_) | Request::TokenRevoke(_) | Request::AuthBootstrap(_),
            ) => self.assert_unchanged(before),
            (
                Effect::Claimed(old),
                Outcome::Tasks(written),
                Request::Claim(_) | Request::WaitingClaim(_),
            ) => {
                assert_eq!(written.len(), 1, "a claim wrote {} tasks", written.len());
                assert_eq!(old.len(), 1, "a claim removed {} tasks", old.len());
                self.assert_written(before, written);
                self.assert_removed(before, old.iter().copied());
            }
            (
                Effect::Claimed(old),
                Outcome::Tasks(written),
                Request::ClaimMany(many) | Request::WaitingClaimMany(many),
            ) => {
                assert!(
                    !written.is_empty() && written.len() <= many.count as usize,
                    "a claim of up to {} tasks wrote {}",
                    many.count,
                    written.len()
                );
                assert_eq!(
                    old.len(),
                    written.len(),
                    "a claim removed {} tasks but wrote {}",
                    old.len(),
                    written.len()
                );
                self.assert_written(before, written);
                self.assert_removed(before, old.iter().copied());
            }
            (effect, outcome, _) => {
                panic!("effect {effect:?} does not match the command or its outcome {outcome:?}")
            }
        }
    }

    /// The group indexes hold as many entries as there are tasks, and count as many
    /// running tasks as there are leases. O(groups).
    fn assert_indexes_count_every_task(&self) {
        let indexed: usize = self.groups.values().map(GroupIndex::len).sum();
        assert_eq!(
            indexed,
            self.tasks.len(),
            "the group indexes name {indexed} tasks, the task map holds {}",
            self.tasks.len()
        );
        let running: usize = self.groups.values().map(|index| index.running).sum();
        assert_eq!(
            running,
            self.leases.len(),
            "the group indexes count {running} running tasks, the lease set holds {}",
            self.leases.len()
        );
    }

    /// A command that changed nothing left the very same maps and next id. O(1).
    fn assert_unchanged(&self, before: &Before) {
        assert_eq!(
            self.next_id, before.next_id,
            "a command that changed nothing consumed ids"
        );
        assert!(
            self.tasks.ptr_eq(&before.tasks) && self.groups.ptr_eq(&before.groups),
            "a command that changed nothing changed tasks"
        );
    }

    /// Every written task got a new id below the next one (or is a live task an add with
    /// `on_conflict` kept), and sits in the task map and in its group's index at its
    /// available time; a job's record points at it.
    fn assert_written(&self, before: &Before, written: &[Task]) {
        assert!(
            self.next_id >= before.next_id,
            "next id went back from {} to {}",
            before.next_id,
            self.next_id
        );
        let (kept, written): (Vec<&Task>, Vec<&Task>) =
            written.iter().partition(|task| task.id < before.next_id);
        for task in kept {
            assert_eq!(
                before.tasks.get(&task.id),
                Some(task),
                "answered task {} is neither new nor a live task as it was",
                task.id
            );
        }
        // A success can enqueue a recurring job's next run, unanswered: at least as many
        // ids were used as tasks answered.
        let ids_used = self.next_id - before.next_id;
        assert!(
            ids_used >= written.len() as u64,
            "{} tasks written with {ids_used} new ids",
            written.len()
        );
        for task in written {
            assert!(
                (before.next_id..self.next_id).contains(&task.id),
                "task {} written outside the new ids {}..{}",
                task.id,
                before.next_id,
                self.next_id
            );
            if let Some(key) = &task.job.key {
                let record = self.job(&task.group, key);
                if !self.tasks.contains_key(&task.id) {
                    // The same update deleted a prerequisite, which cancelled the new job.
                    assert!(
                        record.is_some_and(|record| record.cancelled_task == Some(task.id)),
                        "new task {} of job {key:?} is gone but not cancelled",
                        task.id
                    );
                    continue;
                }
                assert!(
                    record.is_some_and(|record| record.task == Some(task.id)),
                    "job {key:?} does not point at its new task {}",
                    task.id
                );
            }
            assert_eq!(
                self.tasks.get(&task.id),
                Some(task),
                "written task {} is not in the task map as written",
                task.id
            );
            let indexed = self
                .groups
                .get(&*task.group)
                .is_some_and(|index| index.contains(&(task.available_at, task.id)));
            assert!(
                indexed,
                "written task {} is not in the index of group {:?} at {}",
                task.id, task.group, task.available_at
            );
        }
    }

    /// Every removed task existed before and is gone from the task map and its index.
    fn assert_removed(&self, before: &Before, removed: impl IntoIterator<Item = TaskId>) {
        for id in removed {
            let Some(old) = before.tasks.get(&id) else {
                panic!("task {id} was removed but did not exist");
            };
            assert!(
                !self.tasks.contains_key(&id),
                "removed task {id} is still in the task map"
            );
            let indexed = self
                .groups
                .get(&*old.group)
                .is_some_and(|index| index.contains(&(old.available_at, id)));
            assert!(
                !indexed,
                "removed task {id} is still in the index of group {:?}",
                old.group
            );
        }
    }
}
