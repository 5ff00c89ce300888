//! An in-memory log store and snapshot store with a crash model, for tests and the
//! simulation.
//!
//! A [`MemDisk`] keeps two images of the log: what was written and what was synced.
//! Writes change the written image and queue in `pending`; a sync applies the queue to
//! the synced image; [`MemDisk::crash`] throws the written image away and keeps only the
//! synced one, as a power loss would. The disk outlives the stores opened on it, so a
//! simulated node can be killed, crashed and restarted on the same disk.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;

use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;

use crate::planted::Bug;
use crate::planted::is_planted;
use crate::raft_types::RotaConfig;
use crate::raft_types::RotaEntry;
use crate::raft_types::RotaLogId;
use crate::raft_types::RotaVote;
use crate::raft_types::SyncMode;
use crate::state_machine::SnapshotPersistence;
use crate::state_machine::StoredSnapshot;
use crate::state_machine::supersedes;

/// Unsynced writes a disk holds before it syncs on its own, as an OS flushes dirty pages
/// under memory pressure; bounds the queue under [`SyncMode::Never`].
pub const PENDING_OPS_MAX: usize = 4096;

#[derive(Clone, Debug, Default)]
struct LogImage {
    vote: Option<RotaVote>,
    committed: Option<RotaLogId>,
    last_purged: Option<RotaLogId>,
    entries: BTreeMap<u64, RotaEntry>,
}

#[derive(Clone, Debug)]
enum LogOp {
    Vote(RotaVote),
    Committed(Option<RotaLogId>),
    Append(Vec<RotaEntry>),
    TruncateAfter(Option<RotaLogId>),
    Purge(RotaLogId),
}

impl LogImage {
    fn apply(&mut self, op: &LogOp) {
        match op {
            LogOp::Vote(vote) => self.vote = Some(*vote),
            LogOp::Committed(committed) => self.committed = *committed,
            LogOp::Append(entries) => {
                for entry in entries {
                    self.entries.insert(entry.log_id.index(), entry.clone());
                }
            }
            LogOp::TruncateAfter(last) => {
                let first_removed = last.map_or(0, |id| id.index() + 1);
                self.entries.split_off(&first_removed);
            }
            LogOp::Purge(upto) => {
                if self.last_purged.is_none_or(|purged| purged < *upto) {
                    self.last_purged = Some(*upto);
                }
                self.entries = self.entries.split_off(&(upto.index() + 1));
            }
        }
    }
}

#[derive(Debug, Default)]
struct DiskState {
    written: LogImage,
    synced: LogImage,
    pending: Vec<LogOp>,
    snapshot: Option<StoredSnapshot>,
    note: Option<Vec<u8>>,
    syncs: u64,
}

impl DiskState {
    fn write(&mut self, op: LogOp) {
        self.written.apply(&op);
        self.pending.push(op);
        if self.pending.len() >= PENDING_OPS_MAX {
            self.sync();
        }
    }

    fn sync(&mut self) {
        for op in self.pending.drain(..) {
            self.synced.apply(&op);
        }
        self.syncs += 1;
    }
}

/// A simulated disk shared by the stores of one node; see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct MemDisk {
    state: Arc<Mutex<DiskState>>,
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes every write so far durable.
    pub fn sync(&self) {
        self.lock().sync();
    }

    /// Loses every write that was not synced. Snapshots are written with fsync and
    /// rename, so the current snapshot survives.
    pub fn crash(&self) {
        let mut state = self.lock();
        state.written = state.synced.clone();
        state.pending.clear();
    }

    /// Writes that a crash now would lose.
    pub fn unsynced_writes(&self) -> usize {
        self.lock().pending.len()
    }

    /// How many syncs the disk has done.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// A log store on this disk.
    pub fn log_store(&self, sync: SyncMode) -> MemLogStore {
        MemLogStore {
            disk: self.clone(),
            sync,
        }
    }

    /// The snapshot store on this disk.
    pub fn snapshots(&self) -> MemSnapshots {
        MemSnapshots { disk: self.clone() }
    }
}

/// openraft's log storage on a [`MemDisk`].
#[derive(Clone, Debug)]
pub struct MemLogStore {
    disk: MemDisk,
    sync: SyncMode,
}

impl MemLogStore {
    fn write(&self, op: LogOp, sync: bool) {
        let mut state = self.disk.lock();
        state.write(op);
        if sync {
            state.sync();
        }
    }

    fn sync_appends(&self) -> bool {
        self.sync == SyncMode::Always
    }
}

impl<C: RotaConfig> RaftLogReader<C> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RotaEntry>, io::Error> {
        let state = self.disk.lock();
        Ok(state
            .written
            .entries
            .range(range)
            .map(|(_, entry)| entry.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<RotaVote>, io::Error> {
        Ok(self.disk.lock().written.vote)
    }
}

impl<C: RotaConfig> RaftLogStorage<C> for MemLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let state = self.disk.lock();
        let last_purged_log_id = state.written.last_purged;
        let last_log_id = state
            .written
            .entries
            .last_key_value()
            .map(|(_, entry)| entry.log_id)
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &RotaVote) -> Result<(), io::Error> {
        // The vote is synced in every mode: a forgotten vote lets a node vote twice in a term.
        self.write(LogOp::Vote(*vote), true);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<RotaLogId>) -> Result<(), io::Error> {
        // A hint for restart; losing it only means re-applying less before catching up.
        self.write(LogOp::Committed(committed), false);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<RotaLogId>, io::Error> {
        Ok(self.disk.lock().written.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = RotaEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<RotaEntry> = entries.into_iter().collect();
        let sync = self.sync_appends() && !is_planted(Bug::AckBeforeSync);
        self.write(LogOp::Append(entries), sync);
        callback.io_completed(Ok(()));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<RotaLogId>) -> Result<(), io::Error> {
        self.write(LogOp::TruncateAfter(last_log_id), self.sync_appends());
        Ok(())
    }

    async fn purge(&mut self, log_id: RotaLogId) -> Result<(), io::Error> {
        self.write(LogOp::Purge(log_id), false);
        Ok(())
    }
}

/// Snapshot persistence on a [`MemDisk`]; a saved snapshot is durable at once.
#[derive(Clone, Debug)]
pub struct MemSnapshots {
    disk: MemDisk,
}

impl SnapshotPersistence for MemSnapshots {
    fn save(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let mut state = self.disk.lock();
        if supersedes(&snapshot.meta, state.snapshot.as_ref().map(|s| &s.meta)) {
            state.snapshot = Some(snapshot.clone());
        }
        Ok(())
    }

    fn load(&self) -> io::Result<Option<StoredSnapshot>> {
        Ok(self.disk.lock().snapshot.clone())
    }
}

impl MemSnapshots {
    /// Replaces the node's small note beside its snapshot (the daemon keeps it in a file
    /// of the snapshot directory; see [`crate::snapshot_dir::SnapshotDir::save_note`]).
    /// Durable at once, like a snapshot.
    pub fn save_note(&self, note: &[u8]) {
        self.disk.lock().note = Some(note.to_vec());
    }

    /// The note last saved, if any.
    pub fn load_note(&self) -> Option<Vec<u8>> {
        self.disk.lock().note.clone()
    }
}
