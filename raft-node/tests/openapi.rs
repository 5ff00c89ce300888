//! Keeps the OpenAPI document in step: the checked-in `openapi.json` equals what the
//! node serves, and every documented operation is routed on a real node.
//! Regenerate the file with `ROTA_UPDATE_OPENAPI=1 cargo test -p raft-node --test openapi`.

mod common;

use bytes::Bytes;
use common::TestCluster;
use hyper::Method;

fn checked_in_path() -> std::path::PathBuf {
    common::manifest_dir().join("../openapi.json")
}

#[test]
fn the_checked_in_document_is_current() {
    let generated =
        serde_json::to_string_pretty(&raft_node::openapi::document()).expect("json") + "\n";
    if std::env::var_os("ROTA_UPDATE_OPENAPI").is_some() {
        std::fs::write(checked_in_path(), &generated).expect("writes openapi.json");
    }
    let checked_in = std::fs::read_to_string(checked_in_path()).unwrap_or_default();
    assert!(
        checked_in == generated,
        "openapi.json is out of date; run ROTA_UPDATE_OPENAPI=1 cargo test -p raft-node --test openapi"
    );
}

#[test]
fn every_reference_in_the_document_resolves() {
    let document = raft_node::openapi::document();
    let mut names = Vec::new();
    refs_in(&document, &mut names);
    assert!(names.len() > 20, "only {} references", names.len());
    for name in names {
        assert!(
            document["components"]["schemas"][&name].is_object(),
            "$ref to {name}, which components/schemas lacks"
        );
    }
}

/// The document node 1 of `cluster` serves.
async fn served_document(cluster: &TestCluster) -> serde_json::Value {
    let served = cluster
        .client
        .get(cluster.api(1), "/openapi.json", common::CALL_TIMEOUT)
        .await
        .expect("served");
    served.json(cluster.api(1)).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_routed() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let served = served_document(&cluster).await;
    assert_eq!(
        served,
        raft_node::openapi::document(),
        "the node serves the document"
    );

    let paths = served["paths"].as_object().expect("paths");
    let mut checked = 0;
    for (path, operations) in paths {
        let concrete = path
            .replace("{id}", "1")
            .replace("{ids}", "1,2")
            .replace("{name}", "g")
            .replace("{group}", "g");
        for method in operations.as_object().expect("operations").keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            let body = if method == Method::POST {
                Bytes::from_static(b"{}")
            } else {
                Bytes::new()
            };
            let response = cluster
                .client
                .send(
                    cluster.api(1),
                    method.clone(),
                    &concrete,
                    &[],
                    body,
                    common::CALL_TIMEOUT,
                )
                .await
                .expect("answered");
            let text = String::from_utf8_lossy(&response.body);
            assert!(
                response.status != 405 && !text.contains("no such endpoint"),
                "{method} {path} is documented but not routed: {} {text}",
                response.status
            );
            checked += 1;
        }
    }
    assert!(checked >= 19, "only {checked} operations documented");
}

// ---- The bodies the document describes are the ones rpc's types accept ----

use rpc::admin::InitRequestJson;
use rpc::admin::MemberJson;
use rpc::admin::NodeIdJson;
use rpc::worker::AddJson;
use rpc::worker::ChangeJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::UpdateRequestJson;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::json;

