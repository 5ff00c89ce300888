//! The production log store: the Raft log and vote in RocksDB.
//!
//! Two column families: `logs` (key: index as big-endian u64, value: the entry) and
//! `meta` (format version, vote, committed, last purged). Every value is a versioned
//! [`crate::codec`] value. Durability: the vote is always written with a synced write;
//! appends and truncations are synced before openraft is told they are durable under
//! [`SyncMode::Always`], and left to the OS under [`SyncMode::Never`]. A synced write
//! syncs the whole WAL before it, so earlier unsynced writes become durable with it.
//!
//! Every write goes through one writer thread, in the order the store was asked. An
//! append only encodes its entries, puts them in the in-memory [`LogTail`] (readable at
//! once) and queues them: the writer takes everything that queued up during its last
//! write into one RocksDB write and one fsync (group commit), then tells openraft.
//! Meanwhile the leader already sends the entries to its followers, so its own fsync
//! overlaps theirs. The other writes (vote, truncation, purge) wait for the writer, so
//! they land after every append asked for before them.
//!
//! The commit index openraft saves is a restart hint: a node rebuilds its state up to it
//! at start, so a lost one means a restarted node applies less (and its stale reads show
//! older state) until the leader tells it the commit index again. It advances with every
//! commit: writing it on its own would wake the writer and write RocksDB once more per
//! commit. It waits instead, and rides in the writer's next batch, once every write
//! queued before it is in that batch, so it never names an entry the store does not
//! hold; an idle writer writes it after [`COMMITTED_IDLE_WRITE`], and a closing one
//! before it stops. A process killed meanwhile loses at most that much of it.
//!
//! A follower's append is answered only once it is durable, so the hand-off to the
//! writer thread and back buys it nothing and costs two thread wake-ups, which on a
//! virtual machine are a large part of a lightly loaded follower's work. When told to
//! ([`RocksLogStore::inline_appends`], which the node sets while it does not lead), an
//! append finding the writer idle is written on the caller's thread instead, unless the
//! last synced write took longer than [`INLINE_SYNC_MAX`] (a slow disk would hold up
//! everything else the node's thread does) or the append carries more than
//! [`INLINE_ENTRIES_MAX`] entries. A leader under load sends large appends, and there
//! the hand-off pays: a follower that answers later lets the leader gather more commands
//! into its next append (measured: inline writes of large appends cost 2-10% of the
//! throughput at 64 workers, while small ones save 10% of a follower's CPU at 16). A
//! leader does not write inline: its entries go to the followers while its own fsync
//! runs. (The switch follows openraft's server metrics, so a new leader's first appends
//! may still be written inline; that costs time, not safety.) An inline write holds up
//! the Raft core for one write: heartbeats and votes wait for at most that fsync, which
//! is why a slow one turns inline writes off.
//!
//! The write-ahead log is kept small and its files are reused: once the WAL passes
//! [`WAL_BYTES_MAX`], RocksDB flushes the memtables that hold its oldest file, and up to
//! [`WAL_FILES_RECYCLED`] obsolete files are overwritten in place instead of deleted. An
//! append to a fresh file grows it, so every `fdatasync` also writes the file's new size
//! (its inode, or a journal commit on a journaled filesystem) after the data; an
//! overwrite of a file already written does not (a probe on this project's machines:
//! 90-116 us against 150-186 us per sync, docs/performance.md).
//! RocksDB recycles only files that it retired itself, so a store writes and retires two
//! WAL files when it opens ([`prepare_recycled_wal_files`]): a new or restarted node
//! starts on a recycled file rather than after 10 s or more of load. The cap also
//! bounds the WAL on disk and what a restart replays. With RocksDB's defaults
//! both grow to 4 times the memtables' capacity, 1.5 GiB for these three column families,
//! because a WAL file lives until every family has flushed what it holds and the small
//! `meta` family rarely fills its memtable. RocksDB 11's
//! default point-in-time recovery tells a recycled file's stale tail from new records by
//! the log number each record carries; `tests/rocks_crash.rs` kills writers on a
//! recycling store to check it.
//!
//! The counters that decide "the writer is idle" and "every write before this commit
//! index is received" assume one caller at a time, which openraft guarantees: only its
//! core task appends, truncates, purges and saves.

use std::fmt::Debug;
use std::io;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::PoisonError;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use rocksdb::ColumnFamily;
use rocksdb::ColumnFamilyDescriptor;
use rocksdb::DB;
use rocksdb::DBCompressionType;
use rocksdb::Direction;
use rocksdb::IteratorMode;
use rocksdb::Options;
use rocksdb::WriteBatch;
use rocksdb::WriteOptions;

