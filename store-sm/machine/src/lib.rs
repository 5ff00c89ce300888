//! The task machine: the complete semantics of the seed's task store as a pure,
//! deterministic function of the command log.
//!
//! Architecture invariant: this crate depends on nothing but serde and imbl, so nothing
//! here can read a clock, a random source or the disk, and nothing here is async.
//! "Now" is the leader's stamp in each command, never lower than the previous
//! command's. Every collection is a persistent map, so cloning the machine is O(1) and a
//! snapshot can be encoded from a clone while apply goes on. The machine knows nothing
//! of planted bugs: the simulation injects them around it (`store_sm::planted`).

pub mod auth;
mod changes;
pub mod constants;
mod dedup;
mod fingerprint;
mod group_index;
mod ids;
#[cfg(debug_assertions)]
mod invariants;
mod job_apply;
pub mod jobs;
mod legacy;
mod log_time;
mod restore;
mod types;

use std::collections::BTreeSet;
use std::sync::Arc;

use imbl::OrdMap;
use imbl::OrdSet;

use self::constants::CLAIM_DATA_BYTES_MAX;
use self::constants::CLAIM_DURATION_MS_MAX;
use self::constants::DEDUP_KEEP_FORM;
use self::constants::REQUEST_ID_BYTES_MAX;
use self::constants::REQUEST_ITEMS_MAX;
use self::constants::RULES_FORM;

pub use self::auth::Role;
pub use self::auth::ScopedRequest;
pub use self::auth::TokenAddRequest;
pub use self::auth::TokenRecord;
pub use self::auth::TokenRevokeRequest;
pub use self::changes::Change;

pub use self::dedup::DedupEntry;
pub use self::dedup::DedupKey;
pub use self::dedup::DedupTable;
pub use self::dedup::Retention;
pub use self::fingerprint::fingerprint;
use self::group_index::GroupIndex;
use self::job_apply::OutcomeRule;
pub use self::jobs::*;
pub use self::legacy::fits_seed_encoding;
pub use self::log_time::LogTime;
pub use self::restore::AuthParts;
pub use self::restore::InvalidParts;
pub use self::restore::JobParts;
pub use self::types::*;

/// One group's job records, by key and by state.
#[derive(Clone, Debug, Default)]
struct GroupJobs {
    records: OrdMap<JobKey, Arc<JobRecord>>,
    by_state: OrdSet<(JobState, JobKey)>,
}

/// What a command did to the tasks, which the checks after apply need to know.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Effect {
    /// Nothing: refused, answered from the dedup table, or a claim that found no task.
    Unchanged,
    /// An update that wrote its adds and updates and removed what it updated and deleted.
    Updated,
    /// A claim that removed the tasks with these ids and wrote their new versions.
    Claimed(Vec<TaskId>),
    /// A job command (finish, fail, cancel, retry, settings) that changed something.
    Job,
    /// A token was added or revoked; no task changed.
    Auth,
}

/// The replicated task store's state. See the module documentation.
#[derive(Clone, Debug)]
pub struct TaskMachine {
    /// The id the next written task version gets.
    next_id: TaskId,
    /// Log time of the last applied command.
    log_time: LogTime,
    tasks: OrdMap<TaskId, Task>,
    groups: OrdMap<GroupName, GroupIndex>,
    dedup: DedupTable,
    /// Every node id that was ever in the cluster's membership, so that none is reused.
    members_ever: OrdSet<MemberId>,
    /// Job records by group and key.
    jobs: OrdMap<GroupName, GroupJobs>,
    /// Group settings that differ from the defaults.
    settings: OrdMap<GroupName, GroupSettings>,
    /// Leases of claimed tasks, `(lease end, id)`, so lapses are found in order.
    leases: OrdSet<(LogTime, TaskId)>,
    /// Finished job records by the time they expire.
    expiries: OrdSet<(LogTime, GroupName, JobKey)>,
    /// Task versions a cancel removed, so their owner's next write is told why.
    cancelled: OrdMap<TaskId, (GroupName, JobKey)>,
    /// Job records by their id (the first task id of their current run).
    job_ids: OrdMap<TaskId, (GroupName, JobKey)>,
    /// Access tokens by id.
    tokens: OrdMap<String, TokenRecord>,
    /// Whether the first admin token was ever made (it can be made once).
    auth_bootstrapped: bool,
    /// The newest log entry form every member reads, once recorded (0 before); see
    /// [`Request::RaiseLogForm`].
    log_form: u32,
    /// What the last command changed (see [`Change`]); not state.
    changes: Vec<Change>,
}

