//! Blocking claims' queues: per group, the waiting claims in arrival order, and how
//! many of them hold a grant (their claim is being proposed). When a group's claimable
//! count changes, the oldest waiters without a grant get one, as many as there are
//! claimable tasks beyond the grants already out, and only those are woken: a thousand
//! waiters and ten adds wake ten claims, longest waiter first. Waiters without a grant
//! sleep until the group's next task becomes claimable (a lease ending, a retry delay);
//! a change that brings that time forward wakes them to set their timers again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use store_sm::machine::ClientId;
use store_sm::machine::GroupName;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::TaskId;
use tokio::sync::Notify;
use tokio::sync::watch;

/// What a proposal came to, as those who join it see it: `None` while in flight, then
/// its outcome, or `None` inside when the write failed (its outcome is unknown here).
pub type ProposalResult = Option<Option<Arc<Outcome>>>;

/// Blocking claims' proposals that carry a request id and have not finished, so that a
/// retry of the same request on this node joins the one in flight instead of
/// answering while it may still claim a task.
#[derive(Default)]
pub struct InFlight {
    proposals: Mutex<BTreeMap<ProposalKey, (u64, watch::Receiver<ProposalResult>)>>,
    issued: AtomicU64,
}

/// A proposal's client and request id.
pub type ProposalKey = (ClientId, String);

impl InFlight {
    /// Registers a proposal for `key`; the returned number names it for [`InFlight::done`].
    pub fn start(&self, key: ProposalKey, result: watch::Receiver<ProposalResult>) -> u64 {
        let number = self.issued.fetch_add(1, Ordering::Relaxed);
        let mut proposals = self.proposals.lock().unwrap_or_else(|p| p.into_inner());
        proposals.insert(key, (number, result));
        number
    }

    /// The proposal for `key` in flight, if any.
    pub fn get(&self, key: &ProposalKey) -> Option<watch::Receiver<ProposalResult>> {
        let proposals = self.proposals.lock().unwrap_or_else(|p| p.into_inner());
        proposals.get(key).map(|(_, result)| result.clone())
    }

    /// Proposal `number` for `key` has finished.
    pub fn done(&self, key: &ProposalKey, number: u64) {
        let mut proposals = self.proposals.lock().unwrap_or_else(|p| p.into_inner());
        if proposals.get(key).is_some_and(|(n, _)| *n == number) {
            proposals.remove(key);
        }
    }
}

struct Queued {
    wake: Arc<Notify>,
    granted: bool,
    /// The tasks its claim may not take (the ones it `depends` on): a grant goes to it
    /// only while the group holds a claimable task besides those.
    excludes: Vec<TaskId>,
    /// It gave its grant back after a claim that found nothing: grants go to the
    /// others first until it is woken again.
    passed: bool,
}

#[derive(Default)]
struct GroupQueue {
    /// By arrival: the longest waiter first.
    waiting: BTreeMap<u64, Queued>,
    granted: usize,
    /// When the waiters last looked, the group's next task would become claimable then
    /// (`None`: none would), and their timers are set for it.
    armed_for: Option<LogTime>,
}

/// Every group's blocking claims on this node.
#[derive(Default)]
pub struct ClaimQueues {
    groups: Mutex<BTreeMap<GroupName, GroupQueue>>,
    arrivals: AtomicU64,
}

impl ClaimQueues {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<GroupName, GroupQueue>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a blocking claim on `group`; it leaves the queue when the ticket drops.
    pub fn join(self: &Arc<Self>, group: &str) -> ClaimTicket {
        self.join_excluding(group, Vec::new())
    }

    /// [`ClaimQueues::join`] for a claim that may not take the tasks in `excludes`.
    pub fn join_excluding(self: &Arc<Self>, group: &str, excludes: Vec<TaskId>) -> ClaimTicket {
        let seq = self.arrivals.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let mut groups = self.lock();
        let queue = match groups.get_mut(group) {
            Some(queue) => queue,
            None => groups.entry(Arc::from(group)).or_default(),
        };
        queue.waiting.insert(
            seq,
            Queued {
                wake: Arc::clone(&wake),
                granted: false,
                excludes,
                passed: false,
            },
        );
        ClaimTicket {
            queues: Arc::clone(self),
            group: Arc::from(group),
            seq,
            wake,
        }
    }

    /// Waiters queued on `group`, granted or not: the most tasks worth counting.
    pub fn waiting(&self, group: &str) -> usize {
        self.lock().get(group).map_or(0, |q| q.waiting.len())
    }

