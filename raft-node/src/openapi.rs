//! The OpenAPI 3.1 document of the worker and admin API, served at `/openapi.json` and
//! checked in as `openapi.json` at the repository root (for a node with the default
//! configuration); tests keep the two equal, check that every documented operation is
//! routed, and that the bodies the document describes are the ones the node accepts.
//!
//! The paths and operations are written here; every body schema is generated from rpc's
//! types (`rpc::schema`), so a field cannot change without the document changing too.
//! A node serves the document with the limits of its own configuration (the longest
//! claim, the body limit), so it says what that node enforces.

use axum::Json;
use axum::extract::State;
use rpc::admin::RESTORE_BYTES_MAX;
use rpc::job::JOBS_PAGE_DEFAULT;
use rpc::job::JOBS_PAGE_MAX;
use rpc::job::WAIT_KEYS_MAX;
use rpc::job::WAIT_QUERY_BYTES_MAX;
use rpc::schema::INTEGER_SPELLING;
use rpc::schema::reference as ref_schema;
use rpc::watch::WAIT_MS_MAX;
use rpc::watch::WATCH_PAGE_DEFAULT;
use rpc::watch::WATCH_PAGE_MAX;
use rpc::worker::CLAIM_PATH;
use rpc::worker::UPDATE_PATH;
use serde_json::Value;
use serde_json::json;
use store_sm::machine::constants::REQUEST_ID_BYTES_MAX;

use crate::config::BODY_BYTES_MAX_DEFAULT;
use crate::config::CLAIM_DURATION_MAX_MS_DEFAULT;
use crate::config::NodeConfig;
use crate::node::SharedNode;
use crate::worker_api::TASK_IDS_MAX;

/// What a node enforces that its configuration decides, stated in the document it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest claim, `--claim-duration-max-ms`.
    pub claim_duration_max_ms: i64,
    /// Largest request body, `--body-bytes-max`.
    pub body_bytes_max: usize,
}

impl Default for Limits {
    /// The limits of a node started without settings: those of the checked-in document.
    fn default() -> Self {
        Self {
            claim_duration_max_ms: CLAIM_DURATION_MAX_MS_DEFAULT,
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
        }
    }
}

impl Limits {
    /// The limits `config` sets.
    pub fn of(config: &NodeConfig) -> Self {
        Self {
            claim_duration_max_ms: config.claim_duration_max_ms,
            body_bytes_max: config.body_bytes_max,
        }
    }
}

/// The `Idempotency-Key` header as `worker_api::request_id` checks it.
fn idempotency_key() -> Value {
    json!({
        "name": "Idempotency-Key", "in": "header", "required": false,
        "description": format!("The request id, as the body's requestid: a retry with the same value applies once. At most {REQUEST_ID_BYTES_MAX} bytes of printable ASCII (0x20 to 0x7E, or tab), given at most once; if the body has a requestid too, the two must be equal. A key that breaks a rule is refused with 400 and an error naming it (both values when they differ). A node relaying a write without a request id to the leader adds this header with an id it makes up, so that its own retries apply once."),
        "schema": {"type": "string", "maxLength": REQUEST_ID_BYTES_MAX, "pattern": "^[\\t\\x20-\\x7E]*$"}
    })
}

fn json_body(schema: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn error(description: &str) -> Value {
    ok(description, ref_schema("Error"))
}

fn consistency() -> Value {
    json!({
        "name": "consistency", "in": "query", "required": false,
        "description": "linearizable (default): reflects every acknowledged write; stale: served by this node from its applied state",
        "schema": {"type": "string", "enum": ["linearizable", "stale"]}
    })
}

fn query(name: &str, description: &str, required: bool) -> Value {
    json!({"name": name, "in": "query", "required": required, "description": description, "schema": {"type": "string"}})
}

fn read_errors() -> Value {
    json!({
        "400": error("malformed path or query"),
        "503": error("no leader known, or no quorum to confirm the read; retry (Retry-After)")
    })
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            base.insert(key.clone(), value.clone());
        }
    }
    base
}

fn write_responses(limits: &Limits) -> Value {
    json!({
        "200": ok("processed: exactly one of tasks (success) or errors (refused, nothing changed)", ref_schema("WriteResult")),
        "400": error("malformed request: bad JSON, wrong types, unknown fields, a clientid that is not an integer, a duration out of range, a bad requestid or Idempotency-Key, or the two differing"),
        "413": error(&format!("body larger than {} bytes, the serving node's --body-bytes-max (default {BODY_BYTES_MAX_DEFAULT})", limits.body_bytes_max)),
        "422": error("the requestid names an earlier, different request of this client within the dedup window; nothing changed: send a new request under a fresh requestid"),
        "503": error("no leader known or its lease lapsed, or the outcome is unknown; retry with the same requestid")
    })
}

