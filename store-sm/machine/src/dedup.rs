//! The bounded table of recent outcomes, keyed by `(client, request id)`, that makes a
//! retried command return its first outcome instead of applying twice.

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use imbl::GenericHashMap;
use imbl::OrdMap;
use imbl::shared_ptr::DefaultSharedPtr;

use super::LogTime;
use super::constants::DEDUP_BYTES_MAX;
use super::constants::DEDUP_ENTRIES_MAX;
use super::constants::DEDUP_WINDOW_MS;
use super::types::ClientId;
use super::types::Outcome;
use super::types::Refusal;

/// Who asked: the same request id from two clients is two requests.
pub type DedupKey = (ClientId, Arc<str>);

/// One remembered outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupEntry {
    /// Log time of the first application.
    pub applied_at: LogTime,
    /// What the first application answered.
    pub outcome: Arc<Outcome>,
    /// The first request's fingerprint (`None` when restored from a snapshot older than
    /// fingerprints: any request under the id gets the outcome then).
    pub fingerprint: Option<u64>,
}

/// An entry where the table keeps it: in arrival order, with its key and its size, so
/// that eviction and a snapshot's walk read entries in order without a lookup by key.
#[derive(Clone, Debug)]
struct Arrival {
    key: DedupKey,
    entry: DedupEntry,
    bytes: usize,
}

/// A fixed hasher, as the machine holds no random state. Nothing iterates the by-key
/// index, so its layout never reaches an outcome or a snapshot.
type FixedHasher = BuildHasherDefault<DefaultHasher>;

/// The dedup table. Cloning is O(1) (persistent maps), so snapshots share it. Each entry
/// lives once, in arrival order; the by-key index is a hash map to its arrival number,
/// because comparing request ids down an ordered map cost a follower 8% of its CPU.
#[derive(Clone, Debug, Default)]
pub struct DedupTable {
    by_key: GenericHashMap<DedupKey, u64, FixedHasher, DefaultSharedPtr>,
    by_seq: OrdMap<u64, Arrival>,
    next_seq: u64,
    bytes: usize,
}

impl DedupTable {
    /// The first outcome of `key` and its request's fingerprint, if still remembered.
    pub fn get(&self, key: &DedupKey) -> Option<&DedupEntry> {
        let seq = self.by_key.get(key)?;
        self.by_seq.get(seq).map(|arrival| &arrival.entry)
    }

    /// The answer to a request under `key` with `fingerprint`: its first outcome, or,
    /// when the id named another request (a client's bug: answering the first outcome
    /// would tell it the second one happened), a refusal; `None` if `key` is not
    /// remembered.
    pub fn answer(&self, key: &DedupKey, fingerprint: Option<u64>) -> Option<Arc<Outcome>> {
        let first = self.get(key)?;
        if first.fingerprint.is_some() && first.fingerprint != fingerprint {
            let request_id = key.1.to_string();
            let refusal = Refusal::RequestIdReused { request_id };
            return Some(Arc::new(Outcome::Refused(vec![refusal])));
        }
        Some(Arc::clone(&first.outcome))
    }

    /// Remembers the first outcome of `key` (and its request's fingerprint) and evicts
    /// what the limits require.
    pub fn insert(
        &mut self,
        key: DedupKey,
        applied_at: LogTime,
        outcome: Arc<Outcome>,
        fingerprint: Option<u64>,
    ) {
        let bytes = approximate_bytes(&key, &outcome);
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(previous) = self.by_key.insert(key.clone(), seq) {
            // Callers check `get` first; replacing keeps the table consistent regardless.
            if let Some(arrival) = self.by_seq.remove(&previous) {
                self.bytes -= arrival.bytes;
            }
        }
        let entry = DedupEntry {
            applied_at,
            outcome,
            fingerprint,
        };
        self.by_seq.insert(seq, Arrival { key, entry, bytes });
        self.bytes += bytes;
        self.evict(applied_at);
    }

