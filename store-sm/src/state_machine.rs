//! openraft's state machine around the pure [`TaskMachine`]: apply, snapshots built from
//! an O(1) clone while apply goes on, snapshot install, and persistence of the current
//! snapshot so that it and the applied state survive a restart.
//!
//! The machine itself lives in memory. On restart it is decoded from the last persisted
//! snapshot, and openraft re-applies the committed log after it (the log stores persist
//! `committed` for that).

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::RwLockReadGuard;
use std::sync::RwLockWriteGuard;

use futures_util::Stream;
use futures_util::StreamExt;
use openraft::AsyncRuntime;
use openraft::EntryPayload;
use openraft::RaftSnapshotBuilder;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;

use crate::machine::Change;
use crate::machine::Command;
use crate::machine::Outcome;
use crate::machine::Request;
use crate::machine::TaskMachine;
use crate::planted;
use crate::raft_types::RotaConfig;
use crate::raft_types::RotaLogId;
use crate::raft_types::RotaSnapshot;
use crate::raft_types::RotaSnapshotMeta;
use crate::raft_types::RotaStoredMembership;
use crate::raft_types::SnapshotData;
use crate::snapshot::StateHash;
use crate::snapshot::decode_snapshot;
use crate::snapshot::encode_snapshot;
use crate::snapshot::state_hash;

/// A snapshot as persisted: its metadata and its bytes.
#[derive(Clone)]
pub struct StoredSnapshot {
    /// Last log id and membership the snapshot covers.
    pub meta: RotaSnapshotMeta,
    /// The encoded machine (see [`crate::snapshot`]).
    pub data: SnapshotData,
}

impl fmt::Debug for StoredSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredSnapshot")
            .field("meta", &self.meta)
            .field("bytes", &self.data.len())
            .finish()
    }
}

/// Where the current snapshot is kept across restarts.
pub trait SnapshotPersistence: Clone + Send + Sync + 'static {
    /// Makes `snapshot` the current one, durably, unless the current one covers more of
    /// the log (a slow builder must not overwrite a newer installed snapshot).
    fn save(&self, snapshot: &StoredSnapshot) -> io::Result<()>;

    /// The current snapshot, if any was ever saved.
    fn load(&self) -> io::Result<Option<StoredSnapshot>>;
}

/// The state machine's state as of the last applied entry.
#[derive(Clone, Debug, Default)]
pub struct AppliedState {
    /// The task machine.
    pub machine: TaskMachine,
    /// The last applied log id.
    pub applied: Option<RotaLogId>,
    /// The last applied membership.
    pub membership: RotaStoredMembership,
}

impl AppliedState {
    /// The machine's state hash (O(tasks)).
    pub fn state_hash(&self) -> StateHash {
        state_hash(&self.machine)
    }

    fn from_snapshot(snapshot: &StoredSnapshot) -> io::Result<Self> {
        let machine = decode_snapshot(&snapshot.data.load()?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(Self {
            machine,
            applied: snapshot.meta.last_log_id,
            membership: snapshot.meta.last_membership.clone(),
        })
    }
}

/// A read-only handle to the applied state, for queries while Raft owns the state machine.
#[derive(Clone, Debug)]
pub struct StateReader {
    shared: Arc<RwLock<AppliedState>>,
}

impl StateReader {
    /// Runs `f` on the current applied state. Keep `f` short: apply waits for it.
    pub fn read<R>(&self, f: impl FnOnce(&AppliedState) -> R) -> R {
        f(&self
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// A point-in-time copy of the applied state (O(1)).
    pub fn snapshot(&self) -> AppliedState {
        self.read(AppliedState::clone)
    }
}

/// Told of every change to the applied state, in log order, while apply holds the
/// state (so keep each call short): the node's change feed and its waiters.
pub trait ApplyObserver: Send + Sync + 'static {
    /// A command of the entry at log index `index` was applied: `state` is the state
    /// after it and `changes` what it changed; `last` says the entry is done. Told once
    /// per entry, with no changes, for blank and membership entries, and once per
    /// command, in order, for a batch, whose last alone is `last`.
    fn applied(&self, index: u64, state: &AppliedState, changes: &[Change], last: bool);

    /// The state was replaced whole (opened, or a snapshot installed) as of log index
    /// `index`: changes up to it are unknown.
    fn reset(&self, index: u64, state: &AppliedState);
}

/// Rota's [`RaftStateMachine`].
pub struct TaskStateMachine<C, P> {
    shared: Arc<RwLock<AppliedState>>,
    persistence: P,
    observer: Option<Arc<dyn ApplyObserver>>,
    _config: PhantomData<fn() -> C>,
}

fn index_of(applied: Option<RotaLogId>) -> u64 {
    applied.map_or(0, |id| id.index)
}

impl<C: RotaConfig, P: SnapshotPersistence> TaskStateMachine<C, P> {
    /// Opens the state machine at the last persisted snapshot (or empty).
    pub fn open(persistence: P) -> io::Result<Self> {
        let state = match persistence.load()? {
            Some(snapshot) => AppliedState::from_snapshot(&snapshot)?,
            None => AppliedState::default(),
        };
        Ok(Self {
            shared: Arc::new(RwLock::new(state)),
            persistence,
            observer: None,
            _config: PhantomData,
        })
    }

    /// Tells `observer` of every change from now on, starting with the state as opened.
    pub fn observe(&mut self, observer: Arc<dyn ApplyObserver>) {
        {
            let state = self.read();
            observer.reset(index_of(state.applied), &state);
        }
        self.observer = Some(observer);
    }