use crate::codec::decode_value;
use crate::codec::encode_value;
use crate::log_stats::LogStats;
use crate::log_tail::LogTail;
use crate::raft_types::RotaConfig;
use crate::raft_types::RotaEntry;
use crate::raft_types::RotaLogId;
use crate::raft_types::RotaVote;
use crate::raft_types::SyncMode;

/// The on-disk layout this build writes. Older layouts get upgrade code beside `open`.
pub const LOG_FORMAT_VERSION: u32 = 1;

const CF_LOGS: &str = "logs";
const CF_META: &str = "meta";
const KEY_FORMAT: &[u8] = b"format_version";
const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// openraft's log storage in RocksDB; see the module documentation.
#[derive(Clone)]
pub struct RocksLogStore {
    writer: Arc<LogWriter>,
    db: Arc<DB>,
    sync: SyncMode,
    stats: Arc<LogStats>,
    tail: Arc<Mutex<LogTail>>,
}

impl Debug for RocksLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksLogStore")
            .field("path", &self.db.path())
            .field("sync", &self.sync)
            .finish()
    }
}

fn rocks_error(doing: &str) -> impl FnOnce(rocksdb::Error) -> io::Error + '_ {
    move |e| io::Error::other(format!("rocksdb: {doing}: {e}"))
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_index(key: &[u8]) -> io::Result<u64> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "log key is not 8 bytes"))?;
    Ok(u64::from_be_bytes(bytes))
}

fn column<'a>(db: &'a DB, name: &str) -> io::Result<&'a ColumnFamily> {
    db.cf_handle(name)
        .ok_or_else(|| io::Error::other(format!("rocksdb: column family {name} is missing")))
}

/// An io::Error copied for each of the callers that share one failed write.
fn copy_error(error: &io::Error) -> io::Error {
    io::Error::new(error.kind(), error.to_string())
}

/// Writes `batch`, synced or not, counting synced writes and their latency; answers how
/// long a synced write took.
fn write_batch(
    db: &DB,
    stats: &LogStats,
    batch: WriteBatch,
    sync: bool,
) -> io::Result<Option<Duration>> {
    let mut options = WriteOptions::default();
    options.set_sync(sync);
    let started = std::time::Instant::now();
    db.write_opt(batch, &options)
        .map_err(rocks_error("writing"))?;
    if !sync {
        return Ok(None);
    }
    let took = started.elapsed();
    stats.record_sync(took);
    Ok(Some(took))
}

type AppendDone = Box<dyn FnOnce(io::Result<()>) + Send>;
/// Makes the batch of a write that is not an append (it names column families of `db`).
type Work = Box<dyn FnOnce(&DB) -> io::Result<WriteBatch> + Send>;

/// Encoded entries (key, value) to store; `last` is the highest index among them.
struct QueuedAppend {
    entries: Vec<([u8; 8], Vec<u8>)>,
    last: u64,
    done: AppendDone,
}

/// What the writer thread is asked to do, in order.
enum WriteOp {
    /// Entries to store, then report durable.
    Append(QueuedAppend),
    /// Any other write, synced or not, answered once done.
    Other {
        work: Work,
        sync: bool,
        done: futures_channel::oneshot::Sender<io::Result<()>>,
    },
}

/// Appends that queued up, written together: their entries in one batch, one fsync.
const GROUP_OPS_MAX: usize = 1024;

/// How long a saved commit index waits for a batch to ride in before an idle writer
/// writes it alone.
pub const COMMITTED_IDLE_WRITE: Duration = Duration::from_millis(50);

/// An append is written on the caller's thread only while synced writes take less.
pub const INLINE_SYNC_MAX: Duration = Duration::from_millis(2);

/// An append of more entries than this always goes through the writer thread.
pub const INLINE_ENTRIES_MAX: usize = 8;

/// Write-ahead log bytes past which RocksDB flushes the memtables holding the oldest WAL
/// file, so that it can be recycled (about 4 s of writes at 10 000 cycles/s).
pub const WAL_BYTES_MAX: u64 = 8 << 20;

/// Obsolete WAL files kept to be overwritten by the next ones instead of deleted.
pub const WAL_FILES_RECYCLED: usize = 4;

/// A commit index saved and not yet written: its encoded value, and how many writes had
/// been queued when it was saved (it is written only after all of them).
struct PendingCommitted {
    value: Vec<u8>,
    committed: Option<RotaLogId>,
    after_ops: u64,
}

/// The newest commit index waiting for the writer, shared by the store and the thread.
type CommittedSlot = Arc<Mutex<Option<PendingCommitted>>>;