    /// `claimable` tasks of `group` are there to claim: grants go to the oldest waiters
    /// without one until grants match them, and those waiters are woken. Returns how
    /// many were woken.
    pub fn grant(&self, group: &str, claimable: usize) -> usize {
        self.grant_usable(group, claimable, |_| true)
    }

    /// [`ClaimQueues::grant`], passing over a waiter whose claim excludes tasks unless
    /// `usable(excludes)` says the group holds another claimable task: a grant it could
    /// not use would keep the next waiter from one it can (and cost a futile proposal).
    pub fn grant_usable(
        &self,
        group: &str,
        claimable: usize,
        usable: impl Fn(&[TaskId]) -> bool,
    ) -> usize {
        let mut groups = self.lock();
        let Some(queue) = groups.get_mut(group) else {
            return 0;
        };
        let free = claimable.saturating_sub(queue.granted);
        let mut woken = 0;
        // Waiters that passed a grant come last: first in line for none, still served.
        for passed in [false, true] {
            let wanting = queue.waiting.values_mut().filter(|q| {
                !q.granted && q.passed == passed && (q.excludes.is_empty() || usable(&q.excludes))
            });
            for queued in wanting.take(free - woken) {
                queued.granted = true;
                queued.wake.notify_one();
                woken += 1;
            }
        }
        queue.granted += woken;
        woken
    }

    /// `group`'s next task becomes claimable at `at`: if that is sooner than the waiters'
    /// timers are set for, those without a grant are woken to set them again. Returns
    /// how many were woken.
    pub fn retime(&self, group: &str, at: LogTime) -> usize {
        let mut groups = self.lock();
        let Some(queue) = groups.get_mut(group) else {
            return 0;
        };
        if queue.armed_for.is_some_and(|armed| armed <= at) {
            return 0;
        }
        queue.armed_for = Some(at);
        let mut woken = 0;
        for queued in queue.waiting.values().filter(|q| !q.granted) {
            queued.wake.notify_one();
            woken += 1;
        }
        woken
    }

    fn set_granted(&self, ticket: &ClaimTicket, granted: bool) -> bool {
        let mut groups = self.lock();
        let Some(queue) = groups.get_mut(&ticket.group) else {
            return false;
        };
        let Some(queued) = queue.waiting.get_mut(&ticket.seq) else {
            return false;
        };
        let was = queued.granted;
        if was != granted {
            queued.granted = granted;
            if granted {
                queue.granted += 1;
            } else {
                queue.granted -= 1;
            }
        }
        was
    }
}

/// One blocking claim's place in its group's queue.
pub struct ClaimTicket {
    queues: Arc<ClaimQueues>,
    group: GroupName,
    seq: u64,
    wake: Arc<Notify>,
}

impl ClaimTicket {
    /// Resolves when this waiter is granted a claim, or should set its timer again (see
    /// [`ClaimQueues::retime`]); a permit is kept if the wake came first, so none is lost.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// This waiter's timer is set for `at`, when the group's next task becomes claimable
    /// as it just looked (`None`: no task will without a change).
    pub fn armed_for(&self, at: Option<LogTime>) {
        let mut groups = self.queues.lock();
        if let Some(queue) = groups.get_mut(&self.group) {
            queue.armed_for = at;
        }
    }

    /// Whether this waiter holds a grant.
    pub fn is_granted(&self) -> bool {
        let groups = self.queues.lock();
        groups
            .get(&self.group)
            .and_then(|q| q.waiting.get(&self.seq))
            .is_some_and(|q| q.granted)
    }

    /// The waiter's claim came back without a task (or was not made): it gives its
    /// grant back and waits again in its place.
    pub fn release_grant(&self) {
        self.queues.set_granted(self, false);
    }

    /// [`ClaimTicket::release_grant`], and grants go to the other waiters first until
    /// [`ClaimTicket::unpass`]: a waiter whose claim just found nothing should not take
    /// the next grant from one that may use it (with none other, it still gets it).
    pub fn pass_grant(&self) {
        self.release_grant();
        self.set_passed(true);
    }

    /// Grants may come to this waiter again (it was woken: something changed).
    pub fn unpass(&self) {
        self.set_passed(false);
    }

    fn set_passed(&self, passed: bool) {
        let mut groups = self.queues.lock();
        if let Some(queued) = groups
            .get_mut(&self.group)
            .and_then(|q| q.waiting.get_mut(&self.seq))
        {
            queued.passed = passed;
        }
    }
}

