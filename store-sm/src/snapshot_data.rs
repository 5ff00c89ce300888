//! A snapshot's bytes and where they live: in memory (the simulation's disk, a snapshot
//! just built there) or in a region of a file on disk (the daemon), so that a large
//! snapshot is sent, received and kept in chunks without ever being gathered in memory
//! except while it is decoded.

use std::fs::File;
use std::io;
use std::io::Read;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

/// Size of the chunks a snapshot is read, written and sent in.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

/// A snapshot's bytes; cheap to clone.
#[derive(Clone, Debug)]
pub enum SnapshotData {
    /// Held in memory (a `Bytes` made from the encoder's buffer without a copy).
    Memory(Bytes),
    /// A region of an open file whose contents no one changes any more (a file is
    /// replaced by renaming another over its name, so this handle keeps reading it).
    File(Arc<FileRegion>),
}

/// `len` bytes of `file` from `offset`.
#[derive(Debug)]
pub struct FileRegion {
    file: File,
    offset: u64,
    len: u64,
}

impl FileRegion {
    /// The region of `file` from `offset` to its end.
    pub fn to_end(file: File, offset: u64) -> io::Result<Self> {
        let size = file.metadata()?.len();
        let len = size.checked_sub(offset).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot file of {size} bytes ends before its data at {offset}"),
            )
        })?;
        Ok(Self { file, offset, len })
    }
}

impl From<Vec<u8>> for SnapshotData {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Memory(Bytes::from(bytes))
    }
}

impl From<Bytes> for SnapshotData {
    fn from(bytes: Bytes) -> Self {
        Self::Memory(bytes)
    }
}

impl SnapshotData {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::Memory(bytes) => bytes.len() as u64,
            Self::File(region) => region.len,
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `max` bytes from `offset` (fewer only at the end; none past it). In memory
    /// this is a view, not a copy.
    pub fn chunk(&self, offset: u64, max: usize) -> io::Result<Bytes> {
        let end = offset.saturating_add(max as u64).min(self.len());
        if offset >= end {
            return Ok(Bytes::new());
        }
        match self {
            Self::Memory(bytes) => Ok(bytes.slice(offset as usize..end as usize)),
            Self::File(region) => {
                let mut buf = vec![0; (end - offset) as usize];
                region
                    .file
                    .read_exact_at(&mut buf, region.offset + offset)?;
                Ok(Bytes::from(buf))
            }
        }
    }

    /// The chunks in order, read as they are consumed.
    pub fn chunks(&self) -> impl Iterator<Item = io::Result<Bytes>> + Send + Sync + 'static {
        let data = self.clone();
        let len = data.len();
        let mut offset = 0;
        std::iter::from_fn(move || {
            if offset >= len {
                return None;
            }
            let chunk = data.chunk(offset, SNAPSHOT_CHUNK_BYTES);
            offset = chunk.as_ref().map_or(len, |c| offset + c.len() as u64);
            Some(chunk)
        })
    }

    /// Every byte, in one buffer: for decoding, which needs them all. A region is read
    /// into a buffer of its exact size; memory is shared, not copied.
    pub fn load(&self) -> io::Result<Bytes> {
        match self {
            Self::Memory(bytes) => Ok(bytes.clone()),
            Self::File(region) => {
                let len = usize::try_from(region.len)
                    .map_err(|_| io::Error::other("snapshot larger than this machine's memory"))?;
                let mut buf = vec![0; len];
                region.file.read_exact_at(&mut buf, region.offset)?;
                Ok(Bytes::from(buf))
            }
        }
    }

    /// Copies every byte to `out`, a chunk at a time.
    pub fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        for chunk in self.chunks() {
            out.write_all(&chunk?)?;
        }
        Ok(())
    }
}

/// Gathers a snapshot arriving in pieces, up to a limit, in memory or in an unnamed file
/// (removed from its directory as soon as it is created, so a crash leaves nothing).
pub struct SnapshotSpool {
    sink: Sink,
    written: u64,
    limit: u64,
}