/// The writer thread and the queue to it; the thread ends (after the queue) when the
/// last store handle is dropped.
struct LogWriter {
    queue: Option<mpsc::Sender<WriteOp>>,
    /// Writes queued so far; a saved commit index waits for every one of them.
    queued: AtomicU64,
    /// Writes the thread has finished; equal to `queued` when it is idle.
    finished: Arc<AtomicU64>,
    committed: CommittedSlot,
    /// Whether an append may be written on the caller's thread (module docs).
    inline: Arc<AtomicBool>,
    writer: Arc<Mutex<Writer>>,
    thread: Option<JoinHandle<()>>,
}

impl LogWriter {
    fn start(
        db: Arc<DB>,
        sync: SyncMode,
        stats: Arc<LogStats>,
        tail: Arc<Mutex<LogTail>>,
    ) -> io::Result<Self> {
        let (queue, ops) = mpsc::channel();
        let committed = CommittedSlot::default();
        let finished = Arc::new(AtomicU64::new(0));
        let writer = Arc::new(Mutex::new(Writer::new(db, sync, stats, tail)));
        let thread = {
            let (slot, finished, writer) = (
                Arc::clone(&committed),
                Arc::clone(&finished),
                Arc::clone(&writer),
            );
            std::thread::Builder::new()
                .name("rota-log-writer".into())
                .spawn(move || write_loop(&writer, &slot, &finished, &ops))?
        };
        Ok(Self {
            queue: Some(queue),
            queued: AtomicU64::new(0),
            finished,
            committed,
            inline: Arc::default(),
            writer,
            thread: Some(thread),
        })
    }

    /// Writes `append` on this thread if inline appends are on, it is small, the writer
    /// thread has nothing queued or under way, and syncs are fast; otherwise hands it
    /// back.
    fn write_inline(&self, append: QueuedAppend) -> Result<(), QueuedAppend> {
        if !self.inline.load(Ordering::Relaxed) || append.entries.len() > INLINE_ENTRIES_MAX {
            return Err(append);
        }
        let queued = self.queued.load(Ordering::SeqCst);
        if self.finished.load(Ordering::SeqCst) != queued {
            return Err(append);
        }
        // Held by the thread while it writes; every write is in order behind the lock.
        let Ok(mut writer) = self.writer.try_lock() else {
            return Err(append);
        };
        if writer.last_sync_slow {
            return Err(append);
        }
        let committed = take_committed(&self.committed, queued);
        writer.write_appends(&mut vec![append], committed);
        Ok(())
    }

