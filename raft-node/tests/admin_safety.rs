//! The admin API is a contract of its own (issue 20): the node refuses membership calls
//! that would change nothing, and a removed node says so instead of looking ready.

mod common;

use common::TestCluster;
use rpc::admin::ClusterStatusJson;
use serde_json::json;

/// POSTs an admin call and returns its status and body.
async fn call(
    cluster: &TestCluster,
    via: u64,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let response = cluster
        .client
        .post_json(cluster.api(via), path, &body, common::CALL_TIMEOUT)
        .await
        .expect("admin call answered");
    let json = serde_json::from_slice(&response.body).expect("a JSON body");
    (response.status.as_u16(), json)
}

async fn status(cluster: &TestCluster, id: u64) -> ClusterStatusJson {
    cluster.status(id).await.expect("status answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_calls_that_change_nothing_are_refused() {
    let cluster = TestCluster::start(3, "always");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let before = status(&cluster, leader).await;

    for via in [leader, follower] {
        let (code, body) = call(&cluster, via, "/admin/remove", json!({"id": 99})).await;
        assert_eq!(code, 409, "remove of a stranger via {via}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("not a member")),
            "{body}"
        );

        let (code, body) = call(&cluster, via, "/admin/promote", json!({"id": leader})).await;
        assert_eq!(code, 409, "promote of a voter via {via}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("already a voter")),
            "{body}"
        );

        let (code, body) = call(&cluster, via, "/admin/promote", json!({"id": 7})).await;
        assert_eq!(code, 409, "promote of a stranger via {via}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("not a learner")),
            "{body}"
        );

        let (code, body) = call(
            &cluster,
            via,
            "/admin/add-learner",
            json!({"id": follower, "api_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2"}),
        )
        .await;
        assert_eq!(code, 409, "add-learner of a voter via {via}: {body}");
    }
    let after = status(&cluster, leader).await;
    assert_eq!(
        after.membership_index, before.membership_index,
        "no refused call wrote a membership entry"
    );

    // Once removed, an id is retired: removing it again changes nothing either.
    let third = (1..=3)
        .find(|&id| id != leader && id != follower)
        .expect("a third voter");
    let (code, body) = call(&cluster, leader, "/admin/remove", json!({"id": third})).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(&cluster, leader, "/admin/remove", json!({"id": third})).await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("removed already")),
        "{body}"
    );
    let (code, body) = call(
        &cluster,
        leader,
        "/admin/add-learner",
        json!({"id": third, "api_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2"}),
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("never reused")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_says_it_was_removed_and_serves_nothing() {
    let cluster = TestCluster::start(3, "always");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;

    let (code, body) = call(&cluster, leader, "/admin/remove", json!({"id": leader})).await;
    assert_eq!(code, 200, "{body}");
    let rest: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let new_leader = cluster.wait_leader(&rest).await;
    assert_ne!(new_leader, leader);

    // /cluster says so, and names no leader.
    let removed = common::eventually(|| async {
        let seen = status(&cluster, leader).await;
        if seen.removed {
            Ok(seen)
        } else {
            Err(format!("not removed yet: {seen:?}"))
        }
    })
    .await;
    assert_eq!(removed.leader, None, "{removed:?}");

    // /ready is 503 with the reason, so a load balancer stops sending workers there.
    let ready = cluster
        .client
        .get(cluster.api(leader), "/ready", common::CALL_TIMEOUT)
        .await
        .expect("/ready answered");
    assert_eq!(ready.status.as_u16(), 503);
    let reason = String::from_utf8_lossy(&ready.body).to_string();
    assert!(reason.contains("removed"), "{reason}");

    // Worker calls are refused with the members' addresses, and without Retry-After.
    let write = cluster
        .client
        .post_json(
            cluster.api(leader),
            "/update",
            &json!({"clientid": 1, "adds": [{"group": "g"}]}),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("write answered");
    assert_eq!(write.status.as_u16(), 503);
    assert!(write.headers.get("retry-after").is_none());
    let error = String::from_utf8_lossy(&write.body).to_string();
    for id in &rest {
        assert!(error.contains(cluster.api(*id)), "{error} names node {id}");
    }
    let read = cluster
        .client
        .get(
            cluster.api(leader),
            "/groups?consistency=stale",
            common::CALL_TIMEOUT,
        )
        .await
        .expect("read answered");
    assert_eq!(read.status.as_u16(), 503);

    // Admin calls are refused too.
    let (code, body) = call(
        &cluster,
        leader,
        "/admin/transfer-leader",
        json!({"id": leader}),
    )
    .await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("removed")),
        "{body}"
    );

    // The rest of the cluster serves on.
    cluster
        .write(
            rest[0],
            "/update",
            &json!({"clientid": 1, "adds": [{"group": "g"}]}),
        )
        .await
        .expect("the remaining members accept writes");
}

