//! Snapshots counted in writes as well as entries. openraft takes one every
//! `--snapshot-every-entries` log entries; since writes share entries (group commit,
//! up to `BATCH_COMMANDS_MAX` an entry), this keeper also takes one once as many writes were applied
//! since the last snapshot, so that the log kept between snapshots, and what a restart
//! replays, stay the size the setting says whatever the batching.

use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use crate::node::SharedNode;

/// How often the keeper looks at the count: a snapshot comes at most this much later
/// than the count says.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Runs until Raft shuts down: triggers a snapshot whenever this node applied
/// `--snapshot-every-entries` commands since its last one (however it was taken; blank
/// and membership entries count one each, as every entry does for openraft).
pub async fn snapshot_every_writes(node: SharedNode) {
    let every = node.config.snapshot_every_entries;
    let metrics = node.raft.metrics();
    let mut snapshot_seen = metrics.borrow_watched().snapshot.map(|id| id.index());
    let mut writes_at_snapshot = node.feed.commands_applied();
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let (state, snapshot) = {
            let now = metrics.borrow_watched();
            (now.state, now.snapshot.map(|id| id.index()))
        };
        if state == ServerState::Shutdown {
            return;
        }
        let applied = node.feed.commands_applied();
        if snapshot != snapshot_seen {
            snapshot_seen = snapshot;
            writes_at_snapshot = applied;
            continue;
        }
        if applied.saturating_sub(writes_at_snapshot) >= every {
            // It fails only once Raft has stopped, and then so does this keeper.
            if let Err(e) = node.raft.trigger().snapshot().await {
                tracing::info!(error = %e, "raft stopped: no more snapshots by writes");
                return;
            }
            writes_at_snapshot = applied;
        }
    }
}
