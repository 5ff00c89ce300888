//! Known bugs the simulation plants one at a time to prove its checkers catch them.
//!
//! The hooks exist only with the `planted-bugs` feature, which only the simulation build
//! enables; without it [`is_planted`] is `false` and compiles away. A bug is planted per
//! thread because madsim runs a whole simulated cluster on one thread, and the `sim`
//! runner runs several seeds side by side on different threads.
//!
//! The pure machine knows nothing of planted bugs: the four that concern it are injected
//! around it, by the openraft adapter ([`apply_with_planted_bugs`]) and by the snapshot
//! decoder ([`next_id_after_live`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::machine::Command;
use crate::machine::Outcome;
use crate::machine::Refusal;
use crate::machine::Request;
use crate::machine::SettingsChange;
use crate::machine::SettingsRequest;
use crate::machine::Task;
use crate::machine::TaskId;
use crate::machine::TaskMachine;
use crate::machine::UpdateRequest;

/// A bug the simulation can plant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The log store acknowledges an append before the entries are synced.
    AckBeforeSync,
    /// A follower answers a linearizable read from its own state.
    FollowerRead,
    /// The leader stamps commands, and so judges lease expiry, by its raw wall clock.
    WallClockLease,
    /// A node that loads a snapshot numbers new tasks after the highest live id.
    IdReuse,
    /// A refused update still applies its adds.
    PartialTransaction,
    /// A claim ignores its group's `max_running`.
    IgnoreMaxRunning,
    /// A finish of a task that a cancel removed answers success instead of refusing: the
    /// worker is never told to stop.
    UnfencedFinish,
    /// The node's change feed drops the changes of every seventh log entry: watches
    /// skip them.
    WatchSkip,
    /// A node refuses a token it has not applied yet (a new member, a lagging one)
    /// instead of asking the leader: valid workers get 401s.
    LocalTokenCheck,
}

impl Bug {
    /// Every bug, in a fixed order.
    pub const ALL: [Bug; 9] = [
        Bug::AckBeforeSync,
        Bug::FollowerRead,
        Bug::WallClockLease,
        Bug::IdReuse,
        Bug::PartialTransaction,
        Bug::IgnoreMaxRunning,
        Bug::UnfencedFinish,
        Bug::WatchSkip,
        Bug::LocalTokenCheck,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Bug::AckBeforeSync => "ack-before-sync",
            Bug::FollowerRead => "follower-read",
            Bug::WallClockLease => "wall-clock-lease",
            Bug::IdReuse => "id-reuse",
            Bug::PartialTransaction => "partial-transaction",
            Bug::IgnoreMaxRunning => "ignore-max-running",
            Bug::UnfencedFinish => "unfenced-finish",
            Bug::WatchSkip => "watch-skip",
            Bug::LocalTokenCheck => "local-token-check",
        }
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A name that is not a known bug.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown bug {0:?}; known bugs: ack-before-sync, follower-read, wall-clock-lease, id-reuse, partial-transaction, ignore-max-running, unfenced-finish, watch-skip, local-token-check"
)]
pub struct UnknownBug(String);

impl FromStr for Bug {
    type Err = UnknownBug;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Bug::ALL
            .into_iter()
            .find(|bug| bug.name() == name)
            .ok_or_else(|| UnknownBug(name.to_string()))
    }
}

#[cfg(feature = "planted-bugs")]
thread_local! {
    static PLANTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Plants `bug` (or none) for everything that runs on this thread from now on.
#[cfg(feature = "planted-bugs")]
pub fn plant(bug: Option<Bug>) {
    PLANTED.with(|planted| planted.set(bug));
}

/// Whether `bug` is planted on this thread; always `false` without the feature.
#[inline]
pub fn is_planted(bug: Bug) -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        PLANTED.with(|planted| planted.get() == Some(bug))
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        let _ = bug;
        false
    }
}