/// Parses `body` as the node does: serde_json from the bytes into `T`.
fn parses<T: DeserializeOwned>(body: &Value) -> Result<(), String> {
    serde_json::from_str::<T>(&body.to_string())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// How a body is parsed: the node's way, into one rpc type.
type Parser = fn(&Value) -> Result<(), String>;

/// The rpc type that parses each request schema the document names. A request schema
/// missing here fails the test: add the type that parses it.
fn parser(schema: &str) -> Option<Parser> {
    Some(match schema {
        "UpdateRequest" => parses::<UpdateRequestJson>,
        "AddTask" => parses::<AddJson>,
        "ChangeTask" => parses::<ChangeJson>,
        "ClaimRequest" => parses::<ClaimRequestJson>,
        "InitRequest" => parses::<InitRequestJson>,
        "Member" => parses::<MemberJson>,
        "NodeId" => parses::<NodeIdJson>,
        "FinishRequest" => parses::<rpc::job::FinishRequestJson>,
        "FinishManyRequest" => parses::<rpc::job::FinishManyRequestJson>,
        "FinishItem" => parses::<rpc::job::FinishItemJson>,
        "NextClaim" => parses::<rpc::job::NextClaimJson>,
        "FailRequest" => parses::<rpc::job::FailRequestJson>,
        "KeysRequest" => parses::<rpc::job::KeysRequestJson>,
        "JobWaitRequest" => parses::<rpc::job::JobWaitRequestJson>,
        "SettingsChange" => parses::<rpc::job::SettingsChangeJson>,
        "Backoff" => parses::<rpc::job::BackoffJson>,
        "OnConflict" => parses::<rpc::job::OnConflictJson>,
        "TokenAdd" => parses::<rpc::auth::TokenAddJson>,
        "Bootstrap" => parses::<rpc::auth::BootstrapJson>,
        _ => return None,
    })
}

/// The component a `$ref` names (the whole reference if it points elsewhere, which no
/// component is named, so that it fails to resolve).
fn ref_name(schema: &Value) -> Option<&str> {
    schema["$ref"]
        .as_str()
        .map(|r| r.strip_prefix(rpc::schema::COMPONENTS_PATH).unwrap_or(r))
}

/// Every `$ref` name under `value`.
fn refs_in(value: &Value, names: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(name) = ref_name(value) {
                names.push(name.to_string());
            }
            map.values().for_each(|v| refs_in(v, names));
        }
        Value::Array(items) => items.iter().for_each(|v| refs_in(v, names)),
        _ => {}
    }
}

/// The component schemas request bodies use: those `requestBody`s refer to, and those
/// they refer to in turn.
fn request_schema_names(document: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for operations in document["paths"].as_object().expect("paths").values() {
        for operation in operations.as_object().expect("operations").values() {
            refs_in(&operation["requestBody"], &mut names);
        }
    }
    let mut seen: Vec<String> = Vec::new();
    while let Some(name) = names.pop() {
        if !seen.contains(&name) {
            refs_in(&document["components"]["schemas"][&name], &mut names);
            seen.push(name);
        }
    }
    seen.sort();
    seen
}

/// The JSON types a schema allows, `null` included.
/// Whether a schema allows any JSON value (no type, reference or alternatives).
fn is_any(schema: &Value) -> bool {
    schema.as_object().is_some_and(|o| {
        [
            "type",
            "anyOf",
            "oneOf",
            "$ref",
            "enum",
            "const",
            "properties",
        ]
        .iter()
        .all(|k| !o.contains_key(*k))
    })
}

fn types(schema: &Value) -> Vec<&str> {
    if is_any(schema) {
        return vec![
            "null", "boolean", "object", "array", "number", "string", "integer",
        ];
    }
    match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        // An optional reference is `anyOf: [{$ref}, {type: null}]`.
        _ => schema["anyOf"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(types)
            .collect(),
    }
}

/// The first type a schema allows other than `null`.
fn main_type(schema: &Value) -> &str {
    types(schema)
        .into_iter()
        .find(|t| *t != "null")
        .unwrap_or("object")
}

/// A value `schema` allows: the smallest that satisfies it, objects with their required
/// properties only.
fn sample(schema: &Value, components: &Value) -> Value {
    if let Some(name) = ref_name(schema) {
        return sample(&components[name], components);
    }
    if let Some(first) = schema["anyOf"].get(0).or(schema["oneOf"].get(0)) {
        return sample(first, components);
    }
    if let Some(first) = schema["enum"].get(0) {
        return first.clone();
    }
    if let Some(constant) = schema.get("const") {
        return constant.clone();
    }
    match main_type(schema) {
        "integer" => schema["minimum"]
            .as_i64()
            .map_or(json!(1), |m| json!(m.max(1))),
        "string" => json!("x"),
        "number" => json!(1.5),
        "boolean" => json!(true),
        "array" => json!([sample(&schema["items"], components)]),
        _ => {
            let mut object = serde_json::Map::new();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().expect("a property name");
                object.insert(
                    name.to_string(),
                    sample(&schema["properties"][name], components),
                );
            }
            Value::Object(object)
        }
    }
}

/// A value of a JSON type `schema` does not allow.
fn wrong_type(schema: &Value) -> Value {
    match main_type(schema) {
        "string" => json!(5),
        "integer" | "number" | "boolean" => json!("5"),
        "array" => json!({"a": 1}),
        _ => json!([]),
    }
}

/// The field names serde lists when it refuses an unknown one, which for a type that
/// denies unknown fields is every field it accepts.
fn accepted_fields(refusal: &str) -> Vec<String> {
    let expected = refusal.split("expected").nth(1).unwrap_or_default();
    let mut fields: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    fields.sort();
    fields
}

