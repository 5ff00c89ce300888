//! Keeps the OpenAPI document in step: the checked-in `openapi.json` equals what the
//! node serves, and every documented operation is routed on a real node.
//! Regenerate the file with `ROTA_UPDATE_OPENAPI=1 cargo test -p raft-node --test openapi`.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::TestCluster;
use hyper::Method;

fn checked_in_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi.json")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_routed() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let served = cluster
        .client
        .get(cluster.api(1), "/openapi.json", common::CALL_TIMEOUT)
        .await
        .expect("served");
    let served: serde_json::Value = served.json(cluster.api(1)).expect("json");
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
            .replace("{name}", "g");
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
