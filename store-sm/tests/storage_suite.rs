//! openraft's storage conformance suite against every log store, and the persistence of
//! snapshots and applied state across restarts.

mod common;

use common::TestTypes;
use common::apply_entries;
use common::normal;
use common::workload_command;
use openraft::RaftSnapshotBuilder;
use openraft::StorageError;
use openraft::storage::RaftStateMachine;
use openraft::testing::log::StoreBuilder;
use openraft::testing::log::Suite;
use openraft::type_config::TypeConfigExt;
use store_sm::memory::MemDisk;
use store_sm::memory::MemLogStore;
use store_sm::memory::MemSnapshots;
use store_sm::raft_types::SyncMode;
use store_sm::snapshot_dir::SnapshotDir;
use store_sm::state_machine::SnapshotPersistence;
use store_sm::state_machine::TaskStateMachine;

fn storage_error(e: std::io::Error) -> StorageError<TestTypes> {
    StorageError::read(TestTypes::err_from_error(&e))
}

struct MemBuilder(SyncMode);

impl StoreBuilder<TestTypes, MemLogStore, TaskStateMachine<TestTypes, MemSnapshots>>
    for MemBuilder
{
    async fn build(
        &self,
    ) -> Result<((), MemLogStore, TaskStateMachine<TestTypes, MemSnapshots>), StorageError<TestTypes>>
    {
        let disk = MemDisk::new();
        let sm = TaskStateMachine::open(disk.snapshots()).map_err(storage_error)?;
        Ok(((), disk.log_store(self.0), sm))
    }
}

#[tokio::test]
async fn memory_store_passes_openraft_suite() -> Result<(), StorageError<TestTypes>> {
    Suite::test_all(MemBuilder(SyncMode::Always)).await?;
    Suite::test_all(MemBuilder(SyncMode::Never)).await
}

#[cfg(feature = "rocksdb")]
mod rocks {
    use store_sm::rocks::RocksLogStore;
    use tempfile::TempDir;

    use super::*;

    struct RocksBuilder(SyncMode);

    impl StoreBuilder<TestTypes, RocksLogStore, TaskStateMachine<TestTypes, SnapshotDir>, TempDir>
        for RocksBuilder
    {
        async fn build(
            &self,
        ) -> Result<
            (
                TempDir,
                RocksLogStore,
                TaskStateMachine<TestTypes, SnapshotDir>,
            ),
            StorageError<TestTypes>,
        > {
            let dir = tempfile::tempdir().map_err(storage_error)?;
            let log =
                RocksLogStore::open(&dir.path().join("raft-log"), self.0).map_err(storage_error)?;
            let snapshots =
                SnapshotDir::open(dir.path().join("snapshots")).map_err(storage_error)?;
            let sm = TaskStateMachine::open(snapshots).map_err(storage_error)?;
            Ok((dir, log, sm))
        }
    }

    #[tokio::test]
    async fn rocksdb_store_passes_openraft_suite() -> Result<(), StorageError<TestTypes>> {
        Suite::test_all(RocksBuilder(SyncMode::Always)).await?;
        Suite::test_all(RocksBuilder(SyncMode::Never)).await
    }
}

