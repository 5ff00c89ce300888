//! The production log store: the Raft log and vote in RocksDB.
//!
//! Two column families: `logs` (key: index as big-endian u64, value: the entry) and
//! `meta` (format version, vote, committed, last purged). Every value is a versioned
//! [`crate::codec`] value. Durability: the vote is always written with a synced write;
//! appends and truncations are synced before openraft is told they are durable under
//! [`SyncMode::Always`], and left to the OS under [`SyncMode::Never`]. A synced write
//! syncs the whole WAL before it, so earlier unsynced writes become durable with it.

use std::fmt::Debug;
use std::io;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

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
    db: Arc<DB>,
    sync: SyncMode,
    stats: Arc<LogStats>,
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

impl RocksLogStore {
    /// Opens (creating if needed) the log store at `path`, checking its format version.
    pub fn open(path: &Path, sync: SyncMode) -> io::Result<Self> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let mut log_options = Options::default();
        log_options.set_compression_type(DBCompressionType::Lz4);
        let families = [
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_LOGS, log_options),
        ];
        let db = DB::open_cf_descriptors(&options, path, families).map_err(|e| {
            io::Error::other(format!("opening the Raft log at {}: {e}", path.display()))
        })?;
        let store = Self {
            db: Arc::new(db),
            sync,
            stats: Arc::default(),
        };
        store.check_format(path)?;
        Ok(store)
    }

    fn check_format(&self, path: &Path) -> io::Result<()> {
        match self.get_meta::<u32>(KEY_FORMAT)? {
            Some(LOG_FORMAT_VERSION) => Ok(()),
            Some(found) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the Raft log at {} has format {found}; this build reads {LOG_FORMAT_VERSION}: run the Rota release that wrote it",
                    path.display()
                ),
            )),
            None => {
                let empty = self
                    .db
                    .iterator_cf(self.cf(CF_LOGS)?, IteratorMode::Start)
                    .next()
                    .is_none()
                    && self.get_meta::<RotaVote>(KEY_VOTE)?.is_none();
                if !empty {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the Raft log at {} has data but no format header",
                            path.display()
                        ),
                    ));
                }
                self.put_meta(KEY_FORMAT, &LOG_FORMAT_VERSION, true)
            }
        }
    }

    fn cf(&self, name: &str) -> io::Result<&ColumnFamily> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| io::Error::other(format!("rocksdb: column family {name} is missing")))
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        let what = String::from_utf8_lossy(key);
        self.db
            .get_cf(self.cf(CF_META)?, key)
            .map_err(rocks_error("reading metadata"))?
            .map(|bytes| decode_value(&bytes, &what))
            .transpose()
    }

    fn put_meta<T: serde::Serialize>(&self, key: &[u8], value: &T, sync: bool) -> io::Result<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_META)?, key, encode_value(value)?);
        self.write(batch, sync)
    }

    /// Write counters, shared with whoever watches them.
    pub fn stats(&self) -> Arc<LogStats> {
        Arc::clone(&self.stats)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> io::Result<()> {
        let mut options = WriteOptions::default();
        options.set_sync(sync);
        let started = std::time::Instant::now();
        let result = self
            .db
            .write_opt(batch, &options)
            .map_err(rocks_error("writing"));
        if sync {
            self.stats.record_sync(started.elapsed());
        }
        result
    }

    fn sync_appends(&self) -> bool {
        self.sync == SyncMode::Always
    }

    fn last_entry_log_id(&self) -> io::Result<Option<RotaLogId>> {
        let mut iter = self.db.iterator_cf(self.cf(CF_LOGS)?, IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(rocks_error("reading the last entry"))?;
                let entry: RotaEntry = decode_value(&value, "log entry")?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

impl<C: RotaConfig> RaftLogReader<C> for RocksLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RotaEntry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&index) => index,
            Bound::Excluded(&index) => index.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let from = index_key(start);
        let iter = self.db.iterator_cf(
            self.cf(CF_LOGS)?,
            IteratorMode::From(&from, Direction::Forward),
        );
        let mut entries = Vec::new();
        for item in iter {
            let (key, value) = item.map_err(rocks_error("reading entries"))?;
            if !range.contains(&key_index(&key)?) {
                break;
            }
            entries.push(decode_value(&value, "log entry")?);
        }
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
        self.put_meta(KEY_VOTE, vote, true)
    }

    async fn save_committed(&mut self, committed: Option<RotaLogId>) -> Result<(), io::Error> {
        // A restart hint; a lost one only means re-applying less before catching up.
        self.put_meta(KEY_COMMITTED, &committed, false)
    }

    async fn read_committed(&mut self) -> Result<Option<RotaLogId>, io::Error> {
        Ok(self.get_meta::<Option<RotaLogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = RotaEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let logs = self.cf(CF_LOGS)?;
        let mut batch = WriteBatch::default();
        let mut count = 0;
        for entry in entries {
            batch.put_cf(logs, index_key(entry.log_id.index()), encode_value(&entry)?);
            count += 1;
        }
        self.stats.record_append(count);
        // One write and, under SyncMode::Always, one fsync for the whole batch: openraft
        // hands over every entry that queued up meanwhile, which is what batches commands.
        let result = self.write(batch, self.sync_appends());
        let reported = result
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string()));
        callback.io_completed(reported);
        result
    }

    async fn truncate_after(&mut self, last_log_id: Option<RotaLogId>) -> Result<(), io::Error> {
        let first_removed = last_log_id.map_or(0, |id| id.index() + 1);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            self.cf(CF_LOGS)?,
            index_key(first_removed),
            index_key(u64::MAX),
        );
        batch.delete_cf(self.cf(CF_LOGS)?, index_key(u64::MAX));
        self.write(batch, self.sync_appends())
    }

    async fn purge(&mut self, log_id: RotaLogId) -> Result<(), io::Error> {
        // The marker and the deletion share one batch, so the log never has a hole that
        // the marker does not explain.
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_META)?, KEY_LAST_PURGED, encode_value(&log_id)?);
        batch.delete_range_cf(
            self.cf(CF_LOGS)?,
            index_key(0),
            index_key(log_id.index() + 1),
        );
        self.write(batch, false)
    }
}
