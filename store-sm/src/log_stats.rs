//! Counters a log store keeps about its writes, for metrics and for measuring how many
//! commands one append (and one fsync) carries; and the latency histogram they use.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// How long something took, counted by bucket of [`LATENCY_BUCKETS_US`]; shared,
/// lock-free.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    count: AtomicU64,
    us_total: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
}

/// A point-in-time copy of a [`LatencyHistogram`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Durations recorded.
    pub count: u64,
    /// Their total, microseconds.
    pub us_total: u64,
    /// Durations per bucket of [`LATENCY_BUCKETS_US`] (not cumulative); the rest took
    /// longer.
    pub buckets: Vec<u64>,
}

impl LatencyHistogram {
    /// Counts one duration.
    pub fn record(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u64::MAX as u128) as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.us_total.fetch_add(us, Ordering::Relaxed);
        if let Some(bucket) = LATENCY_BUCKETS_US.iter().position(|&bound| us <= bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts now.
    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            count: self.count.load(Ordering::Relaxed),
            us_total: self.us_total.load(Ordering::Relaxed),
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// Write counters of one log store; shared, lock-free.
#[derive(Debug, Default)]
pub struct LogStats {
    appends: AtomicU64,
    entries: AtomicU64,
    syncs: LatencyHistogram,
}

/// A point-in-time copy of [`LogStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogStatsSnapshot {
    /// Append calls.
    pub appends: u64,
    /// Entries appended.
    pub entries: u64,
    /// Synced writes (appends, truncations, votes) and how long they took.
    pub syncs: LatencySnapshot,
}

impl LogStats {
    /// Counts one append of `entries` entries.
    pub fn record_append(&self, entries: usize) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(entries as u64, Ordering::Relaxed);
    }

    /// Counts one synced write that took `elapsed`.
    pub fn record_sync(&self, elapsed: Duration) {
        self.syncs.record(elapsed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> LogStatsSnapshot {
        LogStatsSnapshot {
            appends: self.appends.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            syncs: self.syncs.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_is_counted_in_the_first_bucket_that_holds_it() {
        let histogram = LatencyHistogram::default();
        histogram.record(Duration::from_micros(100));
        histogram.record(Duration::from_micros(101));
        histogram.record(Duration::from_millis(900));
        histogram.record(Duration::from_secs(2));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 4);
        assert_eq!(snapshot.us_total, 100 + 101 + 900_000 + 2_000_000);
        let mut expected = vec![0; LATENCY_BUCKETS_US.len()];
        expected[0] = 1;
        expected[1] = 1;
        expected[11] = 1;
        assert_eq!(snapshot.buckets, expected);
    }
}
