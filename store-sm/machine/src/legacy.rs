//! Commands as builds before the job layer encoded them in the Raft log, so that a node
//! upgraded in place still applies the entries its log holds.

use serde::Deserialize;
use serde::Serialize;

use crate::jobs::AddJob;
use crate::types::AddTask;
use crate::types::ClientId;
use crate::types::Millis;
use crate::types::TaskId;
use crate::types::UpdateRequest;
use crate::types::UpdateTask;

/// An add without job fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyAddTask {
    /// Group of the new task.
    pub group: String,
    /// Payload.
    pub data: String,
    /// `None` is now, negative is now + |t|, otherwise absolute.
    pub timespec: Option<Millis>,
}

/// The seed's `/update` as encoded before the job layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyUpdateRequest {
    /// The writing client.
    pub client: ClientId,
    /// Tasks to create.
    pub adds: Vec<LegacyAddTask>,
    /// Tasks to replace.
    pub updates: Vec<UpdateTask>,
    /// Tasks to remove.
    pub deletes: Vec<TaskId>,
    /// Tasks that must exist.
    pub depends: Vec<TaskId>,
}

impl From<&LegacyUpdateRequest> for UpdateRequest {
    fn from(legacy: &LegacyUpdateRequest) -> Self {
        UpdateRequest {
            client: legacy.client,
            adds: legacy
                .adds
                .iter()
                .map(|add| AddTask {
                    group: add.group.clone(),
                    data: add.data.clone(),
                    timespec: add.timespec,
                    job: AddJob::default(),
                })
                .collect(),
            updates: legacy.updates.clone(),
            deletes: legacy.deletes.clone(),
            depends: legacy.depends.clone(),
        }
    }
}
