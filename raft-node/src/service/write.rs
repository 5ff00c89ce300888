//! Writes: a task request proposed through Raft, stamped with the leader's log clock.

use std::sync::Arc;

use openraft::error::ClientWriteError;
use openraft::error::RaftError;
use store_sm::machine::Command;
use store_sm::machine::Outcome;
use store_sm::machine::Refusal;
use store_sm::machine::Request;

use super::ServiceError;
use crate::node::FORWARD_TIMEOUT;
use crate::node::Node;

impl Node {
    /// `outcome`, unless it refuses a request id reused for another request: that is
    /// not an outcome of the request but a client's bug, answered apart (422) so that a
    /// retry loop stops instead of reading it as the first outcome; or a request outside
    /// the token's groups (403).
    pub(crate) fn outcome_or_reused_id(
        outcome: Arc<Outcome>,
    ) -> Result<Arc<Outcome>, ServiceError> {
        let Outcome::Refused(refusals) = &*outcome else {
            return Ok(outcome);
        };
        let reasons = || {
            let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
            reasons.join("; ")
        };
        if refusals
            .iter()
            .any(|r| matches!(r, Refusal::RequestIdReused { .. }))
        {
            return Err(ServiceError::ReusedRequestId(reasons()));
        }
        // Not an outcome of the request either: the token may not make it (403).
        if refusals
            .iter()
            .any(|r| matches!(r, Refusal::OutOfScope { .. }))
        {
            return Err(ServiceError::Forbidden(reasons()));
        }
        Ok(outcome)
    }

    /// Proposes `request` through Raft, stamped with this node's log clock, and returns
    /// the machine's outcome once a majority has the entry and this node applied it.
    pub async fn write(
        &self,
        request: Request,
        request_id: Option<String>,
    ) -> Result<Arc<Outcome>, ServiceError> {
        self.check_member()?;
        let command = Command {
            stamp: self.clock.now(),
            request_id,
            request,
        };
        // A leader that lost its quorum normally refuses at once (its lease lapsed); the
        // deadline covers the rest, where the outcome is unknown.
        let written = tokio::time::timeout(FORWARD_TIMEOUT, self.raft.client_write(command))
            .await
            .map_err(|_| {
                ServiceError::Unavailable(
                    "the write was not committed in time; its outcome is unknown: retry with the same requestid".into(),
                )
            })?;
        match written {
            Ok(response) => Self::outcome_or_reused_id(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(self.not_leader(&forward))
            }
            Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(_))) => {
                Err(ServiceError::Unavailable(
                    "leadership changed while the write was in flight; its outcome is unknown: retry with the same requestid".into(),
                ))
            }
            Err(RaftError::APIError(other)) => Err(ServiceError::Internal(format!(
                "write refused by Raft: {other}"
            ))),
            Err(RaftError::Fatal(fatal)) => Err(Self::stopped(fatal)),
        }
    }
}
