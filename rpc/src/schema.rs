//! JSON Schemas of the API's bodies, generated with schemars from the very types in
//! [`crate::worker`] and [`crate::admin`] that parse and build them, for the node's
//! OpenAPI document: a field added, renamed or made optional in a type changes the
//! document with it, so the two cannot drift.
//!
//! Requests are described as the node *deserialises* them (what it accepts: unknown
//! fields refused, `null` where a missing value is allowed), answers as the node
//! *serialises* them (what a client reads: every field it always writes is required).
//! Where a field's deserialiser is custom, its type's `#[schemars(...)]` attributes say
//! what that deserialiser accepts, and the functions below add the rules the node
//! checks after parsing (lengths in bytes, the claim bound), each from the constant the
//! node enforces.

use schemars::JsonSchema;
use schemars::Schema;
use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use schemars::transform::RecursiveTransform;
use serde_json::Map;
use serde_json::Value;
use serde_json::json;
use task_machine::constants::CLAIM_DURATION_MS_MAX;
use task_machine::constants::DEDUP_BYTES_HARD_MAX;
use task_machine::constants::DEDUP_BYTES_MAX;
use task_machine::constants::DEDUP_ENTRIES_MAX;
use task_machine::constants::DEDUP_KEEP_MS;
use task_machine::constants::DEDUP_WINDOW_MS;
use task_machine::constants::REQUEST_ID_BYTES_MAX;

use crate::admin;
use crate::auth;
use crate::job;
use crate::watch;
use crate::worker;

/// Where the document keeps its schemas; every `$ref` points here.
pub const COMPONENTS_PATH: &str = "#/components/schemas/";

/// What every integer of a request body must look like, beyond JSON Schema's `integer`.
pub const INTEGER_SPELLING: &str = "Integers in request bodies are JSON integers written without a fraction or an exponent (7, not 7.0 or 7e0): the node refuses the others with 400, although JSON Schema's type integer admits them.";

/// Settings for OpenAPI 3.1, whose Schema Object is JSON Schema 2020-12: type lists with
/// `null` rather than 3.0's `nullable`, definitions under `components/schemas`, and no
/// `$schema` key (the document's `openapi` version says which dialect it speaks).
fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .with_transform(RecursiveTransform(join_wrapped_lines))
}

