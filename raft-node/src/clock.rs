//! Log time: the clock a leader stamps into each command.
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
//! After the whole cluster was down, the first leader continues from the last applied
//! entry's time: leases are extended by the outage, never cut short, and log time then
//! closes the gap to the wall clock at 1% of elapsed time.

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

#[derive(Debug)]
struct ClockState {
    last_mono_ms: f64,
    offset_ms: f64,
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
}
