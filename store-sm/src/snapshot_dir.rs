//! Snapshot persistence in a directory: one file, replaced atomically (write a temporary
//! file, fsync it, rename it over the old one, fsync the directory).
//!
//! ```text
//! "ROTASNPF" | file format version (u32 LE) | meta length (u64 LE) | meta (codec value)
//!   | SHA-256 of meta (32 bytes) | snapshot bytes (crate::snapshot, checksummed itself)
//! ```

use std::fs;
use std::fs::File;
use std::io;
use std::io::Read;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;

use sha2::Digest;
use sha2::Sha256;

use crate::codec::decode_value;
use crate::codec::encode_value;
use crate::raft_types::RotaSnapshotMeta;
use crate::snapshot_data::FileRegion;
use crate::snapshot_data::SNAPSHOT_CHUNK_BYTES;
use crate::snapshot_data::SnapshotData;
use crate::state_machine::SnapshotPersistence;
use crate::state_machine::StoredSnapshot;
use crate::state_machine::supersedes;

const FILE_MAGIC: &[u8; 8] = b"ROTASNPF";
const FILE_FORMAT_VERSION: u32 = 1;
const FILE_NAME: &str = "current.snapshot";
const TEMP_NAME: &str = "current.snapshot.tmp";
const NOTE_NAME: &str = "node.note";
const NOTE_TEMP_NAME: &str = "node.note.tmp";

/// Snapshot persistence in a directory; see the module documentation.
#[derive(Clone, Debug)]
pub struct SnapshotDir {
    dir: PathBuf,
    // The current snapshot, loaded once: openraft asks for it every time it sends one.
    cache: Arc<Mutex<Option<Option<StoredSnapshot>>>>,
}

impl SnapshotDir {
    /// Opens (creating if needed) the snapshot directory `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| context(e, "creating snapshot directory", &dir))?;
        // A temporary file is what a crash during save leaves behind; it is never read.
        match fs::remove_file(dir.join(TEMP_NAME)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(Self {
            dir,
            cache: Arc::new(Mutex::new(None)),
        })
    }

    fn cache(&self) -> MutexGuard<'_, Option<Option<StoredSnapshot>>> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read_file(&self) -> io::Result<Option<StoredSnapshot>> {
        let path = self.dir.join(FILE_NAME);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(context(e, "reading snapshot", &path)),
        };
        read_file(&mut file)
            .and_then(|(meta, data_at)| {
                let region = FileRegion::to_end(file, data_at)?;
                Ok(StoredSnapshot {
                    meta,
                    data: SnapshotData::File(Arc::new(region)),
                })
            })
            .map(Some)
            .map_err(|e| context(e, "decoding snapshot", &path))
    }

    fn write_file(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let temp = self.dir.join(TEMP_NAME);
        let meta = encode_value(&snapshot.meta)?;
        let mut file = File::create(&temp).map_err(|e| context(e, "creating", &temp))?;
        file.write_all(FILE_MAGIC)?;
        file.write_all(&FILE_FORMAT_VERSION.to_le_bytes())?;
        file.write_all(&(meta.len() as u64).to_le_bytes())?;
        file.write_all(&meta)?;
        file.write_all(&Sha256::digest(&meta))?;
        let mut out = io::BufWriter::with_capacity(SNAPSHOT_CHUNK_BYTES, file);
        snapshot.data.write_to(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all().map_err(|e| context(e, "syncing", &temp))?;
        drop(file);
        let path = self.dir.join(FILE_NAME);
        fs::rename(&temp, &path).map_err(|e| context(e, "renaming snapshot into", &path))?;
        File::open(&self.dir)?
            .sync_all()
            .map_err(|e| context(e, "syncing", &self.dir))
    }
}

impl SnapshotDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Replaces a small note the node keeps beside its snapshot (its clock record: see
    /// `raft_node::clock`), whole or not at all. Not synced: a note lost in a power cut
    /// leaves the older one, which its reader must accept.
    pub fn save_note(&self, note: &[u8]) -> io::Result<()> {
        let temp = self.dir.join(NOTE_TEMP_NAME);
        fs::write(&temp, note).map_err(|e| context(e, "writing", &temp))?;
        let path = self.dir.join(NOTE_NAME);
        fs::rename(&temp, &path).map_err(|e| context(e, "renaming note into", &path))
    }

    /// The note last saved, if any.
    pub fn load_note(&self) -> io::Result<Option<Vec<u8>>> {
        let path = self.dir.join(NOTE_NAME);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(context(e, "reading", &path)),
        }
    }
}

fn context(error: io::Error, doing: &str, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{doing} {}: {error}", path.display()))
}

/// Reads and checks a snapshot file's header and metadata; returns the metadata and
/// where the snapshot's bytes start. Those are checked (their own checksum) when they are
/// decoded, which a node does when it opens the snapshot at start.
fn read_file(file: &mut File) -> io::Result<(RotaSnapshotMeta, u64)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let mut header = [0u8; FILE_MAGIC.len() + 4 + 8];
    file.read_exact(&mut header)
        .map_err(|_| invalid("not a Rota snapshot file (too short)"))?;
    if &header[..FILE_MAGIC.len()] != FILE_MAGIC {
        return Err(invalid("not a Rota snapshot file"));
    }
    let version = u32::from_le_bytes(header[8..12].try_into().map_err(|_| invalid("header"))?);
    if version != FILE_FORMAT_VERSION {
        return Err(invalid(&format!(
            "snapshot file format {version} is not supported (this build reads {FILE_FORMAT_VERSION})"
        )));
    }
    let meta_len = u64::from_le_bytes(header[12..20].try_into().map_err(|_| invalid("header"))?);
    if meta_len > crate::codec::VALUE_BYTES_MAX as u64 {
        return Err(invalid("snapshot metadata length is corrupt"));
    }
    let mut meta_bytes = vec![0u8; meta_len as usize + 32];
    file.read_exact(&mut meta_bytes)
        .map_err(|_| invalid("snapshot file is truncated"))?;
    let (meta_bytes, digest) = meta_bytes.split_at(meta_len as usize);
    if Sha256::digest(meta_bytes).as_slice() != digest {
        return Err(invalid(
            "snapshot metadata checksum mismatch: the file is corrupt",
        ));
    }
    let meta: RotaSnapshotMeta = decode_value(meta_bytes, "snapshot metadata")?;
    Ok((meta, (header.len() + meta_bytes.len() + 32) as u64))
}

impl SnapshotPersistence for SnapshotDir {
    fn save(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let mut cache = self.cache();
        let current = match cache.take() {
            Some(current) => current,
            None => self.read_file()?,
        };
        if supersedes(&snapshot.meta, current.as_ref().map(|s| &s.meta)) {
            if let Err(e) = self.write_file(snapshot) {
                *cache = Some(current);
                return Err(e);
            }
            // Kept as the file's region, not the caller's bytes, which may be in memory.
            *cache = Some(self.read_file()?);
        } else {
            *cache = Some(current);
        }
        Ok(())
    }

    fn load(&self) -> io::Result<Option<StoredSnapshot>> {
        let mut cache = self.cache();
        if let Some(current) = &*cache {
            return Ok(current.clone());
        }
        let current = self.read_file()?;
        *cache = Some(current.clone());
        Ok(current)
    }
}