impl Drop for ClaimTicket {
    fn drop(&mut self) {
        let mut groups = self.queues.lock();
        let Some(queue) = groups.get_mut(&self.group) else {
            return;
        };
        let removed = queue.waiting.remove(&self.seq);
        if removed.is_some_and(|queued| queued.granted) {
            // A grant that was never used: the next waiter looks again in its place.
            queue.granted -= 1;
            if let Some(next) = queue.waiting.values().find(|q| !q.granted) {
                next.wake.notify_one();
            }
        }
        if queue.waiting.is_empty() {
            groups.remove(&self.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn waiters_are_woken_to_set_their_timers_only_for_a_sooner_claimable_time() {
        let queues = Arc::new(ClaimQueues::default());
        let tickets: Vec<ClaimTicket> = (0..3).map(|_| queues.join("g")).collect();
        assert_eq!(queues.grant("g", 1), 1);
        // Nothing was to become claimable: any time is sooner, for the two without a grant.
        for ticket in &tickets {
            ticket.armed_for(None);
        }
        assert_eq!(queues.retime("g", LogTime::from_millis(5_000)), 2);
        assert!(tickets[1].woken().now_or_never().is_some());
        assert!(tickets[2].woken().now_or_never().is_some());
        // They looked and set their timers for it: the same time, or a later one, wakes no one.
        tickets[1].armed_for(Some(LogTime::from_millis(5_000)));
        assert_eq!(queues.retime("g", LogTime::from_millis(5_000)), 0);
        assert_eq!(queues.retime("g", LogTime::from_millis(9_000)), 0);
        assert!(tickets[2].woken().now_or_never().is_none());
        // A sooner one does.
        assert_eq!(queues.retime("g", LogTime::from_millis(2_000)), 2);
        assert_eq!(queues.retime("other", LogTime::from_millis(1)), 0);
    }

    #[test]
    fn grants_go_to_the_oldest_waiters_only_and_are_not_given_twice() {
        let queues = Arc::new(ClaimQueues::default());
        let tickets: Vec<ClaimTicket> = (0..5).map(|_| queues.join("g")).collect();
        assert_eq!(queues.waiting("g"), 5);
        assert_eq!(queues.grant("g", 2), 2);
        let granted: Vec<bool> = tickets.iter().map(ClaimTicket::is_granted).collect();
        assert_eq!(granted, [true, true, false, false, false]);
        assert!(
            tickets[0].woken().now_or_never().is_some(),
            "its permit waits"
        );
        assert!(tickets[2].woken().now_or_never().is_none());
        // The same count again grants nothing more: the two grants still cover it.
        assert_eq!(queues.grant("g", 2), 0);
        // The first lost its race: the next grant goes back to it, the longest waiter.
        tickets[0].release_grant();
        assert_eq!(queues.grant("g", 2), 1);
        assert!(tickets[0].is_granted());
        // A granted waiter that leaves frees its grant for the next.
        let mut tickets = tickets;
        drop(tickets.remove(1));
        assert_eq!(queues.grant("g", 2), 1);
        assert!(tickets[1].is_granted(), "the third arrival now");
        drop(tickets);
        assert_eq!(queues.waiting("g"), 0);
        assert_eq!(queues.grant("g", 5), 0);
    }

    #[test]
    fn a_waiter_that_cannot_use_a_grant_is_passed_over() {
        let queues = Arc::new(ClaimQueues::default());
        // The oldest waiter depends on task 7, the only claimable one: it may not take it.
        let picky = queues.join_excluding("g", vec![7]);
        let plain = queues.join("g");
        let only_seven_claimable = |excludes: &[TaskId]| !excludes.contains(&7);
        assert_eq!(queues.grant_usable("g", 1, only_seven_claimable), 1);
        assert!(!picky.is_granted());
        assert!(
            plain.is_granted(),
            "the grant goes to the waiter that can use it"
        );
        // Once another task is claimable, the picky waiter is served in its turn.
        assert_eq!(queues.grant_usable("g", 2, |_| true), 1);
        assert!(picky.is_granted());
    }

    #[test]
    fn a_waiter_that_passed_its_grant_gets_none_until_it_is_woken_again() {
        let queues = Arc::new(ClaimQueues::default());
        let first = queues.join("g");
        let second = queues.join("g");
        assert_eq!(queues.grant("g", 1), 1);
        assert!(first.is_granted());
        // Its claim found nothing: the grant goes to the next waiter, not back to it.
        first.pass_grant();
        assert_eq!(queues.grant("g", 1), 1);
        assert!(!first.is_granted() && second.is_granted());
        // With a grant to spare it is still served, last.
        assert_eq!(queues.grant("g", 2), 1);
        assert!(first.is_granted());
        first.release_grant();
        first.unpass();
        drop(second);
        assert_eq!(queues.grant("g", 1), 1);
        assert!(first.is_granted(), "alone, and woken again");
    }
}
