//! Backup (a consistent snapshot of the whole store) and restore (a new cluster from one).

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use openraft::async_runtime::WatchReceiver;
use openraft::vote::RaftLeaderId;
use rpc::admin::RestoreJson;
use store_sm::machine::LogTime;
use store_sm::raft_types::NodeId;
use store_sm::raft_types::RotaLeaderId;
use store_sm::raft_types::RotaLogId;
use store_sm::raft_types::RotaNode;
use store_sm::raft_types::RotaSnapshot;
use store_sm::raft_types::RotaSnapshotMeta;
use store_sm::raft_types::RotaStoredMembership;
use store_sm::raft_types::RotaVote;
use store_sm::raft_types::SnapshotData;
use store_sm::snapshot::StateHash;
use store_sm::snapshot_data::SnapshotSpool;

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
    /// on this empty node as a snapshot at log index 1, with log time moved to this
    /// node's clock and ids above a floor from it (see
    /// [`store_sm::machine::TaskMachine::start_restored_cluster`]). This node then elects
    /// itself and replicates the snapshot to the other members, which must be running
    /// and empty too.
    pub async fn restore(
        &self,
        members: BTreeMap<NodeId, RotaNode>,
        backup: SnapshotData,
    ) -> Result<RestoreJson, ServiceError> {
        self.check_restore(&members)?;
        let form = self.restored_members_form(&members).await;
        let now = self.clock.now();
        let spool = self
            .snapshot_spool()
            .map_err(|e| ServiceError::Internal(format!("cannot spool the restored state: {e}")))?;
        let restored = off_thread("preparing the backup", move || {
            restored_state(&backup, now, form, spool)
        })
        .await??;
        let (vote, snapshot) = restored_snapshot(members, restored.data.clone())?;
        let applied_index = snapshot.meta.last_log_id.map_or(0, |id| id.index());
        self.raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| ServiceError::Internal(format!("installing the backup failed: {e}")))?;
        let answer = restored.answer(applied_index);
        tracing::info!(
            backup_state_hash = %answer.state_hash,
            state_hash = %answer.restored_state_hash,
            tasks = answer.tasks,
            next_id = answer.next_id,
            log_time = answer.log_time,
            "restored from a backup"
        );
        Ok(answer)
    }

    /// The log entry form every one of `members` reads, if each says so now and it is
    /// one a cluster records: the restored state carries it, so that no entry recording
    /// it follows the restore and changes the state every member is checked to hold.
    async fn restored_members_form(&self, members: &BTreeMap<NodeId, RotaNode>) -> Option<u32> {
        let others = members
            .iter()
            .filter(|(id, _)| **id != self.id())
            .map(|(id, node)| (*id, node.raft_addr.clone()))
            .collect();
        let common = self.lowest_form_now(others).await.ok()?;
        (common >= crate::log_forms::RECORDED_FORM).then_some(common)
    }
}

/// A backup made ready to start a new cluster, and what the restore answers about it.
struct RestoredState {
    data: SnapshotData,
    backup_hash: StateHash,
    hash: StateHash,
    tasks: u64,
    next_id: u64,
    log_time: i64,
}

impl RestoredState {
    fn answer(&self, applied_index: u64) -> RestoreJson {
        RestoreJson {
            applied_index,
            state_hash: self.backup_hash.to_string(),
            restored_state_hash: self.hash.to_string(),
            tasks: self.tasks,
            next_id: self.next_id,
            log_time: self.log_time,
        }
    }
}

/// Decodes the spooled `backup` (which checks it), starts a new cluster's state from it
/// at `now` with the log entry `form` its members read recorded, if they all said so,
/// and encodes that state into `spool`.
fn restored_state(
    backup: &SnapshotData,
    now: LogTime,
    form: Option<u32>,
    mut spool: SnapshotSpool,
) -> Result<RestoredState, ServiceError> {
    let bytes = backup
        .load()
        .map_err(|e| ServiceError::Internal(format!("reading the spooled backup: {e}")))?;
    let (mut machine, backup_hash) = store_sm::snapshot::decode_snapshot_with_hash(&bytes)
        .map_err(|e| ServiceError::Invalid(format!("the body is not a usable backup: {e}")))?;
    drop(bytes);
    // A backup on a recorded form is in a snapshot format (and, from RULES_FORM on,
    // under rules) that members of an older build do not read: refused here rather than
    // installed and fatal to them.
    let recorded = machine.log_form();
    if recorded > form.unwrap_or(0) {
        let members = match form {
            Some(form) => format!("the new members read up to form {form}"),
            None => "not every new member said it reads it".to_string(),
        };
        return Err(ServiceError::Conflict(format!(
            "the backup records log entry form {recorded}, and {members}: start every member with a release that reads it (`rota cluster status` shows a cluster's form), then retry"
        )));
    }
    machine.start_restored_cluster(now);
    if let Some(form) = form {
        machine.raise_log_form(form);
    }
    let spooled =
        |e: std::io::Error| ServiceError::Internal(format!("cannot spool the restored state: {e}"));
    let hash = store_sm::snapshot::write_snapshot(&machine, &mut spool).map_err(spooled)?;
    Ok(RestoredState {
        data: spool.finish().map_err(spooled)?,
        backup_hash,
        hash,
        tasks: machine.task_count() as u64,
        next_id: machine.next_id(),
        log_time: machine.log_time().as_millis(),
    })
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