    /// Drops entries beyond the count and byte limits, and those older than the window.
    pub fn evict(&mut self, now: LogTime) {
        while let Some(&(seq, ref oldest)) = self.by_seq.get_min() {
            let too_old = now.millis_since(oldest.entry.applied_at) > DEDUP_WINDOW_MS;
            let too_many = self.by_seq.len() > DEDUP_ENTRIES_MAX;
            let too_big = self.bytes > DEDUP_BYTES_MAX;
            if !(too_old || too_many || too_big) {
                break;
            }
            let Some(oldest) = self.by_seq.remove(&seq) else {
                break;
            };
            self.bytes -= oldest.bytes;
            let removed = self.by_key.remove(&oldest.key);
            debug_assert!(removed.is_some(), "dedup order names a missing key");
        }
    }

    /// Number of remembered outcomes.
    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// Entries oldest first: the order a snapshot stores and a restore re-inserts.
    pub fn iter_oldest_first(&self) -> impl Iterator<Item = (&DedupKey, &DedupEntry)> + '_ {
        self.by_seq
            .values()
            .map(|arrival| (&arrival.key, &arrival.entry))
    }
}

/// A deterministic estimate of what an entry costs in memory.
fn approximate_bytes(key: &DedupKey, outcome: &Outcome) -> usize {
    const ENTRY_OVERHEAD: usize = 128;
    const PER_ITEM: usize = 64;
    let items = match outcome {
        Outcome::Tasks(tasks) => tasks
            .iter()
            .map(|task| PER_ITEM + task.data.len())
            .sum::<usize>(),
        Outcome::Refused(refusals) => refusals.len() * std::mem::size_of::<Refusal>(),
        Outcome::Settings(_) => PER_ITEM,
        Outcome::Token(token) => {
            PER_ITEM + token.name.len() + token.groups.iter().map(String::len).sum::<usize>()
        }
    };
    ENTRY_OVERHEAD + key.1.len() + items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(client: ClientId, id: &str) -> DedupKey {
        (client, Arc::from(id))
    }

    #[test]
    fn remembers_per_client() {
        let mut table = DedupTable::default();
        table.insert(
            key(1, "a"),
            LogTime::EPOCH,
            Arc::new(Outcome::Tasks(vec![])),
            Some(7),
        );
        assert!(table.get(&key(1, "a")).is_some());
        assert!(table.get(&key(2, "a")).is_none());
    }

    #[test]
    fn forgets_after_the_window() {
        let mut table = DedupTable::default();
        table.insert(
            key(1, "a"),
            LogTime::EPOCH,
            Arc::new(Outcome::Tasks(vec![])),
            Some(7),
        );
        table.evict(LogTime::from_millis(DEDUP_WINDOW_MS));
        assert_eq!(table.len(), 1, "kept for the whole window");
        table.evict(LogTime::from_millis(DEDUP_WINDOW_MS + 1));
        assert!(table.is_empty());
    }

    #[test]
    fn keeps_at_most_the_entry_limit_dropping_the_oldest() {
        let mut table = DedupTable::default();
        for i in 0..DEDUP_ENTRIES_MAX + 10 {
            table.insert(
                key(1, &i.to_string()),
                LogTime::EPOCH,
                Arc::new(Outcome::Tasks(vec![])),
                None,
            );
        }
        assert_eq!(table.len(), DEDUP_ENTRIES_MAX);
        assert!(table.get(&key(1, "0")).is_none());
        assert!(table.get(&key(1, "9")).is_none());
        assert!(table.get(&key(1, "10")).is_some());
    }

    #[test]
    fn walks_oldest_first_and_a_replaced_key_moves_to_the_end() {
        let mut table = DedupTable::default();
        for id in ["a", "b", "c"] {
            table.insert(
                key(1, id),
                LogTime::EPOCH,
                Arc::new(Outcome::Tasks(vec![])),
                Some(1),
            );
        }
        let bytes = table.bytes;
        table.insert(
            key(1, "a"),
            LogTime::from_millis(5),
            Arc::new(Outcome::Tasks(vec![])),
            Some(2),
        );
        let order: Vec<&str> = table.iter_oldest_first().map(|(k, _)| &*k.1).collect();
        assert_eq!(order, ["b", "c", "a"]);
        assert_eq!(table.len(), 3);
        assert_eq!(
            table.bytes, bytes,
            "the replaced entry's size is given back"
        );
        let a = table.get(&key(1, "a")).expect("a is remembered");
        assert_eq!(
            (a.applied_at, a.fingerprint),
            (LogTime::from_millis(5), Some(2))
        );
    }
}
