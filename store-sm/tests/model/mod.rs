//! The reference model: the seed's semantics and the job layer written the obvious way,
//! with plain maps and linear scans, for the property tests to hold the machine against.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;

use store_sm::machine::constants::*;
use store_sm::machine::*;

/// The rule of `Request::Finish`, `FinishMany` and `Fail`: a job's version must be
/// claimed.
const CLAIMED_ONLY: bool = true;
/// The rule of their legacy forms: any version the client owns.
const OWNED: bool = false;

/// The model's whole state.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub next_id: u64,
    pub time_ms: i64,
    pub tasks: BTreeMap<u64, Task>,
    pub seen: BTreeMap<(i64, String), (Request, Outcome)>,
    pub records: BTreeMap<(String, String), JobRecord>,
    pub settings: BTreeMap<String, GroupSettings>,
    pub tokens: BTreeMap<String, TokenRecord>,
    pub bootstrapped: bool,
    pub log_form: u32,
}

fn at(ms: i64) -> LogTime {
    LogTime::from_millis(ms)
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Refusal {
    Refusal::InvalidField {
        field: field.into(),
        reason: reason.into(),
    }
}

fn key_refusal(field: String, key: &str) -> Option<Refusal> {
    (key.is_empty() || key.len() > JOB_KEY_BYTES_MAX).then(|| {
        invalid(
            field,
            format!(
                "a key is 1 to {JOB_KEY_BYTES_MAX} bytes; this one is {} bytes",
                key.len()
            ),
        )
    })
}

/// What an add turned out to be.
enum Plan {
    Plain,
    Kept(u64, bool),
    New(Vec<String>),
}

/// A group a request touches, and the task id (and where it was named) it came from.
type Touched = (String, Option<(ListName, u64)>);

impl Model {
    pub fn new() -> Self {
        Self {
            next_id: 1,
            ..Self::default()
        }
    }

    pub fn settings_of(&self, group: &str) -> GroupSettings {
        self.settings.get(group).copied().unwrap_or_default()
    }

    pub fn apply(&mut self, command: &Command) -> Outcome {
        if let Request::Batch(commands) = &command.request {
            let outcomes = commands.iter().map(|c| Arc::new(self.apply(c))).collect();
            return Outcome::Batch(outcomes);
        }
        self.time_ms = self.time_ms.max(command.stamp.as_millis());
        let now = self.time_ms;
        self.pass_time(now);
        if let Some(id) = &command.request_id
            && id.len() > REQUEST_ID_BYTES_MAX
        {
            return Outcome::Refused(vec![Refusal::RequestIdTooLong { bytes: id.len() }]);
        }
        // The scope is checked first: a request id never lets a worker token read the
        // answer of a request it could not make.
        if let Request::Scoped(scoped) = &command.request
            && let Some(refusal) = self.first_outside(&scoped.groups, &scoped.request)
        {
            return Outcome::Refused(vec![refusal]);
        }
        let key = command
            .request_id
            .clone()
            .map(|id| (command.request.client(), id));
        if let Some((request, first)) = key.as_ref().and_then(|key| self.seen.get(key)) {
            // Another request under a remembered id is refused; the same one (through
            // either door) gets the first outcome.
            if same_request(request, &command.request) {
                return first.clone();
            }
            let request_id = command.request_id.clone().unwrap_or_default();
            return Outcome::Refused(vec![Refusal::RequestIdReused { request_id }]);
        }
        let outcome = self.dispatch(&command.request, now);
        // A waiting claim that found nothing may be proposed again under its id.
        let retry_allowed = matches!(
            command.request.unscoped(),
            Request::WaitingClaim(_) | Request::WaitingClaimMany(_)
        ) && matches!(&outcome, Outcome::Tasks(tasks) if tasks.is_empty());
        if let Some(key) = key.filter(|_| !retry_allowed) {
            self.seen
                .insert(key, (command.request.clone(), outcome.clone()));
        }
        outcome
    }

    fn dispatch(&mut self, request: &Request, now: i64) -> Outcome {
        match request {
            Request::LegacyUpdate(u) | Request::Update(u) => self.update(u, now),
            Request::Claim(c) | Request::WaitingClaim(c) => self.claim(c, 1, now),
            Request::ClaimMany(m) | Request::WaitingClaimMany(m) => {
                self.claim(&m.claim, m.count, now)
            }
            Request::Finish(f) => self.finish(f, CLAIMED_ONLY, now),
            Request::LegacyFinish(f) => self.finish(f, OWNED, now),
            Request::FinishMany(m) => self.finish_many(m, CLAIMED_ONLY, now),
            Request::LegacyFinishMany(m) => self.finish_many(m, OWNED, now),
            Request::Fail(f) => self.fail(f, CLAIMED_ONLY, now),
            Request::LegacyFail(f) => self.fail(f, OWNED, now),
            Request::FinishAndClaim(b) => self.finish_and_claim(b, now),
            Request::Cancel(c) => self.cancel(c, now),
            Request::Retry(r) => self.retry(r, now),
            Request::Settings(s) => self.change_settings(s),
            Request::TokenAdd(a) => self.token_add(a, false, now),
            Request::AuthBootstrap(a) => self.token_add(a, true, now),
            Request::TokenRevoke(r) => match self.tokens.remove(&r.id) {
                Some(record) => Outcome::Token(record),
                None => Outcome::Refused(vec![Refusal::UnknownToken { id: r.id.clone() }]),
            },
            Request::Scoped(scoped) => match self.first_outside(&scoped.groups, &scoped.request) {
                Some(refusal) => Outcome::Refused(vec![refusal]),
                None => self.dispatch(&scoped.request, now),
            },
            Request::PassTime => Outcome::Tasks(Vec::new()),
            Request::RaiseLogForm(form) => {
                self.log_form = self.log_form.max((*form).min(3));
                Outcome::Tasks(Vec::new())
            }
            Request::RaiseRulesForm(form) => {
                self.log_form = self.log_form.max(*form);
                Outcome::Tasks(Vec::new())
            }
            // Reached only inside a scope, which no token may put a batch in.
            Request::Batch(_) => Outcome::Refused(vec![Refusal::OutOfScope {
                group: String::new(),
            }]),
        }
    }

    /// Every group a request names or touches, in the order the machine reports them,
    /// each with the task id (and where it was named) it came from, if it came from one;
    /// `None` for a request no worker token may make.
    fn groups_touched(&self, request: &Request) -> Option<Vec<Touched>> {
        let of = |list: ListName, ids: &[u64]| -> Vec<Touched> {
            ids.iter()
                .filter_map(|&id| {
                    let group = match self.tasks.get(&id) {
                        Some(task) => task.group.to_string(),
                        None if self.log_form < 4 => return None,
                        None => self
                            .records
                            .values()
                            .find(|r| r.cancelled_task == Some(id))?
                            .group
                            .to_string(),
                    };
                    Some((group, Some((list, id))))
                })
                .collect()
        };
        let named = |group: &str| vec![(group.to_string(), None)];
        Some(match request {
            Request::LegacyUpdate(u) | Request::Update(u) => {
                let mut groups: Vec<_> = u.adds.iter().flat_map(|a| named(&a.group)).collect();
                let changed: Vec<u64> = u.updates.iter().map(|c| c.id).collect();
                groups.extend(of(ListName::Updates, &changed));
                groups.extend(of(ListName::Deletes, &u.deletes));
                groups.extend(of(ListName::Depends, &u.depends));
                groups
            }
            Request::Claim(c) | Request::WaitingClaim(c) => {
                [named(&c.group), of(ListName::Depends, &c.depends)].concat()
            }
            Request::ClaimMany(m) | Request::WaitingClaimMany(m) => [
                named(&m.claim.group),
                of(ListName::Depends, &m.claim.depends),
            ]
            .concat(),
            Request::Finish(f) | Request::LegacyFinish(f) => of(ListName::Finish, &[f.id]),
            Request::FinishMany(m) | Request::LegacyFinishMany(m) => of(
                ListName::Finish,
                &m.finishes.iter().map(|i| i.id).collect::<Vec<_>>(),
            ),
            Request::Fail(f) | Request::LegacyFail(f) => of(ListName::Fail, &[f.id]),
            Request::FinishAndClaim(b) => [
                of(ListName::Finish, &[b.finish.id]),
                named(&b.next.claim.group),
                of(ListName::Depends, &b.next.claim.depends),
            ]
            .concat(),
            Request::Cancel(c) => named(&c.group),
            Request::Retry(r) => named(&r.group),
            Request::Settings(s) => named(&s.group),
            Request::Scoped(scoped) => return self.groups_touched(&scoped.request),
            Request::TokenAdd(_)
            | Request::TokenRevoke(_)
            | Request::AuthBootstrap(_)
            | Request::PassTime
            | Request::RaiseLogForm(_)
            | Request::RaiseRulesForm(_)
            | Request::Batch(_) => {
                return None;
            }
        })
    }

    /// The refusal of a request through a token limited to `prefixes`: the first group
    /// outside them, named unless it came from a task id.
    fn first_outside(&self, prefixes: &[String], request: &Request) -> Option<Refusal> {
        let Some(groups) = self.groups_touched(request) else {
            return Some(Refusal::OutOfScope {
                group: String::new(),
            });
        };
        groups
            .into_iter()
            .find(|(g, _)| {
                !prefixes.is_empty() && !prefixes.iter().any(|p| g.starts_with(p.as_str()))
            })
            .map(|(group, from)| match from {
                Some((list, id)) => Refusal::TaskOutOfScope { list, id },
                None => Refusal::OutOfScope { group },
            })
    }

    fn token_add(&mut self, add: &TokenAddRequest, bootstrap: bool, now: i64) -> Outcome {
        let mut refusals = store_sm::machine::auth::check_token_fields(add);
        if bootstrap && self.bootstrapped {
            refusals.push(Refusal::AlreadyBootstrapped);
        }
        if bootstrap && add.role != Role::Admin {
            refusals.push(invalid("role", "the first token is an admin token"));
        }
        if self.tokens.contains_key(&add.id) {
            refusals.push(Refusal::TokenExists { id: add.id.clone() });
        }
        if self.tokens.len() >= TOKENS_MAX {
            refusals.push(Refusal::TooManyTokens);
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let record = TokenRecord {
            id: add.id.clone(),
            name: add.name.clone(),
            role: add.role,
            groups: add.groups.clone(),
            secret_hash: add.secret_hash.clone(),
            created_at: at(now),
        };
        self.tokens.insert(add.id.clone(), record.clone());
        self.bootstrapped = true;
        Outcome::Token(record)
    }

    fn record_mut(&mut self, group: &str, key: &str) -> &mut JobRecord {
        self.records
            .get_mut(&(group.to_string(), key.to_string()))
            .expect("record")
    }

    /// Whether `client` held the lapsed lease of task version `t` (see the machine's
    /// `lapsed_holder`; from form 4, the very version whose lease lapsed).
    fn lapsed_holder(&self, t: &Task, client: i64) -> bool {
        let Some(key) = &t.job.key else {
            return false;
        };
        let Some(record) = self.record(&t.group, key) else {
            return false;
        };
        record.history.last().is_some_and(|a| {
            a.owner == client
                && a.end == Some(AttemptEnd::Lost)
                && (self.log_form < 4
                    || (a.run == record.run
                        && record.task == Some(t.id)
                        && t.job.attempt == a.number
                        && a.ended_at == Some(t.available_at)
                        && record.attempts_forgiven < record.attempts))
        })
    }

    fn record(&self, group: &str, key: &str) -> Option<&JobRecord> {
        self.records.get(&(group.to_string(), key.to_string()))
    }

    fn limit(&self, group: &str, key: &str) -> u32 {
        self.record(group, key)
            .and_then(|r| r.max_attempts)
            .unwrap_or(self.settings_of(group).max_attempts)
    }

    fn pass_time(&mut self, now: i64) {
        loop {
            let lapsed = self
                .tasks
                .values()
                .filter(|t| t.job.leased && t.available_at.as_millis() <= now)
                .map(|t| (t.available_at, t.id))
                .min();
            let Some((end, id)) = lapsed else { break };
            let task = self.tasks.get_mut(&id).expect("task");
            task.job.leased = false;
            let task = task.clone();
            let Some(key) = task.job.key.clone() else {
                continue;
            };
            let limit = self.limit(&task.group, &key);
            let record = self.record_mut(&task.group, &key);
            let last = record.history.last_mut().expect("open attempt");
            last.ended_at = Some(end);
            last.end = Some(AttemptEnd::Lost);
            if limit > 0 && record.attempts - record.attempts_forgiven >= limit {
                let reason = format!(
                    "attempt {} was lost: its lease lapsed at {end}",
                    record.attempts
                );
                self.tasks.remove(&id);
                // Dead as of the lease's end, whenever the lapse is noticed.
                self.dead(&task.group, &key, task.data, reason, end.as_millis());
            } else {
                record.state = JobState::Waiting;
            }
        }
        let expired: Vec<(String, String)> = self
            .records
            .iter()
            .filter(|(_, r)| r.expires_at.is_some_and(|t| t.as_millis() <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.records.remove(&k);
        }
    }

    fn cancelled_key(&self, id: u64) -> Option<Arc<str>> {
        self.records
            .values()
            .find(|r| r.cancelled_task == Some(id))
            .map(|r| Arc::clone(&r.key))
    }

    fn missing(&self, list: ListName, id: u64) -> Refusal {
        match self.cancelled_key(id) {
            Some(key) => Refusal::Cancelled { list, id, key },
            None => Refusal::Missing { list, id },
        }
    }

    fn modifiable(&self, list: ListName, id: u64, client: i64, now: i64) -> Option<Refusal> {
        match self.tasks.get(&id) {
            None => Some(self.missing(list, id)),
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

    /// Each missing task once, however often `depends` names it.
    fn missing_depends(&self, depends: &[u64]) -> Vec<Refusal> {
        let mut reported = std::collections::BTreeSet::new();
        depends
            .iter()
            .filter(|&&id| !self.tasks.contains_key(&id) && reported.insert(id))
            .map(|&id| Refusal::Missing {
                list: ListName::Depends,
                id,
            })
            .collect()
    }

    fn new_task(&mut self, group: &str, data: &str, at_ms: i64, owner: i64, job: TaskJob) -> Task {
        let task = Task {
            id: self.next_id,
            group: Arc::from(group),
            data: data.to_string(),
            available_at: at(at_ms),
            owner,
            job,
        };
        self.next_id += 1;
        self.tasks.insert(task.id, task.clone());
        if let Some(key) = &task.job.key {
            self.record_mut(group, key).task = Some(task.id);
        }
        task
    }

    /// When a timespec puts a task: now, now + |t| for a negative one, or t; `None` when
    /// that is past the end of representable time.
    fn resolve(timespec: Option<i64>, now: i64) -> Option<i64> {
        match timespec {
            None => Some(now),
            Some(t) if t < 0 => t.checked_neg().and_then(|ahead| now.checked_add(ahead)),
            Some(t) => Some(t),
        }
    }

    fn out_of_range(list: ListName, index: usize, timespec: Option<i64>) -> Refusal {
        Refusal::TimespecOutOfRange {
            list,
            index,
            timespec: timespec.unwrap_or_default(),
        }
    }

    fn live_task(&self, group: &str, key: &str) -> Option<u64> {
        self.record(group, key)
            .filter(|r| {
                matches!(
                    r.state,
                    JobState::Waiting | JobState::Running | JobState::Failed
                )
            })
            .and_then(|r| r.task)
    }

    fn plan(&self, adds: &[AddTask], refusals: &mut Vec<Refusal>) -> Vec<Plan> {
        let mut added: Vec<(String, String)> = vec![];
        let mut plans = vec![];
        for (index, add) in adds.iter().enumerate() {
            let job = &add.job;
            let Some(key) = &job.key else {
                if !job.after.is_empty()
                    || job.max_attempts.is_some()
                    || job.every_ms.is_some()
                    || job.on_conflict != OnConflict::Refuse
                {
                    refusals.push(invalid(
                        format!("adds[{index}]"),
                        "after, max_attempts, every_ms and on_conflict need a key; give the task a key",
                    ));
                }
                plans.push(Plan::Plain);
                continue;
            };
            let mut own = vec![];
            own.extend(key_refusal(format!("adds[{index}].key"), key));
            if let Some(every) = job.every_ms
                && !(1..=JOB_INTERVAL_MS_MAX).contains(&every)
            {
                own.push(invalid(
                    format!("adds[{index}].every_ms"),
                    format!("{every} is not between 1 and {JOB_INTERVAL_MS_MAX}"),
                ));
            }
            if !own.is_empty() {
                refusals.extend(own);
                plans.push(Plan::Plain);
                continue;
            }
            let pair = (add.group.clone(), key.clone());
            if added.contains(&pair) {
                refusals.push(Refusal::KeyTwice {
                    index,
                    key: Arc::from(key.as_str()),
                });
                plans.push(Plan::Plain);
                continue;
            }
            added.push(pair);
            if let Some(id) = self.live_task(&add.group, key) {
                match job.on_conflict {
                    OnConflict::Keep => plans.push(Plan::Kept(id, false)),
                    OnConflict::Resubmit => plans.push(Plan::Kept(id, true)),
                    OnConflict::Refuse => {
                        refusals.push(Refusal::KeyLive {
                            index,
                            key: Arc::from(key.as_str()),
                            id,
                        });
                        plans.push(Plan::Plain);
                    }
                }
                continue;
            }
            let mut pending: Vec<String> = vec![];
            for (n, p) in job.after.iter().enumerate() {
                if p == key {
                    refusals.push(invalid(
                        format!("adds[{index}].after[{n}]"),
                        "names the task's own key; a task cannot wait for itself",
                    ));
                    continue;
                }
                if let Some(r) = key_refusal(format!("adds[{index}].after[{n}]"), p) {
                    refusals.push(r);
                    continue;
                }
                if pending.contains(p) {
                    continue;
                }
                if added.contains(&(add.group.clone(), p.clone())) {
                    pending.push(p.clone());
                    continue;
                }
                match self.record(&add.group, p).map(|r| r.state) {
                    Some(JobState::Waiting | JobState::Running | JobState::Failed) => {
                        pending.push(p.clone())
                    }
                    Some(JobState::Succeeded) => {}
                    Some(state) => refusals.push(Refusal::AfterEnded {
                        index,
                        key: Arc::from(p.as_str()),
                        state,
                    }),
                    None => refusals.push(Refusal::AfterUnknown {
                        index,
                        key: Arc::from(p.as_str()),
                    }),
                }
            }
            plans.push(Plan::New(pending));
        }
        plans
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
            if Self::resolve(add.timespec, now).is_none() {
                refusals.push(Self::out_of_range(ListName::Adds, index, add.timespec));
            }
        }
        let plans = self.plan(&u.adds, &mut refusals);
        let mut retakes: Vec<(u64, String)> = vec![];
        for (index, change) in u.updates.iter().enumerate() {
            refusals.extend(self.modifiable(ListName::Updates, change.id, u.client, now));
            let Some(when) = Self::resolve(change.timespec, now) else {
                refusals.push(Self::out_of_range(
                    ListName::Updates,
                    index,
                    change.timespec,
                ));
                continue;
            };
            // From form 4, a retake of a lapsed lease is held to max_running.
            let Some(t) = self.tasks.get(&change.id) else {
                continue;
            };
            if !t.job.leased
                && when > now
                && self.log_form >= 4
                && t.owner == u.client
                && self.lapsed_holder(t, u.client)
                && !retakes.iter().any(|(id, _)| *id == change.id)
            {
                let max = self.settings_of(&t.group).max_running;
                let running = self
                    .tasks
                    .values()
                    .filter(|x| *x.group == *t.group && x.job.leased)
                    .count()
                    + retakes.iter().filter(|(_, g)| **g == *t.group).count();
                if max > 0 && running >= max as usize {
                    refusals.push(Refusal::RetakeOverLimit {
                        id: change.id,
                        ended_at: t.available_at,
                        max_running: max,
                    });
                } else {
                    retakes.push((change.id, t.group.to_string()));
                }
            }
        }
        for &id in &u.deletes {
            refusals.extend(self.modifiable(ListName::Deletes, id, u.client, now));
        }
        refusals.extend(self.missing_depends(&u.depends));
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut out = vec![];
        for (add, plan) in u.adds.iter().zip(plans) {
            let when = Self::resolve(add.timespec, now).expect("checked");
            match plan {
                Plan::Plain => {
                    let job = TaskJob {
                        priority: add.job.priority,
                        ..TaskJob::default()
                    };
                    out.push(self.new_task(&add.group, &add.data, when, u.client, job));
                }
                Plan::Kept(id, resubmit) => {
                    let key = add.job.key.clone().expect("key");
                    let record = self.record_mut(&add.group, &key);
                    if resubmit && record.state == JobState::Running {
                        record.resubmit = Some(add.data.clone());
                    }
                    out.push(self.tasks[&id].clone());
                }
                Plan::New(pending) => {
                    let key = add.job.key.clone().expect("key");
                    let previous = self.record(&add.group, &key).cloned();
                    let record = JobRecord {
                        group: Arc::from(add.group.as_str()),
                        key: Arc::from(key.as_str()),
                        state: JobState::Waiting,
                        task: None,
                        data: None,
                        priority: add.job.priority,
                        max_attempts: add.job.max_attempts,
                        every_ms: add.job.every_ms,
                        run: previous.as_ref().map_or(1, |p| p.run + 1),
                        attempts: 0,
                        attempts_forgiven: 0,
                        history: previous.map(|p| p.history).unwrap_or_default(),
                        result: None,
                        reason: None,
                        created_at: at(now),
                        finished_at: None,
                        expires_at: None,
                        after: pending.iter().map(|k| Arc::from(k.as_str())).collect(),
                        dependants: vec![],
                        resubmit: None,
                        cancelled_task: None,
                        id: None,
                    };
                    self.records
                        .insert((add.group.clone(), key.clone()), record);
                    for p in &pending {
                        self.record_mut(&add.group, p)
                            .dependants
                            .push(Arc::from(key.as_str()));
                    }
                    let job = TaskJob {
                        key: Some(Arc::from(key.as_str())),
                        priority: add.job.priority,
                        attempt: 0,
                        leased: false,
                    };
                    let task = self.new_task(&add.group, &add.data, when, u.client, job);
                    self.record_mut(&add.group, &key).id = Some(task.id);
                    out.push(task);
                }
            }
        }
        for change in &u.updates {
            let old = self.tasks.remove(&change.id).expect("checked");
            let when = Self::resolve(change.timespec, now).expect("checked");
            let mut job = old.job.clone();
            job.leased = old.job.leased && when > now;
            if old.job.leased
                && !job.leased
                && let Some(key) = &old.job.key
            {
                let record = self.record_mut(&old.group, key);
                let last = record.history.last_mut().expect("open attempt");
                last.ended_at = Some(at(now));
                last.end = Some(AttemptEnd::Released);
                record.state = JobState::Waiting;
            }
            // From form 4, the lapsed holder's renewal into the future retakes the lease.
            if !old.job.leased
                && when > now
                && self.log_form >= 4
                && old.owner == u.client
                && self.lapsed_holder(&old, u.client)
                && let Some(key) = &old.job.key
            {
                let record = self.record_mut(&old.group, key);
                let last = record.history.last_mut().expect("the lost attempt");
                last.ended_at = None;
                last.end = None;
                record.state = JobState::Running;
                job.leased = true;
            }
            out.push(self.new_task(&old.group, &change.data, when, u.client, job));
        }
        for id in &u.deletes {
            let Some(old) = self.tasks.remove(id) else {
                continue;
            };
            let Some(key) = old.job.key.clone() else {
                continue;
            };
            let late_finish = old.owner == u.client && self.lapsed_holder(&old, u.client);
            if old.job.leased || late_finish {
                self.succeeded(old, None, now);
            } else {
                let group = old.group.to_string();
                self.cancel_all(
                    &group,
                    &key,
                    format!("deleted by client {}", u.client),
                    Some(old),
                    now,
                );
            }
        }
        Outcome::Tasks(out)
    }

    /// Up to `count` claims in a row, after one check of the request; stops at the
    /// first that finds nothing or once the claimed data reaches the limit.
    fn claim(&mut self, c: &ClaimRequest, count: u32, now: i64) -> Outcome {
        let refusals = self.claim_checks(c, count);
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut claimed: Vec<Task> = vec![];
        while claimed.len() < count as usize
            && claimed.iter().map(|t| t.data.len()).sum::<usize>() < CLAIM_DATA_BYTES_MAX
        {
            match self.claim_one(c, now) {
                Some(task) => claimed.push(task),
                None => break,
            }
        }
        Outcome::Tasks(claimed)
    }

    /// A finish, then a claim by the same client: refused as a whole if either would be.
    fn finish_and_claim(&mut self, b: &FinishAndClaimRequest, now: i64) -> Outcome {
        let mut refusals = vec![];
        if b.next.claim.client != b.finish.client {
            refusals.push(invalid(
                "next",
                "claims for another client than the finish's; one client does both",
            ));
        }
        if !b.next.claim.depends.is_empty() {
            refusals.push(invalid(
                "next",
                "names depends; claim with depends on its own (POST /claim)",
            ));
        }
        let f = &b.finish;
        refusals.extend(self.finish_checks(f.client, f.id, &f.result, CLAIMED_ONLY, now));
        refusals.extend(self.claim_checks(&b.next.claim, b.next.count));
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        self.finish_one(f.id, f.result.clone(), now);
        self.claim(&b.next.claim, b.next.count, now)
    }

    fn claim_checks(&self, c: &ClaimRequest, count: u32) -> Vec<Refusal> {
        let mut refusals = vec![];
        if c.group.is_empty() {
            refusals.push(Refusal::ClaimWithoutGroup);
        }
        if count == 0 || count > CLAIM_COUNT_MAX {
            refusals.push(Refusal::InvalidCount { count });
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
        refusals
    }

    /// One claim of a checked request: the task it takes, if any.
    fn claim_one(&mut self, c: &ClaimRequest, now: i64) -> Option<Task> {
        let settings = self.settings_of(&c.group);
        let running = self
            .tasks
            .values()
            .filter(|t| *t.group == *c.group && t.job.leased)
            .count();
        if settings.paused || (settings.max_running > 0 && running >= settings.max_running as usize)
        {
            return None;
        }
        let pick = self
            .tasks
            .values()
            .filter(|t| {
                *t.group == *c.group
                    && t.available_at.as_millis() <= now
                    && !c.depends.contains(&t.id)
                    && !self.blocked(t)
            })
            .min_by_key(|t| (-(t.job.priority as i128), t.available_at, t.id))
            .cloned();
        let old = pick?;
        self.tasks.remove(&old.id);
        let mut job = old.job.clone();
        job.leased = true;
        if let Some(key) = &old.job.key {
            let record = self.record_mut(&old.group, key);
            record.attempts += 1;
            record.state = JobState::Running;
            record.history.push(Attempt {
                run: record.run,
                number: record.attempts,
                owner: c.client,
                started_at: at(now),
                ended_at: None,
                end: None,
            });
            if record.history.len() > JOB_ATTEMPT_HISTORY_MAX {
                record.history.remove(0);
            }
            job.attempt = record.attempts;
        }
        Some(self.new_task(&old.group, &old.data, now + c.duration_ms, c.client, job))
    }

    fn blocked(&self, task: &Task) -> bool {
        task.job
            .key
            .as_ref()
            .and_then(|k| self.record(&task.group, k))
            .is_some_and(|r| !r.after.is_empty())
    }

    fn held(
        &self,
        list: ListName,
        id: u64,
        client: i64,
        claimed_only: bool,
        now: i64,
    ) -> Option<Refusal> {
        match self.tasks.get(&id) {
            None => Some(self.missing(list, id)),
            Some(t) if t.owner != client || t.available_at.as_millis() <= now => {
                Some(Refusal::NotHeld {
                    list,
                    id,
                    owner: t.owner,
                    available_at: t.available_at,
                })
            }
            // A job's outcome is an attempt's: only a claimed version can have one, or
            // one its lapsed holder took back before anybody claimed it. Entries of
            // builds before that rule keep theirs (any owned version).
            Some(t) if claimed_only && !t.job.leased => t.job.key.as_ref().and_then(|key| {
                (!self.lapsed_holder(t, client)).then(|| Refusal::NotClaimed {
                    list,
                    id,
                    key: Arc::clone(key),
                })
            }),
            Some(_) => None,
        }
    }

    fn finish(&mut self, f: &FinishRequest, claimed_only: bool, now: i64) -> Outcome {
        let refusals = self.finish_checks(f.client, f.id, &f.result, claimed_only, now);
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        self.finish_one(f.id, f.result.clone(), now);
        Outcome::Tasks(vec![])
    }

    /// All of them or none: every task checked first, in order, each named once.
    fn finish_many(&mut self, m: &FinishManyRequest, claimed_only: bool, now: i64) -> Outcome {
        let n = m.finishes.len();
        if n == 0 || n > FINISH_COUNT_MAX {
            return Outcome::Refused(vec![invalid(
                "finishes",
                format!("names {n} tasks; name from 1 to {FINISH_COUNT_MAX}"),
            )]);
        }
        let mut refusals = vec![];
        for (i, item) in m.finishes.iter().enumerate() {
            if m.finishes[..i].iter().any(|earlier| earlier.id == item.id) {
                refusals.push(invalid(
                    "finishes",
                    format!("names task {} twice; name each task once", item.id),
                ));
            } else {
                refusals.extend(self.finish_checks(
                    m.client,
                    item.id,
                    &item.result,
                    claimed_only,
                    now,
                ));
            }
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        for item in &m.finishes {
            self.finish_one(item.id, item.result.clone(), now);
        }
        Outcome::Tasks(vec![])
    }

    fn finish_checks(
        &self,
        client: i64,
        id: u64,
        result: &Option<String>,
        claimed_only: bool,
        now: i64,
    ) -> Vec<Refusal> {
        let mut refusals = vec![];
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
        refusals.extend(self.held(ListName::Finish, id, client, claimed_only, now));
        refusals
    }

    fn finish_one(&mut self, id: u64, result: Option<String>, now: i64) {
        let task = self.tasks.remove(&id).expect("held");
        if task.job.key.is_some() {
            self.succeeded(task, result, now);
        }
    }

    fn succeeded(&mut self, task: Task, result: Option<String>, now: i64) {
        let key = task.job.key.clone().expect("key");
        let group = task.group.to_string();
        let record = self.record_mut(&group, &key);
        if let Some(last) = record.history.last_mut().filter(|a| a.end.is_none()) {
            last.ended_at = Some(at(now));
            last.end = Some(AttemptEnd::Succeeded);
        }
        record.state = JobState::Succeeded;
        record.task = None;
        record.result = result;
        record.reason = None;
        record.finished_at = Some(at(now));
        let dependants = std::mem::take(&mut record.dependants);
        let again = match (record.resubmit.take(), record.every_ms) {
            (Some(data), _) => Some((data, now)),
            (None, Some(every)) => Some((task.data.clone(), now + every)),
            (None, None) => None,
        };
        for d in dependants {
            let r = self.record_mut(&group, &d);
            r.after.retain(|k| **k != *key);
        }
        match again {
            Some((data, when)) => {
                let record = self.record_mut(&group, &key);
                record.run += 1;
                record.attempts = 0;
                record.attempts_forgiven = 0;
                record.state = JobState::Waiting;
                record.created_at = at(now);
                let job = TaskJob {
                    key: Some(Arc::clone(&key)),
                    priority: record.priority,
                    attempt: 0,
                    leased: false,
                };
                let again = self.new_task(&group, &data, when, task.owner, job);
                self.record_mut(&group, &key).id = Some(again.id);
            }
            None => self.expire_later(&group, &key, now),
        }
    }

    fn expire_later(&mut self, group: &str, key: &str, now: i64) {
        let retention = self.settings_of(group).retention_ms;
        self.record_mut(group, key).expires_at = Some(at(now + retention));
    }

    fn dead(&mut self, group: &str, key: &str, data: String, reason: String, now: i64) {
        let record = self.record_mut(group, key);
        record.state = JobState::Dead;
        record.task = None;
        record.data = Some(data);
        record.reason = Some(reason);
        record.finished_at = Some(at(now));
        let dependants = std::mem::take(&mut record.dependants);
        for d in dependants {
            self.cancel_all(
                group,
                &d,
                format!("prerequisite {key:?} is dead"),
                None,
                now,
            );
        }
    }

    /// Cancels `key` and everything that waits for it, depth first as a stack.
    fn cancel_all(
        &mut self,
        group: &str,
        key: &str,
        reason: String,
        removed: Option<Task>,
        now: i64,
    ) {
        let mut work = vec![(key.to_string(), reason, removed)];
        while let Some((key, reason, removed)) = work.pop() {
            let Some(record) = self.record(group, &key).cloned() else {
                continue;
            };
            let removed = match removed {
                Some(t) => Some(t),
                None if matches!(
                    record.state,
                    JobState::Waiting | JobState::Running | JobState::Failed
                ) =>
                {
                    record.task.and_then(|id| self.tasks.remove(&id))
                }
                None if record.state == JobState::Dead => None,
                None => continue,
            };
            let removed_id = removed.as_ref().map(|t| t.id);
            let record = self.record_mut(group, &key);
            if let Some(last) = record.history.last_mut().filter(|a| a.end.is_none()) {
                last.ended_at = Some(at(now));
                last.end = Some(AttemptEnd::Cancelled);
            }
            record.state = JobState::Cancelled;
            record.task = None;
            if let Some(t) = removed {
                record.data = Some(t.data);
            }
            record.reason = Some(reason);
            record.finished_at = Some(at(now));
            record.resubmit = None;
            record.cancelled_task = removed_id;
            let prerequisites = std::mem::take(&mut record.after);
            let dependants = std::mem::take(&mut record.dependants);
            for p in prerequisites {
                self.record_mut(group, &p)
                    .dependants
                    .retain(|d| **d != *key);
            }
            self.expire_later(group, &key, now);
            let because = format!("prerequisite {key:?} was cancelled");
            for d in dependants {
                work.push((d.to_string(), because.clone(), None));
            }
        }
    }

    fn fail(&mut self, f: &FailRequest, claimed_only: bool, now: i64) -> Outcome {
        let mut refusals = vec![];
        if f.error.len() > JOB_ERROR_BYTES_MAX {
            refusals.push(invalid(
                "error",
                format!(
                    "is {} bytes; the limit is {JOB_ERROR_BYTES_MAX}",
                    f.error.len()
                ),
            ));
        }
        if let Some(delay) = f.retry_in_ms
            && !(0..=JOB_INTERVAL_MS_MAX).contains(&delay)
        {
            refusals.push(invalid(
                "retry_in_ms",
                format!("{delay} is not between 0 and {JOB_INTERVAL_MS_MAX}"),
            ));
        }
        refusals.extend(self.held(ListName::Fail, f.id, f.client, claimed_only, now));
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let task = self.tasks.remove(&f.id).expect("held");
        let group = task.group.to_string();
        let backoff = self.settings_of(&group).backoff;
        let seed = task.id ^ now as u64;
        let Some(key) = task.job.key.clone() else {
            let delay = f
                .retry_in_ms
                .unwrap_or_else(|| backoff.jittered_ms(1, seed));
            let job = TaskJob {
                priority: task.job.priority,
                ..TaskJob::default()
            };
            return Outcome::Tasks(vec![self.new_task(
                &group,
                &task.data,
                now + delay,
                f.client,
                job,
            )]);
        };
        let limit = self.limit(&group, &key);
        let record = self.record_mut(&group, &key);
        if let Some(last) = record.history.last_mut().filter(|a| a.end.is_none()) {
            last.ended_at = Some(at(now));
            last.end = Some(AttemptEnd::Failed(f.error.clone()));
        }
        let counted = record.attempts - record.attempts_forgiven;
        if limit > 0 && counted >= limit {
            let first_line = f.error.lines().next().unwrap_or("");
            let mut end = first_line.len().min(200);
            while !first_line.is_char_boundary(end) {
                end -= 1;
            }
            let reason = format!(
                "attempt {} failed: {}",
                task.job.attempt,
                &first_line[..end]
            );
            self.dead(&group, &key, task.data, reason, now);
            return Outcome::Tasks(vec![]);
        }
        let delay = f
            .retry_in_ms
            .unwrap_or_else(|| backoff.jittered_ms(counted.max(1), seed));
        let job = TaskJob {
            leased: false,
            ..task.job.clone()
        };
        let retry = self.new_task(&group, &task.data, now + delay, f.client, job);
        self.record_mut(&group, &key).state = JobState::Failed;
        Outcome::Tasks(vec![retry])
    }

    fn named(&self, group: &str, keys: &[String], refusals: &mut Vec<Refusal>) -> Vec<JobRecord> {
        if group.is_empty() {
            refusals.push(invalid("group", "is missing or empty"));
        }
        if keys.is_empty() {
            refusals.push(invalid("keys", "name at least one key"));
        }
        let mut seen = BTreeSet::new();
        let mut out = vec![];
        for (n, key) in keys.iter().enumerate() {
            if let Some(r) = key_refusal(format!("keys[{n}]"), key) {
                refusals.push(r);
                continue;
            }
            if !seen.insert(key.clone()) {
                continue;
            }
            match self.record(group, key) {
                Some(r) => out.push(r.clone()),
                None => refusals.push(Refusal::UnknownKey {
                    key: Arc::from(key.as_str()),
                }),
            }
        }
        out
    }

    fn cancel(&mut self, c: &CancelRequest, now: i64) -> Outcome {
        let mut refusals = vec![];
        let records = self.named(&c.group, &c.keys, &mut refusals);
        for r in &records {
            if r.state == JobState::Succeeded {
                refusals.push(Refusal::WrongState {
                    key: Arc::clone(&r.key),
                    state: r.state,
                    needed: "a job that succeeded cannot be cancelled".into(),
                });
            }
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        for r in records {
            self.cancel_all(
                &c.group,
                &r.key,
                format!("cancelled by client {}", c.client),
                None,
                now,
            );
        }
        Outcome::Tasks(vec![])
    }

    fn retry(&mut self, r: &RetryRequest, now: i64) -> Outcome {
        let mut refusals = vec![];
        let records = self.named(&r.group, &r.keys, &mut refusals);
        for record in &records {
            if record.state != JobState::Dead {
                refusals.push(Refusal::WrongState {
                    key: Arc::clone(&record.key),
                    state: record.state,
                    needed: "only dead jobs can be retried".into(),
                });
            }
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut out = vec![];
        for old in records {
            let record = self.record_mut(&r.group, &old.key);
            record.attempts_forgiven = record.attempts;
            record.state = JobState::Waiting;
            record.reason = None;
            record.finished_at = None;
            let data = record.data.take().unwrap_or_default();
            let job = TaskJob {
                key: Some(Arc::clone(&old.key)),
                priority: old.priority,
                attempt: old.attempts,
                leased: false,
            };
            out.push(self.new_task(&r.group, &data, now, r.client, job));
        }
        Outcome::Tasks(out)
    }

    fn change_settings(&mut self, s: &SettingsRequest) -> Outcome {
        let mut refusals = vec![];
        if s.group.is_empty() {
            refusals.push(invalid("group", "is missing or empty"));
        }
        let c = &s.change;
        if let Some(b) = &c.backoff {
            if !(0..=JOB_RETENTION_MS_MAX).contains(&b.base_ms) {
                refusals.push(invalid(
                    "backoff.base_ms",
                    format!("{} is not between 0 and {JOB_RETENTION_MS_MAX}", b.base_ms),
                ));
            }
            if !(b.base_ms.max(0)..=JOB_RETENTION_MS_MAX).contains(&b.max_ms) {
                refusals.push(invalid(
                    "backoff.max_ms",
                    format!(
                        "{} is not between base_ms and {JOB_RETENTION_MS_MAX}",
                        b.max_ms
                    ),
                ));
            }
            if !(1000..=BACKOFF_FACTOR_MILLI_MAX).contains(&b.factor_milli) {
                refusals.push(invalid(
                    "backoff.factor",
                    format!(
                        "{} is not between 1 and {}",
                        b.factor_milli as f64 / 1000.0,
                        BACKOFF_FACTOR_MILLI_MAX / 1000
                    ),
                ));
            }
        }
        if let Some(r) = c.retention_ms
            && !(0..=JOB_RETENTION_MS_MAX).contains(&r)
        {
            refusals.push(invalid(
                "retention_ms",
                format!("{r} is not between 0 and {JOB_RETENTION_MS_MAX}"),
            ));
        }
        if !refusals.is_empty() {
            return Outcome::Refused(refusals);
        }
        let mut settings = self.settings_of(&s.group);
        settings.max_running = c.max_running.unwrap_or(settings.max_running);
        settings.paused = c.paused.unwrap_or(settings.paused);
        settings.max_attempts = c.max_attempts.unwrap_or(settings.max_attempts);
        settings.backoff = c.backoff.unwrap_or(settings.backoff);
        settings.retention_ms = c.retention_ms.unwrap_or(settings.retention_ms);
        if settings == GroupSettings::default() {
            self.settings.remove(&s.group);
        } else {
            self.settings.insert(s.group.clone(), settings);
        }
        Outcome::Settings(settings)
    }
}

/// One refusal per id named more than once, in order of its second mention.
pub fn duplicate_refusals(named: impl Iterator<Item = (ListName, u64)>) -> Vec<Refusal> {
    let mut counted = BTreeSet::new();
    let mut reported = BTreeSet::new();
    named
        .filter(|&(_, id)| !counted.insert(id) && reported.insert(id))
        .map(|(list, id)| Refusal::Duplicate { list, id })
        .collect()
}

/// Whether two requests ask the same: a waiting claim is a claim, the seed's update is
/// an update.
fn same_request(a: &Request, b: &Request) -> bool {
    let plain = |request: &Request| match request.unscoped() {
        Request::LegacyUpdate(update) => Request::Update(update.clone()),
        Request::WaitingClaim(claim) => Request::Claim(claim.clone()),
        Request::WaitingClaimMany(many) => Request::ClaimMany(many.clone()),
        // A retry sent across an upgrade, in the other form, is the same request.
        Request::LegacyFinish(finish) => Request::Finish(finish.clone()),
        Request::LegacyFinishMany(many) => Request::FinishMany(many.clone()),
        Request::LegacyFail(fail) => Request::Fail(fail.clone()),
        other => other.clone(),
    };
    plain(a) == plain(b)
}
