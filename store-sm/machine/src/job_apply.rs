//! How the machine carries out the job layer: keyed adds, claims that count attempts,
//! finish and fail, lapsed leases, dead letters, dependencies, cancel, retry and group
//! settings. Everything here runs inside `apply`, at the command's log time.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use crate::Change;
use crate::LogTime;
use crate::TaskMachine;
use crate::constants::DEPENDANTS_LIMIT_FORM;
use crate::constants::FINISH_COUNT_MAX;
use crate::constants::JOB_AFTER_KEYS_MAX;
use crate::constants::JOB_ATTEMPT_HISTORY_MAX;
use crate::constants::JOB_DEPENDANTS_MAX;
use crate::constants::JOB_ERROR_BYTES_MAX;
use crate::constants::JOB_INTERVAL_MS_MAX;
use crate::constants::JOB_RESULT_BYTES_MAX;
use crate::constants::REQUEST_ITEMS_MAX;
use crate::constants::RETAKEN_LEASE_FORM;
use crate::jobs::*;
use crate::types::*;

/// How many of a request's adds wait for each `(group, key)`.
type WaitingFor<'a> = std::collections::BTreeMap<(&'a str, JobKey), usize>;

/// Which versions of a job its owner may finish or fail. The rule comes with the
/// request's log variant, never from the build, so an entry applies alike on every
/// build and on a replay (SPEC section 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutcomeRule {
    /// Only a claimed version, or the version a lapsed holder took back
    /// ([`Request::Finish`], [`Request::FinishMany`], [`Request::Fail`]).
    Claimed,
    /// Any version the client owns: the rule of builds before the claimed-version rule,
    /// kept for the entries they wrote ([`Request::LegacyFinish`] and its kin).
    Owned,
}

/// What an add of an update will do, decided while checking the update.
pub(crate) enum AddPlan {
    /// A task without a key.
    Plain,
    /// The key is live and `on_conflict` keeps it: answer the live task.
    Kept {
        /// The live task.
        id: TaskId,
        /// Run it once more after it succeeds, if it is running.
        resubmit: bool,
    },
    /// A new job (or a new run of a finished or dead one).
    New {
        /// Its key.
        key: JobKey,
        /// Prerequisites that have not succeeded yet.
        after: Vec<JobKey>,
    },
}

/// Refuses a key that is empty or longer than [`JOB_KEY_BYTES_MAX`].
fn check_key(field: impl FnOnce() -> String, key: &str) -> Result<(), Refusal> {
    check_key_length(key).map_err(|reason| Refusal::InvalidField {
        field: field(),
        reason,
    })
}

fn invalid(field: &str, reason: String) -> Refusal {
    Refusal::InvalidField {
        field: field.to_string(),
        reason,
    }
}

