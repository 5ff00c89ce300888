//! What the store-sm integration tests share: a type configuration on tokio and helpers
//! that feed entries to a state machine.

#![allow(dead_code)]

use std::io;

use openraft::EntryPayload;
use openraft::storage::RaftStateMachine;
use store_sm::machine::AddTask;
use store_sm::machine::ClaimRequest;
use store_sm::machine::Command;
use store_sm::machine::LogTime;
use store_sm::machine::Request;
use store_sm::machine::UpdateRequest;
use store_sm::raft_types::Response;
use store_sm::raft_types::RotaEntry;
use store_sm::raft_types::RotaLeaderId;
use store_sm::raft_types::RotaLogId;
use store_sm::raft_types::RotaNode;

openraft::declare_raft_types!(
    /// Rota's types on the tokio runtime, for tests.
    pub TestTypes:
        D = Command,
        R = Response,
        Node = RotaNode,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The log id of `index` in `term`, led by node 1.
pub fn log_id(term: u64, index: u64) -> RotaLogId {
    RotaLogId::new(RotaLeaderId { term, node_id: 1 }, index)
}

/// A normal entry carrying `command`.
pub fn normal(term: u64, index: u64, command: Command) -> RotaEntry {
    RotaEntry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(command),
    }
}

/// A deterministic mix of adds and claims: command `i` of a workload.
pub fn workload_command(i: u64) -> Command {
    let stamp_ms = 1_700_000_000_000 + i as i64 * 7;
    let request = if i % 3 == 2 {
        Request::Claim(ClaimRequest {
            client: (i % 5) as i64,
            group: format!("g{}", i % 4),
            duration_ms: 30_000,
            depends: vec![],
        })
    } else {
        Request::Update(UpdateRequest {
            client: (i % 5) as i64,
            adds: vec![AddTask::seed(
                format!("g{}", i % 4),
                format!("task {i}"),
                None,
            )],
            ..Default::default()
        })
    };
    Command {
        stamp: LogTime::from_millis(stamp_ms),
        request_id: Some(format!("r{i}")),
        request,
    }
}

/// Applies `entries` to `sm` with no client waiting.
pub async fn apply_entries<SM: RaftStateMachine<TestTypes>>(
    sm: &mut SM,
    entries: Vec<RotaEntry>,
) -> io::Result<()> {
    let items = entries.into_iter().map(|entry| Ok((entry, None)));
    sm.apply(futures_util::stream::iter(items)).await
}