impl Default for TaskMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskMachine {
    /// An empty store whose first task gets id 1.
    pub fn new() -> Self {
        Self {
            next_id: 1,
            log_time: LogTime::EPOCH,
            tasks: OrdMap::new(),
            groups: OrdMap::new(),
            dedup: DedupTable::default(),
            members_ever: OrdSet::new(),
            jobs: OrdMap::new(),
            settings: OrdMap::new(),
            leases: OrdSet::new(),
            expiries: OrdSet::new(),
            cancelled: OrdMap::new(),
            job_ids: OrdMap::new(),
            tokens: OrdMap::new(),
            auth_bootstrapped: false,
            log_form: 0,
            changes: Vec::new(),
        }
    }

    /// Records node ids seen in a membership change. Ids are never forgotten: a node id
    /// names one data directory for the life of the cluster.
    pub fn note_members(&mut self, ids: impl IntoIterator<Item = MemberId>) {
        for id in ids {
            self.members_ever.insert(id);
        }
    }

    /// Every node id that was ever a member (voter or learner), sorted.
    pub fn members_ever(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members_ever.iter().copied()
    }

    /// The newest log entry form every member is recorded to read (0 if none was).
    pub fn log_form(&self) -> u32 {
        self.log_form
    }

    /// Raises the recorded log entry form to `form`; a lower one changes nothing.
    pub fn raise_log_form(&mut self, form: u32) {
        self.log_form = self.log_form.max(form);
    }

    /// The dedup table's rule for the recorded log entry form.
    pub(crate) fn dedup_retention(&self) -> Retention {
        if self.log_form >= DEDUP_KEEP_FORM {
            Retention::KeepYoung
        } else {
            Retention::Oldest
        }
    }

    /// Applies one command at its log time and returns its outcome.
    ///
    /// Total: a command that cannot be carried out is refused with every reason, and a
    /// refused command changes nothing but the machine's time and dedup table. Debug and
    /// simulation builds assert the machine's invariants after every command.
    ///
    /// A [`Request::Batch`] applies its commands in turn, each as if it were an entry of
    /// its own, and answers [`Outcome::Batch`]; [`TaskMachine::changes`] then holds all of
    /// theirs, in order.
    pub fn apply(&mut self, command: &Command) -> Arc<Outcome> {
        self.changes.clear();
        self.apply_one(command)
    }

    fn apply_one(&mut self, command: &Command) -> Arc<Outcome> {
        if let Request::Batch(commands) = &command.request {
            let outcomes = commands.iter().map(|c| self.apply_one(c)).collect();
            return Arc::new(Outcome::Batch(outcomes));
        }
        let now = self.advance_time(command.stamp);
        self.pass_time(now);
        #[cfg(debug_assertions)]
        let before = invariants::Before::of(self);
        let (outcome, effect) = self.apply_at(command, now);
        #[cfg(debug_assertions)]
        self.assert_invariants(&before, command, &outcome, effect);
        #[cfg(not(debug_assertions))]
        let _ = effect;
        outcome
    }

