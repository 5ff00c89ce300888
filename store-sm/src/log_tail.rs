//! The newest log entries, kept in memory by the RocksDB log store.
//!
//! An append returns as soon as its entries are here, and a writer thread makes them
//! durable afterwards (openraft's contract: appended entries are readable at once,
//! durable when the callback says so). Replication and apply read what was just
//! appended, so the tail also keeps the most recent written entries, which spares a
//! RocksDB iterator per read on the hot path. Unwritten entries never leave the tail;
//! written ones go oldest first past [`TAIL_ENTRIES_MAX`] or [`TAIL_BYTES_MAX`].

use std::collections::VecDeque;
use std::ops::Bound;
use std::ops::RangeBounds;

use crate::raft_types::RotaEntry;
use crate::raft_types::RotaLogId;

/// Written entries the tail keeps at most (unwritten ones are never dropped).
pub const TAIL_ENTRIES_MAX: usize = 16_384;
/// Encoded bytes of written entries the tail keeps at most.
pub const TAIL_BYTES_MAX: usize = 64 << 20;

/// Contiguous newest entries, with the encoded size of each.
#[derive(Debug, Default)]
pub struct LogTail {
    entries: VecDeque<(RotaEntry, usize)>,
    bytes: usize,
    /// The highest index the writer has stored in RocksDB, among those still relevant.
    written: Option<u64>,
}

/// An append that would leave a hole in the log: a bug of the caller, refused.
#[derive(Debug, thiserror::Error)]
#[error("log append at index {got} would leave a hole after index {last}")]
pub struct NotContiguous {
    last: u64,
    got: u64,
}

