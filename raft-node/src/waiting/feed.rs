//! The change feed: every change this node applies, kept per group for a while, with a
//! signal per group that wakes whoever waits on it (watches, blocking claims, waits for
//! outcomes). Fed in log order by the state machine (through [`super::Observer`]), so a group's
//! changes are never out of order or skipped, on a follower as on the leader; only the
//! oldest are forgotten, and a watch that asks for them is told so (410).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use rpc::watch::WatchEventJson;
use store_sm::machine::Change;
use store_sm::machine::GroupName;
use store_sm::state_machine::AppliedState;
use tokio::sync::Notify;

use crate::json::job_json;
use crate::json::settings_json;
use crate::json::task_json;

/// Most changes the feed keeps, all groups together; the oldest go first.
pub const FEED_CHANGES_MAX: usize = 100_000;

/// Most bytes (roughly: payloads, results and a fixed cost per change) the feed keeps.
pub const FEED_BYTES_MAX: usize = 64 * 1024 * 1024;

/// What one kept change costs beyond its payload.
const CHANGE_OVERHEAD_BYTES: usize = 160;

/// A page of one group's changes.
#[derive(Debug)]
pub struct FeedPage {
    /// Ask from this revision next.
    pub revision: u64,
    /// The changes after the asked revision, oldest first.
    pub changes: Vec<Arc<WatchEventJson>>,
}

/// Why a page cannot be given.
#[derive(Debug, PartialEq, Eq)]
pub struct Forgotten {
    /// The feed's current revision.
    pub revision: u64,
    /// The oldest `after` the feed can answer.
    pub oldest: u64,
    /// The asked revision was ahead of everything this node has, not behind what it
    /// keeps (a revision of the cluster before a restore, or of a node far ahead).
    pub ahead: bool,
}

#[derive(Default)]
struct GroupFeed {
    changes: VecDeque<Arc<WatchEventJson>>,
    signal: Arc<Notify>,
}

#[derive(Default)]
struct FeedState {
    /// Every change after this revision is kept (or was trimmed from every group alike).
    oldest: u64,
    /// The last applied log index.
    revision: u64,
    groups: BTreeMap<GroupName, GroupFeed>,
    /// Every kept change's group and cost, oldest first, to trim in log order.
    order: VecDeque<(u64, GroupName, usize)>,
    bytes: usize,
    /// Groups the entry being applied touched so far: a batch's commands are kept one
    /// by one, and their groups woken once the entry is done.
    touched_in_entry: Vec<GroupName>,
}

/// The change feed of one node. See the module documentation.
#[derive(Default)]
pub struct ChangeFeed {
    state: Mutex<FeedState>,
    /// Commands applied since the node started (a batch's each, and every entry
    /// without one), for the snapshot keeper.
    commands: AtomicU64,
}

impl ChangeFeed {
    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Commands applied since the node started: a batch's each, and every entry
    /// without one.
    pub fn commands_applied(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }

    /// The last applied log index.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// [`Forgotten`] if revision `after` is past both what this feed has applied and
    /// `log_end`, the last entry this node's log holds: no change of this cluster ever
    /// had it, so a page after it would silently skip every change up to it.
    pub fn check_not_ahead(&self, after: u64, log_end: u64) -> Result<(), Forgotten> {
        let state = self.lock();
        if after > state.revision.max(log_end) {
            return Err(Forgotten {
                revision: state.revision,
                oldest: state.oldest,
                ahead: true,
            });
        }
        Ok(())
    }