    fn apply_at(&mut self, command: &Command, now: LogTime) -> (Arc<Outcome>, Effect) {
        let key = match &command.request_id {
            Some(id) if id.len() > REQUEST_ID_BYTES_MAX => {
                let refusal = Refusal::RequestIdTooLong { bytes: id.len() };
                return (Arc::new(Outcome::Refused(vec![refusal])), Effect::Unchanged);
            }
            Some(id) => Some((command.request.client(), Arc::<str>::from(id.as_str()))),
            None => None,
        };
        // Before the dedup table: a request id does not let a token read the first
        // answer of a request it could not make.
        if let Request::Scoped(scoped) = &command.request
            && let Some(refusal) = self.scope_refusal(&scoped.groups, &scoped.request)
        {
            return (Arc::new(Outcome::Refused(vec![refusal])), Effect::Unchanged);
        }
        let fingerprint = key.as_ref().map(|_| fingerprint(&command.request));
        if let Some(first) = key
            .as_ref()
            .and_then(|key| self.dedup.answer(key, fingerprint))
        {
            return (first, Effect::Unchanged);
        }

        let (outcome, effect) = self.apply_request(&command.request, now);
        let outcome = Arc::new(outcome);
        let found_nothing = matches!(&*outcome, Outcome::Tasks(tasks) if tasks.is_empty());
        let forget = found_nothing
            && matches!(
                command.request.unscoped(),
                Request::WaitingClaim(_) | Request::WaitingClaimMany(_)
            );
        if let Some(key) = key.filter(|_| !forget) {
            self.dedup.insert(
                key,
                now,
                Arc::clone(&outcome),
                fingerprint,
                self.dedup_retention(),
            );
        }
        (outcome, effect)
    }

    /// Applies one request at `now`: its outcome and what it did to the tasks.
    fn apply_request(&mut self, request: &Request, now: LogTime) -> (Outcome, Effect) {
        let changed = |outcome: Outcome, effect| match outcome {
            Outcome::Refused(_) => (outcome, Effect::Unchanged),
            _ => (outcome, effect),
        };
        let token = |result: Result<TokenRecord, Vec<Refusal>>| match result {
            Ok(record) => (Outcome::Token(record), Effect::Auth),
            Err(refusals) => (Outcome::Refused(refusals), Effect::Unchanged),
        };
        match request {
            Request::LegacyUpdate(update) | Request::Update(update) => {
                changed(self.apply_update(update, now), Effect::Updated)
            }
            Request::Claim(claim) | Request::WaitingClaim(claim) => self.apply_claim(claim, 1, now),
            Request::ClaimMany(many) | Request::WaitingClaimMany(many) => {
                self.apply_claim(&many.claim, many.count, now)
            }
            Request::Finish(finish) => changed(
                self.apply_finish(finish, OutcomeRule::Claimed, now),
                Effect::Job,
            ),
            Request::LegacyFinish(finish) => changed(
                self.apply_finish(finish, OutcomeRule::Owned, now),
                Effect::Job,
            ),
            Request::FinishMany(many) => changed(
                self.apply_finish_many(many, OutcomeRule::Claimed, now),
                Effect::Job,
            ),
            Request::LegacyFinishMany(many) => changed(
                self.apply_finish_many(many, OutcomeRule::Owned, now),
                Effect::Job,
            ),
            Request::Fail(fail) => changed(
                self.apply_fail(fail, OutcomeRule::Claimed, now),
                Effect::Job,
            ),
            Request::LegacyFail(fail) => {
                changed(self.apply_fail(fail, OutcomeRule::Owned, now), Effect::Job)
            }
            Request::FinishAndClaim(both) => self.apply_finish_and_claim(both, now),
            Request::Cancel(cancel) => changed(self.apply_cancel(cancel, now), Effect::Job),
            Request::Retry(retry) => changed(self.apply_retry(retry, now), Effect::Job),
            Request::Settings(settings) => changed(self.apply_settings(settings, now), Effect::Job),
            Request::TokenAdd(add) => token(self.apply_token_add(add, false, now)),
            Request::AuthBootstrap(add) => token(self.apply_token_add(add, true, now)),
            Request::TokenRevoke(revoke) => token(self.apply_token_revoke(revoke)),
            // What it does, `apply` did: time passed before the request.
            Request::PassTime => (Outcome::Tasks(Vec::new()), Effect::Unchanged),
            // Touches no task, job or token: the maps stay as they were.
            // A rules form comes only in the variant older builds cannot read.
            Request::RaiseLogForm(form) => {
                self.raise_log_form((*form).min(RULES_FORM - 1));
                (Outcome::Tasks(Vec::new()), Effect::Unchanged)
            }
            Request::RaiseRulesForm(form) => {
                self.raise_log_form(*form);
                (Outcome::Tasks(Vec::new()), Effect::Unchanged)
            }
            Request::Scoped(scoped) => match self.scope_refusal(&scoped.groups, &scoped.request) {
                Some(refusal) => (Outcome::Refused(vec![refusal]), Effect::Unchanged),
                None => self.apply_request(&scoped.request, now),
            },
            // `apply` takes a batch apart before this; only a scope reaches here with
            // one, and no token may make a batch.
            Request::Batch(_) => (
                Outcome::Refused(vec![Refusal::OutOfScope {
                    group: String::new(),
                }]),
                Effect::Unchanged,
            ),
        }
    }

