//! Waiting instead of polling (issue 13): the change feed every wait is woken by, and
//! the bound on waiters. A waiter is a parked request future, not a thread: a few
//! hundred bytes and a place in a [`tokio::sync::Notify`] list. Waiting costs no log
//! entry; only what a waiter finally does (a claim) is proposed.

pub mod claims;
pub mod feed;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;

use store_sm::machine::Change;
use store_sm::machine::LogTime;
use store_sm::machine::TaskMachine;
use store_sm::state_machine::AppliedState;
use store_sm::state_machine::ApplyObserver;
use tokio::sync::Notify;

use self::claims::ClaimQueues;
use self::feed::ChangeFeed;

/// What the state machine tells of each applied entry: the feed keeps its changes and
/// wakes their groups' watchers, and each touched group's blocking claims are granted
/// as many claims as it has claimable tasks.
pub struct Observer {
    /// The change feed.
    pub feed: Arc<ChangeFeed>,
    /// The blocking claims.
    pub claims: Arc<ClaimQueues>,
}

impl ApplyObserver for Observer {
    fn applied(&self, index: u64, state: &AppliedState, changes: &[Change], last: bool) {
        let machine = &state.machine;
        for group in self.feed.record(index, state, changes, last) {
            grant_claims(&self.claims, machine, &group, machine.log_time());
        }
    }

    fn reset(&self, index: u64, _state: &AppliedState) {
        self.feed.reset(index);
    }
}

/// Grants `group`'s blocking claims as many claims as `machine` (as of `now`) has
/// claimable tasks, and wakes the others to set their timers again if a task now becomes
/// claimable sooner than they expected (an add for later, a fail with a retry delay, a
/// shorter renewal); how many waiters were granted.
pub fn grant_claims(
    claims: &ClaimQueues,
    machine: &TaskMachine,
    group: &str,
    now: LogTime,
) -> usize {
    let waiting = claims.waiting(group);
    if waiting == 0 {
        return 0;
    }
    let claimable = machine.claimable_count(group, now, waiting);
    let granted = claims.grant_usable(group, claimable, |excludes| {
        machine.claimable_excluding(group, now, excludes)
    });
    if granted < waiting
        && let Some(at) = machine.next_claimable_after(group, now)
    {
        claims.retime(group, at);
    }
    granted
}

/// Why a node takes no more waiters.
#[derive(Debug, thiserror::Error)]
pub enum WaitRefused {
    /// It is stopping.
    #[error("this node is stopping; wait on another node")]
    Stopping,
    /// It holds its maximum.
    #[error(
        "this node already holds {max} waiting requests (--max-waiters); retry shortly or wait on another node"
    )]
    Full {
        /// `--max-waiters`.
        max: usize,
    },
}

/// What a request waits for, for the bound and the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// A blocking claim (`/claim` with `wait_ms`).
    Claim,
    /// A wait for job outcomes (`/job` with `wait_ms`).
    Job,
    /// A watch of a group's changes (`/watch`).
    Watch,
}

impl WaitKind {
    /// Every kind, in metrics order.
    pub const ALL: [WaitKind; 3] = [WaitKind::Claim, WaitKind::Job, WaitKind::Watch];

    /// The kind's name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Claim => "claim",
            WaitKind::Job => "job",
            WaitKind::Watch => "watch",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// Counts of one kind of waiter.
#[derive(Default)]
struct KindCounts {
    waiting: AtomicUsize,
    wakeups: AtomicU64,
    wasted: AtomicU64,
}

/// The node's waiters: how many there are of each kind, against the configured bound,
/// and the stop signal that answers them all at shutdown.
pub struct Waiters {
    max: usize,
    total: AtomicUsize,
    kinds: [KindCounts; 3],
    stopping: AtomicBool,
    stop: Notify,
}

impl Waiters {
    /// At most `max` waiters at once.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            total: AtomicUsize::new(0),
            kinds: Default::default(),
            stopping: AtomicBool::new(false),
            stop: Notify::new(),
        }
    }

    /// A place for one waiter of `kind`, held until the returned slot drops; refused
    /// (503) when the node already holds its maximum or is stopping.
    pub fn enter(self: &Arc<Self>, kind: WaitKind) -> Result<WaitSlot, WaitRefused> {
        if self.is_stopping() {
            return Err(WaitRefused::Stopping);
        }
        let before = self.total.fetch_add(1, Ordering::SeqCst);
        if before >= self.max {
            self.total.fetch_sub(1, Ordering::SeqCst);
            return Err(WaitRefused::Full { max: self.max });
        }
        self.kinds[kind.slot()]
            .waiting
            .fetch_add(1, Ordering::SeqCst);
        Ok(WaitSlot {
            waiters: Arc::clone(self),
            kind,
        })
    }

    /// Answers every waiter now and refuses new ones: the node is shutting down.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop.notify_waiters();
    }

    /// Whether [`Waiters::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Resolves once the node stops; enable it before checking [`Waiters::is_stopping`].
    pub fn stopped(&self) -> tokio::sync::futures::Notified<'_> {
        self.stop.notified()
    }

    /// Waiters of `kind` now.
    pub fn waiting(&self, kind: WaitKind) -> usize {
        self.kinds[kind.slot()].waiting.load(Ordering::Relaxed)
    }

    /// Times a waiter of `kind` was woken to look again.
    pub fn wakeups(&self, kind: WaitKind) -> u64 {
        self.kinds[kind.slot()].wakeups.load(Ordering::Relaxed)
    }

    /// Wake-ups of `kind` that found nothing to answer with and waited again.
    pub fn wasted(&self, kind: WaitKind) -> u64 {
        self.kinds[kind.slot()].wasted.load(Ordering::Relaxed)
    }

    /// The most waiters at once.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// One waiter's place; dropping it frees the place.
pub struct WaitSlot {
    waiters: Arc<Waiters>,
    kind: WaitKind,
}

impl WaitSlot {
    /// Counts a wake-up, and whether it was wasted (found nothing and waits again).
    pub fn woken(&self, wasted: bool) {
        let counts = &self.waiters.kinds[self.kind.slot()];
        counts.wakeups.fetch_add(1, Ordering::Relaxed);
        if wasted {
            counts.wasted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.waiters.total.fetch_sub(1, Ordering::SeqCst);
        self.waiters.kinds[self.kind.slot()]
            .waiting
            .fetch_sub(1, Ordering::SeqCst);
    }
}
