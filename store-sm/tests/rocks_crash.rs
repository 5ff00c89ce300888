//! Crash tests for the RocksDB log store: a child process appends entries and reports
//! each one once the store says it is durable; the parent kills it with SIGKILL at
//! several points, reopens the store and checks what survived.
//!
//! With `SyncMode::Always` every acknowledged entry must be there. With
//! `SyncMode::Never` the store must still open and be consistent: a contiguous log
//! after the purge point, every entry decodable, the vote readable. In both, the saved
//! commit index never names an entry the store lost: the child saves each entry's id as
//! committed before the entry is durable, the harshest order openraft could ask for.
//! Every other round the child writes appends inline (on its own thread, as a follower
//! does) instead of through the writer thread. The store runs with a WAL limit of a few
//! KiB, so the kills land in WAL files that RocksDB recycles (overwrites in place): after
//! a crash, recovery must stop at the new records' end, not replay the file's stale tail.

#![cfg(feature = "rocksdb")]

mod common;

use std::io::BufRead;
use std::io::BufReader;
use std::path::Path;
use std::process::Command as Process;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use common::TestTypes;
use common::log_id;
use common::normal;
use common::workload_command;
use openraft::RaftLogReader;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use openraft::type_config::TypeConfigExt;
use store_sm::raft_types::RotaVote;
use store_sm::raft_types::SyncMode;
use store_sm::rocks::RocksLogStore;

const CHILD_DIR_ENV: &str = "ROTA_CRASH_CHILD_DIR";
const CHILD_SYNC_ENV: &str = "ROTA_CRASH_CHILD_SYNC";
const CHILD_INLINE_ENV: &str = "ROTA_CRASH_CHILD_INLINE";
/// The child stops by itself after this long even if nobody kills it.
const CHILD_RUN_MAX: Duration = Duration::from_secs(60);
/// A WAL limit that a few dozen entries pass, so that files are recycled many times.
const CRASH_WAL_BYTES: u64 = 16 << 10;

fn open_store(dir: &Path, sync: SyncMode) -> std::io::Result<RocksLogStore> {
    RocksLogStore::open_with_wal_limit(dir, sync, CRASH_WAL_BYTES)
}

/// Whether RocksDB's info logs in `dir` say it reused a recycled WAL file.
fn reused_a_wal_file(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .expect("lists the store")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("LOG"))
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|log| log.contains("reusing log")))
}

fn sync_mode(name: &str) -> SyncMode {
    if name == "never" {
        SyncMode::Never
    } else {
        SyncMode::Always
    }
}

/// The child's side: runs only when the parent sets the environment.
#[test]
fn crash_child() {
    let (Ok(dir), Ok(sync)) = (std::env::var(CHILD_DIR_ENV), std::env::var(CHILD_SYNC_ENV)) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let mut store = open_store(Path::new(&dir), sync_mode(&sync)).expect("opens");
        let inline = std::env::var(CHILD_INLINE_ENV).is_ok_and(|v| v == "1");
        store
            .inline_appends()
            .store(inline, std::sync::atomic::Ordering::Relaxed);
        let state = RaftLogStorage::<TestTypes>::get_log_state(&mut store)
            .await
            .expect("state");
        let mut next = state.last_log_id.map_or(1, |id| id.index() + 1);
        let vote = RotaVote::new_committed(1, 1);
        RaftLogStorage::<TestTypes>::save_vote(&mut store, &vote)
            .await
            .expect("vote");
        let started = Instant::now();
        while started.elapsed() < CHILD_RUN_MAX {
            let (tx, rx) = TestTypes::oneshot();
            let entry = normal(1, next, workload_command(next));
            RaftLogStorage::<TestTypes>::append(&mut store, [entry], IOFlushed::signal(tx))
                .await
                .expect("append");
            RaftLogStorage::<TestTypes>::save_committed(&mut store, Some(log_id(1, next)))
                .await
                .expect("commit index");
            rx.await.expect("callback").expect("durable");
            println!("acked {next}");
            next += 1;
        }
    });
}

/// Starts the child on `dir`, kills it after it acknowledged `kill_after` entries and
/// returns the last index it acknowledged.
fn run_and_kill(dir: &Path, sync: &str, inline: bool, kill_after: u64) -> u64 {
    let mut child = Process::new(std::env::current_exe().expect("test binary"))
        .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_SYNC_ENV, sync)
        .env(CHILD_INLINE_ENV, if inline { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns the child");
    let stdout = child.stdout.take().expect("piped");
    let mut acked_here = 0;
    let mut last_acked = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reads the child");
        // libtest may print "test crash_child ... " on the same line as the first ack.
        if let Some((_, index)) = line.rsplit_once("acked ") {
            last_acked = index.parse().expect("an index");
            acked_here += 1;
            if acked_here == kill_after {
                child.kill().expect("SIGKILL");
                break;
            }
        }
    }
    child.wait().expect("reaped");
    assert_eq!(
        acked_here, kill_after,
        "the child stopped before it was killed"
    );
    last_acked
}

/// Reopens the store and checks it is consistent; returns its last log index.
async fn check_consistent(dir: &Path, sync: SyncMode) -> u64 {
    let mut store = open_store(dir, sync).expect("reopens after the crash");
    let state = RaftLogStorage::<TestTypes>::get_log_state(&mut store)
        .await
        .expect("state");
    let last = state.last_log_id.expect("entries survived").index();
    let entries = RaftLogReader::<TestTypes>::try_get_log_entries(&mut store, 0..=last)
        .await
        .expect("every entry decodes");
    let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index()).collect();
    assert_eq!(indexes, (1..=last).collect::<Vec<_>>(), "a contiguous log");
    for entry in &entries {
        let openraft::EntryPayload::Normal(command) = &entry.payload else {
            panic!("entry {} changed kind", entry.log_id.index());
        };
        assert_eq!(
            command,
            &workload_command(entry.log_id.index()),
            "entry content intact"
        );
    }
    let vote = RaftLogReader::<TestTypes>::read_vote(&mut store)
        .await
        .expect("vote reads");
    assert!(vote.is_some(), "the vote survived");
    let committed = RaftLogStorage::<TestTypes>::read_committed(&mut store)
        .await
        .expect("the commit index reads");
    assert!(
        committed.is_none_or(|c| c.index() <= last),
        "the saved commit index {committed:?} is past the stored log's end {last}"
    );
    last
}

fn crash_rounds(sync: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("raft-log");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for (round, kill_after) in [1, 40, 300, 900].into_iter().enumerate() {
        let inline = round % 2 == 1;
        let acked = run_and_kill(&path, sync, inline, kill_after);
        let last = runtime.block_on(check_consistent(&path, sync_mode(sync)));
        eprintln!("sync={sync} inline={inline}: killed after ack {acked}; store holds 1..={last}");
        if sync_mode(sync) == SyncMode::Always {
            assert!(
                last >= acked,
                "acknowledged entry {acked} lost; store ends at {last}"
            );
        }
    }
    assert!(
        reused_a_wal_file(&path),
        "RocksDB never reused a WAL file, so the crashes did not test recycling"
    );
}

#[test]
fn kill_nine_with_sync_loses_no_acknowledged_append() {
    crash_rounds("always");
}

#[test]
fn kill_nine_without_sync_leaves_a_consistent_store() {
    crash_rounds("never");
}