    /// Moves log time to `max(stamp, previous time)`, so time never goes back even when
    /// a new leader's clock is behind the old one's.
    pub(crate) fn advance_time(&mut self, stamp: LogTime) -> LogTime {
        self.log_time = self.log_time.max(stamp);
        self.log_time
    }

    fn apply_update(&mut self, update: &UpdateRequest, now: LogTime) -> Outcome {
        let after_keys: usize = update.adds.iter().map(|add| add.job.after.len()).sum();
        let items = update.adds.len()
            + update.updates.len()
            + update.deletes.len()
            + update.depends.len()
            + after_keys;
        if items > REQUEST_ITEMS_MAX {
            return Outcome::Refused(vec![Refusal::TooManyItems { items }]);
        }

        let mut refusals = Vec::new();
        if update.adds.is_empty() && update.updates.is_empty() && update.deletes.is_empty() {
            refusals.push(Refusal::NothingToDo);
        }
        let named = update
            .updates
            .iter()
            .map(|change| (ListName::Updates, change.id))
            .chain(update.deletes.iter().map(|&id| (ListName::Deletes, id)))
            .chain(update.depends.iter().map(|&id| (ListName::Depends, id)));
        refusals.extend(duplicates(named));

        let mut add_times = Vec::with_capacity(update.adds.len());
        for (index, add) in update.adds.iter().enumerate() {
            if add.group.is_empty() {
                refusals.push(Refusal::MissingGroup { index });
            }
            match resolve_timespec(ListName::Adds, index, add.timespec, now) {
                Ok(available_at) => add_times.push(available_at),
                Err(refusal) => refusals.push(refusal),
            }
        }
        let plans = self.plan_adds(&update.adds, &mut refusals);
        let mut update_times = Vec::with_capacity(update.updates.len());
        let mut retakes = Vec::new();
        for (index, change) in update.updates.iter().enumerate() {
            refusals.extend(
                self.check_modifiable(ListName::Updates, change.id, update.client, now)
                    .err(),
            );
            match resolve_timespec(ListName::Updates, index, change.timespec, now) {
                Ok(available_at) => {
                    refusals.extend(self.retake_refusal(
                        change.id,
                        update.client,
                        available_at,
                        now,
                        &mut retakes,
                    ));
                    update_times.push(available_at);
                }
                Err(refusal) => refusals.push(refusal),
            }
        }
        for &id in &update.deletes {
            refusals.extend(
                self.check_modifiable(ListName::Deletes, id, update.client, now)
                    .err(),
            );
        }
        refusals.extend(self.missing_depends(&update.depends));
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }

        // Every check passed: from here on nothing can fail, so the change is all or nothing.
        let mut written = Vec::with_capacity(update.adds.len() + update.updates.len());
        for ((add, available_at), plan) in update.adds.iter().zip(add_times).zip(plans) {
            written.extend(self.carry_out_add(add, plan, available_at, update.client, now));
        }
        for (change, available_at) in update.updates.iter().zip(update_times) {
            if let Some(old) = self.remove_task(change.id) {
                let job = self.rewritten_job(&old, update.client, available_at, now);
                let group = Arc::clone(&old.group);
                let task =
                    self.insert_new(group, change.data.clone(), available_at, update.client, job);
                self.note_new_version(&task);
                written.push(task);
            }
        }
        for &id in &update.deletes {
            if let Some(old) = self.remove_task(id) {
                self.job_deleted(old, update.client, now);
            }
        }
        Outcome::Tasks(written)
    }

    /// Claims up to `count` tasks of `claim.group`, one after the other as successive
    /// claims would, stopping early when none is left, the group's limits hold the
    /// next one back, or the claimed data reaches [`CLAIM_DATA_BYTES_MAX`].
    fn apply_claim(&mut self, claim: &ClaimRequest, count: u32, now: LogTime) -> (Outcome, Effect) {
        let unchanged = |outcome| (outcome, Effect::Unchanged);
        let refusals = self.claim_refusals(claim, count, now);
        if !refusals.is_empty() {
            return unchanged(Outcome::Refused(refusals));
        }
        let available_at = match claim_end(now, claim.duration_ms) {
            Ok(available_at) => available_at,
            Err(refusal) => return unchanged(Outcome::Refused(vec![refusal])),
        };

        let mut claimed = Vec::new();
        let mut removed = Vec::new();
        let mut data_bytes = 0;
        while claimed.len() < count as usize && data_bytes < CLAIM_DATA_BYTES_MAX {
            if self.claims_held_back(&claim.group) {
                break;
            }
            let Some(id) = self.first_available(&claim.group, now, &claim.depends) else {
                break;
            };
            let Some(old) = self.remove_task(id) else {
                debug_assert!(false, "group index names task {id} that does not exist");
                break;
            };
            let job = self.claimed_job(&old, claim.client, now);
            let task = self.insert_new(old.group, old.data, available_at, claim.client, job);
            self.note_new_version(&task);
            data_bytes += task.data.len();
            claimed.push(task);
            removed.push(id);
        }
        if claimed.is_empty() {
            return unchanged(Outcome::Tasks(claimed));
        }
        (Outcome::Tasks(claimed), Effect::Claimed(removed))
    }

    /// Why a claim of up to `count` tasks under `claim` would be refused at `now`,
    /// whatever is claimable (every reason, as applying it would give them); empty if it
    /// would not be. A blocking claim asks before it waits, so that a refusal is answered
    /// at once rather than hidden behind an empty answer when nothing becomes claimable.
    pub fn claim_refusals(&self, claim: &ClaimRequest, count: u32, now: LogTime) -> Vec<Refusal> {
        if claim.depends.len() > REQUEST_ITEMS_MAX {
            return vec![Refusal::TooManyItems {
                items: claim.depends.len(),
            }];
        }
        let mut refusals = Vec::new();
        if claim.group.is_empty() {
            refusals.push(Refusal::ClaimWithoutGroup);
        }
        if let Err(refusal) = check_claim_count(count) {
            refusals.push(refusal);
        }
        if let Err(refusal) = claim_end(now, claim.duration_ms) {
            refusals.push(refusal);
        }
        refusals.extend(duplicates(
            claim.depends.iter().map(|&id| (ListName::Depends, id)),
        ));
        refusals.extend(self.missing_depends(&claim.depends));
        refusals
    }

    /// The first claimable task of `group` at `now` (highest priority, then oldest) that
    /// the claim does not depend on.
    fn first_available(&self, group: &str, now: LogTime, depends: &[TaskId]) -> Option<TaskId> {
        self.groups
            .get(group)?
            .first_claimable(now, |id| depends.contains(&id))
    }

    fn check_modifiable(
        &self,
        list: ListName,
        id: TaskId,
        client: ClientId,
        now: LogTime,
    ) -> Result<(), Refusal> {
        match self.tasks.get(&id) {
            None => Err(self.missing(list, id)),
            Some(task) if !task.modifiable_by(client, now) => Err(Refusal::Owned {
                list,
                id,
                owner: task.owner,
                available_at: task.available_at,
            }),
            Some(_) => Ok(()),
        }
    }

    /// A refusal for each missing task `depends` names, once however often it is named
    /// (naming one twice is a refusal of its own).
    fn missing_depends<'a>(&'a self, depends: &'a [TaskId]) -> impl Iterator<Item = Refusal> + 'a {
        let mut reported = BTreeSet::new();
        depends
            .iter()
            .filter(move |&&id| !self.tasks.contains_key(&id) && reported.insert(id))
            .map(|&id| Refusal::Missing {
                list: ListName::Depends,
                id,
            })
    }

    /// The shared name of an existing group, so its tasks do not each own a copy.
    fn intern_group(&self, name: &str) -> GroupName {
        match self.groups.get_key_value(name) {
            Some((existing, _)) => Arc::clone(existing),
            None => Arc::from(name),
        }
    }

    fn insert_new(
        &mut self,
        group: GroupName,
        data: String,
        available_at: LogTime,
        owner: ClientId,
        job: TaskJob,
    ) -> Task {
        let id = self.next_id;
        // A u64 of ids at a million per second lasts half a million years.
        self.next_id = id.checked_add(1).expect("task ids exhausted");
        let task = Task {
            id,
            group,
            data,
            available_at,
            owner,
            job,
        };
        self.index_task(task.clone());
        task
    }

    /// Puts a task in the task map, its group's index (blocked while its job waits for
    /// prerequisites) and, if it is a lease, the lease set.
    fn index_task(&mut self, task: Task) {
        let blocked = self.is_blocked(&task);
        let position = (task.available_at, task.id);
        if task.job.leased {
            self.leases.insert(position);
        }
        let index = match self.groups.get_mut(&*task.group) {
            Some(index) => index,
            None => self.groups.entry(Arc::clone(&task.group)).or_default(),
        };
        index.insert(position, task.job.priority, blocked);
        if task.job.leased {
            index.running += 1;
        }
        self.changes.push(Change::TaskWritten(task.id));
        self.tasks.insert(task.id, task);
    }

    fn remove_task(&mut self, id: TaskId) -> Option<Task> {
        let task = self.tasks.remove(&id)?;
        let position = (task.available_at, task.id);
        if task.job.leased {
            self.leases.remove(&position);
        }
        let now_empty = match self.groups.get_mut(&*task.group) {
            Some(index) => {
                index.remove(&position, task.job.priority);
                if task.job.leased {
                    index.running -= 1;
                }
                index.is_empty()
            }
            None => false,
        };
        if now_empty {
            self.groups.remove(&*task.group);
        }
        self.changes.push(Change::TaskRemoved {
            group: Arc::clone(&task.group),
            id,
        });
        Some(task)
    }

    /// What the last applied command changed, in order: tasks written and removed, job
    /// records changed or dropped, settings changed (also what passing log time did
    /// before it: lapsed leases, expired records). Empty after a refusal or a replay.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// One task by id.
    pub fn task(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// Several tasks by id, `None` where one does not exist.
    pub fn tasks(&self, ids: &[TaskId]) -> Vec<Option<Task>> {
        ids.iter().map(|id| self.tasks.get(id).cloned()).collect()
    }

    /// Tasks of `group` by available time, then id (the seed's order; a claim weighs
    /// priority first): only those available at `now` unless `include_owned`, at most
    /// `limit` of them. O(log n + returned).
    pub fn group_tasks(
        &self,
        group: &str,
        limit: Option<usize>,
        include_owned: bool,
        now: LogTime,
    ) -> Vec<Task> {
        self.iter_group(group, include_owned, now)
            .take(limit.unwrap_or(usize::MAX))
            .cloned()
            .collect()
    }

    /// Like [`Self::group_tasks`], without copying the tasks.
    pub fn iter_group<'a>(
        &'a self,
        group: &str,
        include_owned: bool,
        now: LogTime,
    ) -> impl Iterator<Item = &'a Task> + 'a {
        self.iter_group_after(group, include_owned, now, None)
    }

    /// As [`TaskMachine::iter_group`], starting strictly after the task at `after`
    /// (`(available time, id)`, a page's last task): a cursor for paging a large group.
    pub fn iter_group_after<'a>(
        &'a self,
        group: &str,
        include_owned: bool,
        now: LogTime,
        after: Option<(LogTime, TaskId)>,
    ) -> impl Iterator<Item = &'a Task> + 'a {
        let upper = if include_owned { LogTime::MAX } else { now };
        self.groups
            .get(group)
            .into_iter()
            .flat_map(move |index| index.in_order(after, upper))
            .filter_map(|id| self.tasks.get(&id))
    }

    /// Names of the groups that hold tasks, sorted.
    pub fn groups(&self) -> Vec<GroupName> {
        self.groups.keys().cloned().collect()
    }

    /// Number of tasks in `group`.
    pub fn group_len(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, |index| index.len())
    }

    /// The id the next written task gets; every existing id is lower.
    pub fn next_id(&self) -> TaskId {
        self.next_id
    }

    /// Log time of the last applied command.
    pub fn log_time(&self) -> LogTime {
        self.log_time
    }

    /// Number of live tasks.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// All tasks in id order.
    pub fn iter_tasks(&self) -> impl Iterator<Item = &Task> + '_ {
        self.tasks.values()
    }

    /// What a command of `client` under `request_id` asking `request` is answered from
    /// the dedup table: its first outcome, or a refusal if the id named another request;
    /// `None` if the id is not remembered.
    pub fn remembered(
        &self,
        client: ClientId,
        request_id: &str,
        request: &Request,
    ) -> Option<Arc<Outcome>> {
        let key = (client, Arc::<str>::from(request_id));
        self.dedup.answer(&key, Some(fingerprint(request)))
    }

    /// The refusal a request limited to some groups ([`Request::Scoped`]) gets for what
    /// it names outside them, before anything else is looked at; `None` for a request
    /// that is not limited, or names nothing outside. What a node checks before a claim
    /// waits, so that it answers as the claim's own apply would.
    pub fn scope_refusal_of(&self, request: &Request) -> Option<Refusal> {
        match request {
            Request::Scoped(scoped) => self.scope_refusal(&scoped.groups, &scoped.request),
            _ => None,
        }
    }

    /// The dedup table, for snapshots and checks.
    pub fn dedup(&self) -> &DedupTable {
        &self.dedup
    }
}