/// Found from outside: a removed follower or learner is sent nothing more, so it never
/// learned it was removed: a learner stayed ready, relayed writes and served stale reads
/// frozen at its removal. The leader now tells it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_follower_and_a_removed_learner_say_so_and_serve_nothing() {
    let cluster = TestCluster::start(3, "never").with_joiner(4);
    cluster.start_node(4);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let node4 = &cluster.nodes[3];
    let learner = json!({"id": 4, "api_addr": node4.api_addr, "raft_addr": node4.raft_addr});
    let (code, body) = call(&cluster, leader, "/admin/add-learner", learner).await;
    assert_eq!(code, 200, "{body}");
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    for removed in [4, follower] {
        let (code, body) = call(&cluster, leader, "/admin/remove", json!({"id": removed})).await;
        assert_eq!(code, 200, "{body}");
        let seen = common::eventually(|| async {
            let seen = status(&cluster, removed).await;
            if seen.removed {
                Ok(seen)
            } else {
                Err(format!(
                    "node {removed} does not know it was removed: {seen:?}"
                ))
            }
        })
        .await;
        assert_eq!(seen.leader, None, "{seen:?}");
        let ready = cluster
            .client
            .get(cluster.api(removed), "/ready", common::CALL_TIMEOUT)
            .await
            .expect("/ready answered");
        assert_eq!(ready.status.as_u16(), 503, "node {removed}");
        for path in ["/group/g?consistency=stale", "/group/g"] {
            let read = cluster
                .client
                .get(cluster.api(removed), path, common::CALL_TIMEOUT)
                .await
                .expect("read answered");
            assert_eq!(read.status.as_u16(), 503, "node {removed} {path}");
        }
        let write = cluster
            .client
            .post_json(
                cluster.api(removed),
                "/update",
                &json!({"clientid": 1, "adds": [{"group": "g"}]}),
                common::CALL_TIMEOUT,
            )
            .await
            .expect("write answered");
        assert_eq!(write.status.as_u16(), 503, "node {removed}");
        assert!(write.headers.get("retry-after").is_none());
        let error = String::from_utf8_lossy(&write.body).to_string();
        assert!(error.contains(cluster.api(leader)), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_not_handed_to_its_holder_nor_to_a_voter_that_is_down() {
    // A lone voter asked to hand leadership to itself keeps serving.
    let single = TestCluster::start(1, "never");
    single.wait_leader(&[1]).await;
    let (code, body) = call(&single, 1, "/admin/transfer-leader", json!({"id": 1})).await;
    assert_eq!(code, 200, "{body}");
    let write = json!({"clientid": 1, "adds": [{"group": "g", "data": "after"}]});
    let (code, body) = call(&single, 1, "/update", write).await;
    assert_eq!(code, 200, "writes go on: {body}");

    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let (code, body) = call(
        &cluster,
        leader,
        "/admin/transfer-leader",
        json!({"id": leader}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let term = status(&cluster, leader).await.term;
    let down = (1..=3).find(|&id| id != leader).expect("a follower");
    cluster.kill(down);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (code, body) = call(
        &cluster,
        leader,
        "/admin/transfer-leader",
        json!({"id": down}),
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("node {down} has not answered this leader"))),
        "{body}"
    );
    let after = status(&cluster, leader).await;
    assert_eq!(
        (after.leader, after.term),
        (Some(leader), term),
        "nothing moved"
    );
}