/// Applies `command` to `machine`; with [`Bug::PartialTransaction`] planted, a refused
/// update's adds are then applied alone, as a store without all-or-nothing transactions
/// would. A retry answered from the dedup table adds nothing again. With
/// [`Bug::IgnoreMaxRunning`], see [`claim_ignoring_max_running`].
pub fn apply_with_planted_bugs(machine: &mut TaskMachine, command: &Command) -> Arc<Outcome> {
    if is_planted(Bug::IgnoreMaxRunning) {
        return claim_ignoring_max_running(machine, command);
    }
    if is_planted(Bug::UnfencedFinish) {
        return finish_without_fence(machine, command);
    }
    if !is_planted(Bug::PartialTransaction) {
        return machine.apply(command);
    }
    let replayed = is_remembered(machine, command);
    let outcome = machine.apply(command);
    let (Request::Update(update) | Request::LegacyUpdate(update)) = command.request.unscoped()
    else {
        return outcome;
    };
    if outcome.is_refused() && !replayed && !update.adds.is_empty() {
        machine.apply(&Command {
            stamp: command.stamp,
            request_id: None,
            request: Request::Update(UpdateRequest {
                client: update.client,
                adds: update.adds.clone(),
                ..UpdateRequest::default()
            }),
        });
    }
    outcome
}

/// A claim that found nothing because its group is at `max_running` is applied again
/// with the limit lifted for it alone, as a store that forgot the limit would: the limit
/// is set to 0, the claim applied (without its request id, which the first attempt
/// used), and the limit put back, all at the command's time.
fn claim_ignoring_max_running(machine: &mut TaskMachine, command: &Command) -> Arc<Outcome> {
    let outcome = machine.apply(command);
    let Request::Claim(claim) = command.request.unscoped() else {
        return outcome;
    };
    let limit = machine.group_settings(&claim.group).max_running;
    let at_limit = limit > 0 && machine.running_in_group(&claim.group) >= limit as usize;
    if !at_limit || !matches!(&*outcome, Outcome::Tasks(tasks) if tasks.is_empty()) {
        return outcome;
    }
    let set_limit = |max_running| Command {
        stamp: command.stamp,
        request_id: None,
        request: Request::Settings(SettingsRequest {
            client: claim.client,
            group: claim.group.clone(),
            change: SettingsChange {
                max_running: Some(max_running),
                ..SettingsChange::default()
            },
        }),
    };
    machine.apply(&set_limit(0));
    let claimed = machine.apply(&Command {
        request_id: None,
        ..command.clone()
    });
    machine.apply(&set_limit(limit));
    claimed
}

/// A finish refused because a cancel removed the task answers success, as a store that
/// does not fence finishes would (the state is unchanged: the task is gone either way).
/// A finish that also claims the next task answers that it found none.
fn finish_without_fence(machine: &mut TaskMachine, command: &Command) -> Arc<Outcome> {
    let outcome = machine.apply(command);
    let cancelled = matches!(
        (command.request.unscoped(), &*outcome),
        (Request::Finish(_) | Request::FinishAndClaim(_), Outcome::Refused(refusals))
            if refusals.iter().any(|r| matches!(r, Refusal::Cancelled { .. }))
    );
    if cancelled {
        return Arc::new(Outcome::Tasks(Vec::new()));
    }
    outcome
}

/// Whether the dedup table already holds `command`'s first outcome.
fn is_remembered(machine: &TaskMachine, command: &Command) -> bool {
    command.request_id.as_deref().is_some_and(|id| {
        let key = (command.request.client(), Arc::<str>::from(id));
        machine.dedup().get(&key).is_some()
    })
}

/// The next id [`Bug::IdReuse`] restores from a snapshot: one past the highest live id,
/// so ids of tasks deleted at the top are handed out again.
pub fn next_id_after_live(tasks: &[Task]) -> TaskId {
    tasks
        .iter()
        .map(|task| task.id)
        .max()
        .map_or(1, |last| last + 1)
}
