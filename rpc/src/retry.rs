//! A worker's writes, retried until the answer is definite.
//!
//! A timeout, a dropped connection or a 5xx does not prove that a write had no effect, so
//! a worker sends the same body (with its request id, which makes the cluster apply it
//! once) again, to the next node in turn, until a node answers with the write's outcome:
//! its tasks or its refusal. The simulation's workers, the partition tests' workers and
//! the integration tests' workers all write this way.

use std::time::Duration;

use crate::client::ClientError;
use crate::client::HttpClient;
use crate::worker::WriteRequestJson;
use crate::worker::WriteResultJson;

/// How a worker retries: the deadline of each attempt and the pause before the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Deadline of one attempt.
    pub call_timeout: Duration,
    /// Pause after a failed attempt, so that a cluster electing a leader is not flooded.
    pub pause: Duration,
}

/// Why a write has no definite answer.
#[derive(Debug, thiserror::Error)]
pub enum NotDefinite {
    /// A node answered 4xx: the request itself is wrong, and sending it again cannot help.
    #[error("the request was rejected: {0}")]
    Rejected(ClientError),
    /// The caller gave up first; the write may or may not have taken effect.
    #[error("gave up before a definite answer")]
    GaveUp,
}

/// What a write came to after its retries.
#[derive(Debug)]
pub struct Retried {
    /// The cluster's answer, or why there is none.
    pub answer: Result<WriteResultJson, NotDefinite>,
    /// Attempts that failed and were retried (timeouts, 5xx, dropped connections).
    pub retries: u64,
}

/// The nodes a worker talks to, tried in turn: after a failure, the next one.
#[derive(Clone, Debug)]
pub struct RoundRobin {
    client: HttpClient,
    addrs: Vec<String>,
    turn: usize,
}

impl RoundRobin {
    /// The nodes at `addrs` (API addresses), starting at index `first` (modulo their
    /// number), so that workers spread over the nodes; `None` if `addrs` is empty.
    pub fn new(addrs: Vec<String>, first: usize) -> Option<Self> {
        (!addrs.is_empty()).then(|| Self {
            client: HttpClient::new(),
            addrs,
            turn: first,
        })
    }

    /// The node whose turn it is.
    pub fn current(&self) -> &str {
        &self.addrs[self.turn % self.addrs.len()]
    }

    /// Moves on to the next node, after the current one failed.
    pub fn next_node(&mut self) {
        self.turn = self.turn.wrapping_add(1);
    }

    /// The HTTP client, for calls that are not retried (reads).
    pub fn client(&self) -> &HttpClient {
        &self.client
    }

    /// Sends `request` to the current node, then to the next ones in turn, until one
    /// answers with the write's outcome, a node rejects the request, or `give_up` (asked
    /// before every attempt) says to stop.
    pub async fn write_until_definite(
        &mut self,
        request: &WriteRequestJson,
        policy: RetryPolicy,
        give_up: impl Fn() -> bool,
    ) -> Retried {
        let mut retries = 0;
        loop {
            if give_up() {
                return Retried {
                    answer: Err(NotDefinite::GaveUp),
                    retries,
                };
            }
            if let Some(answer) = self.attempt(request, policy.call_timeout).await {
                return Retried { answer, retries };
            }
            self.next_node();
            retries += 1;
            tokio::time::sleep(policy.pause).await;
        }
    }

    /// One attempt at the current node: a definite answer, a rejection, or `None` when
    /// nothing is known (no answer, a 5xx, a body that does not parse).
    async fn attempt(
        &self,
        request: &WriteRequestJson,
        timeout: Duration,
    ) -> Option<Result<WriteResultJson, NotDefinite>> {
        match write_once(&self.client, self.current(), request, timeout).await {
            Ok(Ok(answer)) => Some(Ok(answer)),
            Ok(Err(rejected)) => Some(Err(NotDefinite::Rejected(rejected))),
            Err(_) => None,
        }
    }
}

/// One attempt of a write at `addr`: `Ok` with a definite answer (the write's outcome, or
/// the node's rejection of a malformed request), `Err` with why nothing is known (no
/// answer, a 5xx, a body that does not parse), so the write may be sent again.
pub(crate) async fn write_once(
    client: &HttpClient,
    addr: &str,
    request: &WriteRequestJson,
    timeout: Duration,
) -> Result<Result<WriteResultJson, ClientError>, String> {
    let response = client
        .post_json(addr, request.path(), request, timeout)
        .await
        .map_err(|e| e.to_string())?;
    if response.status.is_client_error() {
        return match response.success(addr) {
            Err(rejected) => Ok(Err(rejected)),
            Ok(_) => Err("a 4xx that is not an error".into()),
        };
    }
    if !response.status.is_success() {
        return Err(format!("status {}", response.status));
    }
    response
        .json::<WriteResultJson>(addr)
        .map(Ok)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_take_turns_from_the_given_start() {
        let addrs = vec!["a:1".to_string(), "b:2".to_string(), "c:3".to_string()];
        let mut nodes = RoundRobin::new(addrs, 4).expect("has nodes");
        assert_eq!(nodes.current(), "b:2");
        nodes.next_node();
        assert_eq!(nodes.current(), "c:3");
        nodes.next_node();
        assert_eq!(nodes.current(), "a:1");
        assert!(RoundRobin::new(Vec::new(), 0).is_none());
    }
}
