//! The bounded table of recent outcomes, keyed by `(client, request id)`, that makes a
//! retried command return its first outcome instead of applying twice.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use imbl::Vector;

use super::LogTime;
use super::constants::DEDUP_BYTES_HARD_MAX;
use super::constants::DEDUP_BYTES_MAX;
use super::constants::DEDUP_ENTRIES_MAX;
use super::constants::DEDUP_KEEP_MS;
use super::constants::DEDUP_WINDOW_MS;
use super::types::ClientId;
use super::types::Outcome;
use super::types::Refusal;

/// Which outcomes the count and byte limits may drop before the window ends: the rule
/// is part of what the machine applies, so it follows the recorded log entry form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Below [`crate::constants::DEDUP_KEEP_FORM`]: the oldest, however young.
    Oldest,
    /// Only those older than [`DEDUP_KEEP_MS`], unless the table holds more than
    /// [`DEDUP_BYTES_HARD_MAX`].
    KeepYoung,
}

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
    /// Inserted again later under the same key: no longer answers, skipped by walks,
    /// and already taken out of the counts; it waits to leave from the front.
    replaced: bool,
}

/// A fixed hasher, as the machine holds no random state. Nothing iterates the by-key
/// index, so its layout never reaches an outcome or a snapshot.
type FixedHasher = BuildHasherDefault<DefaultHasher>;

/// Arrival number by key, in [`INDEX_SHARDS`] hash maps chosen by the key. A map grows
/// all at once, rehashing every entry: one map of the million entries that 60 s of
/// writes may leave held the node's one apply thread for over 100 ms each time it
/// doubled; a shard of them takes a few.
#[derive(Debug)]
struct Index {
    shards: Vec<HashMap<DedupKey, u64, FixedHasher>>,
}

/// How many maps the index is split into.
const INDEX_SHARDS: usize = 64;

impl Index {
    fn shard(&self, key: &DedupKey) -> &HashMap<DedupKey, u64, FixedHasher> {
        &self.shards[shard_of(key)]
    }

    fn shard_mut(&mut self, key: &DedupKey) -> &mut HashMap<DedupKey, u64, FixedHasher> {
        &mut self.shards[shard_of(key)]
    }

    fn get(&self, key: &DedupKey) -> Option<&u64> {
        self.shard(key).get(key)
    }

    fn insert(&mut self, key: DedupKey, seq: u64) -> Option<u64> {
        self.shard_mut(&key).insert(key, seq)
    }

    fn remove(&mut self, key: &DedupKey) -> Option<u64> {
        self.shard_mut(key).remove(key)
    }
}

impl FromIterator<(DedupKey, u64)> for Index {
    fn from_iter<I: IntoIterator<Item = (DedupKey, u64)>>(entries: I) -> Self {
        let mut index = Index {
            shards: (0..INDEX_SHARDS).map(|_| HashMap::default()).collect(),
        };
        for (key, seq) in entries {
            index.insert(key, seq);
        }
        index
    }
}

/// The shard of `key`: FNV-1a of its client and request id, cheap next to the map's own
/// hash.
fn shard_of(key: &DedupKey) -> usize {
    let hash = super::fingerprint::fnv1a([&key.0.to_le_bytes()[..], key.1.as_bytes()]);
    (hash % INDEX_SHARDS as u64) as usize
}

/// The dedup table. Entries live once, in arrival order, in a persistent vector, so a
/// clone (every read view, every snapshot) is O(1). The by-key index is a plain hash
/// map that a clone does not take: a persistent one (path copies of a hash trie on every
/// insert and eviction while a clone lived) cost the leader 10% and a follower 20% of
/// their CPU at 64 workers. A clone rebuilds an index only if it is changed; until then
/// its lookups walk the entries, so lookups on a clone belong in tests and checks, not
/// on a request's path.
#[derive(Debug, Default)]
pub struct DedupTable {
    arrivals: Vector<Arrival>,
    /// Arrival number of `arrivals[0]`.
    front_seq: u64,
    /// Entries that answer: `arrivals` less the replaced ones.
    live: usize,
    bytes: usize,
    /// `None` in a clone until it is changed.
    index: Option<Index>,
}