    /// The changes of `group` after revision `after`, whole revisions only, at least
    /// `limit` unless fewer exist; [`Forgotten`] if some after `after` were trimmed.
    pub fn page(&self, group: &str, after: u64, limit: usize) -> Result<FeedPage, Forgotten> {
        let state = self.lock();
        if after < state.oldest {
            return Err(Forgotten {
                revision: state.revision,
                oldest: state.oldest,
                ahead: false,
            });
        }
        let Some(feed) = state.groups.get(group) else {
            return Ok(FeedPage {
                revision: state.revision.max(after),
                changes: Vec::new(),
            });
        };
        let start = feed.changes.partition_point(|c| c.revision() <= after);
        let mut changes: Vec<Arc<WatchEventJson>> = Vec::new();
        for change in feed.changes.range(start..) {
            // An entry still being applied (a batch's first commands) is not told yet:
            // a page that ended inside it would skip its other changes.
            if change.revision() > state.revision {
                break;
            }
            let full = changes.len() >= limit;
            if full && changes.last().map(|c| c.revision()) != Some(change.revision()) {
                let revision = changes.last().map_or(after, |c| c.revision());
                return Ok(FeedPage { revision, changes });
            }
            changes.push(Arc::clone(change));
        }
        Ok(FeedPage {
            revision: state.revision.max(after),
            changes,
        })
    }

    /// The signal of `group`: notified (all waiters) whenever a change of the group is
    /// applied and when the feed is reset. Enable a `notified()` future before looking
    /// at the state it guards, so that no change slips between.
    pub fn signal(&self, group: &str) -> Arc<Notify> {
        let mut state = self.lock();
        match state.groups.get(group) {
            Some(feed) => Arc::clone(&feed.signal),
            None => {
                let feed = GroupFeed::default();
                let signal = Arc::clone(&feed.signal);
                state.groups.insert(Arc::from(group), feed);
                signal
            }
        }
    }

    /// Forgets `group`'s entry if it holds no change and nobody holds its signal.
    pub fn release(&self, group: &str) {
        let mut state = self.lock();
        let unused = state
            .groups
            .get(group)
            .is_some_and(|f| f.changes.is_empty() && Arc::strong_count(&f.signal) == 1);
        if unused {
            state.groups.remove(group);
        }
    }

    /// Groups with an entry (changes kept or a signal held).
    #[cfg(test)]
    fn groups(&self) -> usize {
        self.lock().groups.len()
    }

    /// Changes kept, for metrics.
    pub fn kept(&self) -> usize {
        self.lock().order.len()
    }
}

/// What one command's changes become: one event per task version and per job record
/// (its state after the command), in the order the journal first names them.
fn events(
    index: u64,
    applied: &AppliedState,
    changes: &[Change],
) -> Vec<(GroupName, WatchEventJson)> {
    let machine = &applied.machine;
    let mut written = BTreeSet::new();
    let mut jobs_seen = BTreeSet::new();
    let mut events = Vec::new();
    for change in changes {
        match change {
            Change::TaskWritten(id) => {
                if let Some(task) = machine.task(*id) {
                    written.insert(*id);
                    let event = WatchEventJson::Task {
                        revision: index,
                        task: task_json(task),
                    };
                    events.push((Arc::clone(&task.group), event));
                }
            }
            // A version written and removed by one command was never visible.
            Change::TaskRemoved { group, id } if !written.contains(id) => {
                let event = WatchEventJson::Removed {
                    revision: index,
                    id: *id,
                };
                events.push((Arc::clone(group), event));
            }
            Change::TaskRemoved { .. } => {}
            Change::Job { group, key } => {
                if !jobs_seen.insert((Arc::clone(group), Arc::clone(key))) {
                    continue;
                }
                if let Some(record) = machine.job(group, key) {
                    let event = WatchEventJson::Job {
                        revision: index,
                        job: Box::new(job_json(machine, record)),
                    };
                    events.push((Arc::clone(group), event));
                }
            }
            Change::JobDropped { group, key } => {
                let event = WatchEventJson::JobDropped {
                    revision: index,
                    key: key.to_string(),
                };
                events.push((Arc::clone(group), event));
            }
            Change::Settings(group) => {
                let settings = machine.group_settings(group);
                let running = machine.running_in_group(group);
                let event = WatchEventJson::Settings {
                    revision: index,
                    settings: settings_json(group, &settings, running),
                };
                events.push((Arc::clone(group), event));
            }
        }
    }
    events
}

