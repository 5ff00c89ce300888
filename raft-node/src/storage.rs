//! Where a node keeps its snapshots: a snapshot directory in the daemon, the memory store
//! (with its crash model) in simulation. One type for both keeps the node's openraft
//! types the same in every build; the log store is passed to [`crate::start_on`] as a
//! value and needs no such type.

use std::io;

use store_sm::memory::MemSnapshots;
use store_sm::snapshot_data::SnapshotSpool;
use store_sm::snapshot_dir::SnapshotDir;
use store_sm::state_machine::SnapshotPersistence;
use store_sm::state_machine::StoredSnapshot;

/// The snapshot store of a node.
#[derive(Clone)]
pub enum NodeSnapshots {
    /// Files in the data directory.
    Dir(SnapshotDir),
    /// The simulated disk.
    Memory(MemSnapshots),
}

impl SnapshotPersistence for NodeSnapshots {
    fn save(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        match self {
            Self::Dir(dir) => dir.save(snapshot),
            Self::Memory(memory) => memory.save(snapshot),
        }
    }

    fn load(&self) -> io::Result<Option<StoredSnapshot>> {
        match self {
            Self::Dir(dir) => dir.load(),
            Self::Memory(memory) => memory.load(),
        }
    }
}

impl NodeSnapshots {
    /// Keeps `note`, the node's clock record, beside its snapshot.
    pub fn save_note(&self, note: &[u8]) -> io::Result<()> {
        match self {
            Self::Dir(dir) => dir.save_note(note),
            Self::Memory(memory) => {
                memory.save_note(note);
                Ok(())
            }
        }
    }

    /// A spool for a snapshot arriving: an unnamed file in the snapshot directory, or
    /// memory for the simulated disk.
    pub fn spool(&self, limit: u64) -> io::Result<SnapshotSpool> {
        match self {
            Self::Dir(dir) => SnapshotSpool::in_dir(dir.path(), limit),
            Self::Memory(_) => Ok(SnapshotSpool::in_memory(limit)),
        }
    }

    /// The note last kept, if any.
    pub fn load_note(&self) -> io::Result<Option<Vec<u8>>> {
        match self {
            Self::Dir(dir) => dir.load_note(),
            Self::Memory(memory) => Ok(memory.load_note()),
        }
    }
}