/// A write's answers, and the 409 of a finish with `next` during a rolling upgrade.
fn finish_responses(limits: &Limits) -> Value {
    let mut responses = write_responses(limits);
    responses["409"] = error(
        "with next: a member of the cluster may not read a finish with next (an older build, or one the leader has not heard from); nothing changed: send the finish without next, then a claim",
    );
    responses
}

fn admin_post(summary: &str, body: Option<Value>) -> Value {
    let mut op = json!({
        "tags": ["admin"],
        "summary": summary,
        "responses": {
            "200": ok("the cluster as this node sees it afterwards", ref_schema("ClusterStatus")),
            "400": error("malformed request"),
            "409": error("refused: the change conflicts with the current configuration"),
            "503": error("no leader known; retry")
        }
    });
    if let Some(schema) = body {
        op["requestBody"] = json_body(schema);
    }
    json!({"post": op})
}

/// The generated schemas, with `duration`'s maximum lowered to the node's own bound.
fn schemas(limits: &Limits) -> Value {
    let mut schemas = rpc::schema::components();
    let duration = schemas
        .get_mut("ClaimRequest")
        .and_then(|claim| claim.pointer_mut("/properties/duration"))
        .and_then(Value::as_object_mut);
    if let Some(duration) = duration {
        let max = limits.claim_duration_max_ms;
        duration.insert("maximum".into(), max.into());
        let generic = duration
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let description = format!(
            "{generic} The node that served this document allows at most {max} (its --claim-duration-max-ms; the default is {CLAIM_DURATION_MAX_MS_DEFAULT}, one day)."
        );
        duration.insert("description".into(), description.into());
    }
    Value::Object(schemas)
}

