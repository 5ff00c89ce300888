//! The applied state's values in the API's JSON shapes: one conversion each, shared by
//! the handlers and the change feed.

use rpc::job::AttemptJson;
use rpc::job::BackoffJson;
use rpc::job::JobJson;
use rpc::job::SettingsJson;
use rpc::worker::TaskJson;
use rpc::worker::WriteResultJson;
use store_sm::machine::AttemptEnd;
use store_sm::machine::ClientId;
use store_sm::machine::GroupSettings;
use store_sm::machine::JobRecord;
use store_sm::machine::Outcome;
use store_sm::machine::Refusal;
use store_sm::machine::Task;
use store_sm::machine::TaskMachine;

/// A task version as the API shows it.
pub fn task_json(task: &Task) -> TaskJson {
    TaskJson {
        id: task.id,
        group: task.group.to_string(),
        data: task.data.clone(),
        timespec: task.available_at.as_millis(),
        ownerid: task.owner,
        key: task.job.key.as_deref().map(String::from),
        priority: task.job.priority,
        attempt: task.job.attempt,
    }
}

/// A write's outcome as the API answers it to client `asker`.
pub fn outcome_json(outcome: &Outcome, asker: ClientId) -> WriteResultJson {
    match outcome {
        Outcome::Tasks(tasks) => WriteResultJson::Tasks {
            tasks: tasks.iter().map(task_json).collect(),
        },
        Outcome::Refused(refusals) => WriteResultJson::Errors {
            errors: refusals.iter().map(|r| refusal_text(r, asker)).collect(),
        },
        // Only a settings or token change answers these, and no task endpoint sends one;
        // a batch's outcomes are split among its writers before anyone answers.
        Outcome::Settings(_) | Outcome::Token(_) | Outcome::Batch(_) => WriteResultJson::Errors {
            errors: vec![
                "internal error: a task write answered settings, a token or a batch; report this"
                    .into(),
            ],
        },
    }
}

/// A refusal as told to client `asker`. The machine's text cannot know who asked (the
/// outcome is remembered for the request id, and replicated), so a finish or fail of a
/// task whose owner is the asker itself, refused because its lease lapsed, is told so
/// here rather than as "not held by this client (owner <the asker>)".
pub fn refusal_text(refusal: &Refusal, asker: ClientId) -> String {
    match refusal {
        Refusal::NotHeld {
            list,
            id,
            owner,
            available_at,
        } if *owner == asker => format!(
            "{list}: task {id} is no longer held: this client's lease on it ended at {available_at} (log time, \
             ms); nobody has claimed it since: renew it to take it back (POST /update), or \
             claim it again"
        ),
        other => other.to_string(),
    }
}

/// A group's settings, with its running count.
pub fn settings_json(group: &str, settings: &GroupSettings, running: usize) -> SettingsJson {
    SettingsJson {
        group: group.to_string(),
        max_running: settings.max_running,
        paused: settings.paused,
        max_attempts: settings.max_attempts,
        backoff: BackoffJson {
            base_ms: settings.backoff.base_ms,
            factor: f64::from(settings.backoff.factor_milli) / 1000.0,
            max_ms: settings.backoff.max_ms,
        },
        retention_ms: settings.retention_ms,
        running,
    }
}

fn attempt_json(attempt: &store_sm::machine::Attempt) -> AttemptJson {
    let (outcome, error) = match &attempt.end {
        None => ("running", None),
        Some(AttemptEnd::Succeeded) => ("succeeded", None),
        Some(AttemptEnd::Failed(error)) => ("failed", Some(error.clone())),
        Some(AttemptEnd::Lost) => ("lost", None),
        Some(AttemptEnd::Released) => ("released", None),
        Some(AttemptEnd::Cancelled) => ("cancelled", None),
    };
    AttemptJson {
        run: attempt.run,
        attempt: attempt.number,
        owner: attempt.owner,
        started_at: attempt.started_at.as_millis(),
        ended_at: attempt.ended_at.map(|t| t.as_millis()),
        outcome: outcome.to_string(),
        error,
    }
}

/// A record as the API shows it, with its live task's data and available time.
pub fn job_json(machine: &TaskMachine, record: &JobRecord) -> JobJson {
    let task = record.task.and_then(|id| machine.task(id));
    JobJson {
        group: record.group.to_string(),
        key: record.key.to_string(),
        id: record.id,
        state: record.state.as_str().to_string(),
        task: task.map(|t| t.id),
        available_at: task.map(|t| t.available_at.as_millis()),
        data: task.map(|t| t.data.clone()).or_else(|| record.data.clone()),
        priority: record.priority,
        max_attempts: record.max_attempts,
        every_ms: record.every_ms,
        run: record.run,
        attempts: record.attempts,
        history: record.history.iter().map(attempt_json).collect(),
        // Results were checked to be JSON when they were recorded.
        result: record.result.as_deref().map(|text| {
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.into()))
        }),
        reason: record.reason.clone(),
        created_at: record.created_at.as_millis(),
        finished_at: record.finished_at.map(|t| t.as_millis()),
        expires_at: record.expires_at.map(|t| t.as_millis()),
        after: record.after.iter().map(|k| k.to_string()).collect(),
        dependants: record.dependants.iter().map(|k| k.to_string()).collect(),
        resubmitted: record.resubmit.is_some(),
    }
}
