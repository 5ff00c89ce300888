//! The node's service layer: what a node does for a request, whatever carried it.
//!
//! Writes, reads, cluster status, formation, membership changes, backup and restore live
//! here as plain methods on [`Node`](crate::node::Node) that take and return plain values
//! and fail with a [`ServiceError`]. Nothing here knows HTTP: the routers in
//! `worker_api`, `admin_api` and `metrics` parse a request, call one method, and map the
//! answer; when the answer is [`ServiceError::NotLeader`], they relay the request to the
//! leader once (`relay`).

pub mod auth;
mod backup;
mod claim_wait;
pub(crate) mod group_commit;
mod job_wait;
mod membership;
mod read;
mod status;
mod watch;
mod write;

pub use self::backup::Backup;
pub use self::read::Consistency;
pub use self::read::ReadView;
pub use self::watch::WatchRequest;

use openraft::AsyncRuntime;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::ForwardToLeader;

use crate::node::Node;
use crate::runtime::NodeRuntime;
use crate::types::NodeTypes;
use crate::waiting::WaitRefused;

/// Why the service could not do what was asked.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ServiceError {
    /// Only the leader can do this, and the leader's API is at this address.
    #[error("this node does not lead; the leader is at {leader_api}")]
    NotLeader {
        /// The leader's API address (`host:port`).
        leader_api: String,
    },
    /// Nobody can do it right now (no leader, no quorum, the node is stopping, an
    /// outcome that is not known): the same request may succeed later.
    #[error("{0}")]
    Unavailable(String),
    /// The request is malformed or names something impossible; resending it is useless.
    #[error("{0}")]
    Invalid(String),
    /// The request is well formed but conflicts with the cluster's state.
    #[error("{0}")]
    Conflict(String),
    /// The request's id names an earlier, different request of the same client.
    #[error("{0}")]
    ReusedRequestId(String),
    /// What the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request carries no valid token.
    #[error("{0}")]
    Unauthorized(String),
    /// The token is valid but its role or groups do not allow the request.
    #[error("{0}")]
    Forbidden(String),
    /// A fault of this node.
    #[error("{0}")]
    Internal(String),
    /// This node was removed from the cluster and serves nothing any more.
    #[error(
        "node {id} was removed from the cluster and serves no requests; send them to a member ({}), and stop this node and wipe its data directory",
        members.join(", ")
    )]
    Removed {
        /// This node's id.
        id: u64,
        /// The API addresses of the members it last knew of.
        members: Vec<String>,
    },
}

impl From<WaitRefused> for ServiceError {
    fn from(refused: WaitRefused) -> Self {
        ServiceError::Unavailable(refused.to_string())
    }
}

/// Runs `work` on a thread of its own (openraft's `spawn_blocking` makes one per call;
/// inline in the simulation), so that work of seconds (encoding or decoding millions of
/// tasks) does not hold the node's one async thread; `doing` names it in the error if
/// the thread fails.
async fn off_thread<T: Send + 'static>(
    doing: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ServiceError> {
    NodeRuntime::spawn_blocking(work)
        .await
        .map_err(|e| ServiceError::Internal(format!("{doing}: {e}")))
}

/// The answer while leadership moves. A relay may have given the request its request id,
/// which its client never saw: so the advice is to send one, not to reuse one.
pub const LEADERSHIP_MOVING: &str = "leadership is moving; retry shortly (send writes with a requestid so that a retry applies once)";

impl Node {
    /// Where to send what only the leader can do: the leader's API address, or why no
    /// leader can take it now.
    fn not_leader(&self, forward: &ForwardToLeader<NodeTypes>) -> ServiceError {
        let leader_api = match (&forward.leader_node, forward.leader_id) {
            (Some(node), _) => Some(node.api_addr.clone()),
            (None, Some(id)) => self.member_api_addr(id),
            (None, None) => None,
        };
        match leader_api {
            // openraft names this node while it steps up or down: nobody to relay to yet.
            Some(_) if forward.leader_id == Some(self.id()) => {
                ServiceError::Unavailable(LEADERSHIP_MOVING.into())
            }
            Some(leader_api) => ServiceError::NotLeader { leader_api },
            None => ServiceError::Unavailable(
                "no leader is known or its lease has lapsed; retry shortly".into(),
            ),
        }
    }

    /// The term this node leads in, or `None` while it does not lead.
    pub fn leading_term(&self) -> Option<u64> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        (metrics.state == ServerState::Leader).then_some(metrics.current_term)
    }

    /// Refuses to serve when this node was removed from the cluster: its state will never
    /// catch up again, and it must not relay to a leader it no longer follows.
    pub fn check_member(&self) -> Result<(), ServiceError> {
        if let Some(members) = self.removed_notice() {
            return Err(ServiceError::Removed {
                id: self.id(),
                members: members.to_vec(),
            });
        }
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        let membership = metrics.membership_config.membership();
        // A node that was never given a membership is new, not removed.
        let knows_a_cluster = membership.nodes().next().is_some();
        if knows_a_cluster && membership.get_node(&self.id()).is_none() {
            return Err(ServiceError::Removed {
                id: self.id(),
                members: membership
                    .nodes()
                    .map(|(_, n)| n.api_addr.clone())
                    .collect(),
            });
        }
        Ok(())
    }

    /// The ids of the members (voters and learners) of this node's current membership.
    pub fn member_ids(&self) -> Vec<u64> {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        let membership = metrics.membership_config.membership();
        membership.nodes().map(|(id, _)| *id).collect()
    }

    /// Whether this node belongs to no cluster yet: never given a membership, it holds
    /// no state (and no token) at all.
    pub fn is_blank(&self) -> bool {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        metrics
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_none()
    }

    /// The error for a Raft instance that has stopped for good.
    fn stopped(fatal: impl std::fmt::Display) -> ServiceError {
        ServiceError::Unavailable(format!("this node has stopped ({fatal}); use another node"))
    }
}