/// The job API's operations (issue 12).
fn job_paths(limits: &Limits) -> Value {
    let page_limit = json!({"name": "limit", "in": "query", "required": false, "description": format!("at most this many (default {JOBS_PAGE_DEFAULT}, at most {JOBS_PAGE_MAX})"), "schema": {"type": "integer", "minimum": 0, "maximum": JOBS_PAGE_MAX}});
    json!({
            "/finish": {"post": {"tags": ["jobs"], "summary": "End a claim with success: the task is removed and a job's outcome recorded (owner only; the id is the fence); with next, also claim the client's next tasks in the same write, answered in tasks",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("FinishRequest")), "responses": finish_responses(limits)}},
            "/finish/many": {"post": {"tags": ["jobs"], "summary": "End the claims of several tasks (1 to 1 000) with success in one request, all or none: a refusal names every task that cannot be finished (owner only; each id is its fence)",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("FinishManyRequest")), "responses": write_responses(limits)}},
            "/fail": {"post": {"tags": ["jobs"], "summary": "End a claim with an error: the task is claimable again after the back-off, or its job is dead after its last attempt; answers the retry's task version, or none",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("FailRequest")), "responses": write_responses(limits)}},
            "/cancel": {"post": {"tags": ["jobs"], "summary": "Cancel jobs by key, running or not; a running job's owner is refused with the reason on its next write, and jobs waiting for a cancelled one are cancelled too",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("KeysRequest")), "responses": write_responses(limits)}},
            "/retry": {"post": {"tags": ["jobs"], "summary": "Re-drive dead jobs by key with a fresh attempt budget; answers their new task versions",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("KeysRequest")), "responses": write_responses(limits)}},
            "/job": {"get": {"tags": ["jobs"], "summary": "A job's record by group and key, or by id; with wait_ms, answered once the job has finished (succeeded, dead or cancelled) or at the deadline",
                "parameters": [query("group", "the job's group (with key; not with id)", false), query("key", "the job's key (with group; not with id)", false),
                    {"name": "id", "in": "query", "required": false, "description": "instead of group and key: the job's id (the record's id, the task id its current run began with) or its live task's id; with wait_ms, the answer comes when that run ends", "schema": {"type": "integer", "format": "uint64", "minimum": 1}},
                    consistency(), wait_ms()],
                "responses": merge(json!({"200": ok("the record", ref_schema("Job")), "404": error("no job with this key in the group, or with this id (never added, past the retention, or the id of an earlier run)")}), read_errors())}},
            "/jobs": {"get": {"tags": ["jobs"], "summary": "A group's job records in key order, by state if asked, one page at a time",
                "parameters": [query("group", "the group", true),
                    query("state", "waiting, running, failed, succeeded, dead or cancelled", false),
                    query("after", "start after this key (the previous page's next)", false),
                    page_limit.clone(),
                    consistency()],
                "responses": merge(json!({"200": ok("a page", ref_schema("JobPage"))}), read_errors())}},
            "/jobs/wait": {"get": {"tags": ["jobs", "waiting"], "summary": "Several jobs' records, answered once every one has finished (succeeded, dead or cancelled) or at the deadline",
                "parameters": [query("group", "the jobs' group", true),
                    {"name": "key", "in": "query", "required": true, "description": format!("a job's key; repeat for each job (1 to {WAIT_KEYS_MAX})"), "schema": {"type": "array", "items": {"type": "string"}}, "style": "form", "explode": true},
                    consistency(), wait_ms()],
                "responses": merge(json!({"200": ok("the records, whether all finished, and keys with no record", ref_schema("JobWait"))}), read_errors())},
                "post": {"tags": ["jobs", "waiting"], "summary": format!("GET /jobs/wait with its parameters in a JSON body, for more keys than a URL holds (clients switch past {WAIT_QUERY_BYTES_MAX} bytes of path and query); a read, as the GET"),
                "requestBody": json_body(ref_schema("JobWaitRequest")),
                "responses": merge(json!({"200": ok("the records, whether all finished, and keys with no record", ref_schema("JobWait"))}), merge(read_errors(), json!({"400": error("malformed body")})))}},
            "/dead": {"get": {"tags": ["jobs"], "summary": "A group's dead jobs (dead letters) in key order, one page at a time",
                "parameters": [query("group", "the group", true),
                    query("after", "start after this key (the previous page's next)", false),
                    page_limit.clone(),
                    consistency()],
                "responses": merge(json!({"200": ok("a page", ref_schema("JobPage"))}), read_errors())}},
            "/groups/{group}/stats": {
                "get": {"tags": ["jobs"], "summary": "A group's counts: tasks by availability, job records by state (O(tasks + jobs) per call)",
                    "parameters": [{"name": "group", "in": "path", "required": true, "schema": {"type": "string"}}, consistency()],
                    "responses": merge(json!({"200": ok("the counts", ref_schema("GroupStats"))}), read_errors())}},
            "/groups/{group}/settings": {
                "get": {"tags": ["jobs"], "summary": "A group's settings (the defaults unless changed)",
                    "parameters": [{"name": "group", "in": "path", "required": true, "schema": {"type": "string"}}, consistency()],
                    "responses": merge(json!({"200": ok("the settings", ref_schema("GroupSettings"))}), read_errors())},
                "put": {"tags": ["jobs"], "summary": "Change a group's settings: the fields given change, the others keep their value",
                    "parameters": [{"name": "group", "in": "path", "required": true, "schema": {"type": "string"}}, idempotency_key()],
                    "requestBody": json_body(ref_schema("SettingsChange")),
                    "responses": {
                        "200": ok("the settings afterwards (running as counted right after the change applied)", ref_schema("GroupSettings")),
                        "400": error("malformed request or a setting out of range, named"),
                        "503": error("no leader known or its lease lapsed; retry with the same requestid")}}}
    })
}

/// The `wait_ms` query parameter of a read that may wait.
fn wait_ms() -> Value {
    json!({"name": "wait_ms", "in": "query", "required": false, "description": format!("wait up to this many milliseconds (default 0, at most {WAIT_MS_MAX}); waiting writes nothing to the log"), "schema": {"type": "integer", "minimum": 0, "maximum": WAIT_MS_MAX}})
}

fn watch_paths() -> Value {
    let limit = json!({"name": "limit", "in": "query", "required": false, "description": format!("changes per page, whole revisions (default {WATCH_PAGE_DEFAULT}, at most {WATCH_PAGE_MAX})"), "schema": {"type": "integer", "minimum": 0, "maximum": WATCH_PAGE_MAX}});
    json!({
        "/watch": {"get": {"tags": ["waiting"], "summary": "A group's changes (tasks written and removed, job records, settings) after a revision, in log order, from this node's applied state; waits up to wait_ms for the first. With Accept: text/event-stream, a stream of them (event = kind, data = the change, id = its revision on the last change of each revision; Last-Event-ID resumes, over after; one that is not a revision gets 400) until the client leaves, or until this node no longer keeps the position (event gone, with the 410 body, then the stream ends)",
            "parameters": [query("group", "the group", true),
                {"name": "after", "in": "query", "required": false, "description": "changes after this revision (a log index); default: the node's current revision", "schema": {"type": "integer", "minimum": 0}},
                wait_ms(), limit],
            "responses": {
                "200": ok("the changes, and the revision to ask from next", ref_schema("WatchPage")),
                "400": error("malformed group, after, wait_ms or limit, named"),
                "410": {"description": "the node no longer keeps changes that far back, or the revision is ahead of its log (one kept across a restore); re-read the group and watch from the revision given", "content": {"application/json": {"schema": ref_schema("WatchGone")}}},
                "503": error("the node holds its maximum of waiting requests (--max-waiters) or is stopping; Retry-After says when to retry")}}}
    })
}

