//! Log time: the clock a leader stamps into each command.
//!
//! Followers also take the leader's time from every append it sends (the
//! `x-rota-log-time` header, see `crate::network`), forward only, once they accepted the
//! append: applied stamps alone leave a follower's clock at the last command's time on an
//! idle cluster, and a node that caught up on old entries or applied only a membership
//! change since would lead from there, behind by the idle time (found from outside).
//!
//! Every node runs one [`LogClock`]. It follows the monotonic clock and corrects toward
//! the wall clock by at most [`LOG_CLOCK_SLEW_RATE`] (the machine's constant) of elapsed
//! time, so a jump of the wall clock (forward or back, by any amount) changes the rate
//! of log time, and thus any lease's length, by at most 1%. While a node follows, it moves its clock to the time of every
//! entry it applies ([`LogClock::follow`]), so a node that becomes leader continues the
//! cluster's time rather than starting from its own wall clock: a node whose wall clock
//! jumped ahead and that restarted would otherwise expire every lease early the moment
//! it led (the simulation found this). A node also starts from the time of the state
//! it opens, so a restarted node never leads on its wall clock; only a new cluster,
//! with no time in its log, starts from the wall clock. The state machine adds the
//! other half of the guarantee: applied time is `max(stamp, previous)`, so log time
//! never goes back across leaders.
//!
//! After the whole cluster was down, log time catches up with the outage at once rather
//! than at 1% of elapsed time (which left absolute timespecs claimable late by up to the
//! outage's length). Every node keeps a [`ClockRecord`] beside its snapshot, rewritten
//! every second: its log time and its wall clock at one instant. A restarted node's
//! *estimate* of log time is `record.log + 99% of (wall now - record.wall)`: the time of
//! the record advanced by the real time its own wall clock says has passed, less the slew
//! (see [`LogClock::resume_from`]); a running node's estimate is its clock, and so is a
//! restarted node's once it has known a leader for [`RESUME_FORGOTTEN_AFTER`] (the
//! catch-up is the first leader's business; an estimate kept longer would be stale, and
//! a node whose clock jumped just before it restarted into a live cluster would keep an
//! inflated one that a later leader could take while the live nodes are slow to
//! answer: the simulation found that). A new leader
//! asks every voter for its estimate and, with answers from a majority (itself
//! included), moves its clock forward to the *smallest* answer, never back
//! ([`LogClock::advance_to`]). The smallest, not the median: a wall clock that jumped
//! forward during the outage inflates its node's estimate, which is the unsafe direction
//! (leases would end early), and a majority's smallest answer always comes from a node
//! whose clock did not jump forward as long as only a minority's did. The leader stamps
//! nothing in a term before its catch-up ends (`time_keeper::catch_up`): a stamp from
//! the clock before the move would grant a lease that the move shortens. A clock that
//! jumped back only makes the catch-up smaller, and log time then slews as before (so
//! does a jump back in the second between a node's last record and the outage).
//!
//! Why that keeps leases: log time at the last stamp before the outage was at least the
//! record's time plus 99% of the real time between the record and that stamp (log time
//! never runs slower than that), so the estimate exceeds it by at most 99% of the real
//! time since the stamp. Log time thus never advances faster than real time across an
//! outage, as the holder of a lease assumes (it gives its lease up 1% early). Nodes with
//! no record (new, or from an older release) answer their clock: no catch-up, as before.

use std::sync::Mutex;

use store_sm::machine::LogTime;
use store_sm::machine::constants::LOG_CLOCK_SLEW_RATE;
use tokio::time::Instant;

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait WallClock: Send + Sync + 'static {
    /// Now, by this clock.
    fn now_ms(&self) -> i64;
}

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// How long after it first knows a leader a restarted node keeps offering its
/// record-based estimate: a few election rounds' worth of time for the first leader to
/// ask for it.
pub const RESUME_FORGOTTEN_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

#[derive(Debug)]
struct ClockState {
    last_mono_ms: f64,
    offset_ms: f64,
    /// From the record found at start: log time then, and the monotonic time it was read.
    resumed: Option<(f64, f64)>,
}

