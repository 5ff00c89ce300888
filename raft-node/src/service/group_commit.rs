//! Group commit: writes that arrive while others are in flight share one log entry
//! ([`Request::Batch`]), so that Raft's work per entry (the leader's core, the log's
//! write, every follower's decode, append and apply) is paid once per batch instead of
//! once per write. Each write still gets its own outcome, as if it had been an entry of
//! its own (the machine applies a batch's commands in turn).
//!
//! A write joins the pending batch; the first to join spawns the batch's proposal,
//! which lets every request the runtime has ready run first (one yield, which tokio
//! defers until the runtime has nothing else to run and has read its sockets again),
//! and then proposes what gathered, in arrival order: [`BATCH_COMMANDS_MAX`] commands
//! an entry at most, and no more bytes than the largest request makes alone (so that
//! entries, appends and the log kept between snapshots are bounded as before), alone if
//! it is one. Even a write that finds none in flight waits for that turn: a
//! burst's first write proposed at once would leave in an append of its own, and the
//! rest of the burst would wait for that append's answer (one append in flight per
//! follower, `append_stream::AHEAD_MAX`). The proposal runs in a task of its own, so
//! that a client that goes away does not take the other writes of its batch with it.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use openraft::error::ClientWriteError;
use openraft::error::RaftError;
use store_sm::machine::Command;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use tokio::sync::oneshot;

use crate::types::NodeRaft;
use crate::types::NodeTypes;

/// Most commands in one batch: a burst of writes larger than this goes into several
/// entries.
pub const BATCH_COMMANDS_MAX: usize = 128;

/// Why a proposed write has no outcome.
#[derive(Clone, Debug)]
pub enum ProposalError {
    /// Raft refused the entry or lost it.
    Raft(RaftError<NodeTypes, ClientWriteError<NodeTypes>>),
    /// The batch's proposal ended without an answer for this write (the node is
    /// stopping, or the proposal failed); the entry may still commit.
    Unanswered,
    /// The batch's entry answered something other than one outcome per command: a bug.
    Mismatched(String),
    /// The command could not be encoded to be measured: a bug.
    Unencodable(String),
}

/// A proposed write's outcome.
pub type Proposed = Result<Arc<Outcome>, ProposalError>;

type Waiter = oneshot::Sender<Proposed>;

/// A write waiting for its batch: the command, the bytes it encodes to, who waits.
type Pending = (Command, usize, Waiter);

/// The writes waiting to be proposed together.
#[derive(Debug)]
pub struct GroupCommit {
    pending: Mutex<Vec<Pending>>,
    /// Most bytes of commands in one batch.
    bytes_max: usize,
    /// Entries proposed for more than one write.
    batches: AtomicU64,
    /// Writes proposed in those entries.
    batched_writes: AtomicU64,
}

impl GroupCommit {
    /// Batches of at most `bytes_max` bytes of commands: the node's request body limit,
    /// so that an entry is never larger than the largest single request makes it.
    pub fn new(bytes_max: usize) -> Self {
        Self {
            pending: Mutex::default(),
            bytes_max,
            batches: AtomicU64::default(),
            batched_writes: AtomicU64::default(),
        }
    }

    /// Proposes `command` through `raft`, alone or, if `may_batch` (every member reads
    /// a batch), in a batch (see the module documentation); returns its outcome once it
    /// is applied.
    pub async fn propose(
        self: &Arc<Self>,
        raft: &NodeRaft,
        command: Command,
        may_batch: bool,
    ) -> Proposed {
        if !may_batch {
            return propose_alone(raft, command).await;
        }
        let bytes = match store_sm::codec::encoded_len(&command) {
            Ok(bytes) => bytes,
            Err(e) => return Err(ProposalError::Unencodable(e.to_string())),
        };
        let (waiter, answer) = oneshot::channel();
        let opens_batch = {
            let mut pending = self.lock();
            pending.push((command, bytes, waiter));
            pending.len() == 1
        };
        if opens_batch {
            tokio::spawn(Arc::clone(self).propose_pending(raft.clone()));
        }
        answer.await.unwrap_or(Err(ProposalError::Unanswered))
    }