impl LogTail {
    /// The index of the oldest entry held, if any.
    pub fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index())
    }

    /// The id of the newest entry held, if any.
    pub fn last_log_id(&self) -> Option<RotaLogId> {
        self.entries.back().map(|(e, _)| e.log_id)
    }

    /// Adds the next entries, each with its encoded length, all or none of them.
    pub fn push_all(
        &mut self,
        entries: impl IntoIterator<Item = (RotaEntry, usize)>,
    ) -> Result<(), NotContiguous> {
        let entries: Vec<_> = entries.into_iter().collect();
        let mut expected = self.last_log_id().map(|id| id.index() + 1);
        for (entry, _) in &entries {
            let got = entry.log_id.index();
            if let Some(expected) = expected.filter(|&e| e != got) {
                return Err(NotContiguous {
                    last: expected - 1,
                    got,
                });
            }
            expected = Some(got + 1);
        }
        for (entry, size) in entries {
            self.bytes += size;
            self.entries.push_back((entry, size));
        }
        Ok(())
    }

    /// The entries held within `range`, and the first index held (everything below it
    /// is read from RocksDB instead).
    pub fn read<RB: RangeBounds<u64>>(&self, range: &RB) -> (Option<u64>, Vec<RotaEntry>) {
        let Some(first) = self.first_index() else {
            return (None, Vec::new());
        };
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let skip = usize::try_from(start.saturating_sub(first)).unwrap_or(usize::MAX);
        let entries = self
            .entries
            .iter()
            .skip(skip)
            .map(|(e, _)| e)
            .take_while(|e| range.contains(&e.log_id.index()))
            .cloned()
            .collect();
        (Some(first), entries)
    }

    /// Drops every entry after `last_kept` (all of them for `None`).
    pub fn truncate_after(&mut self, last_kept: Option<u64>) {
        while let Some((entry, size)) = self.entries.back() {
            if last_kept.is_some_and(|kept| entry.log_id.index() <= kept) {
                break;
            }
            self.bytes -= size;
            self.entries.pop_back();
        }
        self.written = match (self.written, last_kept) {
            (Some(w), Some(kept)) => Some(w.min(kept)),
            _ => None,
        };
    }

    /// Drops every entry up to and including `index`.
    pub fn purge_up_to(&mut self, index: u64) {
        while let Some((entry, size)) = self.entries.front() {
            if entry.log_id.index() > index {
                break;
            }
            self.bytes -= size;
            self.entries.pop_front();
        }
    }

    /// Records that the writer stored every entry up to `index`, then lets the oldest
    /// written entries go while the tail is over its limits.
    pub fn mark_written(&mut self, index: u64) {
        self.written = Some(self.written.map_or(index, |w| w.max(index)));
        let written = self.written.unwrap_or(index);
        while self.entries.len() > TAIL_ENTRIES_MAX || self.bytes > TAIL_BYTES_MAX {
            match self.entries.front() {
                Some((entry, size)) if entry.log_id.index() <= written => {
                    self.bytes -= size;
                    self.entries.pop_front();
                }
                _ => break,
            }
        }
    }

    /// Entries held, written or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use openraft::EntryPayload;

    use super::*;
    use openraft::vote::RaftLeaderIdExt;

    use crate::raft_types::RotaLeaderId;

    fn entry(index: u64) -> RotaEntry {
        RotaEntry {
            log_id: RotaLogId::new(RotaLeaderId::new_committed(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(entries: &[RotaEntry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index()).collect()
    }

    fn tail_of(range: std::ops::RangeInclusive<u64>) -> LogTail {
        let mut tail = LogTail::default();
        for i in range {
            tail.push_all([(entry(i), 10)]).expect("contiguous");
        }
        tail
    }

    #[test]
    fn reads_the_part_of_a_range_it_holds_and_says_where_it_starts() {
        let tail = tail_of(5..=9);
        let (first, got) = tail.read(&(3..=7));
        assert_eq!(first, Some(5));
        assert_eq!(indexes(&got), vec![5, 6, 7]);
        assert_eq!(indexes(&tail.read(&(8..)).1), vec![8, 9]);
        assert!(tail.read(&(10..20)).1.is_empty());
        assert!(tail.read(&(7..7)).1.is_empty());
        assert_eq!(LogTail::default().read(&(0..)), (None, Vec::new()));
    }

    #[test]
    fn refuses_a_hole() {
        let mut tail = tail_of(1..=3);
        assert!(tail.push_all([(entry(5), 1)]).is_err());
        assert_eq!(tail.len(), 3);
        tail.truncate_after(Some(1));
        tail.push_all([(entry(2), 1)])
            .expect("follows the kept entry");
    }

    #[test]
    fn keeps_unwritten_entries_past_its_limits_and_drops_written_ones_oldest_first() {
        let mut tail = LogTail::default();
        let count = TAIL_ENTRIES_MAX as u64 + 100;
        for i in 1..=count {
            tail.push_all([(entry(i), 1)]).expect("contiguous");
        }
        tail.mark_written(50);
        assert_eq!(tail.first_index(), Some(51), "only written entries go");
        tail.mark_written(count);
        assert_eq!(tail.len(), TAIL_ENTRIES_MAX);
        assert_eq!(tail.first_index(), Some(101));

        let mut big = LogTail::default();
        big.push_all([(entry(1), TAIL_BYTES_MAX)]).expect("first");
        big.push_all([(entry(2), 1)]).expect("second");
        big.mark_written(2);
        assert_eq!(big.first_index(), Some(2), "over the byte limit");
    }

    #[test]
    fn a_truncation_forgets_that_removed_entries_were_written() {
        let mut tail = LogTail::default();
        for i in 1..=(TAIL_ENTRIES_MAX as u64 + 10) {
            tail.push_all([(entry(i), 1)]).expect("contiguous");
        }
        tail.mark_written(TAIL_ENTRIES_MAX as u64 + 10);
        tail.truncate_after(Some(TAIL_ENTRIES_MAX as u64));
        // Entries appended again after the cut are not written yet and must stay.
        for i in 1..=20 {
            tail.push_all([(entry(TAIL_ENTRIES_MAX as u64 + i), 1)])
                .expect("contiguous");
        }
        tail.mark_written(TAIL_ENTRIES_MAX as u64);
        assert_eq!(
            tail.last_log_id().map(|id| id.index()),
            Some(TAIL_ENTRIES_MAX as u64 + 20)
        );
        assert!(tail.first_index() <= Some(TAIL_ENTRIES_MAX as u64 + 1));
        tail.purge_up_to(TAIL_ENTRIES_MAX as u64 + 5);
        assert_eq!(tail.first_index(), Some(TAIL_ENTRIES_MAX as u64 + 6));
        tail.truncate_after(None);
        assert!(tail.is_empty());
    }
}