    fn send(&self, op: WriteOp) -> io::Result<()> {
        let stopped = || io::Error::other("the log writer has stopped");
        let queue = self.queue.as_ref().ok_or_else(stopped)?;
        queue.send(op).map_err(|_| stopped())?;
        self.queued.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Leaves `committed` for the writer's next batch, after every write queued so far.
    fn save_committed(&self, committed: Option<RotaLogId>) -> io::Result<()> {
        let value = encode_value(&committed)?;
        let after_ops = self.queued.load(Ordering::SeqCst);
        *lock_slot(&self.committed) = Some(PendingCommitted {
            value,
            committed,
            after_ops,
        });
        Ok(())
    }

    /// The commit index saved and not yet written, if any.
    fn unwritten_committed(&self) -> Option<Option<RotaLogId>> {
        lock_slot(&self.committed)
            .as_ref()
            .map(|pending| pending.committed)
    }

    /// Writes the batch `work` makes on the writer, after everything queued before it,
    /// and waits for it.
    async fn run(&self, work: Work, sync: bool) -> io::Result<()> {
        let (done, answer) = futures_channel::oneshot::channel();
        self.send(WriteOp::Other { work, sync, done })?;
        answer
            .await
            .map_err(|_| io::Error::other("the log writer stopped before the write"))?
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has written what was queued; joining
        // it releases the database before a reopen of the same directory.
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock_tail(tail: &Mutex<LogTail>) -> MutexGuard<'_, LogTail> {
    // The tail is consistent after every method; a panic elsewhere does not spoil it.
    tail.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock_slot(slot: &Mutex<Option<PendingCommitted>>) -> MutexGuard<'_, Option<PendingCommitted>> {
    // A plain value, replaced whole: a panic elsewhere cannot leave it half-written.
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the waiting commit index if every write queued before it has been received.
fn take_committed(slot: &Mutex<Option<PendingCommitted>>, received: u64) -> Option<Vec<u8>> {
    let mut pending = lock_slot(slot);
    match pending.as_ref() {
        Some(waiting) if waiting.after_ops <= received => pending.take().map(|p| p.value),
        _ => None,
    }
}

fn lock_writer(writer: &Mutex<Writer>) -> MutexGuard<'_, Writer> {
    // Its state (the first failure, the last sync's speed) is whole after every method.
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

fn write_loop(
    writer: &Mutex<Writer>,
    committed: &Mutex<Option<PendingCommitted>>,
    finished: &AtomicU64,
    ops: &mpsc::Receiver<WriteOp>,
) {
    let mut appends = Vec::new();
    let mut received: u64 = 0;
    loop {
        let first = match ops.recv_timeout(COMMITTED_IDLE_WRITE) {
            Ok(op) => op,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                lock_writer(writer).write_committed(take_committed(committed, received));
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let mut taken = vec![first];
        while taken.len() < GROUP_OPS_MAX {
            match ops.try_recv() {
                Ok(op) => taken.push(op),
                Err(_) => break,
            }
        }
        received += taken.len() as u64;
        let ready = take_committed(committed, received);
        let mut writer = lock_writer(writer);
        for op in taken {
            match op {
                WriteOp::Append(append) => appends.push(append),
                WriteOp::Other { work, sync, done } => {
                    writer.write_appends(&mut appends, None);
                    let result = writer.run(work, sync);
                    let _ = done.send(result);
                }
            }
        }
        if appends.is_empty() {
            writer.write_committed(ready);
        } else {
            writer.write_appends(&mut appends, ready);
        }
        drop(writer);
        finished.store(received, Ordering::SeqCst);
    }
    // The store is closing: everything queued has been received, so the last commit
    // index can be written whatever it waited for.
    lock_writer(writer).write_committed(take_committed(committed, u64::MAX));
}

/// The writer thread's state: after one failed write it writes nothing more, so that a
/// write that fails and a later one that succeeds cannot leave a hole in the log; every
/// later operation gets the first error, and openraft stops the node.
struct Writer {
    db: Arc<DB>,
    sync: SyncMode,
    stats: Arc<LogStats>,
    tail: Arc<Mutex<LogTail>>,
    failed: Option<io::Error>,
    /// Whether the last synced append took longer than [`INLINE_SYNC_MAX`].
    last_sync_slow: bool,
}

impl Writer {
    fn new(db: Arc<DB>, sync: SyncMode, stats: Arc<LogStats>, tail: Arc<Mutex<LogTail>>) -> Self {
        Self {
            db,
            sync,
            stats,
            tail,
            failed: None,
            last_sync_slow: false,
        }
    }

    /// The first failure, if a write failed before.
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(first) => Err(io::Error::new(
                first.kind(),
                format!("the log store stopped writing after an earlier failure: {first}"),
            )),
        }
    }

    fn note(&mut self, result: &io::Result<()>) {
        if let (Err(error), None) = (result, &self.failed) {
            tracing::error!("log write failed; the log store writes nothing more: {error}");
            self.failed = Some(copy_error(error));
        }
    }

    /// Runs one write that is not an append.
    fn run(&mut self, work: Work, sync: bool) -> io::Result<()> {
        self.check()?;
        let result = work(&self.db)
            .and_then(|batch| write_batch(&self.db, &self.stats, batch, sync).map(drop));
        self.note(&result);
        result
    }

    /// Writes a waiting commit index on its own, unsynced (a hint: see the module).
    fn write_committed(&mut self, committed: Option<Vec<u8>>) {
        if let Some(value) = committed {
            let _ = self.run(
                Box::new(move |db| meta_batch(db, KEY_COMMITTED, value)),
                false,
            );
        }
    }

    /// Writes the queued appends, and `committed` if given, in one batch, then reports to
    /// each append.
    fn write_appends(&mut self, appends: &mut Vec<QueuedAppend>, committed: Option<Vec<u8>>) {
        if appends.is_empty() {
            return;
        }
        let result = self.check().and_then(|()| {
            let logs = column(&self.db, CF_LOGS)?;
            let mut batch = WriteBatch::default();
            let mut count = 0;
            for append in appends.iter() {
                for (key, value) in &append.entries {
                    batch.put_cf(logs, key, value);
                    count += 1;
                }
            }
            if let Some(value) = committed {
                batch.put_cf(column(&self.db, CF_META)?, KEY_COMMITTED, value);
            }
            self.stats.record_append(count);
            let synced = self.sync == SyncMode::Always;
            if let Some(took) = write_batch(&self.db, &self.stats, batch, synced)? {
                self.last_sync_slow = took > INLINE_SYNC_MAX;
            }
            Ok(())
        });
        self.note(&result);
        if result.is_ok()
            && let Some(last) = appends.iter().map(|append| append.last).max()
        {
            lock_tail(&self.tail).mark_written(last);
        }
        for append in appends.drain(..) {
            (append.done)(result.as_ref().map(|_| ()).map_err(copy_error));
        }
    }
}

impl RocksLogStore {
    /// Opens (creating if needed) the log store at `path`, checking its format version,
    /// and starts its writer thread.
    pub fn open(path: &Path, sync: SyncMode) -> io::Result<Self> {
        Self::open_with_wal_limit(path, sync, WAL_BYTES_MAX)
    }

    /// [`RocksLogStore::open`] with another [`WAL_BYTES_MAX`]: tests use a tiny one so that
    /// a few hundred entries go through several recycled WAL files.
    pub fn open_with_wal_limit(
        path: &Path,
        sync: SyncMode,
        wal_bytes_max: u64,
    ) -> io::Result<Self> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_max_total_wal_size(wal_bytes_max);
        options.set_recycle_log_file_num(WAL_FILES_RECYCLED);
        let mut log_options = Options::default();
        log_options.set_compression_type(DBCompressionType::Lz4);
        let families = [
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_LOGS, log_options),
        ];
        let db = DB::open_cf_descriptors(&options, path, families).map_err(|e| {
            io::Error::other(format!("opening the Raft log at {}: {e}", path.display()))
        })?;
        let db = Arc::new(db);
        let stats = Arc::<LogStats>::default();
        check_format(&db, &stats, path)?;
        prepare_recycled_wal_files(&db, wal_bytes_max).map_err(|e| {
            io::Error::new(e.kind(), format!("the Raft log at {}: {e}", path.display()))
        })?;
        let tail = Arc::<Mutex<LogTail>>::default();
        let writer =
            LogWriter::start(Arc::clone(&db), sync, Arc::clone(&stats), Arc::clone(&tail))?;
        Ok(Self {
            writer: Arc::new(writer),
            db,
            sync,
            stats,
            tail,
        })
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        get_meta(&self.db, key)
    }