/// The first line of `text`, at most 200 bytes, for a reason that names an error.
fn headline(text: &str) -> &str {
    let line = text.lines().next().unwrap_or("");
    let mut end = line.len().min(200);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

impl TaskMachine {
    /// Lets log time pass to `now`: leases that ended by then lapse (a lost attempt),
    /// finished job records past their retention go, old dedup entries go. Amortised
    /// O(log n) per lease, record and entry, each handled once.
    pub(crate) fn pass_time(&mut self, now: LogTime) {
        while let Some(&(end, id)) = self.leases.get_min() {
            if end > now {
                break;
            }
            self.lapse(end, id);
        }
        while let Some((at, group, key)) = self.expiries.get_min().cloned() {
            if at > now {
                break;
            }
            self.expiries
                .remove(&(at, Arc::clone(&group), Arc::clone(&key)));
            self.drop_record(&group, &key);
        }
        let retention = self.dedup_retention();
        self.dedup.evict(now, retention);
    }

    /// The machine as the next command at `now` would find it: a copy (O(1)) in which
    /// log time has passed to `now`, so leases that ended by then have lapsed and
    /// expired records are gone. Reads of job state use it, so that a lapsed lease shows
    /// as lost before any command arrives; the replicated state is not touched.
    pub fn as_of(&self, now: LogTime) -> TaskMachine {
        let mut view = self.clone();
        let now = view.advance_time(now);
        view.pass_time(now);
        view
    }

    /// A lease ended at `end` without a finish or fail: the attempt is lost, and the job
    /// is dead if that was its last attempt; otherwise the task is claimable again.
    fn lapse(&mut self, end: LogTime, id: TaskId) {
        self.leases.remove(&(end, id));
        let Some(task) = self.tasks.get_mut(&id) else {
            debug_assert!(false, "lease of task {id} that does not exist");
            return;
        };
        task.job.leased = false;
        let group = Arc::clone(&task.group);
        let key = task.job.key.clone();
        if let Some(index) = self.groups.get_mut(&*group) {
            index.running -= 1;
        }
        let Some(key) = key else { return };
        let limit = self.attempt_limit(&group, &key);
        let lost = self.with_record(&group, &key, |record| {
            if let Some(attempt) = record.open_attempt_mut() {
                attempt.ended_at = Some(end);
                attempt.end = Some(AttemptEnd::Lost);
            }
            let out_of_attempts = limit > 0 && record.attempts_counted() >= limit;
            if !out_of_attempts {
                record.state = JobState::Waiting;
            }
            out_of_attempts.then_some(record.attempts)
        });
        if let Some(Some(attempt)) = lost
            && let Some(task) = self.remove_task(id)
        {
            // It died when the lease ended, not when log time next passed that point:
            // a read of an idle cluster and the command that later applies the lapse
            // must both say `end`.
            let reason = format!("attempt {attempt} was lost: its lease lapsed at {end}");
            self.job_dead(&group, &key, task.data, reason, end);
        }
    }

    /// The attempt limit of a job: its own, else its group's (0: unlimited).
    fn attempt_limit(&self, group: &str, key: &str) -> u32 {
        self.job(group, key)
            .and_then(|record| record.max_attempts)
            .unwrap_or_else(|| self.group_settings(group).max_attempts)
    }

    /// Why a write naming a task that does not exist is refused: cancelled, or missing.
    pub(crate) fn missing(&self, list: ListName, id: TaskId) -> Refusal {
        match self.cancelled.get(&id) {
            Some((_, key)) => Refusal::Cancelled {
                list,
                id,
                key: Arc::clone(key),
            },
            None => Refusal::Missing { list, id },
        }
    }

    /// Whether `task`'s job still waits for prerequisites.
    pub(crate) fn is_blocked(&self, task: &Task) -> bool {
        task.job
            .key
            .as_ref()
            .and_then(|key| self.job(&task.group, key))
            .is_some_and(|record| !record.after.is_empty())
    }

    /// Whether claims of `group` answer empty now: paused, or at `max_running`.
    pub(crate) fn claims_held_back(&self, group: &str) -> bool {
        let settings = self.group_settings(group);
        let running = self.groups.get(group).map_or(0, |index| index.running);
        settings.paused || (settings.max_running > 0 && running >= settings.max_running as usize)
    }

    /// How many claims of `group` at `now` would each get a task, counting at most
    /// `limit`: none while the group is paused, at most `max_running` less the running
    /// leases. Ask a machine [`TaskMachine::as_of`] `now`, so that lapsed leases count
    /// as ended. Blocking claims wake about this many waiters.
    pub fn claimable_count(&self, group: &str, now: LogTime, limit: usize) -> usize {
        let Some(index) = self.groups.get(group) else {
            return 0;
        };
        let settings = self.group_settings(group);
        if settings.paused || limit == 0 {
            return 0;
        }
        let limit = match settings.max_running {
            0 => limit,
            max => limit.min((max as usize).saturating_sub(index.running)),
        };
        if limit == 0 {
            return 0;
        }
        index.available_count(now, limit)
    }

    /// Whether a claim on `group` that may not take the tasks in `excluded` (the ones it
    /// depends on) would find one at `now`, the group's pause and `max_running` aside
    /// (see [`TaskMachine::claimable_count`]). Blocking claims with dependencies ask it.
    pub fn claimable_excluding(&self, group: &str, now: LogTime, excluded: &[TaskId]) -> bool {
        self.first_available(group, now, excluded).is_some()
    }

    /// The earliest time at which time passing alone changes this state: a lease ends
    /// or a finished record's retention does (see [`crate::Request::PassTime`]).
    pub fn next_due(&self) -> Option<LogTime> {
        let lease = self.leases.get_min().map(|&(end, _)| end);
        let expiry = self.expiries.get_min().map(|(at, _, _)| *at);
        lease.into_iter().chain(expiry).min()
    }

    /// When, after `now`, a task of `group` next becomes claimable by time alone (a
    /// lease ending, an available time or a back-off passing); `None` if nothing will
    /// without another command.
    pub fn next_claimable_after(&self, group: &str, now: LogTime) -> Option<LogTime> {
        self.groups.get(group)?.next_available_after(now)
    }

    /// Checks the job fields of an update's adds and decides what each add does.
    pub(crate) fn plan_adds(&self, adds: &[AddTask], refusals: &mut Vec<Refusal>) -> Vec<AddPlan> {
        let mut added: BTreeSet<(&str, &str)> = BTreeSet::new();
        let mut waiting_for = WaitingFor::default();
        let mut plans = Vec::with_capacity(adds.len());
        for (index, add) in adds.iter().enumerate() {
            let job = &add.job;
            let Some(key) = &job.key else {
                if job.needs_key() {
                    refusals.push(invalid(
                        &format!("adds[{index}]"),
                        "after, max_attempts, every_ms and on_conflict need a key; give the task a key"
                            .to_string(),
                    ));
                }
                plans.push(AddPlan::Plain);
                continue;
            };
            let before = refusals.len();
            refusals.extend(check_key(|| format!("adds[{index}].key"), key).err());
            if let Some(every) = job.every_ms
                && !(1..=JOB_INTERVAL_MS_MAX).contains(&every)
            {
                refusals.push(invalid(
                    &format!("adds[{index}].every_ms"),
                    format!("{every} is not between 1 and {JOB_INTERVAL_MS_MAX}"),
                ));
            }
            if job.after.len() > JOB_AFTER_KEYS_MAX {
                refusals.push(invalid(
                    &format!("adds[{index}].after"),
                    format!(
                        "names {} keys; the limit is {JOB_AFTER_KEYS_MAX}",
                        job.after.len()
                    ),
                ));
            }
            if refusals.len() > before {
                plans.push(AddPlan::Plain);
                continue;
            }
            let key_arc: JobKey = Arc::from(key.as_str());
            if !added.insert((add.group.as_str(), key.as_str())) {
                refusals.push(Refusal::KeyTwice {
                    index,
                    key: key_arc,
                });
                plans.push(AddPlan::Plain);
                continue;
            }
            if let Some(id) = self.live_task_of(&add.group, key) {
                plans.push(match job.on_conflict {
                    OnConflict::Keep => AddPlan::Kept {
                        id,
                        resubmit: false,
                    },
                    OnConflict::Resubmit => AddPlan::Kept { id, resubmit: true },
                    OnConflict::Refuse => {
                        refusals.push(Refusal::KeyLive {
                            index,
                            key: key_arc,
                            id,
                        });
                        AddPlan::Plain
                    }
                });
                continue;
            }
            let after = self.pending_prerequisites(index, add, &added, refusals);
            if self.log_form() >= DEPENDANTS_LIMIT_FORM {
                self.count_dependants(index, add, &after, &mut waiting_for, refusals);
            }
            plans.push(AddPlan::New {
                key: key_arc,
                after,
            });
        }
        plans
    }

    /// The prerequisites of an add that have not succeeded, refusing unknown ones, ones
    /// that ended without success and the add's own key.
    fn pending_prerequisites(
        &self,
        index: usize,
        add: &AddTask,
        added: &BTreeSet<(&str, &str)>,
        refusals: &mut Vec<Refusal>,
    ) -> Vec<JobKey> {
        let mut pending: Vec<JobKey> = Vec::new();
        for (n, prerequisite) in add.job.after.iter().enumerate() {
            if add.job.key.as_deref() == Some(prerequisite.as_str()) {
                refusals.push(invalid(
                    &format!("adds[{index}].after[{n}]"),
                    "names the task's own key; a task cannot wait for itself".to_string(),
                ));
                continue;
            }
            if let Err(refusal) = check_key(|| format!("adds[{index}].after[{n}]"), prerequisite) {
                refusals.push(refusal);
                continue;
            }
            if pending.iter().any(|key| **key == **prerequisite) {
                continue;
            }
            let key: JobKey = Arc::from(prerequisite.as_str());
            if added.contains(&(add.group.as_str(), prerequisite.as_str())) {
                pending.push(key);
                continue;
            }
            match self
                .job(&add.group, prerequisite)
                .map(|record| record.state)
            {
                Some(state) if state.is_live() => pending.push(key),
                Some(JobState::Succeeded) => {}
                Some(state) => refusals.push(Refusal::AfterEnded { index, key, state }),
                None => refusals.push(Refusal::AfterUnknown { index, key }),
            }
        }
        pending
    }

    /// Counts the add at `index` as a dependant of each job in `after` (with the
    /// request's earlier adds in `waiting_for`), refusing it where that passes
    /// [`JOB_DEPENDANTS_MAX`].
    fn count_dependants<'a>(
        &self,
        index: usize,
        add: &'a AddTask,
        after: &[JobKey],
        waiting_for: &mut WaitingFor<'a>,
        refusals: &mut Vec<Refusal>,
    ) {
        for prerequisite in after {
            let place = (add.group.as_str(), Arc::clone(prerequisite));
            let earlier = waiting_for.get(&place).copied().unwrap_or(0);
            let recorded = self
                .job(&add.group, prerequisite)
                .map_or(0, |record| record.dependants.len());
            if recorded + earlier >= JOB_DEPENDANTS_MAX {
                refusals.push(invalid(
                    &format!("adds[{index}].after"),
                    format!(
                        "job {prerequisite:?} already has {JOB_DEPENDANTS_MAX} jobs waiting for it, the most; make the others wait for jobs that wait for it"
                    ),
                ));
            }
            waiting_for.insert(place, earlier + 1);
        }
    }

    /// The live task of job `key` in `group`, if the job is live.
    fn live_task_of(&self, group: &str, key: &str) -> Option<TaskId> {
        self.job(group, key)
            .filter(|record| record.state.is_live())
            .and_then(|record| record.task)
    }

    /// Carries out one checked add.
    pub(crate) fn carry_out_add(
        &mut self,
        add: &AddTask,
        plan: AddPlan,
        available_at: LogTime,
        client: ClientId,
        now: LogTime,
    ) -> Option<Task> {
        let group = self.intern_group(&add.group);
        match plan {
            AddPlan::Plain => {
                let job = TaskJob {
                    priority: add.job.priority,
                    ..TaskJob::default()
                };
                Some(self.insert_new(group, add.data.clone(), available_at, client, job))
            }
            AddPlan::Kept { id, resubmit } => {
                if resubmit && let Some(key) = &add.job.key {
                    self.with_record(&group, key, |record| {
                        if record.state == JobState::Running {
                            record.resubmit = Some(add.data.clone());
                        }
                    });
                }
                self.tasks.get(&id).cloned()
            }
            AddPlan::New { key, after } => {
                self.start_run(&group, &key, add, after, now);
                let job = TaskJob {
                    key: Some(Arc::clone(&key)),
                    priority: add.job.priority,
                    attempt: 0,
                    leased: false,
                };
                let task = self.insert_new(group, add.data.clone(), available_at, client, job);
                self.note_new_version(&task);
                self.name_run(&task.group, &key, task.id);
                Some(task)
            }
        }
    }

    /// Gives a job the id of the task its new run began with, in place of its last
    /// run's.
    fn name_run(&mut self, group: &GroupName, key: &JobKey, id: TaskId) {
        if let Some(Some(old)) = self.with_record(group, key, |record| record.id.replace(id)) {
            self.job_ids.remove(&old);
        }
        self.job_ids
            .insert(id, (Arc::clone(group), Arc::clone(key)));
    }

    /// Creates the record of a new job, or starts a new run of a finished or dead one,
    /// and registers it with its prerequisites.
    fn start_run(
        &mut self,
        group: &GroupName,
        key: &JobKey,
        add: &AddTask,
        after: Vec<JobKey>,
        now: LogTime,
    ) {
        let previous = self.job(group, key).cloned();
        if let Some(previous) = &previous {
            self.forget_finish(previous);
        }
        // Kept until the run's task has its id, which then replaces it in the index.
        let previous_id = previous.as_ref().and_then(|p| p.id);
        let record = JobRecord {
            group: Arc::clone(group),
            key: Arc::clone(key),
            state: JobState::Waiting,
            task: None,
            data: None,
            priority: add.job.priority,
            max_attempts: add.job.max_attempts,
            every_ms: add.job.every_ms,
            run: previous.as_ref().map_or(1, |p| p.run.saturating_add(1)),
            attempts: 0,
            attempts_forgiven: 0,
            history: previous.map(|p| p.history).unwrap_or_default(),
            result: None,
            reason: None,
            created_at: now,
            finished_at: None,
            expires_at: None,
            after: after.clone(),
            dependants: Vec::new(),
            resubmit: None,
            cancelled_task: None,
            id: previous_id,
        };
        self.put_record(record);
        for prerequisite in &after {
            self.with_record(group, prerequisite, |record| {
                record.dependants.push(Arc::clone(key));
            });
        }
    }

    /// Removes what a finished record left behind: its expiry and its cancelled task.
    fn forget_finish(&mut self, record: &JobRecord) {
        if let Some(at) = record.expires_at {
            self.expiries
                .remove(&(at, Arc::clone(&record.group), Arc::clone(&record.key)));
        }
        if let Some(id) = record.cancelled_task {
            self.cancelled.remove(&id);
        }
    }

    /// Points a job's record at its newest task version.
    pub(crate) fn note_new_version(&mut self, task: &Task) {
        if let Some(key) = &task.job.key {
            let id = task.id;
            self.with_record(&task.group, key, |record| record.task = Some(id));
        }
    }

    /// The job fields of a seed update's new version of `old` by `client`: a lease
    /// renewed by its owner stays a lease; one given back ends its attempt as released;
    /// from [`RETAKEN_LEASE_FORM`] on, a late renewal by the holder whose lease lapsed
    /// (nobody claimed the job since) takes the lease back, attempt and all.
    pub(crate) fn rewritten_job(
        &mut self,
        old: &Task,
        client: ClientId,
        available_at: LogTime,
        now: LogTime,
    ) -> TaskJob {
        let mut job = old.job.clone();
        job.leased = old.job.leased && available_at > now;
        let retaken = self.retakes_lease(old, client, available_at, now);
        let Some(key) = &old.job.key else {
            return job;
        };
        if old.job.leased && !job.leased {
            self.with_record(&old.group, key, |record| {
                if let Some(attempt) = record.open_attempt_mut() {
                    attempt.ended_at = Some(now);
                    attempt.end = Some(AttemptEnd::Released);
                }
                record.state = JobState::Waiting;
            });
        } else if retaken {
            job.leased = true;
            self.with_record(&old.group, key, |record| {
                if let Some(attempt) = record.history.last_mut() {
                    attempt.ended_at = None;
                    attempt.end = None;
                }
                record.state = JobState::Running;
            });
        }
        job
    }

    /// Whether `client`'s update of `old` to `available_at` takes a lapsed lease back
    /// (from [`RETAKEN_LEASE_FORM`] on): its holder renews it into the future while
    /// nobody claimed it since.
    fn retakes_lease(
        &self,
        old: &Task,
        client: ClientId,
        available_at: LogTime,
        now: LogTime,
    ) -> bool {
        !old.job.leased
            && available_at > now
            && self.log_form() >= RETAKEN_LEASE_FORM
            && old.owner == client
            && self.lapsed_holder(old, client)
    }

    /// Refuses an update that would take a lapsed lease back in a group that already
    /// runs its `max_running` tasks, counting the update's `earlier` retakes (task and
    /// group): a retake is a lease like a claim's, and the limit may stand for "one at a
    /// time". A task named twice is refused as such, not counted twice.
    pub(crate) fn retake_refusal(
        &self,
        id: TaskId,
        client: ClientId,
        available_at: LogTime,
        now: LogTime,
        earlier: &mut Vec<(TaskId, GroupName)>,
    ) -> Option<Refusal> {
        let old = self.tasks.get(&id)?;
        if !self.retakes_lease(old, client, available_at, now)
            || earlier.iter().any(|(named, _)| *named == id)
        {
            return None;
        }
        let max_running = self.group_settings(&old.group).max_running;
        let running = self.running_in_group(&old.group)
            + earlier
                .iter()
                .filter(|(_, group)| *group == old.group)
                .count();
        if max_running > 0 && running >= max_running as usize {
            return Some(Refusal::RetakeOverLimit {
                id,
                ended_at: old.available_at,
                max_running,
            });
        }
        earlier.push((id, Arc::clone(&old.group)));
        None
    }

    /// A seed delete removed `old`: for a job, the client that claimed it last finished
    /// it (a seed worker deletes what it has done, even after its lease lapsed, as long
    /// as nobody claimed it since), and anyone else cancelled it.
    pub(crate) fn job_deleted(&mut self, old: Task, client: ClientId, now: LogTime) {
        let Some(key) = old.job.key.clone() else {
            return;
        };
        let late_finish = old.owner == client && self.lapsed_holder(&old, client);
        if old.job.leased || late_finish {
            self.job_succeeded(old, None, now);
        } else {
            let group = Arc::clone(&old.group);
            let reason = format!("deleted by client {client}");
            self.cancel_cascade(&group, key, reason, Some(old), now);
        }
    }

    /// The job fields of a claim's new version of `old`, counting the attempt.
    pub(crate) fn claimed_job(&mut self, old: &Task, client: ClientId, now: LogTime) -> TaskJob {
        let mut job = old.job.clone();
        job.leased = true;
        if let Some(key) = &old.job.key {
            self.with_record(&old.group, key, |record| {
                record.attempts = record.attempts.saturating_add(1);
                record.state = JobState::Running;
                record.history.push(Attempt {
                    run: record.run,
                    number: record.attempts,
                    owner: client,
                    started_at: now,
                    ended_at: None,
                    end: None,
                });
                let excess = record.history.len().saturating_sub(JOB_ATTEMPT_HISTORY_MAX);
                record.history.drain(..excess);
                job.attempt = record.attempts;
            });
        }
        job
    }

    /// Refuses a finish or fail of a task that `client` does not hold at `now`, and, under
    /// [`OutcomeRule::Claimed`], of a job's version that it owns without a claim (a job's
    /// outcome is an attempt's).
    fn check_held(
        &self,
        list: ListName,
        id: TaskId,
        client: ClientId,
        rule: OutcomeRule,
        now: LogTime,
    ) -> Result<(), Refusal> {
        match self.tasks.get(&id) {
            None => Err(self.missing(list, id)),
            Some(task) if task.owner != client || !task.is_owned_at(now) => Err(Refusal::NotHeld {
                list,
                id,
                owner: task.owner,
                available_at: task.available_at,
            }),
            Some(task) => match (&task.job.key, rule) {
                (Some(key), OutcomeRule::Claimed)
                    if !task.job.leased && !self.lapsed_holder(task, client) =>
                {
                    Err(Refusal::NotClaimed {
                        list,
                        id,
                        key: key.clone(),
                    })
                }
                _ => Ok(()),
            },
        }
    }

    /// Whether `client` held the last claim of `task`'s job, whose lease lapsed, and
    /// nobody claimed it since: its late renewal took the task back (docs/fencing.md), so
    /// it may still record the outcome, as its seed delete may (see `job_deleted`).
    ///
    /// From [`RETAKEN_LEASE_FORM`] on, `task` must also be the very version whose lease
    /// lapsed (same run, attempt and end, no `/retry` since): before, the task of a new
    /// run or a retry counted as well when the client's attempt was the last one lost.
    fn lapsed_holder(&self, task: &Task, client: ClientId) -> bool {
        let Some(key) = &task.job.key else {
            return false;
        };
        let strict = self.log_form() >= RETAKEN_LEASE_FORM;
        self.job(&task.group, key).is_some_and(|record| {
            record.history.last().is_some_and(|attempt| {
                attempt.owner == client
                    && attempt.end == Some(AttemptEnd::Lost)
                    && (!strict
                        || (attempt.run == record.run
                            && record.task == Some(task.id)
                            && task.job.attempt == attempt.number
                            && attempt.ended_at == Some(task.available_at)
                            && record.attempts_forgiven < record.attempts))
            })
        })
    }

    pub(crate) fn apply_finish(
        &mut self,
        finish: &FinishRequest,
        rule: OutcomeRule,
        now: LogTime,
    ) -> Outcome {
        let refusals = self.finish_refusals(finish.client, finish.id, &finish.result, rule, now);
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        self.finish_task(finish.id, finish.result.clone(), now);
        Outcome::Tasks(Vec::new())
    }

    /// Finishes every task of `many`, or none: the refusal lists each task that cannot be
    /// finished (not held, gone, cancelled, a result too large, named twice).
    pub(crate) fn apply_finish_many(
        &mut self,
        many: &FinishManyRequest,
        rule: OutcomeRule,
        now: LogTime,
    ) -> Outcome {
        let count = many.finishes.len();
        if !(1..=FINISH_COUNT_MAX).contains(&count) {
            return Outcome::Refused(vec![invalid(
                "finishes",
                format!("names {count} tasks; name from 1 to {FINISH_COUNT_MAX}"),
            )]);
        }
        let mut named = BTreeSet::new();
        let mut refusals = Vec::new();
        for item in &many.finishes {
            if !named.insert(item.id) {
                refusals.push(invalid(
                    "finishes",
                    format!("names task {} twice; name each task once", item.id),
                ));
                continue;
            }
            refusals.extend(self.finish_refusals(many.client, item.id, &item.result, rule, now));
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        for item in &many.finishes {
            self.finish_task(item.id, item.result.clone(), now);
        }
        Outcome::Tasks(Vec::new())
    }

    /// Why `client` cannot finish task `id` with `result` at `now`; empty if it can.
    fn finish_refusals(
        &self,
        client: ClientId,
        id: TaskId,
        result: &Option<String>,
        rule: OutcomeRule,
        now: LogTime,
    ) -> Vec<Refusal> {
        let mut refusals = Vec::new();
        if let Some(result) = result
            && result.len() > JOB_RESULT_BYTES_MAX
        {
            refusals.push(invalid(
                "result",
                format!(
                    "of task {id} is {} bytes; the limit is {JOB_RESULT_BYTES_MAX}: store large results elsewhere and record a reference",
                    result.len()
                ),
            ));
        }
        refusals.extend(
            self.check_held(ListName::Finish, id, client, rule, now)
                .err(),
        );
        refusals
    }

    /// Removes held task `id`; a job's record turns succeeded with `result`.
    fn finish_task(&mut self, id: TaskId, result: Option<String>, now: LogTime) {
        if let Some(task) = self.remove_task(id)
            && task.job.key.is_some()
        {
            self.job_succeeded(task, result, now);
        }
    }

    /// Finishes `both.finish` and then claims as `both.next` says, in one command: refused
    /// with every reason of either, changing nothing, unless both may go ahead.
    pub(crate) fn apply_finish_and_claim(
        &mut self,
        both: &FinishAndClaimRequest,
        now: LogTime,
    ) -> (Outcome, crate::Effect) {
        let (finish, next) = (&both.finish, &both.next);
        let mut refusals = Vec::new();
        if next.claim.client != finish.client {
            refusals.push(invalid(
                "next",
                "claims for another client than the finish's; one client does both".into(),
            ));
        }
        if !next.claim.depends.is_empty() {
            // A claim depending on the finished task would find it gone.
            refusals.push(invalid(
                "next",
                "names depends; claim with depends on its own (POST /claim)".into(),
            ));
        }
        refusals.extend(self.finish_refusals(
            finish.client,
            finish.id,
            &finish.result,
            OutcomeRule::Claimed,
            now,
        ));
        refusals.extend(self.claim_refusals(&next.claim, next.count, now));
        if !refusals.is_empty() {
            return (Outcome::Refused(refusals), crate::Effect::Unchanged);
        }
        self.finish_task(finish.id, finish.result.clone(), now);
        let (claimed, _) = self.apply_claim(&next.claim, next.count, now);
        debug_assert!(
            !matches!(claimed, Outcome::Refused(_)),
            "a claim checked before the finish was refused after it"
        );
        // The finish changed the state whether or not the claim found a task.
        (claimed, crate::Effect::Job)
    }

    pub(crate) fn apply_fail(
        &mut self,
        fail: &FailRequest,
        rule: OutcomeRule,
        now: LogTime,
    ) -> Outcome {
        let mut refusals = Vec::new();
        if fail.error.len() > JOB_ERROR_BYTES_MAX {
            refusals.push(invalid(
                "error",
                format!(
                    "is {} bytes; the limit is {JOB_ERROR_BYTES_MAX}",
                    fail.error.len()
                ),
            ));
        }
        if let Some(delay) = fail.retry_in_ms
            && !(0..=JOB_INTERVAL_MS_MAX).contains(&delay)
        {
            refusals.push(invalid(
                "retry_in_ms",
                format!("{delay} is not between 0 and {JOB_INTERVAL_MS_MAX}"),
            ));
        }
        refusals.extend(
            self.check_held(ListName::Fail, fail.id, fail.client, rule, now)
                .err(),
        );
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let Some(task) = self.remove_task(fail.id) else {
            return Outcome::Tasks(Vec::new());
        };
        let group = Arc::clone(&task.group);
        let backoff = self.group_settings(&group).backoff;
        let seed = task.id ^ now.as_millis() as u64;
        let Some(key) = task.job.key.clone() else {
            let delay = fail
                .retry_in_ms
                .unwrap_or_else(|| backoff.jittered_ms(1, seed));
            let at = now.checked_add(delay).unwrap_or(LogTime::MAX);
            let job = TaskJob {
                priority: task.job.priority,
                ..TaskJob::default()
            };
            return Outcome::Tasks(vec![self.insert_new(
                group,
                task.data,
                at,
                fail.client,
                job,
            )]);
        };
        let limit = self.attempt_limit(&group, &key);
        let counted = self.with_record(&group, &key, |record| {
            if let Some(attempt) = record.open_attempt_mut() {
                attempt.ended_at = Some(now);
                attempt.end = Some(AttemptEnd::Failed(fail.error.clone()));
            }
            record.attempts_counted()
        });
        let counted = counted.unwrap_or(0);
        if limit > 0 && counted >= limit {
            let reason = format!(
                "attempt {} failed: {}",
                task.job.attempt,
                headline(&fail.error)
            );
            self.job_dead(&group, &key, task.data, reason, now);
            return Outcome::Tasks(Vec::new());
        }
        let delay = fail
            .retry_in_ms
            .unwrap_or_else(|| backoff.jittered_ms(counted.max(1), seed));
        let at = now.checked_add(delay).unwrap_or(LogTime::MAX);
        let job = TaskJob {
            leased: false,
            ..task.job.clone()
        };
        let retry = self.insert_new(group, task.data, at, fail.client, job);
        let id = retry.id;
        self.with_record(&retry.group, &key, |record| {
            record.state = JobState::Failed;
            record.task = Some(id);
        });
        Outcome::Tasks(vec![retry])
    }

    /// A job's live task (already removed) ended with success: record it, release its
    /// dependants, and enqueue it again if it recurs or was resubmitted.
    fn job_succeeded(&mut self, task: Task, result: Option<String>, now: LogTime) {
        let Some(key) = task.job.key.clone() else {
            return;
        };
        let group = Arc::clone(&task.group);
        let outcome = self.with_record(&group, &key, |record| {
            if let Some(attempt) = record.open_attempt_mut() {
                attempt.ended_at = Some(now);
                attempt.end = Some(AttemptEnd::Succeeded);
            }
            record.state = JobState::Succeeded;
            record.task = None;
            record.result = result;
            record.reason = None;
            record.finished_at = Some(now);
            let dependants = std::mem::take(&mut record.dependants);
            let again = match (record.resubmit.take(), record.every_ms) {
                (Some(data), _) => Some((data, now)),
                (None, Some(every)) => Some((
                    task.data.clone(),
                    now.checked_add(every).unwrap_or(LogTime::MAX),
                )),
                (None, None) => None,
            };
            (dependants, again)
        });
        let Some((dependants, again)) = outcome else {
            return;
        };
        for dependant in dependants {
            self.prerequisite_succeeded(&group, &dependant, &key);
        }
        match again {
            Some((data, at)) => self.enqueue_again(&group, &key, data, at, task.owner, now),
            None => self.set_expiry(&group, &key, now),
        }
    }

    /// Job `dependant` no longer waits for `prerequisite`; claimable once it waits for none.
    fn prerequisite_succeeded(
        &mut self,
        group: &GroupName,
        dependant: &JobKey,
        prerequisite: &str,
    ) {
        let released = self.with_record(group, dependant, |record| {
            record.after.retain(|key| &**key != prerequisite);
            record.after.is_empty().then_some(record.task).flatten()
        });
        if let Some(Some(id)) = released
            && let Some(task) = self.tasks.get(&id)
        {
            let position = (task.available_at, id);
            let priority = task.job.priority;
            if let Some(index) = self.groups.get_mut(group) {
                index.unblock(&position, priority);
            }
        }
    }

    /// A new run of a job that just succeeded (recurring, or resubmitted while it ran).
    fn enqueue_again(
        &mut self,
        group: &GroupName,
        key: &JobKey,
        data: String,
        at: LogTime,
        owner: ClientId,
        now: LogTime,
    ) {
        let priority = self.with_record(group, key, |record| {
            record.run = record.run.saturating_add(1);
            record.attempts = 0;
            record.attempts_forgiven = 0;
            record.state = JobState::Waiting;
            record.created_at = now;
            record.priority
        });
        let job = TaskJob {
            key: Some(Arc::clone(key)),
            priority: priority.unwrap_or(0),
            attempt: 0,
            leased: false,
        };
        let task = self.insert_new(Arc::clone(group), data, at, owner, job);
        self.note_new_version(&task);
        self.name_run(group, key, task.id);
    }

    /// Starts the retention clock of a record that just finished.
    fn set_expiry(&mut self, group: &GroupName, key: &JobKey, now: LogTime) {
        let retention = self.group_settings(group).retention_ms;
        let at = now.checked_add(retention).unwrap_or(LogTime::MAX);
        self.with_record(group, key, |record| record.expires_at = Some(at));
        self.expiries
            .insert((at, Arc::clone(group), Arc::clone(key)));
    }

    /// A job (its task already removed) is out of attempts: keep its data as a dead
    /// letter and cancel what waits for it.
    fn job_dead(
        &mut self,
        group: &GroupName,
        key: &JobKey,
        data: String,
        reason: String,
        now: LogTime,
    ) {
        let dependants = self.with_record(group, key, |record| {
            record.state = JobState::Dead;
            record.task = None;
            record.data = Some(data);
            record.reason = Some(reason);
            record.finished_at = Some(now);
            std::mem::take(&mut record.dependants)
        });
        let because = format!("prerequisite {key:?} is dead");
        for dependant in dependants.unwrap_or_default() {
            self.cancel_cascade(group, dependant, because.clone(), None, now);
        }
    }

    /// Cancels job `key` and, transitively, every job waiting for it. `removed` is its
    /// live task if the caller already took it out of the store.
    fn cancel_cascade(
        &mut self,
        group: &GroupName,
        key: JobKey,
        reason: String,
        removed: Option<Task>,
        now: LogTime,
    ) {
        let mut work = vec![(key, reason, removed)];
        while let Some((key, reason, removed)) = work.pop() {
            let Some(record) = self.job(group, &key) else {
                continue;
            };
            let removed = match removed {
                Some(task) => Some(task),
                None if record.state.is_live() => record.task.and_then(|id| self.remove_task(id)),
                None if record.state == JobState::Dead => None,
                None => continue,
            };
            let dependants = self.job_cancelled(group, &key, reason, removed, now);
            let because = format!("prerequisite {key:?} was cancelled");
            work.extend(
                dependants
                    .into_iter()
                    .map(|dependant| (dependant, because.clone(), None)),
            );
        }
    }

    /// Records the cancellation of job `key` whose live task (if any) was `removed`;
    /// returns the jobs that waited for it.
    fn job_cancelled(
        &mut self,
        group: &GroupName,
        key: &JobKey,
        reason: String,
        removed: Option<Task>,
        now: LogTime,
    ) -> Vec<JobKey> {
        let removed_id = removed.as_ref().map(|task| task.id);
        let outcome = self.with_record(group, key, |record| {
            if let Some(attempt) = record.open_attempt_mut() {
                attempt.ended_at = Some(now);
                attempt.end = Some(AttemptEnd::Cancelled);
            }
            record.state = JobState::Cancelled;
            record.task = None;
            if let Some(task) = removed {
                record.data = Some(task.data);
            }
            record.reason = Some(reason);
            record.finished_at = Some(now);
            record.resubmit = None;
            record.cancelled_task = removed_id;
            (
                std::mem::take(&mut record.after),
                std::mem::take(&mut record.dependants),
            )
        });
        let Some((prerequisites, dependants)) = outcome else {
            return Vec::new();
        };
        for prerequisite in prerequisites {
            self.with_record(group, &prerequisite, |record| {
                record.dependants.retain(|dependant| dependant != key);
            });
        }
        if let Some(id) = removed_id {
            self.cancelled
                .insert(id, (Arc::clone(group), Arc::clone(key)));
        }
        self.set_expiry(group, key, now);
        dependants
    }

    /// Checks a cancel's or retry's group and keys; the keys' records, deduplicated.
    fn named_jobs(
        &self,
        group: &str,
        keys: &[String],
        refusals: &mut Vec<Refusal>,
    ) -> Vec<JobRecord> {
        if group.is_empty() {
            refusals.push(invalid("group", "is missing or empty".to_string()));
        }
        if keys.is_empty() {
            refusals.push(invalid("keys", "name at least one key".to_string()));
        }
        if keys.len() > REQUEST_ITEMS_MAX {
            refusals.push(Refusal::TooManyItems { items: keys.len() });
            return Vec::new();
        }
        let mut seen = BTreeSet::new();
        let mut records = Vec::new();
        for (n, key) in keys.iter().enumerate() {
            if let Err(refusal) = check_key(|| format!("keys[{n}]"), key) {
                refusals.push(refusal);
                continue;
            }
            if !seen.insert(key.as_str()) {
                continue;
            }
            match self.job(group, key) {
                Some(record) => records.push(record.clone()),
                None => refusals.push(Refusal::UnknownKey {
                    key: Arc::from(key.as_str()),
                }),
            }
        }
        records
    }

    pub(crate) fn apply_cancel(&mut self, cancel: &CancelRequest, now: LogTime) -> Outcome {
        let mut refusals = Vec::new();
        let records = self.named_jobs(&cancel.group, &cancel.keys, &mut refusals);
        for record in &records {
            if record.state == JobState::Succeeded {
                refusals.push(Refusal::WrongState {
                    key: Arc::clone(&record.key),
                    state: record.state,
                    needed: "a job that succeeded cannot be cancelled".to_string(),
                });
            }
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let reason = format!("cancelled by client {}", cancel.client);
        for record in records {
            self.cancel_cascade(&record.group, record.key, reason.clone(), None, now);
        }
        Outcome::Tasks(Vec::new())
    }

    pub(crate) fn apply_retry(&mut self, retry: &RetryRequest, now: LogTime) -> Outcome {
        let mut refusals = Vec::new();
        let records = self.named_jobs(&retry.group, &retry.keys, &mut refusals);
        for record in &records {
            if record.state != JobState::Dead {
                refusals.push(Refusal::WrongState {
                    key: Arc::clone(&record.key),
                    state: record.state,
                    needed: "only dead jobs can be retried".to_string(),
                });
            }
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut written = Vec::with_capacity(records.len());
        for record in records {
            let (group, key) = (record.group, record.key);
            let data = self.with_record(&group, &key, |record| {
                record.attempts_forgiven = record.attempts;
                record.state = JobState::Waiting;
                record.reason = None;
                record.finished_at = None;
                record.data.take().unwrap_or_default()
            });
            let job = TaskJob {
                key: Some(Arc::clone(&key)),
                priority: record.priority,
                attempt: record.attempts,
                leased: false,
            };
            let task = self.insert_new(group, data.unwrap_or_default(), now, retry.client, job);
            self.note_new_version(&task);
            written.push(task);
        }
        Outcome::Tasks(written)
    }

    pub(crate) fn apply_settings(&mut self, request: &SettingsRequest, _now: LogTime) -> Outcome {
        let mut refusals = Vec::new();
        if request.group.is_empty() {
            refusals.push(invalid("group", "is missing or empty".to_string()));
        }
        let change = &request.change;
        refusals.extend(
            change
                .problems()
                .into_iter()
                .map(|(field, reason)| invalid(field, reason)),
        );
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut settings = self.group_settings(&request.group);
        if let Some(max_running) = change.max_running {
            settings.max_running = max_running;
        }
        if let Some(paused) = change.paused {
            settings.paused = paused;
        }
        if let Some(max_attempts) = change.max_attempts {
            settings.max_attempts = max_attempts;
        }
        if let Some(backoff) = change.backoff {
            settings.backoff = backoff;
        }
        if let Some(retention) = change.retention_ms {
            settings.retention_ms = retention;
        }
        let group = self.intern_group(&request.group);
        if settings == GroupSettings::default() {
            self.settings.remove(&group);
        } else {
            self.settings.insert(Arc::clone(&group), settings);
        }
        self.changes.push(Change::Settings(group));
        Outcome::Settings(settings)
    }

    /// Stores a new record (or replaces one), keeping the state index.
    pub(crate) fn put_record(&mut self, record: JobRecord) {
        let jobs = self.jobs.entry(Arc::clone(&record.group)).or_default();
        if let Some(old) = jobs.records.get(&record.key) {
            jobs.by_state.remove(&(old.state, Arc::clone(&old.key)));
        }
        jobs.by_state
            .insert((record.state, Arc::clone(&record.key)));
        self.changes.push(Change::Job {
            group: Arc::clone(&record.group),
            key: Arc::clone(&record.key),
        });
        jobs.records
            .insert(Arc::clone(&record.key), Arc::new(record));
    }

    /// Changes the record of `key` in `group` through `change`, keeping the state index;
    /// `None` if there is no such record.
    pub(crate) fn with_record<R>(
        &mut self,
        group: &str,
        key: &str,
        change: impl FnOnce(&mut JobRecord) -> R,
    ) -> Option<R> {
        let jobs = self.jobs.get_mut(group)?;
        let record = Arc::make_mut(jobs.records.get_mut(key)?);
        self.changes.push(Change::Job {
            group: Arc::clone(&record.group),
            key: Arc::clone(&record.key),
        });
        let before = record.state;
        let answer = change(record);
        if record.state != before {
            jobs.by_state.remove(&(before, Arc::clone(&record.key)));
            jobs.by_state
                .insert((record.state, Arc::clone(&record.key)));
        }
        Some(answer)
    }

    /// Removes a record past its retention.
    fn drop_record(&mut self, group: &str, key: &str) {
        let Some(jobs) = self.jobs.get_mut(group) else {
            return;
        };
        let Some(record) = jobs.records.remove(key) else {
            return;
        };
        jobs.by_state
            .remove(&(record.state, Arc::clone(&record.key)));
        self.changes.push(Change::JobDropped {
            group: Arc::clone(&record.group),
            key: Arc::clone(&record.key),
        });
        let now_empty = jobs.records.is_empty();
        if let Some(id) = record.cancelled_task {
            self.cancelled.remove(&id);
        }
        if let Some(id) = record.id {
            self.job_ids.remove(&id);
        }
        if now_empty {
            self.jobs.remove(group);
        }
    }

    /// The record of job `key` in `group`.
    pub fn job(&self, group: &str, key: &str) -> Option<&JobRecord> {
        self.jobs
            .get(group)?
            .records
            .get(key)
            .map(|record| &**record)
    }

    /// The record of the job with id `id`: the first task of its current run (what its
    /// add answered), one of its live task versions, or a version a cancel removed.
    pub fn job_by_id(&self, id: TaskId) -> Option<&JobRecord> {
        let (group, key) = match self.job_ids.get(&id).or_else(|| self.cancelled.get(&id)) {
            Some((group, key)) => (&**group, &**key),
            None => {
                let task = self.tasks.get(&id)?;
                (&*task.group, task.job.key.as_deref()?)
            }
        };
        self.job(group, key)
            .filter(|record| [record.id, record.task, record.cancelled_task].contains(&Some(id)))
    }

    /// Job records of `group` in key order, only those in `state` if given, starting
    /// after key `after` (a cursor). O(log n + returned).
    pub fn jobs<'a>(
        &'a self,
        group: &str,
        state: Option<JobState>,
        after: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a JobRecord> + 'a> {
        let Some(jobs) = self.jobs.get(group) else {
            return Box::new(std::iter::empty());
        };
        let after: Option<JobKey> = after.map(Arc::from);
        match state {
            Some(state) => {
                let start = match after {
                    Some(key) => Bound::Excluded((state, key)),
                    None => Bound::Included((state, Arc::from(""))),
                };
                Box::new(
                    jobs.by_state
                        .range((start, Bound::Unbounded))
                        .take_while(move |(s, _)| *s == state)
                        .filter_map(|(_, key)| jobs.records.get(key).map(|r| &**r)),
                )
            }
            None => {
                let start = match after {
                    Some(key) => Bound::Excluded(key),
                    None => Bound::Unbounded,
                };
                Box::new(
                    jobs.records
                        .range((start, Bound::Unbounded))
                        .map(|(_, record)| &**record),
                )
            }
        }
    }

    /// Every job record, by group then key (snapshots).
    pub fn iter_jobs(&self) -> impl Iterator<Item = &JobRecord> + '_ {
        self.jobs
            .values()
            .flat_map(|jobs| jobs.records.values().map(|record| &**record))
    }

    /// Number of job records in `group` in `state`. O(returned).
    pub fn job_count(&self, group: &str, state: JobState) -> usize {
        self.jobs(group, Some(state), None).count()
    }

    /// The settings of `group` (the defaults unless changed).
    pub fn group_settings(&self, group: &str) -> GroupSettings {
        self.settings.get(group).copied().unwrap_or_default()
    }

    /// Groups whose settings differ from the defaults, by name.
    pub fn configured_groups(&self) -> impl Iterator<Item = (&GroupName, &GroupSettings)> + '_ {
        self.settings.iter()
    }

    /// Names of the groups that hold job records, sorted.
    pub fn job_groups(&self) -> Vec<GroupName> {
        self.jobs.keys().cloned().collect()
    }

    /// How many of `group`'s tasks are leases that have not lapsed.
    pub fn running_in_group(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, |index| index.running)
    }
}