/// What a kept change holds in memory, roughly: every string and list it carries, so
/// that the byte bound holds whatever a job's keys, prerequisites, dependants and
/// history hold (a job with many dependants is stored whole at each of its changes).
fn cost(event: &WatchEventJson) -> usize {
    CHANGE_OVERHEAD_BYTES
        + match event {
            WatchEventJson::Task { task, .. } => {
                task.data.len() + task.group.len() + task.key.as_ref().map_or(0, String::len)
            }
            WatchEventJson::Job { job, .. } => {
                let strings = |list: &[String]| {
                    list.iter()
                        .map(|s| s.len() + STRING_OVERHEAD_BYTES)
                        .sum::<usize>()
                };
                job.group.len()
                    + job.key.len()
                    + job.state.len()
                    + job.data.as_ref().map_or(0, String::len)
                    + job.result.as_ref().map_or(0, |r| r.to_string().len())
                    + job.reason.as_ref().map_or(0, String::len)
                    + job
                        .history
                        .iter()
                        .map(|a| {
                            ATTEMPT_OVERHEAD_BYTES
                                + a.outcome.len()
                                + a.error.as_ref().map_or(0, String::len)
                        })
                        .sum::<usize>()
                    + strings(&job.after)
                    + strings(&job.dependants)
            }
            WatchEventJson::Removed { .. }
            | WatchEventJson::JobDropped { .. }
            | WatchEventJson::Settings { .. } => 0,
        }
}

/// What a string in a list costs beyond its bytes (its header).
const STRING_OVERHEAD_BYTES: usize = 24;

/// What an attempt of a job's history costs beyond its strings.
const ATTEMPT_OVERHEAD_BYTES: usize = 80;

impl FeedState {
    /// Drops the oldest changes until the feed is within its bounds, whole revisions at
    /// a time, so that `oldest` always splits the log between two revisions.
    fn trim(&mut self) {
        while self.order.len() > FEED_CHANGES_MAX || self.bytes > FEED_BYTES_MAX {
            let Some(&(revision, _, _)) = self.order.front() else {
                return;
            };
            while self.order.front().is_some_and(|(r, _, _)| *r == revision) {
                let Some((_, group, bytes)) = self.order.pop_front() else {
                    break;
                };
                self.bytes -= bytes;
                let now_unused = match self.groups.get_mut(&group) {
                    Some(feed) => {
                        feed.changes.pop_front();
                        feed.changes.is_empty() && Arc::strong_count(&feed.signal) == 1
                    }
                    None => false,
                };
                if now_unused {
                    self.groups.remove(&group);
                }
            }
            self.oldest = revision;
        }
    }
}

impl ChangeFeed {
    /// Keeps the changes of a command of the entry at `index` (`applied` is the state
    /// after it) and returns the groups they touch. Once the entry's `last` command is
    /// kept, its changes are told: the feed's revision moves to `index` and every group
    /// the entry touched is woken.
    pub fn record(
        &self,
        index: u64,
        applied: &AppliedState,
        changes: &[Change],
        last: bool,
    ) -> Vec<GroupName> {
        self.commands.fetch_add(1, Ordering::Relaxed);
        let mut events = events(index, applied, changes);
        if store_sm::planted::is_planted(store_sm::planted::Bug::WatchSkip)
            && index.is_multiple_of(7)
        {
            events.clear();
        }
        let mut state = self.lock();
        let mut touched: Vec<GroupName> = Vec::new();
        for (group, event) in events {
            let bytes = cost(&event);
            state.bytes += bytes;
            state.order.push_back((index, Arc::clone(&group), bytes));
            let feed = state.groups.entry(Arc::clone(&group)).or_default();
            feed.changes.push_back(Arc::new(event));
            if touched.last() != Some(&group) {
                touched.push(group);
            }
        }
        touched.sort();
        touched.dedup();
        if !last {
            state.touched_in_entry.extend(touched.iter().cloned());
            return touched;
        }
        state.revision = index;
        // A batch's earlier commands touched these too; an entry of one command, none.
        let mut woken = std::mem::take(&mut state.touched_in_entry);
        if !woken.is_empty() {
            woken.extend(touched.iter().cloned());
            woken.sort();
            woken.dedup();
        }
        let woken = if woken.is_empty() { &touched } else { &woken };
        for group in woken {
            if let Some(feed) = state.groups.get(group) {
                feed.signal.notify_waiters();
            }
        }
        state.trim();
        touched
    }