    /// Writes one metadata value on the writer, after everything queued before it.
    async fn put_meta<T: serde::Serialize>(
        &self,
        key: &'static [u8],
        value: &T,
        sync: bool,
    ) -> io::Result<()> {
        let value = encode_value(value)?;
        self.writer
            .run(Box::new(move |db| meta_batch(db, key, value)), sync)
            .await
    }

    /// Write counters, shared with whoever watches them.
    pub fn stats(&self) -> Arc<LogStats> {
        Arc::clone(&self.stats)
    }

    /// The switch that lets appends be written on the caller's thread when the writer
    /// is idle (module docs): on while this node does not lead, off while it does. It is
    /// off when the store opens.
    pub fn inline_appends(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.writer.inline)
    }

    fn sync_appends(&self) -> bool {
        self.sync == SyncMode::Always
    }

    fn last_entry_log_id(&self) -> io::Result<Option<RotaLogId>> {
        if let Some(last) = lock_tail(&self.tail).last_log_id() {
            return Ok(Some(last));
        }
        // An empty tail means nothing is waiting to be written: RocksDB has the log.
        let mut iter = self
            .db
            .iterator_cf(column(&self.db, CF_LOGS)?, IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(rocks_error("reading the last entry"))?;
                let entry: RotaEntry = decode_value(&value, "log entry")?;
                Ok(Some(entry.log_id))
            }
        }
    }

    /// Entries from RocksDB within `range` and below `below` (all of them for `None`).
    fn read_stored<RB: RangeBounds<u64>>(
        &self,
        range: &RB,
        below: Option<u64>,
    ) -> io::Result<Vec<RotaEntry>> {
        let start = match range.start_bound() {
            Bound::Included(&index) => index,
            Bound::Excluded(&index) => index.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut entries = Vec::new();
        if below.is_some_and(|below| start >= below) {
            return Ok(entries);
        }
        let from = index_key(start);
        let iter = self.db.iterator_cf(
            column(&self.db, CF_LOGS)?,
            IteratorMode::From(&from, Direction::Forward),
        );
        for item in iter {
            let (key, value) = item.map_err(rocks_error("reading entries"))?;
            let index = key_index(&key)?;
            if !range.contains(&index) || below.is_some_and(|below| index >= below) {
                break;
            }
            entries.push(decode_value(&value, "log entry")?);
        }
        Ok(entries)
    }
}

/// A batch that sets the metadata value `key` to `value` (encoded).
fn meta_batch(db: &DB, key: &[u8], value: Vec<u8>) -> io::Result<WriteBatch> {
    let mut batch = WriteBatch::default();
    batch.put_cf(column(db, CF_META)?, key, value);
    Ok(batch)
}

fn get_meta<T: serde::de::DeserializeOwned>(db: &DB, key: &[u8]) -> io::Result<Option<T>> {
    let what = String::from_utf8_lossy(key);
    db.get_cf(column(db, CF_META)?, key)
        .map_err(rocks_error("reading metadata"))?
        .map(|bytes| decode_value(&bytes, &what))
        .transpose()
}