/// Descriptions come from doc comments, wrapped at 90 columns for the source: a reader of
/// the document gets each paragraph on one line.
fn join_wrapped_lines(schema: &mut Schema) {
    if let Some(Value::String(description)) = schema.get_mut("description") {
        *description = description
            .split("\n\n")
            .map(|paragraph| paragraph.split('\n').collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
}

/// Adds `T`'s schema, and those it refers to, to `generator`'s definitions.
fn add<T: JsonSchema>(generator: &mut SchemaGenerator) {
    // The returned `$ref` is not needed: the definitions are the product.
    let _ = generator.subschema_for::<T>();
}

/// The schemas of every request body, as the node accepts them.
pub fn request_schemas() -> Map<String, Value> {
    let mut generator = settings().for_deserialize().into_generator();
    add::<worker::UpdateRequestJson>(&mut generator);
    add::<worker::ClaimRequestJson>(&mut generator);
    add::<job::FinishRequestJson>(&mut generator);
    add::<job::FinishManyRequestJson>(&mut generator);
    add::<job::FailRequestJson>(&mut generator);
    add::<job::KeysRequestJson>(&mut generator);
    add::<job::SettingsChangeJson>(&mut generator);
    add::<admin::InitRequestJson>(&mut generator);
    add::<admin::AddLearnerJson>(&mut generator);
    add::<admin::NodeIdJson>(&mut generator);
    add::<auth::TokenAddJson>(&mut generator);
    add::<auth::BootstrapJson>(&mut generator);
    generator.take_definitions(true)
}

/// The schemas of every answer body, as the node writes them.
pub fn answer_schemas() -> Map<String, Value> {
    let mut generator = settings().for_serialize().into_generator();
    add::<worker::TaskJson>(&mut generator);
    add::<worker::WriteResultJson>(&mut generator);
    add::<worker::ErrorJson>(&mut generator);
    add::<job::JobJson>(&mut generator);
    add::<job::JobPageJson>(&mut generator);
    add::<job::JobWaitJson>(&mut generator);
    add::<job::JobWaitRequestJson>(&mut generator);
    add::<job::SettingsJson>(&mut generator);
    add::<job::GroupStatsJson>(&mut generator);
    add::<watch::WatchPageJson>(&mut generator);
    add::<watch::WatchGoneJson>(&mut generator);
    add::<admin::ClusterStatusJson>(&mut generator);
    add::<admin::ProbeJson>(&mut generator);
    add::<admin::StateHashJson>(&mut generator);
    add::<admin::RestoreJson>(&mut generator);
    add::<auth::TokenJson>(&mut generator);
    add::<auth::NewTokenJson>(&mut generator);
    add::<auth::TokenListJson>(&mut generator);
    add::<auth::WhoAmIJson>(&mut generator);
    generator.take_definitions(true)
}

/// Every schema the document's `components/schemas` holds: requests and answers. A name
/// is never both (a test checks it), since one name cannot carry two schemas.
pub fn components() -> Map<String, Value> {
    let mut schemas = request_schemas();
    schemas.extend(answer_schemas());
    schemas
}

/// A `$ref` to the component schema `name`.
pub fn reference(name: &str) -> Value {
    json!({ "$ref": format!("{COMPONENTS_PATH}{name}") })
}

/// `clientid`: a JSON integer as serde reads an `i64`, which refuses 1.0 and 1e3.
pub(crate) fn client_id(schema: &mut Schema) {
    schema.insert(
        "description".into(),
        "The writing client, owner of every task the request writes: a JSON integer from -2^63 to 2^63-1 written without a fraction or an exponent (7, not 7.0 or 7e0). Anything else, or none, is refused with 400.".into(),
    );
}

/// `requestid`: at most [`REQUEST_ID_BYTES_MAX`] bytes, which JSON Schema cannot say
/// (`maxLength` counts characters), and the rule for the `Idempotency-Key` header.
pub(crate) fn request_id(schema: &mut Schema) {
    let window_minutes = DEDUP_WINDOW_MS / 60_000;
    let dedup_mib = DEDUP_BYTES_MAX >> 20;
    let keep_s = DEDUP_KEEP_MS / 1000;
    let full_mib = DEDUP_BYTES_HARD_MAX >> 20;
    schema.insert("maxLength".into(), REQUEST_ID_BYTES_MAX.into());
    schema.insert(
        "description".into(),
        format!(
            "Makes a retry apply once: a write whose clientid and requestid the cluster applied before returns that first outcome and applies nothing, for {window_minutes} minutes of log time (less when more than {DEDUP_ENTRIES_MAX} outcomes or {dedup_mib} MiB are remembered: the oldest go first), but always for {keep_s} s while the outcomes take less than {full_mib} MiB. The empty string is a key like any other. At most {REQUEST_ID_BYTES_MAX} bytes of UTF-8 (maxLength counts characters, so {REQUEST_ID_BYTES_MAX} characters outside ASCII are too long); longer is refused with 400. The same value may come in the Idempotency-Key header instead or as well; if both are given they must be equal (400 otherwise). null is none."
        )
        .into(),
    );
}

/// `duration`: from 1 to the machine's bound; the node's OpenAPI document lowers
/// `maximum` to the node's own configured bound.
pub(crate) fn claim_duration(schema: &mut Schema) {
    schema.insert("minimum".into(), 1.into());
    schema.insert("maximum".into(), CLAIM_DURATION_MS_MAX.into());
    schema.insert(
        "description".into(),
        format!(
            "Milliseconds the claimed task stays owned by clientid: an integer from 1 to the node's --claim-duration-max-ms, written without a fraction or an exponent; anything else is refused with 400. No node may be configured above {CLAIM_DURATION_MS_MAX} (365 days), the longest claim the task machine grants."
        )
        .into(),
    );
}

/// A node's `role` as the status endpoints write it.
pub(crate) fn node_role(schema: &mut Schema) {
    schema.insert(
        "enum".into(),
        json!(["leader", "follower", "candidate", "learner", "shutdown"]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name in both directions must carry the same schema in both (as `Backoff` does:
    /// it is read and written alike), since one name cannot carry two schemas.
    #[test]
    fn no_name_carries_two_schemas() {
        let answers = answer_schemas();
        for (name, schema) in request_schemas() {
            if let Some(answer) = answers.get(&name) {
                assert_eq!(
                    &schema, answer,
                    "{name} differs between requests and answers; give one of the types its own schema name"
                );
            }
        }
    }

    #[test]
    fn every_reference_resolves() {
        let schemas = components();
        let text = serde_json::to_string(&schemas).expect("json");
        for part in text.split(r#""$ref":""#).skip(1) {
            let target = part.split('"').next().unwrap_or_default();
            let name = target.strip_prefix(COMPONENTS_PATH).unwrap_or(target);
            assert!(schemas.contains_key(name), "dangling $ref {target}");
        }
    }

    #[test]
    fn the_rules_come_from_the_constants() {
        let schemas = request_schemas();
        let claim = &schemas["ClaimRequest"]["properties"];
        assert_eq!(claim["duration"]["minimum"], 1);
        assert_eq!(claim["duration"]["maximum"], CLAIM_DURATION_MS_MAX);
        assert_eq!(claim["requestid"]["maxLength"], REQUEST_ID_BYTES_MAX);
        assert_eq!(claim["clientid"]["type"], "integer");
        let update = &schemas["UpdateRequest"]["properties"];
        assert_eq!(update["requestid"]["maxLength"], REQUEST_ID_BYTES_MAX);
        assert_eq!(update["clientid"]["type"], "integer");
    }
}