    /// How many entries carried more than one write, and how many writes they carried.
    pub fn batched(&self) -> (u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.batched_writes.load(Ordering::Relaxed),
        )
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Proposes every pending write, once the requests that are ready have had their
    /// turn to join.
    async fn propose_pending(self: Arc<Self>, raft: NodeRaft) {
        tokio::task::yield_now().await;
        let pending = std::mem::take(&mut *self.lock());
        let mut batches = self.split(pending).into_iter();
        let Some(first) = batches.next() else {
            return;
        };
        // Spawned tasks run once this one waits, so the first batch is proposed first
        // and the others after it, in order.
        for batch in batches {
            tokio::spawn(propose_batch(raft.clone(), batch));
        }
        propose_batch(raft, first).await;
    }

    /// `pending` cut into batches, in order, each within the limits on commands and
    /// bytes (a command larger than the byte limit alone).
    fn split(&self, pending: Vec<Pending>) -> Vec<Vec<Pending>> {
        let mut batches: Vec<Vec<Pending>> = Vec::new();
        let mut bytes = 0;
        for write in pending {
            let full = batches.last().is_none_or(|batch| {
                batch.len() >= BATCH_COMMANDS_MAX || bytes + write.1 > self.bytes_max
            });
            if full {
                batches.push(Vec::new());
                bytes = 0;
            }
            bytes += write.1;
            if let Some(batch) = batches.last_mut() {
                batch.push(write);
            }
        }
        for batch in &batches {
            self.count(batch.len());
        }
        batches
    }

    fn count(&self, writes: usize) {
        if writes > 1 {
            self.batches.fetch_add(1, Ordering::Relaxed);
            self.batched_writes
                .fetch_add(writes as u64, Ordering::Relaxed);
        }
    }
}

async fn propose_alone(raft: &NodeRaft, command: Command) -> Proposed {
    // Boxed: openraft's write is a future of kilobytes that every caller's would
    // otherwise hold and copy at each await on the way down (docs/performance.md,
    // session 37).
    Box::pin(raft.client_write(command))
        .await
        .map(|response| response.data)
        .map_err(ProposalError::Raft)
}

/// Proposes `batch` as one entry (alone if it holds one write) and answers each write.
async fn propose_batch(raft: NodeRaft, mut batch: Vec<Pending>) {
    if batch.len() <= 1 {
        if let Some((command, _, waiter)) = batch.pop() {
            let _ = waiter.send(propose_alone(&raft, command).await);
        }
        return;
    }
    let (commands, waiters): (Vec<Command>, Vec<Waiter>) = batch
        .into_iter()
        .map(|(command, _, waiter)| (command, waiter))
        .unzip();
    let entry = Command {
        stamp: commands[0].stamp,
        request_id: None,
        request: Request::Batch(commands),
    };
    let answers: Vec<Proposed> = match propose_alone(&raft, entry).await {
        Ok(outcome) => match &*outcome {
            Outcome::Batch(outcomes) if outcomes.len() == waiters.len() => {
                outcomes.iter().cloned().map(Ok).collect()
            }
            other => {
                let answered = match other {
                    Outcome::Batch(outcomes) => format!("{} outcomes", outcomes.len()),
                    _ => "one outcome".into(),
                };
                let error = ProposalError::Mismatched(format!(
                    "a log entry of {} writes answered {answered}; the writes applied, but \
                     their outcomes are lost: report this",
                    waiters.len()
                ));
                vec![Err(error); waiters.len()]
            }
        },
        Err(error) => vec![Err(error); waiters.len()],
    };
    for (waiter, answer) in waiters.into_iter().zip(answers) {
        // A write whose client went away no longer waits; the others still do.
        let _ = waiter.send(answer);
    }
}