/// A node's log time and wall clock at one instant, kept on disk so that after a restart
/// the node can tell how much real time passed (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClockRecord {
    /// Log time, in milliseconds since the Unix epoch.
    pub log_ms: i64,
    /// The node's wall clock at the same instant.
    pub wall_ms: i64,
}

/// Monotonic time slewed toward the wall clock; see the module documentation.
pub struct LogClock {
    wall: Box<dyn WallClock>,
    start: Instant,
    state: Mutex<ClockState>,
}

impl std::fmt::Debug for LogClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogClock")
            .field("state", &self.state)
            .finish()
    }
}

impl LogClock {
    /// A clock that starts at `wall`'s time now.
    pub fn new(wall: impl WallClock) -> Self {
        let offset_ms = wall.now_ms() as f64;
        Self {
            wall: Box::new(wall),
            start: Instant::now(),
            state: Mutex::new(ClockState {
                last_mono_ms: 0.0,
                offset_ms,
                resumed: None,
            }),
        }
    }

    /// Sets log time now to `log_time`, the time of the entry this follower just applied.
    /// The leader never calls it for its own entries: its stamps are the cluster's time.
    pub fn follow(&self, log_time: LogTime) {
        let mono_ms = self.start.elapsed().as_secs_f64() * 1000.0;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.last_mono_ms = state.last_mono_ms.max(mono_ms);
        state.offset_ms = log_time.as_millis() as f64 - state.last_mono_ms;
    }

    /// Moves log time forward to `at` if it is behind; never back.
    pub fn advance_to(&self, at: LogTime) {
        let now = self.now();
        if at > now {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.offset_ms += at.millis_since(now) as f64;
        }
    }

    /// What this node keeps on disk: log time and its wall clock, now.
    pub fn record(&self) -> ClockRecord {
        ClockRecord {
            log_ms: self.now().as_millis(),
            wall_ms: self.wall.now_ms(),
        }
    }

    /// Takes the record a restarted node found: from now on [`LogClock::estimate`] is at
    /// least `record.log_ms` plus 99% of the wall-clock time since `record.wall_ms`,
    /// growing with the monotonic clock. A wall clock behind the record adds nothing.
    pub fn resume_from(&self, record: ClockRecord) {
        let passed = self.wall.now_ms().saturating_sub(record.wall_ms).max(0) as f64;
        let resumed_ms = record.log_ms as f64 + passed * (1.0 - LOG_CLOCK_SLEW_RATE);
        let mono_ms = self.start.elapsed().as_secs_f64() * 1000.0;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.resumed = Some((resumed_ms, mono_ms));
    }

    /// Drops what [`LogClock::resume_from`] set: once a leader has served for a while,
    /// this node's clock follows the cluster's time and the record has done its job.
    pub fn forget_resume(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.resumed = None;
    }

    /// This node's estimate of log time, which a new leader may catch up to: the larger
    /// of its clock and what the record found at start says (see the module docs).
    pub fn estimate(&self) -> LogTime {
        let now = self.now();
        let mono_ms = self.start.elapsed().as_secs_f64() * 1000.0;
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let resumed = state.resumed.map(|(at_ms, read_ms)| {
            let since = (mono_ms - read_ms).max(0.0) * (1.0 - LOG_CLOCK_SLEW_RATE);
            LogTime::from_millis((at_ms + since) as i64)
        });
        resumed.map_or(now, |resumed| resumed.max(now))
    }

    /// Log time now; never decreases between calls to [`LogClock::follow`].
    pub fn now(&self) -> LogTime {
        if store_sm::planted::is_planted(store_sm::planted::Bug::WallClockLease) {
            return LogTime::from_millis(self.wall.now_ms());
        }
        let mono_ms = self.start.elapsed().as_secs_f64() * 1000.0;
        let target_offset = self.wall.now_ms() as f64 - mono_ms;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = (mono_ms - state.last_mono_ms).max(0.0);
        let max_step = elapsed * LOG_CLOCK_SLEW_RATE;
        state.offset_ms += (target_offset - state.offset_ms).clamp(-max_step, max_step);
        state.last_mono_ms = state.last_mono_ms.max(mono_ms);
        LogTime::from_millis((state.last_mono_ms + state.offset_ms) as i64)
    }
}

