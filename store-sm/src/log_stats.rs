//! Counters a log store keeps about its writes, for metrics and for measuring how many
//! commands one append (and one fsync) carries.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Upper bounds of the sync latency buckets, in microseconds.
pub const SYNC_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Write counters of one log store; shared, lock-free.
#[derive(Debug, Default)]
pub struct LogStats {
    appends: AtomicU64,
    entries: AtomicU64,
    syncs: AtomicU64,
    sync_us_total: AtomicU64,
    sync_buckets: [AtomicU64; SYNC_BUCKETS_US.len()],
}

/// A point-in-time copy of [`LogStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogStatsSnapshot {
    /// Append calls.
    pub appends: u64,
    /// Entries appended.
    pub entries: u64,
    /// Synced writes (appends, truncations, votes).
    pub syncs: u64,
    /// Total time spent in synced writes, microseconds.
    pub sync_us_total: u64,
    /// Synced writes per bucket of [`SYNC_BUCKETS_US`] (not cumulative); the rest took longer.
    pub sync_buckets: Vec<u64>,
}

impl LogStats {
    /// Counts one append of `entries` entries.
    pub fn record_append(&self, entries: usize) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(entries as u64, Ordering::Relaxed);
    }

    /// Counts one synced write that took `elapsed`.
    pub fn record_sync(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u64::MAX as u128) as u64;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_us_total.fetch_add(us, Ordering::Relaxed);
        if let Some(bucket) = SYNC_BUCKETS_US.iter().position(|&bound| us <= bound) {
            self.sync_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> LogStatsSnapshot {
        LogStatsSnapshot {
            appends: self.appends.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            sync_us_total: self.sync_us_total.load(Ordering::Relaxed),
            sync_buckets: self
                .sync_buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}
