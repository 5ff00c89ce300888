//! The OpenAPI 3 document of the worker and admin API, served at `/openapi.json` and
//! checked in as `openapi.json` at the repository root; tests keep the two equal and
//! check that every documented operation is routed.

use axum::Json;
use serde_json::Value;
use serde_json::json;

fn ref_schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
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

fn write_responses() -> Value {
    json!({
        "200": ok("processed: exactly one of tasks (success) or errors (refused, nothing changed)", ref_schema("WriteResult")),
        "400": error("malformed request: bad JSON, wrong types, unknown fields, bad duration or requestid"),
        "413": error("body larger than the configured limit (1 MiB by default)"),
        "503": error("no leader known or its lease lapsed, or the outcome is unknown; retry with the same requestid")
    })
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

fn schemas() -> Value {
    let id = json!({"type": "integer", "format": "uint64", "minimum": 0});
    let timespec = json!({"type": "integer", "format": "int64", "description": "ms since the Unix epoch; negative: now + |t|; missing: now"});
    let addr = json!({"type": "string", "description": "host:port"});
    json!({
        "Task": {"type": "object", "required": ["id", "group", "data", "timespec", "ownerid"], "properties": {
            "id": id, "group": {"type": "string"}, "data": {"type": "string"},
            "timespec": {"type": "integer", "format": "int64", "description": "available time, ms since the Unix epoch"},
            "ownerid": {"type": "integer", "format": "int64"}}},
        "AddTask": {"type": "object", "additionalProperties": false, "properties": {
            "group": {"type": "string", "description": "required; an add without one is refused"},
            "data": {"type": ["string", "null"], "default": ""}, "timespec": timespec,
            "id": {"description": "accepted and ignored, as in the seed"}}},
        "ChangeTask": {"type": "object", "additionalProperties": false, "required": ["id"], "properties": {
            "id": id, "data": {"type": ["string", "null"], "default": ""}, "timespec": timespec}},
        "UpdateRequest": {"type": "object", "additionalProperties": false, "required": ["clientid"], "properties": {
            "clientid": {"type": "integer", "format": "int64"},
            "adds": {"type": ["array", "null"], "items": ref_schema("AddTask")},
            "updates": {"type": ["array", "null"], "items": ref_schema("ChangeTask")},
            "deletes": {"type": ["array", "null"], "items": id},
            "depends": {"type": ["array", "null"], "items": id},
            "requestid": {"type": "string", "maxLength": 64, "description": "a retry with the same value applies once (also the Idempotency-Key header)"}}},
        "ClaimRequest": {"type": "object", "additionalProperties": false, "required": ["clientid", "duration"], "properties": {
            "clientid": {"type": "integer", "format": "int64"},
            "group": {"type": "string"},
            "duration": {"type": "integer", "format": "int64", "minimum": 1, "description": "ms of ownership, at most the configured maximum (one day by default)"},
            "depends": {"type": ["array", "null"], "items": id},
            "requestid": {"type": "string", "maxLength": 64}}},
        "WriteResult": {"oneOf": [
            {"type": "object", "required": ["tasks"], "additionalProperties": false, "properties": {"tasks": {"type": "array", "items": ref_schema("Task")}}},
            {"type": "object", "required": ["errors"], "additionalProperties": false, "properties": {"errors": {"type": "array", "items": {"type": "string"}}}}]},
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string", "description": "what happened and what to do"}}},
        "NodeStatus": {"type": "object", "required": ["id", "api_addr", "raft_addr", "role"], "properties": {
            "id": id, "api_addr": addr, "raft_addr": addr,
            "role": {"type": "string", "enum": ["leader", "follower", "candidate", "learner", "shutdown"]},
            "lag": {"type": ["integer", "null"], "description": "entries behind the leader; known on the leader only"}}},
        "ClusterStatus": {"type": "object", "required": ["id", "leader", "term", "voters", "learners", "nodes"], "properties": {
            "id": id, "leader": {"type": ["integer", "null"]}, "term": {"type": "integer"},
            "commit_index": {"type": ["integer", "null"]}, "applied_index": {"type": ["integer", "null"]},
            "snapshot_index": {"type": ["integer", "null"]}, "purged_index": {"type": ["integer", "null"]},
            "applied_time_ms": {"type": "integer", "format": "int64"},
            "voters": {"type": "array", "items": id}, "learners": {"type": "array", "items": id},
            "retired": {"type": "array", "items": id, "description": "ids that were members once; never reused"},
            "membership_index": {"type": ["integer", "null"], "description": "log index of the configuration in effect"},
            "membership_committed": {"type": "boolean", "description": "false while a membership change is in flight"},
            "joint": {"type": "boolean", "description": "old and new voters both decide (mid-change)"},
            "nodes": {"type": "array", "items": ref_schema("NodeStatus")}}},
        "Member": {"type": "object", "additionalProperties": false, "required": ["id", "api_addr", "raft_addr"], "properties": {
            "id": id, "api_addr": addr, "raft_addr": addr}},
        "InitRequest": {"type": "object", "additionalProperties": false, "required": ["members"], "properties": {
            "members": {"type": "array", "items": ref_schema("Member")}}},
        "NodeId": {"type": "object", "additionalProperties": false, "required": ["id"], "properties": {"id": id}},
        "Probe": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
        "Restore": {"type": "object", "required": ["applied_index", "state_hash", "tasks"], "properties": {
            "applied_index": {"type": "integer"}, "state_hash": {"type": "string"}, "tasks": {"type": "integer"}}},
        "StateHash": {"type": "object", "required": ["state_hash", "tasks"], "properties": {
            "applied_index": {"type": ["integer", "null"]}, "state_hash": {"type": "string"}, "tasks": {"type": "integer"}}}
    })
}

/// The whole document.
pub fn document() -> Value {
    let task_list = json!({"type": "array", "items": ref_schema("Task")});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Rota",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A replicated task store. Worker API of entrogo's TaskStore; any node answers, followers relay writes and linearizable reads to the leader. Every non-200 body is {\"error\": ...}."
        },
        "paths": {
            "/groups": {"get": {"tags": ["worker"], "summary": "Names of the groups that hold tasks",
                "parameters": [consistency()],
                "responses": merge(json!({"200": ok("group names", json!({"type": "array", "items": {"type": "string"}}))}), read_errors())}},
            "/task/{id}": {"get": {"tags": ["worker"], "summary": "One task",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "integer", "format": "uint64"}}, consistency()],
                "responses": merge(json!({"200": ok("the task", ref_schema("Task")), "404": error("no task has this id (any more)")}), read_errors())}},
            "/tasks/{ids}": {"get": {"tags": ["worker"], "summary": "Several tasks; null where one does not exist",
                "parameters": [{"name": "ids", "in": "path", "required": true, "description": "comma-separated ids, at most 10000", "schema": {"type": "string"}}, consistency()],
                "responses": merge(json!({"200": ok("tasks in the order asked", json!({"type": "array", "items": {"oneOf": [ref_schema("Task"), {"type": "null"}]}}))}), read_errors())}},
            "/group/{name}": {"get": {"tags": ["worker"], "summary": "Tasks of a group in claim order (available time, then id)",
                "parameters": [
                    {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "required": false, "description": "at most this many", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "owned", "in": "query", "required": false, "description": "include owned tasks: 0, 1, yes, no, true, false (default: unowned only)", "schema": {"type": "string"}},
                    consistency()],
                "responses": merge(json!({"200": ok("tasks; [] for a group with none", task_list)}), read_errors())}},
            "/update": {"post": {"tags": ["worker"], "summary": "Add, update and delete tasks in one all-or-nothing transaction",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string", "maxLength": 64}}],
                "requestBody": json_body(ref_schema("UpdateRequest")), "responses": write_responses()}},
            "/claim": {"post": {"tags": ["worker"], "summary": "Claim the oldest available task of a group for duration ms",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string", "maxLength": 64}}],
                "requestBody": json_body(ref_schema("ClaimRequest")), "responses": write_responses()}},
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
            "/admin/transfer-leader": admin_post("Hand leadership to another voter", Some(ref_schema("NodeId"))),
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
                    "413": error("backup larger than 4 GiB")}}},
            "/admin/state-hash": {"get": {"tags": ["admin"], "summary": "Hash of this node's applied state, to compare replicas (O(tasks))",
                "responses": {"200": ok("hash", ref_schema("StateHash"))}}}
        },
        "components": {"schemas": schemas()}
    })
}

/// The `/openapi.json` handler.
pub async fn get_openapi() -> Json<Value> {
    Json(document())
}