/// Key of the filler that [`prepare_recycled_wal_files`] writes and deletes at once, in
/// the default column family, which holds nothing else.
const KEY_WAL_FILLER: &[u8] = b"wal_filler";

/// WAL files that [`prepare_recycled_wal_files`] writes: the second retires the first, so
/// the WAL in use after it is a recycled file.
const WAL_FILES_PREPARED: usize = 2;

/// Makes the WAL that the store starts with a recycled file of `wal_bytes_max` bytes, as
/// it is on a store that has run for a while, instead of a new file that every synced
/// write grows (see the module). RocksDB recycles only files that it retired itself, so
/// this writes [`WAL_FILES_PREPARED`] WAL files full of a filler that it deletes in the
/// same write, and retires each with a flush of every column family. Synced, so that the
/// files' blocks are allocated on disk before they are overwritten. About 90 ms and 16
/// MiB written at every open, measured on this project's machines.
fn prepare_recycled_wal_files(db: &DB, wal_bytes_max: u64) -> io::Result<()> {
    let filler = vec![0u8; usize::try_from(wal_bytes_max.min(WAL_BYTES_MAX)).unwrap_or(0)];
    let mut synced = WriteOptions::default();
    synced.set_sync(true);
    let families = [column(db, CF_META)?, column(db, CF_LOGS)?];
    let preparing = "preparing recycled WAL files";
    for _ in 0..WAL_FILES_PREPARED {
        let mut batch = WriteBatch::default();
        batch.put(KEY_WAL_FILLER, &filler);
        batch.delete(KEY_WAL_FILLER);
        db.write_opt(batch, &synced)
            .map_err(rocks_error(preparing))?;
        db.flush().map_err(rocks_error(preparing))?;
        for family in families {
            db.flush_cf(family).map_err(rocks_error(preparing))?;
        }
    }
    Ok(())
}

/// Checks the layout version, writing it into a new, empty store.
fn check_format(db: &DB, stats: &LogStats, path: &Path) -> io::Result<()> {
    match get_meta::<u32>(db, KEY_FORMAT)? {
        Some(LOG_FORMAT_VERSION) => Ok(()),
        Some(found) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the Raft log at {} has format {found}; this build reads {LOG_FORMAT_VERSION}: run the Rota release that wrote it",
                path.display()
            ),
        )),
        None => {
            let empty = db
                .iterator_cf(column(db, CF_LOGS)?, IteratorMode::Start)
                .next()
                .is_none()
                && get_meta::<RotaVote>(db, KEY_VOTE)?.is_none();
            if !empty {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the Raft log at {} has data but no format header",
                        path.display()
                    ),
                ));
            }
            let batch = meta_batch(db, KEY_FORMAT, encode_value(&LOG_FORMAT_VERSION)?)?;
            write_batch(db, stats, batch, true).map(drop)
        }
    }
}

impl<C: RotaConfig> RaftLogReader<C> for RocksLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RotaEntry>, io::Error> {
        // The tail first: an entry that leaves it meanwhile is already in RocksDB.
        let (tail_first, from_tail) = lock_tail(&self.tail).read(&range);
        let mut entries = self.read_stored(&range, tail_first)?;
        entries.extend(from_tail);
        Ok(entries)
    }

    async fn read_vote(&mut self) -> Result<Option<RotaVote>, io::Error> {
        self.get_meta(KEY_VOTE)
    }
}