/// The document of a node with the default configuration: the checked-in copy.
pub fn document() -> Value {
    document_for(&Limits::default())
}

/// The document of a node with `limits`.
pub fn document_for(limits: &Limits) -> Value {
    let task_list = json!({"type": "array", "items": ref_schema("Task")});
    let mut document = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Rota",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!("A replicated task store. Worker API of entrogo's TaskStore; any node answers, followers relay writes and linearizable reads to the leader. Every non-200 body is {{\"error\": ...}}. {INTEGER_SPELLING}")
        },
        "paths": {
            "/groups": {"get": {"tags": ["worker"], "summary": "Names of the groups that hold tasks",
                "parameters": [consistency()],
                "responses": merge(json!({"200": ok("group names", json!({"type": "array", "items": {"type": "string"}}))}), read_errors())}},
            "/task/{id}": {"get": {"tags": ["worker"], "summary": "One task",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "integer", "format": "uint64"}}, consistency()],
                "responses": merge(json!({"200": ok("the task", ref_schema("Task")), "404": error("no task has this id (any more)")}), read_errors())}},
            "/tasks/{ids}": {"get": {"tags": ["worker"], "summary": "Several tasks; null where one does not exist",
                "parameters": [{"name": "ids", "in": "path", "required": true, "description": format!("comma-separated ids, at most {TASK_IDS_MAX}"), "schema": {"type": "string"}}, consistency()],
                "responses": merge(json!({"200": ok("tasks in the order asked", json!({"type": "array", "items": {"oneOf": [ref_schema("Task"), {"type": "null"}]}}))}), read_errors())}},
            "/group/{name}": {"get": {"tags": ["worker"], "summary": "Tasks of a group by available time, then id (the seed's order; claims take the highest priority first)",
                "parameters": [
                    {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "required": false, "description": "at most this many", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "owned", "in": "query", "required": false, "description": "include owned tasks: 0, 1, yes, no, true, false (default: unowned only)", "schema": {"type": "string"}},
                    {"name": "after", "in": "query", "required": false, "description": "a cursor, TIMESPEC:ID of the previous page's last task: only the tasks after it, in the same order", "schema": {"type": "string"}},
                    consistency()],
                "responses": merge(json!({"200": ok("tasks; [] for a group with none", task_list)}), read_errors())}},
            UPDATE_PATH: {"post": {"tags": ["worker"], "summary": "Add, update and delete tasks in one all-or-nothing transaction",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("UpdateRequest")), "responses": write_responses(limits)}},
            CLAIM_PATH: {"post": {"tags": ["worker"], "summary": "Claim the oldest available task of a group for duration ms",
                "parameters": [idempotency_key()],
                "requestBody": json_body(ref_schema("ClaimRequest")), "responses": write_responses(limits)}},
            "/cluster": {"get": {"tags": ["status"], "summary": "This node's view of the cluster",
                "responses": {"200": ok("status", ref_schema("ClusterStatus"))}}},
            "/health": {"get": {"tags": ["status"], "summary": "The process is up",
                "responses": {"200": ok("up", ref_schema("Probe"))}}},
            "/ready": {"get": {"tags": ["status"], "summary": "A leader is known and this node has applied what it knows committed",
                "responses": {"200": ok("ready", ref_schema("Probe")), "503": ok("not ready, and why", ref_schema("Probe"))}}},
            "/metrics": {"get": {"tags": ["status"], "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text format 0.0.4", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"tags": ["status"], "summary": "This document",
                "responses": {"200": ok("OpenAPI 3.1", json!({"type": "object"}))}}},
            "/admin/init": admin_post("Form a cluster with these voters (once; this node must be one)", Some(ref_schema("InitRequest"))),
            "/admin/add-learner": admin_post("Add a node that replicates without voting", Some(ref_schema("Member"))),
            "/admin/promote": admin_post("Make a learner a voter", Some(ref_schema("NodeId"))),
            "/admin/remove": admin_post("Remove a voter or learner from the cluster", Some(ref_schema("NodeId"))),
            "/admin/transfer-leader": admin_post("Hand leadership to another voter (naming the leader itself changes nothing; a voter that has not answered the leader for two election timeouts is refused with 409)", Some(ref_schema("NodeId"))),
            "/admin/snapshot": admin_post("Build a snapshot on this node now and compact its log", None),
            "/admin/backup": {"get": {"tags": ["admin"], "summary": "A consistent snapshot holding every acknowledged write",
                "responses": merge(json!({"200": {"description": "snapshot bytes; headers x-rota-applied-index and x-rota-state-hash",
                    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}), read_errors())}},
            "/admin/restore": {"post": {"tags": ["admin"], "summary": "Start a new cluster from a backup: install it on this empty node, which then replicates it to the other (empty) members",
                "parameters": [{"name": "x-rota-restore-members", "in": "header", "required": true, "description": "the new cluster's members: {\"members\": [{\"id\", \"api_addr\", \"raft_addr\"}]}; this node must be one", "schema": {"type": "string"}}],
                "requestBody": {"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "responses": {
                    "200": ok("installed; the node now elects itself and replicates", ref_schema("Restore")),
                    "400": error("missing or invalid members header, or the body is not a usable backup"),
                    "409": error("this node already holds a cluster's state"),
                    "413": error(&format!("backup larger than the node's --snapshot-max-bytes (default {RESTORE_BYTES_MAX} bytes)"))}}},
            "/admin/state-hash": {"get": {"tags": ["admin"], "summary": "Hash of this node's applied state, to compare replicas (O(tasks))",
                "responses": {"200": ok("hash", ref_schema("StateHash"))}}}
        },
        "components": {"schemas": schemas(limits)}
    });
    document["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer", "description": "A Rota token, rota_<id>_<secret>. A node with --auth=tokens (the default) refuses a request without one (401) or whose role does not allow it (403): worker (task and job API, optionally limited to group prefixes), reader (reads, /watch, /metrics), admin (everything). /health, /ready, /openapi.json, /ui and the one-time bootstrap are open; /cluster, /admin/init and /admin/restore are open on a node that belongs to no cluster yet."}
    });
    document["security"] = json!([{"bearer": []}]);
    for more in [job_paths(limits), watch_paths(), auth_paths()] {
        if let (Some(paths), Value::Object(more)) = (document["paths"].as_object_mut(), more) {
            paths.extend(more);
        }
    }
    document
}

