//! Reads: linearizable on the leader through read-index, stale from this node's state.

use openraft::ReadPolicy;
use openraft::async_runtime::WatchReceiver;
use openraft::error::LinearizableReadError;
use openraft::error::RaftError;
use store_sm::machine::LogTime;
use store_sm::state_machine::AppliedState;

use super::ServiceError;
use crate::node::FORWARD_TIMEOUT;
use crate::node::Node;

/// How fresh a read must be (SPEC section 2, "Reads").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Reflects every write acknowledged before the read: served by the leader.
    Linearizable,
    /// This node's applied state, whatever its lag: served anywhere.
    Stale,
}

impl Consistency {
    /// Parses the `consistency` query value; absent means linearizable.
    pub fn parse(value: Option<&str>) -> Result<Self, ServiceError> {
        match value {
            None | Some("linearizable") => Ok(Self::Linearizable),
            Some("stale") => Ok(Self::Stale),
            Some(other) => Err(ServiceError::Invalid(format!(
                "consistency={other:?} is not one of linearizable, stale"
            ))),
        }
    }
}

/// A consistent view to answer a read from.
pub struct ReadView {
    /// The applied state (an O(1) clone: reading it never holds up apply).
    pub state: Box<AppliedState>,
    /// The log time at which ownership is judged.
    pub now: LogTime,
}

impl Node {
    /// A view for a read at `consistency`: stale reads are served here from what this node
    /// applied; linearizable reads only on a leader that confirmed its leadership with a
    /// quorum ([`ServiceError::NotLeader`] elsewhere).
    pub async fn read(&self, consistency: Consistency) -> Result<ReadView, ServiceError> {
        self.check_member()?;
        if consistency == Consistency::Stale || self.planted_follower_read() {
            let state = self.state.snapshot();
            let now = self.read_time(state.machine.log_time());
            return Ok(ReadView {
                state: Box::new(state),
                now,
            });
        }
        let linearized = tokio::time::timeout(
            FORWARD_TIMEOUT,
            self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        .map_err(|_| {
            ServiceError::Unavailable(
                "could not confirm leadership with a quorum in time; retry".into(),
            )
        })?;
        match linearized {
            Ok(_) => {
                self.await_log_held_at_start().await?;
                let state = self.state.snapshot();
                let now = state.machine.log_time().max(self.clock.now());
                Ok(ReadView {
                    state: Box::new(state),
                    now,
                })
            }
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                Err(self.not_leader(&forward))
            }
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => {
                // The error's own text lists the quorum set's internals: name who answered.
                let answered: Vec<String> = e.got.iter().map(ToString::to_string).collect();
                let answered = match answered.as_slice() {
                    [] => "no node answered".to_string(),
                    nodes => format!("only node {} answered", nodes.join(" and ")),
                };
                Err(ServiceError::Unavailable(format!(
                    "this node leads but has not heard from a majority lately ({answered}), so \
                     it cannot confirm what it would answer; retry shortly (a read may also \
                     ask for ?consistency=stale)"
                )))
            }
            Err(RaftError::Fatal(fatal)) => Err(Self::stopped(fatal)),
        }
    }

    /// The log time a read of a state applied up to `applied` judges ownership, lapses
    /// and retention at (SPEC 2): on the leader the larger of it and the leader's clock,
    /// so time passes on an idle cluster; elsewhere the last applied entry's time.
    pub(super) fn read_time(&self, applied: LogTime) -> LogTime {
        if self.leading_term().is_some() {
            applied.max(self.clock.now())
        } else {
            applied
        }
    }

    /// A leader that restarted and kept its leadership (the same term) may have had
    /// entries of its log committed, and acknowledged, before the restart that it does
    /// not know are committed now: it saves its commit index lazily, and openraft's
    /// read index is then only the term's first entry. Such a leader waits until it has
    /// applied its whole log as it was at start, which it will, since it leads and
    /// never truncates its own log. (The simulation's crash scenario found a read that
    /// missed an acknowledged add after every node lost power.)
    async fn await_log_held_at_start(&self) -> Result<(), ServiceError> {
        let (term_at_start, Some(last_at_start)) = self.log_at_start else {
            return Ok(());
        };
        let (term, applied) = {
            let metrics = self.raft.metrics().borrow_watched().clone();
            (
                metrics.current_term,
                metrics.last_applied.map(|id| id.index()),
            )
        };
        if term != term_at_start || applied >= Some(last_at_start) {
            return Ok(());
        }
        self.raft
            .wait(Some(FORWARD_TIMEOUT))
            .applied_index_at_least(Some(last_at_start), "a read after a restart")
            .await
            .map(drop)
            .map_err(|_| {
                ServiceError::Unavailable(
                    "this leader restarted and has not caught up with its log yet; retry".into(),
                )
            })
    }

    /// Whether the simulation planted "followers answer linearizable reads locally" and
    /// this node follows.
    fn planted_follower_read(&self) -> bool {
        store_sm::planted::is_planted(store_sm::planted::Bug::FollowerRead)
            && self.leader_id() != Some(self.id())
    }
}
