//! The walking skeleton: three simulated nodes elect a leader and serve writes (with a
//! token) through the real router and transport, and a killed node catches up.

#![cfg(madsim)]

use std::time::Duration;

use rpc::client::HttpClient;
use sim_tests::cluster::CALL_TIMEOUT;
use sim_tests::cluster::SimCluster;

#[madsim::test]
async fn three_nodes_elect_serve_writes_and_converge() {
    // Nothing but the bootstrap answers before the first token exists (`start_serving`
    // makes it).
    let (cluster, tokens, leader) = SimCluster::start_serving(3).await;
    assert!((1..=3).contains(&leader));

    // Without a token nothing is written.
    let addr = cluster.nodes[&leader].api_addr();
    let status = cluster
        .on_client(async move {
            let body = serde_json::json!({"clientid": 1, "adds": [{"group": "g", "data": "x"}]});
            HttpClient::new()
                .post_json(&addr, "/update", &body, CALL_TIMEOUT)
                .await
                .expect("answers")
                .status
        })
        .await;
    assert_eq!(status.as_u16(), 401);
    let worker = HttpClient::new()
        .with_token(Some(&tokens.worker))
        .expect("a header");

    // A write through a follower is relayed to the leader and acknowledged.
    let follower = if leader == 1 { 2 } else { 1 };
    let addr = cluster.nodes[&follower].api_addr();
    let client = worker.clone();
    let added: serde_json::Value = cluster
        .on_client(async move {
            let body = serde_json::json!({"clientid": 1, "adds": [{"group": "g", "data": "x"}]});
            client
                .post_json(&addr, "/update", &body, CALL_TIMEOUT)
                .await
                .expect("answers")
                .json(&addr)
                .expect("JSON")
        })
        .await;
    let id = added["tasks"][0]["id"].as_u64().expect("an id");

    // Kill a follower, write more, restart it: it catches up to the same state.
    cluster.kill(follower);
    let other = (1..=3)
        .find(|&n| n != leader && n != follower)
        .expect("third");
    let addr = cluster.nodes[&other].api_addr();
    let client = worker.clone();
    cluster
        .on_client(async move {
            for i in 0..20 {
                let body = serde_json::json!({"clientid": 1, "adds": [{"group": "g", "data": format!("{i}")}]});
                let response = client
                    .post_json(&addr, "/update", &body, CALL_TIMEOUT)
                    .await
                    .expect("answers");
                assert!(response.status.is_success(), "{:?}", response.status);
            }
        })
        .await;
    cluster.restart(follower);
    let hash = cluster
        .wait_converged(&[1, 2, 3], Duration::from_secs(20))
        .await
        .expect("the restarted node converges");
    assert_eq!(hash.tasks, 21);
    assert!(id > 0);
}