/// The token API's operations (issue 16).
fn auth_paths() -> Value {
    let refused = json!({
        "401": error("no token, or an unknown or revoked one"),
        "403": error("the token is not an admin token"),
        "503": error("no leader known; retry")
    });
    json!({
        rpc::auth::WHOAMI_PATH: {"get": {"tags": ["auth"], "summary": "The token this request carries, as the cluster knows it (any role; never its secret)",
            "responses": {"200": ok("the caller's token", ref_schema("WhoAmI")),
                "401": error("no token, or an unknown or revoked one"),
                "503": error("this node has not applied the token and no leader can be asked; retry")}}},
        "/admin/tokens": {
            "get": {"tags": ["auth"], "summary": "Every token (never its secret)",
                "parameters": [consistency()],
                "responses": merge(json!({"200": ok("tokens by id", ref_schema("TokenList"))}), refused.clone())},
            "post": {"tags": ["auth"], "summary": "Make a token; its bearer form is in the answer only",
                "requestBody": json_body(ref_schema("TokenAdd")),
                "responses": merge(json!({"200": ok("the token and its bearer form", ref_schema("NewToken")),
                    "400": error("unknown role, an empty prefix, or prefixes on a token that is not a worker's"),
                    "409": error("the cluster holds its limit of tokens")}), refused.clone())}},
        "/admin/tokens/{id}": {"delete": {"tags": ["auth"], "summary": "Revoke a token",
            "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}, idempotency_key()],
            "responses": merge(json!({"200": ok("the revoked token", ref_schema("Token")), "404": error("no token has this id")}), refused)}},
        rpc::auth::BOOTSTRAP_PATH: {"post": {"tags": ["auth"], "summary": "The cluster's first admin token: open, and answered once in the cluster's life (Consul's ACL bootstrap)",
            "security": [],
            "requestBody": {"required": false, "content": {"application/json": {"schema": ref_schema("Bootstrap")}}},
            "responses": {"200": ok("the first admin token and its bearer form", ref_schema("NewToken")),
                "409": error("the first admin token was made already"),
                "503": error("no leader known; retry")}}}
    })
}

/// The `/openapi.json` handler: the document with this node's limits.
pub async fn get_openapi(State(node): State<SharedNode>) -> Json<Value> {
    Json(document_for(&Limits::of(&node.config)))
}