impl Clone for DedupTable {
    fn clone(&self) -> Self {
        Self {
            arrivals: self.arrivals.clone(),
            front_seq: self.front_seq,
            live: self.live,
            bytes: self.bytes,
            index: None,
        }
    }
}

impl DedupTable {
    /// The first outcome of `key` and its request's fingerprint, if still remembered.
    pub fn get(&self, key: &DedupKey) -> Option<&DedupEntry> {
        let arrival = match &self.index {
            Some(index) => {
                let seq = index.get(key)?;
                self.arrivals
                    .get(usize::try_from(seq - self.front_seq).ok()?)?
            }
            None => self
                .arrivals
                .iter()
                .rev()
                .find(|arrival| !arrival.replaced && arrival.key == *key)?,
        };
        Some(&arrival.entry)
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

    /// The index, built from the entries first in a clone.
    fn index_mut(&mut self) -> &mut Index {
        let arrivals = &self.arrivals;
        let front_seq = self.front_seq;
        self.index.get_or_insert_with(|| {
            (front_seq..)
                .zip(arrivals.iter())
                .filter(|(_, arrival)| !arrival.replaced)
                .map(|(seq, arrival)| (arrival.key.clone(), seq))
                .collect()
        })
    }

    /// Remembers the first outcome of `key` (and its request's fingerprint) and evicts
    /// what the limits require.
    pub fn insert(
        &mut self,
        key: DedupKey,
        applied_at: LogTime,
        outcome: Arc<Outcome>,
        fingerprint: Option<u64>,
        retention: Retention,
    ) {
        self.push(key, applied_at, outcome, fingerprint);
        self.evict(applied_at, retention);
    }

    /// Puts a restored entry back as the snapshot held it, limits aside: the table it
    /// came from kept it under the rule of its time, and dropping it here would make
    /// this node answer a retry differently from the others.
    pub fn restore(
        &mut self,
        key: DedupKey,
        applied_at: LogTime,
        outcome: Arc<Outcome>,
        fingerprint: Option<u64>,
    ) {
        self.push(key, applied_at, outcome, fingerprint);
    }

    /// Appends an entry, replacing an earlier one under the same key.
    fn push(
        &mut self,
        key: DedupKey,
        applied_at: LogTime,
        outcome: Arc<Outcome>,
        fingerprint: Option<u64>,
    ) {
        let bytes = approximate_bytes(&key, &outcome);
        let seq = self.front_seq + self.arrivals.len() as u64;
        let front_seq = self.front_seq;
        if let Some(previous) = self.index_mut().insert(key.clone(), seq) {
            // Callers check `get` first; replacing keeps the table consistent regardless.
            let place = usize::try_from(previous - front_seq).ok();
            if let Some(old) = place.and_then(|place| self.arrivals.get_mut(place)) {
                old.replaced = true;
                self.bytes -= old.bytes;
                self.live -= 1;
            }
        }
        let entry = DedupEntry {
            applied_at,
            outcome,
            fingerprint,
        };
        self.arrivals.push_back(Arrival {
            key,
            entry,
            bytes,
            replaced: false,
        });
        self.live += 1;
        self.bytes += bytes;
    }

    /// Drops entries older than the window, and the oldest beyond the count and byte
    /// limits (under [`Retention::KeepYoung`], only those older than [`DEDUP_KEEP_MS`]
    /// while the table holds at most [`DEDUP_BYTES_HARD_MAX`]).
    pub fn evict(&mut self, now: LogTime, retention: Retention) {
        while let Some(oldest) = self.arrivals.front() {
            let age = now.millis_since(oldest.entry.applied_at);
            let too_old = age > DEDUP_WINDOW_MS;
            let may_go = retention == Retention::Oldest
                || age > DEDUP_KEEP_MS
                || self.bytes > DEDUP_BYTES_HARD_MAX;
            let too_many = self.live > DEDUP_ENTRIES_MAX;
            let too_big = self.bytes > DEDUP_BYTES_MAX;
            if !(oldest.replaced || too_old || (may_go && (too_many || too_big))) {
                break;
            }
            let Some(oldest) = self.arrivals.pop_front() else {
                break;
            };
            self.front_seq += 1;
            if oldest.replaced {
                continue;
            }
            self.live -= 1;
            self.bytes -= oldest.bytes;
            // A clone without an index builds it later from what is left: building it
            // here would cost a read view (which evicts as time passes) the whole table.
            if let Some(index) = self.index.as_mut() {
                let removed = index.remove(&oldest.key);
                debug_assert!(removed.is_some(), "dedup order names a missing key");
            }
        }
    }

    /// Roughly what the remembered outcomes take in memory, in bytes (what the byte
    /// limits count).
    pub fn approximate_bytes(&self) -> usize {
        self.bytes
    }

    /// Number of remembered outcomes.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Entries oldest first: the order a snapshot stores and a restore re-inserts.
    pub fn iter_oldest_first(&self) -> impl Iterator<Item = (&DedupKey, &DedupEntry)> + '_ {
        self.arrivals
            .iter()
            .filter(|arrival| !arrival.replaced)
            .map(|arrival| (&arrival.key, &arrival.entry))
    }
}