/// Applies a workload, snapshots it, reopens the state machine on the same persistence
/// and checks that the snapshot and the applied state survived; then installs the
/// snapshot into a fresh state machine and checks that it is identical.
async fn snapshot_survives_restart<P: SnapshotPersistence>(persistence: P, fresh: P) {
    let mut sm = TaskStateMachine::<TestTypes, P>::open(persistence.clone()).expect("opens");
    let entries = (1..=500)
        .map(|i| normal(1, i, workload_command(i)))
        .collect();
    apply_entries(&mut sm, entries).await.expect("applies");
    let before = sm.reader().snapshot();
    assert!(before.machine.task_count() > 0);

    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("builds");
    assert_eq!(built.meta.last_log_id, before.applied);
    // Apply goes on after the builder took its view; the snapshot keeps its point in time.
    apply_entries(&mut sm, vec![normal(1, 501, workload_command(501))])
        .await
        .expect("applies");
    drop(sm);

    let mut reopened = TaskStateMachine::<TestTypes, P>::open(persistence).expect("reopens");
    let (applied, membership) = reopened.applied_state().await.expect("state");
    assert_eq!(applied, before.applied);
    assert_eq!(membership, before.membership);
    assert_eq!(
        reopened.reader().snapshot().state_hash(),
        before.state_hash()
    );
    let current = reopened
        .get_current_snapshot()
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(current.meta, built.meta);

    let mut other = TaskStateMachine::<TestTypes, P>::open(fresh).expect("opens");
    other
        .install_snapshot(&current.meta, current.snapshot)
        .await
        .expect("installs");
    assert_eq!(other.reader().snapshot().state_hash(), before.state_hash());
    assert_eq!(
        other.applied_state().await.expect("state").0,
        before.applied
    );
}

#[tokio::test]
async fn memory_snapshot_survives_restart() {
    snapshot_survives_restart(MemDisk::new().snapshots(), MemDisk::new().snapshots()).await;
}

#[tokio::test]
async fn directory_snapshot_survives_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let persistence = SnapshotDir::open(dir.path().join("a")).expect("opens");
    let fresh = SnapshotDir::open(dir.path().join("b")).expect("opens");
    snapshot_survives_restart(persistence, fresh).await;
    // And a new process (no cache) reads the same file.
    let reread = SnapshotDir::open(dir.path().join("a")).expect("opens");
    assert!(reread.load().expect("loads").is_some());
}

#[tokio::test]
async fn determinism_same_log_same_state_hash() {
    let mut a = TaskStateMachine::<TestTypes, MemSnapshots>::open(MemDisk::new().snapshots())
        .expect("opens");
    let mut b = TaskStateMachine::<TestTypes, MemSnapshots>::open(MemDisk::new().snapshots())
        .expect("opens");
    let entries: Vec<_> = (1..=2000)
        .map(|i| normal(1, i, workload_command(i)))
        .collect();
    apply_entries(&mut a, entries.clone())
        .await
        .expect("applies");
    // The same log in different batch sizes.
    for chunk in entries.chunks(37) {
        apply_entries(&mut b, chunk.to_vec())
            .await
            .expect("applies");
    }
    let (a, b) = (a.reader().snapshot(), b.reader().snapshot());
    assert_eq!(a.applied, b.applied);
    assert_eq!(a.state_hash(), b.state_hash());
}

async fn append(store: &mut MemLogStore, indexes: std::ops::RangeInclusive<u64>) {
    let entries: Vec<_> = indexes.map(|i| normal(1, i, workload_command(i))).collect();
    openraft::storage::RaftLogStorage::<TestTypes>::append(
        store,
        entries,
        openraft::storage::IOFlushed::noop(),
    )
    .await
    .expect("appends");
}

async fn last_index(store: &mut MemLogStore) -> Option<u64> {
    let state = openraft::storage::RaftLogStorage::<TestTypes>::get_log_state(store)
        .await
        .expect("state");
    state.last_log_id.map(|id| id.index())
}

#[tokio::test]
async fn memory_crash_keeps_exactly_the_synced_writes() {
    let disk = MemDisk::new();
    let mut relaxed = disk.log_store(SyncMode::Never);
    append(&mut relaxed, 1..=5).await;
    disk.sync();
    append(&mut relaxed, 6..=8).await;
    assert_eq!(disk.unsynced_writes(), 1);
    assert_eq!(
        last_index(&mut relaxed).await,
        Some(8),
        "written entries are readable"
    );
    disk.crash();
    assert_eq!(
        last_index(&mut relaxed).await,
        Some(5),
        "unsynced entries are gone"
    );

    let mut strict = disk.log_store(SyncMode::Always);
    append(&mut strict, 6..=7).await;
    disk.crash();
    assert_eq!(
        last_index(&mut strict).await,
        Some(7),
        "synced appends survive"
    );
}