#[test]
fn every_request_schema_is_exactly_what_its_rpc_type_accepts() {
    let document = raft_node::openapi::document();
    let components = &document["components"]["schemas"];
    let names = request_schema_names(&document);
    assert!(names.len() >= 7, "only {names:?} found as request schemas");
    for name in &names {
        let schema = &components[name.as_str()];
        let parse = parser(name)
            .unwrap_or_else(|| panic!("request schema {name} has no rpc type in parser()"));
        if schema.get("properties").is_none() {
            // An enumeration: exactly the documented values parse.
            let values: Vec<Value> = match schema["enum"].as_array() {
                Some(values) => values.clone(),
                None => schema["oneOf"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|alternative| alternative["const"].clone())
                    .collect(),
            };
            assert!(
                !values.is_empty(),
                "{name}: neither an object nor an enumeration"
            );
            for value in &values {
                parse(value).unwrap_or_else(|e| panic!("{name}: {value} is documented: {e}"));
            }
            assert!(
                parse(&json!("undocumented")).is_err(),
                "{name}: only its values"
            );
            continue;
        }
        let properties = schema["properties"].as_object().expect("properties");
        let required: Vec<&str> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            schema["additionalProperties"],
            json!(false),
            "{name}: the node refuses unknown fields"
        );

        let base = sample(schema, components);
        parse(&base).unwrap_or_else(|e| panic!("{name}: {base} is documented valid: {e}"));

        // The documented properties are exactly the fields serde accepts.
        let mut with_unknown = base.clone();
        with_unknown["undocumented"] = json!(1);
        let refusal = parse(&with_unknown).expect_err("an undocumented field is refused");
        let mut documented: Vec<String> = properties.keys().cloned().collect();
        documented.sort();
        assert_eq!(
            accepted_fields(&refusal),
            documented,
            "{name}: fields accepted vs documented ({refusal})"
        );

        for (property, property_schema) in properties {
            let with = |value: Value| {
                let mut body = base.clone();
                body[property.as_str()] = value;
                parse(&body).map(|()| body)
            };
            let value = sample(property_schema, components);
            with(value.clone())
                .unwrap_or_else(|e| panic!("{name}.{property} = {value} is documented: {e}"));
            let nullable = types(property_schema).contains(&"null");
            assert_eq!(
                with(Value::Null).is_ok(),
                nullable,
                "{name}.{property}: null is accepted iff the document allows null"
            );
            let wrong = wrong_type(property_schema);
            assert!(
                is_any(property_schema) || with(wrong.clone()).is_err(),
                "{name}.{property} = {wrong} has a type the document does not allow"
            );
            if main_type(property_schema) == "integer" {
                // The spelling rule of the info description, beyond JSON Schema's integer.
                assert!(
                    with(json!(1.0)).is_err(),
                    "{name}.{property}: 1.0 is refused"
                );
            }
            let mut without = base.clone();
            let present = without
                .as_object_mut()
                .and_then(|o| o.remove(property.as_str()))
                .is_some();
            if present {
                assert_eq!(
                    parse(&without).is_ok(),
                    !required.contains(&property.as_str()),
                    "{name}.{property}: may be left out iff the document says it is not required"
                );
            }
        }
    }
}