/// `None` is now; negative is now + |t|; anything else is absolute. Refused if the result
/// does not fit, naming item `index` of `list`.
fn resolve_timespec(
    list: ListName,
    index: usize,
    timespec: Option<Millis>,
    now: LogTime,
) -> Result<LogTime, Refusal> {
    let resolved = match timespec {
        None => Some(now),
        Some(t) if t < 0 => t.checked_neg().and_then(|ahead| now.checked_add(ahead)),
        Some(t) => Some(LogTime::from_millis(t)),
    };
    resolved.ok_or(Refusal::TimespecOutOfRange {
        list,
        index,
        timespec: timespec.unwrap_or_default(),
    })
}

/// When a claim of `duration_ms` made at `now` ends; refused unless the duration is
/// positive, at most [`CLAIM_DURATION_MS_MAX`] and ends within representable time.
fn claim_end(now: LogTime, duration_ms: Millis) -> Result<LogTime, Refusal> {
    if duration_ms <= 0 {
        return Err(Refusal::InvalidDuration { duration_ms });
    }
    if duration_ms > CLAIM_DURATION_MS_MAX {
        return Err(Refusal::DurationTooLong { duration_ms });
    }
    now.checked_add(duration_ms)
        .ok_or(Refusal::DurationOutOfRange { duration_ms })
}

/// A refusal for each id named more than once, naming the list of its second mention.
fn duplicates(named: impl Iterator<Item = (ListName, TaskId)>) -> impl Iterator<Item = Refusal> {
    let mut seen = BTreeSet::new();
    let mut reported = BTreeSet::new();
    named
        .filter(move |&(_, id)| !seen.insert(id) && reported.insert(id))
        .map(|(list, id)| Refusal::Duplicate { list, id })
}

/// A small deterministic generator for tests (xorshift): each call gives a number below
/// its `bound`.
#[cfg(test)]
pub(crate) fn test_numbers(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |bound| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod job_tests;