enum Sink {
    Memory(Vec<u8>),
    File(io::BufWriter<File>),
}

/// A snapshot bigger than the configured limit.
#[derive(Debug, thiserror::Error)]
#[error("snapshot larger than the limit of {limit} bytes (--snapshot-max-bytes)")]
pub struct TooLarge {
    /// The limit.
    pub limit: u64,
}

impl SnapshotSpool {
    /// A spool in memory, for the simulation.
    pub fn in_memory(limit: u64) -> Self {
        Self {
            sink: Sink::Memory(Vec::new()),
            written: 0,
            limit,
        }
    }

    /// A spool in a new unnamed file in `dir`.
    pub fn in_dir(dir: &std::path::Path, limit: u64) -> io::Result<Self> {
        let path = dir.join(format!(
            ".incoming-{}-{}.snapshot",
            std::process::id(),
            NEXT_SPOOL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        Ok(Self {
            sink: Sink::File(io::BufWriter::with_capacity(SNAPSHOT_CHUNK_BYTES, file)),
            written: 0,
            limit,
        })
    }

    /// Appends `bytes`; refuses them if the total would pass the limit.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let total = self.written.saturating_add(bytes.len() as u64);
        if total > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                TooLarge { limit: self.limit },
            ));
        }
        match &mut self.sink {
            Sink::Memory(buf) => buf.extend_from_slice(bytes),
            Sink::File(file) => file.write_all(bytes)?,
        }
        self.written = total;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The snapshot gathered.
    pub fn finish(self) -> io::Result<SnapshotData> {
        match self.sink {
            Sink::Memory(buf) => Ok(buf.into()),
            Sink::File(file) => {
                let file = file.into_inner().map_err(|e| e.into_error())?;
                Ok(SnapshotData::File(Arc::new(FileRegion::to_end(file, 0)?)))
            }
        }
    }
}

/// So a snapshot can be encoded straight into a spool; the limit still applies.
impl Write for SnapshotSpool {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        SnapshotSpool::write(self, bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Memory(_) => Ok(()),
            Sink::File(file) => file.flush(),
        }
    }
}

static NEXT_SPOOL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Reads a whole stream into a spool, for callers holding a reader.
pub fn spool_reader(spool: &mut SnapshotSpool, reader: &mut impl Read) -> io::Result<()> {
    let mut buf = vec![0; SNAPSHOT_CHUNK_BYTES];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        spool.write(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn a_file_spool_keeps_nothing_in_memory_or_in_the_directory_and_reads_back_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = sample(2 * SNAPSHOT_CHUNK_BYTES + 17);
        let mut spool = SnapshotSpool::in_dir(dir.path(), 1 << 30).expect("spool");
        for piece in bytes.chunks(65_536) {
            spool.write(piece).expect("write");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "the spool file has no name"
        );
        let data = spool.finish().expect("finish");
        assert!(matches!(data, SnapshotData::File(_)));
        assert_eq!(data.len(), bytes.len() as u64);
        let chunks: Vec<Bytes> = data.chunks().collect::<io::Result<_>>().expect("chunks");
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks.concat(), bytes);
        assert_eq!(&*data.load().expect("load"), &bytes[..]);
        assert_eq!(data.chunk(bytes.len() as u64, 10).expect("end").len(), 0);
    }

    #[test]
    fn a_spool_refuses_bytes_past_its_limit() {
        let mut spool = SnapshotSpool::in_memory(100);
        spool.write(&[0; 60]).expect("under");
        let err = spool.write(&[0; 41]).expect_err("over");
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert!(err.to_string().contains("100 bytes"), "{err}");
        spool.write(&[0; 40]).expect("to the limit exactly");
        assert_eq!(spool.written(), 100);
    }

    #[test]
    fn memory_chunks_are_views() {
        let data = SnapshotData::from(sample(10));
        let chunk = data.chunk(3, 4).expect("chunk");
        assert_eq!(&chunk[..], &sample(10)[3..7]);
        assert_eq!(data.chunks().count(), 1);
    }
}