/// Whether `value` is what `schema` describes, for the keywords the document uses; an
/// object may carry no key its schema does not list, so an answer with a field the
/// document lacks fails too.
fn conforms(value: &Value, schema: &Value, components: &Value) -> Result<(), String> {
    if let Some(name) = ref_name(schema) {
        return conforms(value, &components[name], components);
    }
    if let Some(options) = schema["anyOf"].as_array().or(schema["oneOf"].as_array()) {
        let errors: Vec<String> = options
            .iter()
            .filter_map(|option| conforms(value, option, components).err())
            .collect();
        return if errors.len() < options.len() {
            Ok(())
        } else {
            Err(format!("{value} matches no option: {errors:?}"))
        };
    }
    let allowed = types(schema);
    let actual = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if !allowed.is_empty() && !allowed.contains(&actual) {
        return Err(format!("{value} is {actual}, not {allowed:?}"));
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        return Err(format!("{value} is not one of {options:?}"));
    }
    match value {
        Value::Object(object) => {
            for key in schema["required"].as_array().into_iter().flatten() {
                let key = key.as_str().unwrap_or_default();
                if !object.contains_key(key) {
                    return Err(format!("{value} lacks required {key}"));
                }
            }
            for (key, field) in object {
                let field_schema = schema["properties"]
                    .get(key)
                    .ok_or_else(|| format!("{key} is not documented (in {value})"))?;
                conforms(field, field_schema, components).map_err(|e| format!("{key}: {e}"))?;
            }
        }
        Value::Array(items) => {
            for item in items {
                conforms(item, &schema["items"], components)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_what_the_document_describes() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let document = raft_node::openapi::document();
    let components = &document["components"]["schemas"];
    let call = |method: Method, path: String, body: Value| {
        let cluster = &cluster;
        async move {
            let body = if body.is_null() {
                Bytes::new()
            } else {
                Bytes::from(body.to_string())
            };
            let response = cluster
                .client
                .send(
                    cluster.api(1),
                    method,
                    &path,
                    &[],
                    body,
                    common::CALL_TIMEOUT,
                )
                .await
                .expect("answered");
            let json: Value = serde_json::from_slice(&response.body).expect("a JSON answer");
            (response.status.as_u16(), json)
        }
    };
    let (_, added) = call(
        Method::POST,
        "/update".into(),
        json!({"clientid": 1, "adds": [{"group": "g", "data": "d"}]}),
    )
    .await;
    let id = added["tasks"][0]["id"].as_u64().expect("an added task");
    let answers = [
        ("WriteResult", added),
        (
            "WriteResult",
            call(
                Method::POST,
                "/update".into(),
                json!({"clientid": 1, "deletes": [id + 100]}),
            )
            .await
            .1,
        ),
        (
            "Task",
            call(Method::GET, format!("/task/{id}"), Value::Null)
                .await
                .1,
        ),
        (
            "Error",
            call(Method::GET, "/task/999999".into(), Value::Null)
                .await
                .1,
        ),
        (
            "ClusterStatus",
            call(Method::GET, "/cluster".into(), Value::Null).await.1,
        ),
        (
            "Probe",
            call(Method::GET, "/health".into(), Value::Null).await.1,
        ),
        (
            "Probe",
            call(Method::GET, "/ready".into(), Value::Null).await.1,
        ),
        (
            "StateHash",
            call(Method::GET, "/admin/state-hash".into(), Value::Null)
                .await
                .1,
        ),
    ];
    for (name, answer) in answers {
        conforms(&answer, &rpc::schema::reference(name), components)
            .unwrap_or_else(|e| panic!("{name} answer {answer}: {e}"));
    }
}

// ---- The limits the document states are the ones the node enforces ----

/// An `Idempotency-Key` header with `value`.
fn key(value: &[u8]) -> (&'static str, &[u8]) {
    ("Idempotency-Key", value)
}

/// A write's status and answer, with `headers`.
async fn post(
    cluster: &TestCluster,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &Value,
) -> (u16, Value) {
    let headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)> = headers
        .iter()
        .map(|(name, value)| {
            (
                hyper::header::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                hyper::header::HeaderValue::from_bytes(value).expect("a header value"),
            )
        })
        .collect();
    let response = cluster
        .client
        .send(
            cluster.api(1),
            Method::POST,
            path,
            &headers,
            Bytes::from(body.to_string()),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("answered");
    let json: Value = serde_json::from_slice(&response.body).expect("a JSON answer");
    (response.status.as_u16(), json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_states_what_the_node_enforces() {
    let cluster = TestCluster::start_with(1, "always", &["--claim-duration-max-ms", "5000"]);
    cluster.wait_ready(&[1]).await;
    let served = served_document(&cluster).await;
    let limits = raft_node::openapi::Limits {
        claim_duration_max_ms: 5000,
        ..Default::default()
    };
    assert_eq!(
        served,
        raft_node::openapi::document_for(&limits),
        "the node serves the document of its own limits"
    );
    let claim = &served["components"]["schemas"]["ClaimRequest"]["properties"];
    let update = &served["components"]["schemas"]["UpdateRequest"]["properties"];
    assert_eq!(
        claim["duration"]["maximum"], 5000,
        "the node states its own --claim-duration-max-ms"
    );

    // duration: from minimum to maximum, and nothing outside.
    let min = claim["duration"]["minimum"].as_i64().expect("a minimum");
    let max = claim["duration"]["maximum"].as_i64().expect("a maximum");
    for (duration, status) in [(min - 1, 400), (min, 200), (max, 200), (max + 1, 400)] {
        let body = json!({"clientid": 1, "group": "g", "duration": duration});
        let (got, answer) = post(&cluster, "/claim", &[], &body).await;
        assert_eq!(got, status, "duration {duration}: {answer}");
    }

    // clientid: an integer, written as one.
    assert_eq!(claim["clientid"]["type"], "integer");
    assert_eq!(update["clientid"]["type"], "integer");
    for (clientid, status) in [
        (json!(1), 200),
        (json!(0), 200),
        (json!(1.0), 400),
        (json!(0.0), 400),
        (json!(1e3), 400),
        (json!("1"), 400),
        (Value::Null, 400),
    ] {
        let body = json!({"clientid": clientid, "adds": [{"group": "g"}]});
        let (got, answer) = post(&cluster, "/update", &[], &body).await;
        assert_eq!(got, status, "clientid {clientid}: {answer}");
    }

    // requestid: maxLength is in bytes, not characters.
    let limit = update["requestid"]["maxLength"]
        .as_u64()
        .expect("a maxLength") as usize;
    assert_eq!(claim["requestid"]["maxLength"], limit);
    let ascii_at_limit = "a".repeat(limit);
    let two_byte_at_limit = "é".repeat(limit);
    let two_byte_in_limit = "é".repeat(limit / 2);
    for (requestid, status) in [
        (ascii_at_limit.clone(), 200),
        ("a".repeat(limit + 1), 400),
        (two_byte_in_limit, 200),
        (two_byte_at_limit, 400),
    ] {
        let body = json!({"clientid": 2, "adds": [{"group": "g"}], "requestid": requestid});
        let (got, answer) = post(&cluster, "/update", &[], &body).await;
        assert_eq!(
            got,
            status,
            "requestid of {} bytes: {answer}",
            requestid.len()
        );
    }

    // Idempotency-Key: documented on both writes, and enforced as documented.
    for path in ["/update", "/claim"] {
        let parameters = served["paths"][path]["post"]["parameters"]
            .as_array()
            .expect("parameters");
        let key = parameters
            .iter()
            .find(|p| p["name"] == "Idempotency-Key")
            .expect("Idempotency-Key is documented");
        assert_eq!(key["in"], "header");
        assert_eq!(key["schema"]["maxLength"], limit);
    }
    let add = |requestid: Option<&str>| {
        let mut body = json!({"clientid": 3, "adds": [{"group": "k"}]});
        if let Some(id) = requestid {
            body["requestid"] = json!(id);
        }
        body
    };
    let (status, first) = post(&cluster, "/update", &[key(b"same")], &add(Some("same"))).await;
    assert_eq!(status, 200, "equal in both: {first}");
    let (status, again) = post(&cluster, "/update", &[key(b"same")], &add(None)).await;
    assert_eq!(
        (status, &again),
        (200, &first),
        "the header alone is the same request id: the retry returns the first outcome"
    );
    let (status, again) = post(&cluster, "/update", &[], &add(Some("same"))).await;
    assert_eq!((status, &again), (200, &first), "and so is the body alone");
    let (status, answer) = post(
        &cluster,
        "/update",
        &[key(b"key-left")],
        &add(Some("key-right")),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("key-left") && error.contains("key-right"),
        "the error names both: {error}"
    );
    let (status, answer) = post(
        &cluster,
        "/claim",
        &[key(b"key-left")],
        &json!({
            "clientid": 3, "group": "k", "duration": 10, "requestid": "key-right"
        }),
    )
    .await;
    assert_eq!(status, 400, "a claim too: {answer}");
    let (status, answer) = post(
        &cluster,
        "/update",
        &[key(b"with space\tand tab")],
        &add(None),
    )
    .await;
    assert_eq!(status, 200, "printable ASCII and tab: {answer}");
    let long = "k".repeat(limit + 1);
    for (headers, what) in [
        (vec![key(long.as_bytes())], "longer than maxLength"),
        (vec![key(b"caf\xc3\xa9")], "not ASCII"),
        (vec![key(b"\x80")], "not ASCII"),
        (vec![key(b"a"), key(b"b")], "given twice"),
        (vec![key(b"a"), key(b"a")], "given twice, even equal"),
    ] {
        let (status, answer) = post(&cluster, "/update", &headers, &add(None)).await;
        assert_eq!(status, 400, "{what}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains("Idempotency-Key"), "{what}: {error}");
    }
}
