//! Backup (a consistent snapshot of the whole store) and restore (a new cluster from one).

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use openraft::async_runtime::WatchReceiver;
use openraft::vote::RaftLeaderId;
use rpc::admin::RestoreJson;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaLeaderId;
use store_sm::raft_types::RotaLogId;
use store_sm::raft_types::RotaNode;
use store_sm::raft_types::RotaSnapshot;
use store_sm::raft_types::RotaSnapshotMeta;
use store_sm::raft_types::RotaStoredMembership;
use store_sm::raft_types::RotaVote;
use store_sm::raft_types::SnapshotData;

use super::Consistency;
use super::ServiceError;
use super::off_thread;
use crate::node::Node;

/// The node id in the log id of a restored snapshot. Real nodes start at 1, so no real
/// leader ever had this id, and every election after the restore outranks it.
const RESTORE_LEADER: NodeId = 0;

/// A consistent snapshot of the store.
pub struct Backup {
    /// The snapshot format of `store_sm::snapshot` (checksummed).
    pub bytes: Vec<u8>,
    /// The log index it was taken at.
    pub applied_index: u64,
    /// Its state hash.
    pub state_hash: String,
}

impl Node {
    /// A snapshot of the whole store as of a linearizable read: it holds every write
    /// acknowledged before the call.
    pub async fn backup(&self) -> Result<Backup, ServiceError> {
        let view = self.read(Consistency::Linearizable).await?;
        let applied_index = view.state.applied.map_or(0, |id| id.index());
        let machine = view.state.machine.clone();
        let (bytes, hash) = off_thread("encoding the backup", move || {
            store_sm::snapshot::encode_snapshot_with_hash(&machine)
        })
        .await?;
        Ok(Backup {
            bytes,
            applied_index,
            state_hash: hash.to_string(),
        })
    }

    /// Whether this node holds nothing yet: no membership, no log, nothing applied.
    fn is_empty(&self) -> bool {
        let watch = self.raft.metrics();
        let metrics = watch.borrow_watched();
        self.is_blank() && metrics.last_log_index.is_none() && metrics.last_applied.is_none()
    }

    /// Refuses a restore of a cluster of `members` here unless this node is one of them
    /// and holds nothing yet; cheap, so a caller can check before it reads a large backup.
    pub fn check_restore(&self, members: &BTreeMap<NodeId, RotaNode>) -> Result<(), ServiceError> {
        if members.contains_key(&RESTORE_LEADER) {
            return Err(ServiceError::Invalid("node ids start at 1".into()));
        }
        if !members.contains_key(&self.id()) {
            return Err(ServiceError::Invalid(format!(
                "the members do not include this node ({}); send the restore to a node you list",
                self.id()
            )));
        }
        if !self.is_empty() {
            return Err(ServiceError::Conflict(
                "this node already holds a cluster's state; restore into newly started nodes with empty data directories".into(),
            ));
        }
        Ok(())
    }

    /// Starts a new cluster of `members` from `backup` (the snapshot format): installs it
    /// on this empty node as a snapshot at log index 1. This node then elects itself and
    /// replicates the snapshot to the other members, which must be running and empty too.
    pub async fn restore(
        &self,
        members: BTreeMap<NodeId, RotaNode>,
        backup: SnapshotData,
    ) -> Result<RestoreJson, ServiceError> {
        self.check_restore(&members)?;
        let spooled = backup.clone();
        let checked = off_thread("checking the backup", move || {
            let bytes = spooled
                .load()
                .map_err(|e| ServiceError::Internal(format!("reading the spooled backup: {e}")))?;
            // Decoded only to check the backup: the state machine decodes it again.
            let (machine, state_hash) = store_sm::snapshot::decode_snapshot_with_hash(&bytes)
                .map_err(|e| {
                    ServiceError::Invalid(format!("the body is not a usable backup: {e}"))
                })?;
            Ok::<_, ServiceError>((machine.task_count() as u64, state_hash))
        })
        .await?;
        let (tasks, state_hash) = checked?;
        let (vote, snapshot) = restored_snapshot(members, backup)?;
        let applied_index = snapshot.meta.last_log_id.map_or(0, |id| id.index());
        self.raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| ServiceError::Internal(format!("installing the backup failed: {e}")))?;
        tracing::info!(%state_hash, tasks, "restored from a backup");
        Ok(RestoreJson {
            applied_index,
            state_hash: state_hash.to_string(),
            tasks,
        })
    }
}

/// The snapshot at log index 1, term 1, led by [`RESTORE_LEADER`], whose membership has
/// `members` as voters, and the committed vote that lets a node install it.
fn restored_snapshot(
    members: BTreeMap<NodeId, RotaNode>,
    backup: SnapshotData,
) -> Result<(RotaVote, RotaSnapshot), ServiceError> {
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let log_id = RotaLogId::new(RotaLeaderId::new(1, RESTORE_LEADER), 1);
    let membership = openraft::Membership::new(vec![voters], members)
        .map_err(|e| ServiceError::Invalid(format!("invalid members: {e}")))?;
    let snapshot = RotaSnapshot {
        meta: RotaSnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: RotaStoredMembership::new(Some(log_id), membership),
        },
        snapshot: backup,
    };
    Ok((RotaVote::new_committed(1, RESTORE_LEADER), snapshot))
}