#[cfg(all(test, not(madsim)))] // paused tokio time; the simulation tests the clock under skew
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicI64;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;

    /// A wall clock a test can jump.
    #[derive(Clone, Default)]
    struct JumpingClock(Arc<AtomicI64>);

    impl WallClock for JumpingClock {
        fn now_ms(&self) -> i64 {
            // Real time passes too, so the test sees monotonic progress.
            SystemClock.now_ms() + self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn wall_clock_jumps_move_log_time_by_at_most_the_slew() {
        let jump = JumpingClock::default();
        let clock = LogClock::new(jump.clone());
        let start = clock.now();
        for offset_ms in [60_000, -3_600_000] {
            jump.0.store(offset_ms, Ordering::SeqCst);
            let before = clock.now();
            tokio::time::advance(Duration::from_secs(10)).await;
            let after = clock.now();
            let moved = after.millis_since(before);
            // 10 s of monotonic time; the correction adds or removes at most 1% of it.
            assert!(
                (9_899..=10_101).contains(&moved),
                "log time moved {moved} ms in 10 s"
            );
        }
        assert!(clock.now() > start, "log time never goes back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_takes_the_log_time_and_then_slews_from_it() {
        let jump = JumpingClock::default();
        jump.0.store(600_000, Ordering::SeqCst);
        let clock = LogClock::new(jump.clone());
        let log_time = LogTime::from_millis(SystemClock.now_ms());
        clock.follow(log_time);
        assert!(
            clock.now().millis_since(log_time).abs() <= 1,
            "follows the log, not its wall clock"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        let moved = clock.now().millis_since(log_time);
        assert!(
            (10_000..=10_101).contains(&moved),
            "then runs at most 1% fast toward its wall clock: moved {moved} ms in 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_node_estimates_log_time_from_its_record_and_its_wall_clock() {
        let wall = JumpingClock::default();
        let clock = LogClock::new(wall.clone());
        let applied = LogTime::from_millis(SystemClock.now_ms() - 3_600_000);
        clock.follow(applied);
        assert_eq!(clock.estimate(), clock.now(), "no record: the clock itself");

        // Kept an hour ago, when log time was `applied`: 99% of the hour is added.
        clock.resume_from(ClockRecord {
            log_ms: applied.as_millis(),
            wall_ms: SystemClock.now_ms() - 3_600_000,
        });
        let estimate = clock.estimate().millis_since(applied);
        assert!(
            (3_563_000..=3_565_000).contains(&estimate),
            "99% of the hour since the record: {estimate} ms"
        );
        assert!(
            clock.now().millis_since(applied) < 100,
            "the estimate does not move the clock"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        let later = clock.estimate().millis_since(applied);
        assert!(
            (estimate + 9_899..=estimate + 9_901).contains(&later),
            "and grows at 99% of monotonic time: {later} ms"
        );
        clock.forget_resume();
        assert_eq!(clock.estimate(), clock.now(), "forgotten: the clock again");

        // A wall clock behind the record adds nothing.
        let behind = LogClock::new(wall.clone());
        behind.follow(applied);
        behind.resume_from(ClockRecord {
            log_ms: applied.as_millis(),
            wall_ms: SystemClock.now_ms() + 60_000,
        });
        assert!(behind.estimate().millis_since(applied) < 100);
    }

    #[tokio::test(start_paused = true)]
    async fn advance_to_moves_the_clock_forward_only() {
        let clock = LogClock::new(JumpingClock::default());
        let now = clock.now();
        clock.advance_to(LogTime::from_millis(now.as_millis() - 60_000));
        assert!(clock.now().millis_since(now).abs() <= 1, "never back");
        let ahead = LogTime::from_millis(now.as_millis() + 60_000);
        clock.advance_to(ahead);
        assert!(
            clock.now().millis_since(ahead).abs() <= 1,
            "forward at once"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let moved = clock.now().millis_since(ahead);
        assert!(
            (990..=1_010).contains(&moved),
            "then slews as before: {moved} ms in 1 s"
        );
    }
}