    /// Forgets every change: the state was replaced whole as of `index`. Wakes every
    /// waiter, so that a watch behind `index` learns its revision is forgotten.
    pub fn reset(&self, index: u64) {
        let mut state = self.lock();
        state.revision = index;
        state.touched_in_entry.clear();
        state.oldest = index;
        state.order.clear();
        state.bytes = 0;
        state
            .groups
            .retain(|_, feed| Arc::strong_count(&feed.signal) > 1);
        for feed in state.groups.values_mut() {
            feed.changes.clear();
            feed.signal.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use store_sm::machine::AddTask;
    use store_sm::machine::ClaimRequest;
    use store_sm::machine::Command;
    use store_sm::machine::LogTime;
    use store_sm::machine::Request;
    use store_sm::machine::UpdateRequest;

    use super::*;

    /// A machine fed command by command, each one log index further.
    struct Log {
        state: AppliedState,
        index: u64,
        feed: ChangeFeed,
    }

    impl Log {
        fn new() -> Self {
            Self {
                state: AppliedState::default(),
                index: 0,
                feed: ChangeFeed::default(),
            }
        }

        fn apply(&mut self, request: Request) {
            self.index += 1;
            self.apply_part(request, true);
        }

        /// Applies one command of the entry at the current index; `last` ends it.
        fn apply_part(&mut self, request: Request, last: bool) {
            self.state.machine.apply(&Command {
                stamp: LogTime::from_millis(1_000 + self.index as i64),
                request_id: None,
                request,
            });
            let changes = self.state.machine.changes().to_vec();
            self.feed.record(self.index, &self.state, &changes, last);
        }

        fn add(&mut self, group: &str, data: &str) {
            self.apply(add_request(group, data));
        }
    }

    fn add_request(group: &str, data: &str) -> Request {
        Request::Update(UpdateRequest {
            client: 1,
            adds: vec![AddTask::seed(group, data, None)],
            ..UpdateRequest::default()
        })
    }

    #[test]
    fn a_job_change_costs_its_prerequisites_and_dependants() {
        let mut log = Log::new();
        let job = |key: String, after: Vec<String>| {
            let mut add = AddTask::seed("g", "", Some(i64::MAX / 2));
            add.job.key = Some(key);
            add.job.after = after;
            Request::Update(UpdateRequest {
                client: 1,
                adds: vec![add],
                ..UpdateRequest::default()
            })
        };
        log.apply(job("x".into(), vec![]));
        // Each add also changes x, whose record then lists every dependant so far: the
        // feed holds x whole at each of those changes.
        let dependants = 100;
        let key_bytes = 200;
        for i in 0..dependants {
            log.apply(job(format!("{i:0key_bytes$}"), vec!["x".into()]));
        }
        let held = log.feed.lock().bytes;
        let listed: usize = (1..=dependants).map(|n| n * key_bytes).sum();
        assert!(
            held > listed,
            "{held} bytes counted for {listed} bytes of dependants"
        );
    }

    fn revisions(page: &FeedPage) -> Vec<u64> {
        page.changes.iter().map(|c| c.revision()).collect()
    }

    #[test]
    fn a_group_sees_its_own_changes_in_log_order() {
        let mut log = Log::new();
        log.add("a", "1");
        log.add("b", "2");
        log.add("a", "3");
        log.apply(Request::Claim(ClaimRequest {
            client: 7,
            group: "a".into(),
            duration_ms: 1_000,
            depends: Vec::new(),
        }));
        let page = log.feed.page("a", 0, 100).expect("kept");
        assert_eq!(revisions(&page), vec![1, 3, 4, 4]);
        assert_eq!(page.revision, 4);
        assert!(matches!(
            &*page.changes[2],
            WatchEventJson::Removed { id: 1, .. }
        ));
        assert!(
            matches!(&*page.changes[3], WatchEventJson::Task { task, .. } if task.ownerid == 7)
        );
        let later = log.feed.page("a", 3, 100).expect("kept");
        assert_eq!(revisions(&later), vec![4, 4]);
        let none = log.feed.page("c", 0, 100).expect("kept");
        assert_eq!((none.changes.len(), none.revision), (0, 4));
    }

    /// The commands of one entry (a batch) are told together, once the last is kept:
    /// a page read between them would end inside the entry and skip the rest.
    #[tokio::test]
    async fn a_batch_is_told_whole_once_its_last_command_is_kept() {
        let mut log = Log::new();
        log.add("a", "1");
        let signal = log.feed.signal("a");
        let woken = signal.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        log.index += 1;
        log.apply_part(add_request("a", "2"), false);
        let page = log.feed.page("a", 0, 100).expect("kept");
        assert_eq!((revisions(&page), page.revision), (vec![1], 1));
        let waiting = futures_util::poll!(woken.as_mut());
        assert!(waiting.is_pending(), "woken before the entry was done");
        log.apply_part(add_request("b", "3"), false);
        log.apply_part(add_request("a", "4"), true);
        let page = log.feed.page("a", 1, 100).expect("kept");
        assert_eq!((revisions(&page), page.revision), (vec![2, 2], 2));
        assert!(futures_util::poll!(woken).is_ready(), "not woken once done");
        let other = log.feed.page("b", 0, 100).expect("kept");
        assert_eq!(revisions(&other), vec![2]);
    }

    #[test]
    fn a_page_ends_at_a_whole_revision() {
        let mut log = Log::new();
        log.add("a", "1");
        log.apply(Request::Claim(ClaimRequest {
            client: 7,
            group: "a".into(),
            duration_ms: 1_000,
            depends: Vec::new(),
        }));
        log.add("a", "3");
        // Revision 2 holds two changes: a limit of 2 cannot split it.
        let page = log.feed.page("a", 0, 2).expect("kept");
        assert_eq!(revisions(&page), vec![1, 2, 2]);
        assert_eq!(page.revision, 2);
        let next = log.feed.page("a", page.revision, 2).expect("kept");
        assert_eq!(revisions(&next), vec![3]);
    }

    #[test]
    fn trimmed_revisions_are_forgotten_and_said_so() {
        let mut log = Log::new();
        for i in 0..FEED_CHANGES_MAX + 10 {
            log.add("a", &i.to_string());
        }
        assert!(log.feed.kept() <= FEED_CHANGES_MAX);
        let forgotten = log.feed.page("a", 0, 10).expect_err("trimmed");
        assert_eq!(forgotten.revision, log.index);
        assert_eq!(forgotten.oldest, 10);
        let page = log.feed.page("a", forgotten.oldest, 10).expect("kept");
        assert_eq!(page.changes[0].revision(), 11);
    }

    #[test]
    fn a_reset_forgets_everything_before_it_and_wakes_waiters() {
        let mut log = Log::new();
        log.add("a", "1");
        let signal = log.feed.signal("a");
        let woken = signal.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        log.feed.reset(50);
        assert!(
            futures_util::FutureExt::now_or_never(woken).is_some(),
            "a reset wakes the group's waiters"
        );
        assert_eq!(
            log.feed.page("a", 0, 10).expect_err("forgotten"),
            Forgotten {
                revision: 50,
                oldest: 50,
                ahead: false,
            }
        );
        assert!(log.feed.check_not_ahead(50, 0).is_ok());
        assert!(
            log.feed.check_not_ahead(60, 60).is_ok(),
            "in this node's log"
        );
        assert!(log.feed.check_not_ahead(61, 60).expect_err("ahead").ahead);
        assert_eq!(log.feed.page("a", 50, 10).expect("kept").revision, 50);
    }

    #[test]
    fn an_unused_group_entry_is_released() {
        let feed = ChangeFeed::default();
        let signal = feed.signal("a");
        assert_eq!(feed.groups(), 1);
        feed.release("a");
        assert_eq!(feed.groups(), 1, "still held");
        drop(signal);
        feed.release("a");
        assert_eq!(feed.groups(), 0);
    }
}