/// A deterministic estimate of what an entry costs in memory.
fn approximate_bytes(key: &DedupKey, outcome: &Outcome) -> usize {
    const ENTRY_OVERHEAD: usize = 128;
    const PER_ITEM: usize = 64;
    // A number, not `size_of::<Refusal>()`: the estimate decides which entries are
    // evicted, so every build in one cluster must compute the same one, and the enum's
    // layout changes whenever a variant grows. 56 is what that size has been since the
    // job layer (6b7ddb3) gave a variant two strings, so this changes no eviction.
    const PER_REFUSAL: usize = 56;
    let items = match outcome {
        Outcome::Tasks(tasks) => tasks
            .iter()
            .map(|task| PER_ITEM + task.data.len())
            .sum::<usize>(),
        Outcome::Refused(refusals) => refusals.len() * PER_REFUSAL,
        Outcome::Settings(_) => PER_ITEM,
        Outcome::Token(token) => {
            PER_ITEM + token.name.len() + token.groups.iter().map(String::len).sum::<usize>()
        }
        // A batch carries no request id, so the table never holds one.
        Outcome::Batch(outcomes) => outcomes.len() * PER_ITEM,
    };
    ENTRY_OVERHEAD + key.1.len() + items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Millis;

    fn key(client: ClientId, id: &str) -> DedupKey {
        (client, Arc::from(id))
    }

    #[test]
    fn a_refusal_is_estimated_the_same_in_every_build() {
        // Members must agree on what the table holds; these numbers are a rule of the
        // replicated machine, not a measurement of this build's types.
        let refused = Outcome::Refused(vec![Refusal::NothingToDo, Refusal::ClaimWithoutGroup]);
        assert_eq!(
            approximate_bytes(&key(1, "abcd"), &refused),
            128 + 4 + 2 * 56
        );
    }

    #[test]
    fn a_clone_evicts_without_an_index_and_builds_a_consistent_one_later() {
        let mut table = DedupTable::default();
        for (n, id) in ["a", "b", "c"].into_iter().enumerate() {
            let at = LogTime::from_millis(n as Millis);
            table.insert(
                key(1, id),
                at,
                Arc::new(Outcome::Tasks(vec![])),
                Some(7),
                Retention::Oldest,
            );
        }
        let mut view = table.clone();
        // Past the window of "a" and "b" only: a read view passing time evicts them.
        view.evict(LogTime::from_millis(DEDUP_WINDOW_MS + 2), Retention::Oldest);
        assert_eq!(view.len(), 1);
        assert!(view.get(&key(1, "a")).is_none());
        assert!(view.get(&key(1, "c")).is_some());
        let later = LogTime::from_millis(DEDUP_WINDOW_MS + 3);
        view.insert(
            key(1, "d"),
            later,
            Arc::new(Outcome::Tasks(vec![])),
            Some(7),
            Retention::Oldest,
        );
        view.insert(
            key(1, "c"),
            later,
            Arc::new(Outcome::Tasks(vec![])),
            Some(8),
            Retention::Oldest,
        );
        assert_eq!(view.len(), 2);
        assert_eq!(view.get(&key(1, "c")).map(|e| e.fingerprint), Some(Some(8)));
        assert_eq!(table.len(), 3, "the original is untouched");
    }

    #[test]
    fn remembers_per_client() {
        let mut table = DedupTable::default();
        table.insert(
            key(1, "a"),
            LogTime::EPOCH,
            Arc::new(Outcome::Tasks(vec![])),
            Some(7),
            Retention::Oldest,
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
            Retention::Oldest,
        );
        table.evict(LogTime::from_millis(DEDUP_WINDOW_MS), Retention::Oldest);
        assert_eq!(table.len(), 1, "kept for the whole window");
        table.evict(LogTime::from_millis(DEDUP_WINDOW_MS + 1), Retention::Oldest);
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
                Retention::Oldest,
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
            remember(&mut table, key(1, id));
        }
        let bytes = table.bytes;
        table.insert(
            key(1, "a"),
            LogTime::from_millis(5),
            Arc::new(Outcome::Tasks(vec![])),
            Some(2),
            Retention::Oldest,
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

    #[test]
    fn keep_young_holds_every_outcome_until_it_is_old_enough_to_go() {
        let mut table = DedupTable::default();
        let empty = Arc::new(Outcome::Tasks(vec![]));
        let young = LogTime::from_millis(1_000);
        for i in 0..DEDUP_ENTRIES_MAX + 10 {
            let k = key(1, &i.to_string());
            table.insert(k, young, Arc::clone(&empty), None, Retention::KeepYoung);
        }
        assert_eq!(
            table.len(),
            DEDUP_ENTRIES_MAX + 10,
            "none is old enough to go"
        );
        assert!(table.get(&key(1, "0")).is_some());

        table.evict(
            LogTime::from_millis(1_000 + DEDUP_KEEP_MS),
            Retention::KeepYoung,
        );
        assert_eq!(
            table.len(),
            DEDUP_ENTRIES_MAX + 10,
            "kept for the whole keep time"
        );
        table.evict(
            LogTime::from_millis(1_000 + DEDUP_KEEP_MS + 1),
            Retention::KeepYoung,
        );
        assert_eq!(table.len(), DEDUP_ENTRIES_MAX, "then the count limit holds");
        assert!(table.get(&key(1, "9")).is_none());
        assert!(table.get(&key(1, "10")).is_some());
    }

    #[test]
    fn keep_young_holds_at_most_the_hard_bound() {
        let mut table = DedupTable::default();
        // One big answer shared by every entry: the bound counts it each time, as it
        // would separate answers, while the test holds it once.
        let task = crate::Task {
            id: 1,
            group: Arc::from("g"),
            data: "x".repeat(4 << 20),
            available_at: LogTime::EPOCH,
            owner: 1,
            job: crate::TaskJob::default(),
        };
        let big = Arc::new(Outcome::Tasks(vec![task]));
        let start = LogTime::from_millis(1_000);
        // Each entry is its answer and a little more.
        let fit = DEDUP_BYTES_HARD_MAX / ((4 << 20) + 1024);
        for n in 0..fit + 10 {
            let k = key(1, &n.to_string());
            table.insert(k, start, Arc::clone(&big), None, Retention::KeepYoung);
            assert_eq!(table.len(), (n + 1).min(fit), "entry {n}");
        }
        assert!(table.approximate_bytes() <= DEDUP_BYTES_HARD_MAX);
        assert!(table.get(&key(1, "9")).is_none(), "the oldest went");
        assert!(table.get(&key(1, "10")).is_some());

        // Once the keep time has passed, the oldest go down to the soft byte bound.
        table.evict(
            LogTime::from_millis(1_000 + DEDUP_KEEP_MS + 1),
            Retention::KeepYoung,
        );
        assert!(table.approximate_bytes() <= DEDUP_BYTES_MAX);
    }

    #[test]
    fn a_restored_entry_is_kept_as_the_snapshot_held_it() {
        let mut table = DedupTable::default();
        let empty = Arc::new(Outcome::Tasks(vec![]));
        for i in 0..DEDUP_ENTRIES_MAX + 10 {
            let k = key(1, &i.to_string());
            table.restore(k, LogTime::EPOCH, Arc::clone(&empty), Some(1));
        }
        assert_eq!(table.len(), DEDUP_ENTRIES_MAX + 10);
        table.evict(LogTime::EPOCH, Retention::Oldest);
        assert_eq!(
            table.len(),
            DEDUP_ENTRIES_MAX,
            "the next command's rule applies"
        );
    }

    /// Remembers an empty outcome under `k` at the epoch.
    fn remember(table: &mut DedupTable, k: DedupKey) {
        table.insert(
            k,
            LogTime::EPOCH,
            Arc::new(Outcome::Tasks(vec![])),
            Some(1),
            Retention::Oldest,
        );
    }

    #[test]
    fn a_clone_answers_without_an_index_and_changes_apart_from_the_original() {
        let mut table = DedupTable::default();
        for id in ["a", "b", "c"] {
            remember(&mut table, key(1, id));
        }
        let mut copy = table.clone();
        assert!(copy.index.is_none(), "a clone does not copy the index");
        assert!(copy.get(&key(1, "b")).is_some());
        assert!(copy.get(&key(1, "z")).is_none());

        remember(&mut copy, key(1, "d"));
        remember(&mut table, key(2, "e"));
        assert!(copy.get(&key(1, "d")).is_some());
        assert!(table.get(&key(1, "d")).is_none());
        assert!(copy.get(&key(2, "e")).is_none());
        assert!(table.get(&key(2, "e")).is_some());
        let order = |t: &DedupTable| -> Vec<String> {
            t.iter_oldest_first()
                .map(|(k, _)| format!("{}{}", k.0, k.1))
                .collect()
        };
        assert_eq!(order(&copy), ["1a", "1b", "1c", "1d"]);
        assert_eq!(order(&table), ["1a", "1b", "1c", "2e"]);
    }

    /// The table against a plain model (a list in arrival order), through inserts of new
    /// and repeated keys, clones that go on changing, and time passing the window.
    #[test]
    fn agrees_with_a_plain_model_through_repeats_clones_and_expiry() {
        #[derive(Clone, Default)]
        struct Model(Vec<(DedupKey, LogTime, u64)>);
        impl Model {
            fn insert(&mut self, key: DedupKey, at: LogTime, fingerprint: u64) {
                self.0.retain(|(k, _, _)| *k != key);
                self.0.push((key, at, fingerprint));
                self.evict(at);
            }
            fn evict(&mut self, now: LogTime) {
                self.0
                    .retain(|(_, at, _)| now.millis_since(*at) <= DEDUP_WINDOW_MS);
            }
        }
        let mut next = crate::test_numbers(0x9e37_79b9_7f4a_7c15);
        let mut tables = vec![(DedupTable::default(), Model::default())];
        let mut now: Millis = 0;
        for step in 0..4_000u64 {
            now += next((DEDUP_WINDOW_MS / 200) as u64) as Millis;
            let at = LogTime::from_millis(now);
            let which = next(tables.len() as u64) as usize;
            let op = next(10);
            if op == 0 && tables.len() < 4 {
                let copy = (tables[which].0.clone(), tables[which].1.clone());
                tables.push(copy);
            }
            let (table, model) = &mut tables[which];
            match op {
                0 => {}
                1 => {
                    table.evict(at, Retention::Oldest);
                    model.evict(at);
                }
                _ => {
                    let k = key(next(3) as ClientId, &next(300).to_string());
                    table.insert(
                        k.clone(),
                        at,
                        Arc::new(Outcome::Tasks(vec![])),
                        Some(step),
                        Retention::Oldest,
                    );
                    model.insert(k, at, step);
                }
            }
            for (table, model) in &tables {
                let walked: Vec<(DedupKey, LogTime, u64)> = table
                    .iter_oldest_first()
                    .map(|(k, e)| (k.clone(), e.applied_at, e.fingerprint.unwrap_or(0)))
                    .collect();
                assert_eq!(walked, model.0, "step {step}: the walk");
                assert_eq!(table.len(), model.0.len(), "step {step}: the count");
            }
            let (table, model) = &tables[which];
            for (k, at, fingerprint) in &model.0 {
                let entry = table.get(k).expect("a remembered key is found");
                assert_eq!(
                    (entry.applied_at, entry.fingerprint),
                    (*at, Some(*fingerprint))
                );
            }
            assert!(table.get(&key(9, "never")).is_none());
        }
    }
}