    /// A handle for queries.
    pub fn reader(&self) -> StateReader {
        StateReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Applies one command of the entry at `index` and tells the observer what it
    /// changed, and whether it was the entry's `last`.
    fn apply_command(
        &self,
        index: u64,
        state: &mut AppliedState,
        command: &Command,
        last: bool,
    ) -> Arc<Outcome> {
        let outcome = planted::apply_with_planted_bugs(&mut state.machine, command);
        if let Some(observer) = &self.observer {
            observer.applied(index, state, state.machine.changes(), last);
        }
        outcome
    }

    /// Tells the observer of the entry at `index`, which changed no task.
    fn unchanged(&self, index: u64, state: &AppliedState) -> Arc<Outcome> {
        if let Some(observer) = &self.observer {
            observer.applied(index, state, &[], true);
        }
        empty_response()
    }

    fn write(&self) -> RwLockWriteGuard<'_, AppliedState> {
        self.shared
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Builds a snapshot from a point-in-time clone of the applied state.
pub struct TaskSnapshotBuilder<C, P> {
    view: AppliedState,
    persistence: P,
    _config: PhantomData<fn() -> C>,
}

impl<C: RotaConfig, P: SnapshotPersistence> RaftSnapshotBuilder<C> for TaskSnapshotBuilder<C, P> {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<RotaSnapshot, io::Error> {
        // Encoding and the fsync take seconds for millions of tasks: on another thread,
        // so that the node's async thread keeps serving and heartbeating meanwhile, and
        // at a low priority, so that it takes mostly the CPU that requests leave.
        // The simulation has no threads: its runtime runs the build inline.
        let view = self.view.clone();
        let persistence = self.persistence.clone();
        let build = move || build_and_save(&view, &persistence);
        #[cfg(not(madsim))]
        return crate::background::run_at_low_priority("rota-snapshot", build).await?;
        #[cfg(madsim)]
        return C::AsyncRuntime::spawn_blocking(build).await?;
    }
}

/// Encodes `view` and makes it the current snapshot.
fn build_and_save<P: SnapshotPersistence>(
    view: &AppliedState,
    persistence: &P,
) -> Result<RotaSnapshot, io::Error> {
    let started = std::time::Instant::now();
    let data: SnapshotData = encode_snapshot(&view.machine).into();
    let stored = StoredSnapshot {
        meta: RotaSnapshotMeta {
            last_log_id: view.applied,
            last_membership: view.membership.clone(),
        },
        data,
    };
    persistence.save(&stored)?;
    tracing::info!(
        last_log_id = ?stored.meta.last_log_id,
        bytes = stored.data.len(),
        tasks = view.machine.task_count(),
        ms = started.elapsed().as_millis() as u64,
        "snapshot built"
    );
    Ok(RotaSnapshot {
        meta: stored.meta,
        snapshot: stored.data,
    })
}

fn empty_response() -> Arc<Outcome> {
    Arc::new(Outcome::Tasks(Vec::new()))
}

impl<C: RotaConfig, P: SnapshotPersistence> RaftStateMachine<C> for TaskStateMachine<C, P> {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = TaskSnapshotBuilder<C, P>;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<RotaLogId>, RotaStoredMembership), io::Error> {
        let state = self.read();
        Ok((state.applied, state.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<C>, io::Error>> + Unpin + openraft::OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let response = {
                let mut state = self.write();
                state.applied = Some(entry.log_id);
                let index = entry.log_id.index;
                match entry.payload {
                    EntryPayload::Blank => self.unchanged(index, &state),
                    // An empty batch (no leader makes one) applies as one command.
                    EntryPayload::Normal(Command {
                        request: Request::Batch(commands),
                        ..
                    }) if !commands.is_empty() => {
                        let last = commands.len() - 1;
                        let outcomes = commands
                            .iter()
                            .enumerate()
                            .map(|(n, command)| {
                                self.apply_command(index, &mut state, command, n == last)
                            })
                            .collect();
                        Arc::new(Outcome::Batch(outcomes))
                    }
                    EntryPayload::Normal(command) => {
                        self.apply_command(index, &mut state, &command, true)
                    }
                    EntryPayload::Membership(membership) => {
                        state
                            .machine
                            .note_members(membership.nodes().map(|(id, _)| *id));
                        state.membership =
                            RotaStoredMembership::new(Some(entry.log_id), membership);
                        self.unchanged(index, &state)
                    }
                }
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        TaskSnapshotBuilder {
            view: self.read().clone(),
            persistence: self.persistence.clone(),
            _config: PhantomData,
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &RotaSnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot,
        };
        // Decoding and the fsync off the async thread, as in `build_snapshot`.
        let persistence = self.persistence.clone();
        let (state, stored) = C::AsyncRuntime::spawn_blocking(move || {
            let state = AppliedState::from_snapshot(&stored)?;
            // Durable before the state changes: a crash right after must not find an
            // applied state that no snapshot or log on disk can rebuild.
            persistence.save(&stored)?;
            Ok::<_, io::Error>((state, stored))
        })
        .await??;
        let mut current = self.write();
        *current = state;
        if let Some(observer) = &self.observer {
            observer.reset(index_of(current.applied), &current);
        }
        drop(current);
        tracing::info!(last_log_id = ?meta.last_log_id, bytes = stored.data.len(), "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<RotaSnapshot>, io::Error> {
        Ok(self.persistence.load()?.map(|stored| RotaSnapshot {
            meta: stored.meta,
            snapshot: stored.data,
        }))
    }
}

/// Whether `candidate` covers strictly more of the log than `current`, the rule every
/// [`SnapshotPersistence`] applies before replacing its snapshot.
pub fn supersedes(candidate: &RotaSnapshotMeta, current: Option<&RotaSnapshotMeta>) -> bool {
    match current {
        None => true,
        Some(current) => candidate.last_log_id >= current.last_log_id,
    }
}