impl<C: RotaConfig> RaftLogStorage<C> for RocksLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let last_purged_log_id: Option<RotaLogId> = self.get_meta(KEY_LAST_PURGED)?;
        let last_log_id = self.last_entry_log_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &RotaVote) -> Result<(), io::Error> {
        // Synced in every mode: a forgotten vote lets a node vote twice in one term.
        self.put_meta(KEY_VOTE, vote, true).await
    }

    async fn save_committed(&mut self, committed: Option<RotaLogId>) -> Result<(), io::Error> {
        // A restart hint: nobody waits for it, and it rides in the writer's next batch
        // (module docs say what a lost one costs).
        self.writer.save_committed(committed)
    }

    async fn read_committed(&mut self) -> Result<Option<RotaLogId>, io::Error> {
        if let Some(unwritten) = self.writer.unwritten_committed() {
            return Ok(unwritten);
        }
        Ok(self.get_meta::<Option<RotaLogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = RotaEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        let mut held = Vec::new();
        for entry in entries {
            let value = encode_value(&entry)?;
            encoded.push((index_key(entry.log_id.index()), value));
            held.push(entry);
        }
        let last = held.last().map(|e| e.log_id.index());
        lock_tail(&self.tail)
            .push_all(held.into_iter().zip(encoded.iter().map(|(_, v)| v.len())))
            .map_err(|hole| io::Error::new(io::ErrorKind::InvalidInput, hole))?;
        let Some(last) = last else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let append = QueuedAppend {
            entries: encoded,
            last,
            done: Box::new(move |result| callback.io_completed(result)),
        };
        match self.writer.write_inline(append) {
            Ok(()) => Ok(()),
            Err(append) => self.writer.send(WriteOp::Append(append)),
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<RotaLogId>) -> Result<(), io::Error> {
        let last_kept = last_log_id.map(|id| id.index());
        lock_tail(&self.tail).truncate_after(last_kept);
        let first_removed = last_kept.map_or(0, |index| index + 1);
        let work: Work = Box::new(move |db| {
            let logs = column(db, CF_LOGS)?;
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(logs, index_key(first_removed), index_key(u64::MAX));
            batch.delete_cf(logs, index_key(u64::MAX));
            Ok(batch)
        });
        let result = self.writer.run(work, self.sync_appends()).await;
        // Appends queued before the truncation marked entries past the cut as written.
        lock_tail(&self.tail).truncate_after(last_kept);
        result
    }

    async fn purge(&mut self, log_id: RotaLogId) -> Result<(), io::Error> {
        lock_tail(&self.tail).purge_up_to(log_id.index());
        // The marker and the deletion share one batch, so the log never has a hole that
        // the marker does not explain.
        let marker = encode_value(&log_id)?;
        let work: Work = Box::new(move |db| {
            let mut batch = meta_batch(db, KEY_LAST_PURGED, marker)?;
            batch.delete_range_cf(
                column(db, CF_LOGS)?,
                index_key(0),
                index_key(log_id.index() + 1),
            );
            Ok(batch)
        });
        self.writer.run(work, false).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored_committed(store: &RocksLogStore) -> Option<Option<RotaLogId>> {
        store
            .get_meta(KEY_COMMITTED)
            .expect("reads the commit index")
    }

    fn some_log_id(index: u64) -> Option<RotaLogId> {
        Some(RotaLogId::new(
            crate::raft_types::RotaLeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        ))
    }

    /// Sizes of the WAL files in `dir`, and whether RocksDB's info log of the latest open
    /// says it reused a recycled one.
    fn wal_files(dir: &Path) -> (Vec<u64>, bool) {
        let mut sizes = Vec::new();
        for entry in std::fs::read_dir(dir).expect("lists the store") {
            let entry = entry.expect("a directory entry");
            if entry.file_name().to_string_lossy().ends_with(".log") {
                sizes.push(entry.metadata().expect("metadata").len());
            }
        }
        let info = std::fs::read_to_string(dir.join("LOG")).expect("RocksDB's info log");
        (sizes, info.contains("reusing log"))
    }

    #[test]
    fn a_store_opens_onto_a_recycled_wal_file_of_full_size() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for open in ["new", "reopened"] {
            let store = RocksLogStore::open(dir.path(), SyncMode::Always).expect("opens");
            let (sizes, reused) = wal_files(dir.path());
            assert!(reused, "{open}: the WAL in use is not a recycled file");
            assert!(
                !sizes.is_empty() && sizes.iter().all(|&size| size >= WAL_BYTES_MAX),
                "{open}: WAL files {sizes:?}, each should be at least {WAL_BYTES_MAX} bytes"
            );
            drop(store);
        }
    }

    #[test]
    fn a_saved_commit_index_is_written_by_an_idle_writer_and_at_close() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = RocksLogStore::open(dir.path(), SyncMode::Always).expect("opens");
        store.writer.save_committed(some_log_id(7)).expect("saves");
        assert_eq!(store.writer.unwritten_committed(), Some(some_log_id(7)));

        let deadline = std::time::Instant::now() + COMMITTED_IDLE_WRITE * 10;
        while stored_committed(&store).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "an idle writer never wrote the commit index"
            );
            std::thread::sleep(COMMITTED_IDLE_WRITE / 10);
        }
        assert_eq!(stored_committed(&store), Some(some_log_id(7)));
        assert_eq!(store.writer.unwritten_committed(), None);

        // One saved just before the store closes is written as it closes.
        store.writer.save_committed(some_log_id(9)).expect("saves");
        drop(store);
        let store = RocksLogStore::open(dir.path(), SyncMode::Always).expect("reopens");
        assert_eq!(stored_committed(&store), Some(some_log_id(9)));
    }

    /// An append whose report says which thread wrote it, and the receiving end.
    fn traced_append(index: u64) -> (QueuedAppend, mpsc::Receiver<(io::Result<()>, String)>) {
        let (report, reported) = mpsc::channel();
        let append = QueuedAppend {
            entries: vec![(index_key(index), b"entry".to_vec())],
            last: index,
            done: Box::new(move |result| {
                let thread = std::thread::current().name().unwrap_or("").to_string();
                let _ = report.send((result, thread));
            }),
        };
        (append, reported)
    }

    #[test]
    fn an_idle_writer_lets_a_follower_write_its_append_inline() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = RocksLogStore::open(dir.path(), SyncMode::Always).expect("opens");
        let writer = &store.writer;
        let here = std::thread::current().name().unwrap_or("").to_string();
        let stored = |index| {
            let logs = column(&store.db, CF_LOGS).expect("logs");
            store
                .db
                .get_cf(logs, index_key(index))
                .expect("reads")
                .is_some()
        };

        // Off (a leader, or a store just opened): handed back for the writer thread.
        let (append, _) = traced_append(1);
        assert!(writer.write_inline(append).is_err(), "inline is off");

        store.inline_appends().store(true, Ordering::Relaxed);
        let (append, report) = traced_append(1);
        assert!(
            writer.write_inline(append).is_ok(),
            "an idle writer: inline"
        );
        let (result, thread) = report.try_recv().expect("reported before returning");
        assert!(result.is_ok());
        assert_eq!(thread, here, "written on the caller's thread");
        assert!(stored(1));

        // A large append: the leader is busy, and a later answer lets it batch more.
        let (mut append, _) = traced_append(2);
        append.entries = (2..=2 + INLINE_ENTRIES_MAX as u64)
            .map(|index| (index_key(index), b"entry".to_vec()))
            .collect();
        assert!(writer.write_inline(append).is_err(), "too many entries");

        // A slow disk: the node's thread must not wait for it.
        lock_writer(&writer.writer).last_sync_slow = true;
        let (append, _) = traced_append(2);
        assert!(writer.write_inline(append).is_err(), "syncs are slow");
        lock_writer(&writer.writer).last_sync_slow = false;

        // Something queued: the append goes behind it, to the writer thread.
        let (queued, queued_report) = traced_append(2);
        writer.send(WriteOp::Append(queued)).expect("queues");
        let (append, report) = traced_append(3);
        match writer.write_inline(append) {
            // The thread was still at it: the append goes behind, through the queue.
            Err(append) => writer.send(WriteOp::Append(append)).expect("queues"),
            // The thread had already finished the first one: nothing is out of order.
            Ok(()) => assert!(stored(2), "inline only after what was queued"),
        }
        let (result, thread) = queued_report.recv().expect("the queued one is reported");
        assert!(result.is_ok());
        assert_eq!(thread, "rota-log-writer");
        assert!(report.recv().expect("reported").0.is_ok());
        assert!(stored(2) && stored(3));
    }

    #[test]
    fn a_commit_index_waits_for_the_writes_queued_before_it() {
        let slot: Mutex<Option<PendingCommitted>> = Mutex::new(Some(PendingCommitted {
            value: b"c".to_vec(),
            committed: some_log_id(3),
            after_ops: 5,
        }));
        assert_eq!(
            take_committed(&slot, 4),
            None,
            "one write before it is still queued"
        );
        assert_eq!(take_committed(&slot, 5), Some(b"c".to_vec()));
        assert_eq!(take_committed(&slot, 6), None, "taken once");
    }

    #[test]
    fn after_a_failed_write_the_writer_writes_nothing_more() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = RocksLogStore::open(dir.path(), SyncMode::Always).expect("opens");
        let mut writer = Writer::new(
            Arc::clone(&store.db),
            SyncMode::Always,
            Arc::default(),
            Arc::default(),
        );
        let failed = writer.run(Box::new(|_| Err(io::Error::other("disk on fire"))), true);
        assert!(failed.is_err());

        // An append after it is refused and stores nothing: no hole behind the failure.
        let (report, reported) = mpsc::channel();
        let mut appends = vec![QueuedAppend {
            entries: vec![(index_key(1), b"entry".to_vec())],
            last: 1,
            done: Box::new(move |result| {
                let _ = report.send(result.map_err(|e| e.to_string()));
            }),
        }];
        writer.write_appends(&mut appends, None);
        let answer = reported.recv().expect("the append is answered");
        assert!(answer.expect_err("refused").contains("disk on fire"));
        let logs = column(&store.db, CF_LOGS).expect("logs");
        assert!(
            store
                .db
                .get_cf(logs, index_key(1))
                .expect("reads")
                .is_none()
        );
        assert!(
            writer
                .run(Box::new(|_| Ok(WriteBatch::default())), true)
                .is_err(),
            "and so is any other write"
        );
    }
}
