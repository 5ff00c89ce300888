//! The job API through real nodes (issue 12): keyed adds, attempts, finish and fail,
//! dead letters and retry, cancel, dependencies, group settings, and clear 400s; writes
//! sent to a follower as well as to the leader.

mod common;

use common::TestCluster;
use hyper::Method;
use raft_node::log_forms::ANNOUNCE_FORM_ENV;
use raft_node::log_forms::LOG_FORMS_READ;
use serde_json::Value;
use serde_json::json;

/// Sends `body` (or nothing) with `method` to node `via`; the status and JSON body.
async fn call(
    cluster: &TestCluster,
    via: u64,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let headers = [(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    )];
    let response = cluster
        .client
        .send(
            cluster.api(via),
            method,
            path,
            &headers,
            bytes.into(),
            common::CALL_TIMEOUT,
        )
        .await
        .expect("the node answered");
    let json = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status.as_u16(), json)
}

/// POSTs `body` to node `via` until it answers `want` (a new leader may first answer
/// 503, a node just started not at all), and returns that answer's JSON body.
async fn post_until(cluster: &TestCluster, via: u64, path: &str, body: &Value, want: u16) -> Value {
    common::eventually(|| async {
        match call(cluster, via, Method::POST, path, Some(body.clone())).await {
            (status, answer) if status == want => Ok(answer),
            (status, answer) => Err(format!("{status}: {answer}")),
        }
    })
    .await
}

async fn post(cluster: &TestCluster, via: u64, path: &str, body: Value) -> Value {
    let (status, json) = call(cluster, via, Method::POST, path, Some(body)).await;
    assert_eq!(status, 200, "POST {path}: {json}");
    json
}

async fn get(cluster: &TestCluster, via: u64, path: &str) -> Value {
    let (status, json) = call(cluster, via, Method::GET, path, None).await;
    assert_eq!(status, 200, "GET {path}: {json}");
    json
}

/// Starts `GET path` on node `via` in the background (a wait): its status, JSON body and
/// how long it took.
fn spawn_get(
    cluster: &TestCluster,
    via: u64,
    path: String,
) -> tokio::task::JoinHandle<(u16, Value, std::time::Duration)> {
    let api = cluster.api(via).to_string();
    let client = cluster.client.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let answer = client
            .get(&api, &path, std::time::Duration::from_secs(45))
            .await
            .expect("answered");
        let json = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        (answer.status.as_u16(), json, started.elapsed())
    })
}

fn first_task(answer: &Value) -> Value {
    answer["tasks"][0].clone()
}

fn claim(group: &str, client: i64) -> Value {
    json!({"clientid": client, "group": group, "duration": 60_000})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_their_whole_life_through_any_node() {
    let cluster = TestCluster::start(3, "always");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");

    // Seed tasks show no job field; a keyed add does.
    let added = post(
        &cluster,
        follower,
        "/update",
        json!({"clientid": 1, "adds": [
            {"group": "seed", "data": "plain"},
            {"group": "jobs", "data": "a", "key": "a", "max_attempts": 2},
            {"group": "jobs", "data": "b", "key": "b", "after": ["a"]},
        ]}),
    )
    .await;
    let plain = &added["tasks"][0];
    assert_eq!(
        plain
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>()),
        Some(vec![
            "data".into(),
            "group".into(),
            "id".into(),
            "ownerid".into(),
            "timespec".into()
        ]),
        "a seed task's fields are the seed's: {plain}"
    );
    assert_eq!(added["tasks"][1]["key"], "a");

    // A live key is refused by default and kept on request.
    let again = post(
        &cluster,
        leader,
        "/update",
        json!({"clientid": 1, "adds": [{"group": "jobs", "key": "a"}]}),
    )
    .await;
    assert!(
        again["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("live task")),
        "{again}"
    );
    let kept = post(
        &cluster,
        follower,
        "/update",
        json!({"clientid": 1, "adds": [{"group": "jobs", "key": "a", "on_conflict": "keep"}]}),
    )
    .await;
    assert_eq!(kept["tasks"][0]["id"], added["tasks"][1]["id"]);

    // b waits for a: the first claim gets a, attempt 1; the next finds nothing.
    let a1 = first_task(&post(&cluster, follower, "/claim", claim("jobs", 7)).await);
    assert_eq!(
        (a1["key"].as_str(), a1["attempt"].as_u64()),
        (Some("a"), Some(1))
    );
    let none = post(&cluster, follower, "/claim", claim("jobs", 7)).await;
    assert_eq!(none, json!({"tasks": []}));

    // Fail with an immediate retry, then fail again: a is dead and b is cancelled.
    let retry = post(
        &cluster,
        follower,
        "/fail",
        json!({"clientid": 7, "id": a1["id"], "error": "disk full", "retry_in_ms": 0}),
    )
    .await;
    assert_eq!(retry["tasks"][0]["key"], "a");
    let a2 = first_task(&post(&cluster, leader, "/claim", claim("jobs", 8)).await);
    assert_eq!(a2["attempt"], 2);
    let stale = post(
        &cluster,
        follower,
        "/finish",
        json!({"clientid": 7, "id": a1["id"]}),
    )
    .await;
    assert!(
        stale["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("does not exist")),
        "{stale}"
    );
    post(
        &cluster,
        follower,
        "/fail",
        json!({"clientid": 8, "id": a2["id"], "error": "again"}),
    )
    .await;
    let a = get(&cluster, follower, "/job?group=jobs&key=a").await;
    assert_eq!(a["state"], "dead", "{a}");
    assert_eq!(a["data"], "a");
    assert_eq!(a["history"][0]["outcome"], "failed");
    assert_eq!(a["history"][0]["error"], "disk full");
    let b = get(&cluster, leader, "/job?group=jobs&key=b").await;
    assert_eq!(b["state"], "cancelled");
    assert_eq!(b["reason"], "prerequisite \"a\" is dead");
    let dead = get(&cluster, follower, "/dead?group=jobs").await;
    assert_eq!(dead["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(dead["next"], Value::Null);

    // Retry the dead job; finish it with a result.
    let retried = post(
        &cluster,
        follower,
        "/retry",
        json!({"group": "jobs", "keys": ["a"]}),
    )
    .await;
    assert_eq!(retried["tasks"][0]["key"], "a");
    let a3 = first_task(&post(&cluster, follower, "/claim", claim("jobs", 9)).await);
    assert_eq!(a3["attempt"], 3);
    post(
        &cluster,
        follower,
        "/finish",
        json!({"clientid": 9, "id": a3["id"], "result": {"rows": 3}}),
    )
    .await;
    let a = get(&cluster, leader, "/job?group=jobs&key=a").await;
    assert_eq!(
        (a["state"].as_str(), &a["result"]),
        (Some("succeeded"), &json!({"rows": 3}))
    );

    // Cancel a running job: its owner's renewal is refused with the reason.
    post(
        &cluster,
        follower,
        "/update",
        json!({"clientid": 1, "adds": [{"group": "halt", "key": "h"}]}),
    )
    .await;
    let h = first_task(&post(&cluster, follower, "/claim", claim("halt", 5)).await);
    post(
        &cluster,
        follower,
        "/cancel",
        json!({"group": "halt", "keys": ["h"]}),
    )
    .await;
    let renewal = post(
        &cluster,
        follower,
        "/update",
        json!({"clientid": 5, "updates": [{"id": h["id"], "timespec": -60_000}]}),
    )
    .await;
    assert!(
        renewal["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("was cancelled")),
        "{renewal}"
    );

    // Group settings: pause holds claims back; the change shows on every node.
    let (status, settings) = call(
        &cluster,
        follower,
        Method::PUT,
        "/groups/queue/settings",
        Some(json!({"paused": true, "max_running": 2, "backoff": {"base_ms": 10, "factor": 1.5, "max_ms": 100}})),
    )
    .await;
    assert_eq!(status, 200, "{settings}");
    assert_eq!(settings["backoff"]["factor"], 1.5);
    post(
        &cluster,
        leader,
        "/update",
        json!({"clientid": 1, "adds": [{"group": "queue"}]}),
    )
    .await;
    assert_eq!(
        post(&cluster, leader, "/claim", claim("queue", 1)).await,
        json!({"tasks": []})
    );
    for id in 1..=3 {
        let settings = get(&cluster, id, "/groups/queue/settings").await;
        assert_eq!(
            (
                settings["paused"].as_bool(),
                settings["max_running"].as_u64()
            ),
            (Some(true), Some(2))
        );
    }
    let (status, _) = call(
        &cluster,
        leader,
        Method::PUT,
        "/groups/queue/settings",
        Some(json!({"paused": false})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        post(&cluster, leader, "/claim", claim("queue", 1)).await["tasks"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    cluster.wait_converged(&[1, 2, 3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_job_input_is_a_400_that_names_the_field() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let long_key = "k".repeat(257);
    let cases = [
        (
            "/update",
            json!({"clientid": 1, "adds": [{"group": "g", "key": long_key}]}),
            "adds[0].key",
        ),
        (
            "/update",
            json!({"clientid": 1, "adds": [{"group": "g", "key": "a", "after": ["a"]}]}),
            "adds[0].after[0]",
        ),
        (
            "/update",
            json!({"clientid": 1, "adds": [{"group": "g", "key": "a", "on_conflict": "merge"}]}),
            "unknown variant `merge`",
        ),
        (
            "/update",
            json!({"clientid": 1, "adds": [{"group": "g", "after": ["x"]}]}),
            "need a key",
        ),
        (
            "/finish",
            json!({"clientid": 1, "id": 1, "result": "x".repeat(300_000)}),
            "result:",
        ),
        (
            "/fail",
            json!({"clientid": 1, "id": 1, "retry_in_ms": -5}),
            "retry_in_ms",
        ),
        ("/cancel", json!({"group": "g", "keys": []}), "keys"),
        ("/retry", json!({"group": "", "keys": ["a"]}), "group"),
    ];
    for (path, body, expected) in cases {
        let (status, json) = call(&cluster, 1, Method::POST, path, Some(body.clone())).await;
        assert_eq!(status, 400, "{path} {body}: {json}");
        let error = json["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(expected),
            "{path}: {error:?} does not name {expected}"
        );
    }
    let (status, json) = call(
        &cluster,
        1,
        Method::PUT,
        "/groups/g/settings",
        Some(json!({"max_attempts": -1})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        json["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_attempts")),
        "{json}"
    );
    let (status, json) = call(&cluster, 1, Method::GET, "/jobs?group=g&state=lost", None).await;
    assert_eq!(status, 400, "{json}");
    let (status, _) = call(&cluster, 1, Method::GET, "/job?group=g&key=nope", None).await;
    assert_eq!(status, 404);
    let (status, json) = call(&cluster, 1, Method::GET, "/job?group=g", None).await;
    assert_eq!(
        (
            status,
            json["error"].as_str().is_some_and(|e| e.contains("key"))
        ),
        (400, true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_shows_in_reads_and_ends_waits_before_any_write() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let add = json!({"clientid": 1, "adds": [{"group": "l", "key": "k", "max_attempts": 1}]});
    post(&cluster, 1, "/update", add).await;
    let claim = json!({"clientid": 7, "group": "l", "duration": 300});
    let claimed = post(&cluster, 1, "/claim", claim).await;
    assert_eq!(claimed["tasks"][0]["attempt"], 1);
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let job = get(&cluster, 1, "/job?group=l&key=k").await;
    assert_eq!(job["state"], "dead", "{job}");
    // A holder's finish after its lease lapsed is refused, and told that its own lease
    // ended (not that the task is held by an owner that is itself).
    let add = json!({"clientid": 1, "adds": [{"group": "seed", "data": "s"}]});
    post(&cluster, 1, "/update", add).await;
    let claim = json!({"clientid": 7, "group": "seed", "duration": 300});
    let claimed = post(&cluster, 1, "/claim", claim).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let id = claimed["tasks"][0]["id"].clone();
    let late = post(&cluster, 1, "/finish", json!({"clientid": 7, "id": id})).await;
    let error = late["errors"][0].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "finish: task {id} is no longer held: this client's lease on it ended at "
        )),
        "{late}"
    );
    let other = post(&cluster, 1, "/finish", json!({"clientid": 8, "id": id})).await;
    let error = other["errors"][0].as_str().unwrap_or_default();
    assert!(
        error.contains("is not held by this client (owner 7"),
        "{other}"
    );
    assert_eq!(job["history"][0]["outcome"], "lost");
    let settings = get(&cluster, 1, "/groups/l/settings").await;
    assert_eq!(settings["running"], 0);
    // A stale read on the leader judges at the leader's clock too (SPEC 2).
    let job = get(&cluster, 1, "/job?group=l&key=k&consistency=stale").await;
    assert_eq!(job["state"], "dead", "{job}");
    let settings = get(&cluster, 1, "/groups/l/settings?consistency=stale").await;
    assert_eq!(settings["running"], 0);

    // A wait for an outcome ends when a lease's end ends the job, with no write.
    let add = json!({"clientid": 1, "adds": [{"group": "l", "key": "w", "max_attempts": 1}]});
    post(&cluster, 1, "/update", add).await;
    let claim = json!({"clientid": 7, "group": "l", "duration": 500});
    post(&cluster, 1, "/claim", claim).await;
    let started = std::time::Instant::now();
    let waited = get(&cluster, 1, "/jobs/wait?group=l&key=w&wait_ms=20000").await;
    assert_eq!(waited["finished"], true, "{waited}");
    assert_eq!(waited["jobs"][0]["state"], "dead", "{waited}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "woken by the lease's end, not the wait's"
    );
}

#[tokio::test]
async fn a_finish_with_next_claims_the_next_task_in_the_same_write() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let adds = json!({"clientid": 1, "adds": [
        {"group": "n", "key": "a"}, {"group": "n", "key": "b"}]});
    post(&cluster, leader, "/update", adds).await;
    let a = first_task(&post(&cluster, follower, "/claim", claim("n", 7)).await);
    let next = json!({"group": "n", "duration": 60_000});
    let finish = json!({"clientid": 7, "id": a["id"], "result": 1, "next": next});
    let answer = post(&cluster, follower, "/finish", finish.clone()).await;
    let b = first_task(&answer);
    assert_eq!(
        (b["key"].as_str(), b["ownerid"].as_i64()),
        (Some("b"), Some(7)),
        "{answer}"
    );
    let job = get(&cluster, leader, "/job?group=n&key=a").await;
    assert_eq!(job["state"], "succeeded", "{job}");
    // Nothing left: the finish applies, the claim comes back empty (it never waits).
    let finish_b = json!({"clientid": 7, "id": b["id"], "next": next});
    let answer = post(&cluster, leader, "/finish", finish_b).await;
    assert_eq!(answer["tasks"], json!([]), "{answer}");
    // A stale id: refused, and nothing is claimed.
    post(
        &cluster,
        leader,
        "/update",
        json!({"clientid": 1, "adds": [{"group": "n", "key": "c"}]}),
    )
    .await;
    let answer = post(&cluster, leader, "/finish", finish).await;
    assert!(
        answer["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("does not exist")),
        "{answer}"
    );
    let job = get(&cluster, leader, "/job?group=n&key=c").await;
    assert_eq!(job["state"], "waiting", "{job}");
    // A next claim the node cannot take: 400 before anything is written.
    for (bad, says) in [
        (json!({"group": "n", "duration": 0}), "next.duration"),
        (
            json!({"group": "n", "duration": 1000, "count": 0}),
            "next.count 0",
        ),
        (
            json!({"group": "n", "duration": 1000, "depends": [1]}),
            "depends",
        ),
        (json!({"group": "", "duration": 1000}), "next.group"),
    ] {
        let body = json!({"clientid": 7, "id": 1, "next": bad});
        let (status, json) = call(&cluster, leader, Method::POST, "/finish", Some(body)).await;
        assert_eq!(status, 400, "{json}");
        let error = json["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{says}: {error}");
    }
}

/// Issue 17's upgrade rule in a cluster in the middle of an upgrade (node 3 announces
/// form 2, as the builds before the recorded form do, so none is recorded): a leader
/// logs a finish with `next` only once every member has shown it reads that entry. A
/// learner that never answered keeps it refused (409, naming the node); a plain finish
/// still applies, in the form older builds read; once the learner runs and answers,
/// `next` is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_with_next_waits_until_every_member_reads_it() {
    let older = [(3, ANNOUNCE_FORM_ENV, "2")];
    let cluster = TestCluster::start_with_env(3, "never", &[], &older).with_joiner(4);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let adds = json!({"clientid": 1, "adds": [{"group": "u", "key": "y"},
        {"group": "u", "key": "z"}, {"group": "u", "key": "a"}, {"group": "u", "key": "b"},
        {"group": "u", "key": "c"}]});
    post(&cluster, leader, "/update", adds).await;
    let next = json!({"group": "u", "duration": 60_000});
    // While every member reads it: y finished and z claimed in one write.
    let y = first_task(&post(&cluster, leader, "/claim", claim("u", 7)).await);
    let finish_y = json!({"clientid": 7, "id": y["id"], "next": next, "requestid": "y-1"});
    let first = post(&cluster, leader, "/finish", finish_y.clone()).await;
    assert_eq!(first_task(&first)["key"], "z", "{first}");

    let node4 = &cluster.nodes[3];
    let learner = json!({"id": 4, "api_addr": node4.api_addr, "raft_addr": node4.raft_addr});
    post(&cluster, leader, "/admin/add-learner", learner).await;
    // A retry of that write now gets its first outcome, not a 409: it was applied.
    let again = post(&cluster, follower, "/finish", finish_y).await;
    assert_eq!(again, first);
    let z = first_task(&first);
    post(
        &cluster,
        leader,
        "/finish",
        json!({"clientid": 7, "id": z["id"]}),
    )
    .await;
    let a = first_task(&post(&cluster, leader, "/claim", claim("u", 7)).await);
    assert_eq!(a["key"], "a", "{a}");

    let finish_a = json!({"clientid": 7, "id": a["id"], "next": next});
    let (status, body) = call(&cluster, follower, Method::POST, "/finish", Some(finish_a)).await;
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("node 4 has not answered") && error.contains("without next"),
        "{body}"
    );
    // Refused as a whole: a still runs, nothing else is claimed.
    let job = get(&cluster, leader, "/job?group=u&key=a").await;
    assert_eq!(job["state"], "running", "{job}");
    let job = get(&cluster, leader, "/job?group=u&key=b").await;
    assert_eq!(job["state"], "waiting", "{job}");
    // The two parts apart are taken.
    post(
        &cluster,
        follower,
        "/finish",
        json!({"clientid": 7, "id": a["id"]}),
    )
    .await;
    let job = get(&cluster, leader, "/job?group=u&key=a").await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let b = first_task(&post(&cluster, follower, "/claim", claim("u", 7)).await);

    cluster.start_node(4);
    let finish_b = json!({"clientid": 7, "id": b["id"], "next": next});
    let answer = post_until(&cluster, follower, "/finish", &finish_b, 200).await;
    assert_eq!(first_task(&answer)["key"], "c", "{answer}");
    for id in 1..=4 {
        let status = cluster.status(id).await.expect("a status");
        assert_eq!(status.log_form, 0, "node 3 reads form 2 only: {status:?}");
    }
}

/// Once every member announced the form that records itself, the leader records it in
/// the replicated state, and every later leader takes `next` at once, even one that
/// never heard from a member that is down; a learner of an older build is then refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_log_form_keeps_next_while_a_member_is_down() {
    let cluster = TestCluster::start(3, "never").with_joiner(4);
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    cluster.wait_log_form_recorded(leader).await;
    let status = cluster.status(leader).await.expect("a status");
    assert_eq!(status.log_form, LOG_FORMS_READ, "{status:?}");
    let adds = json!({"clientid": 1, "adds": [{"group": "d", "key": "x"},
        {"group": "d", "key": "y"}]});
    post(&cluster, leader, "/update", adds).await;
    let x = first_task(&post(&cluster, leader, "/claim", claim("d", 7)).await);

    // A follower goes down, then the leader restarts: whoever leads next has not heard
    // from the follower since its process started.
    let down = (1..=3).find(|&id| id != leader).expect("a follower");
    let up = (1..=3)
        .find(|&id| id != leader && id != down)
        .expect("another");
    // Both others restart, so that neither holds an answer of the follower's.
    cluster.kill(down);
    cluster.kill(leader);
    cluster.kill(up);
    cluster.start_node(leader);
    cluster.start_node(up);
    let new_leader = cluster.wait_leader(&[leader, up]).await;
    let finish_x = json!({"clientid": 7, "id": x["id"], "requestid": "x-1",
        "next": {"group": "d", "duration": 60_000}});
    let answer = common::eventually(|| async {
        match call(
            &cluster,
            new_leader,
            Method::POST,
            "/finish",
            Some(finish_x.clone()),
        )
        .await
        {
            (200, answer) => Ok(answer),
            (409, body) => panic!("refused although every member reads it: {body}"),
            (status, body) => Err(format!("{status}: {body}")),
        }
    })
    .await;
    assert_eq!(first_task(&answer)["key"], "y", "{answer}");
    let job = get(&cluster, new_leader, "/job?group=d&key=x").await;
    assert_eq!(job["state"], "succeeded", "{job}");

    // A learner that announces an older form is refused, and taken once upgraded.
    cluster.set_env(4, ANNOUNCE_FORM_ENV, "2");
    cluster.start_node(4);
    let node4_up = || async {
        match cluster.status(4).await {
            Some(_) => Ok(()),
            None => Err("node 4 does not answer yet".to_string()),
        }
    };
    common::eventually(node4_up).await;
    let node4 = &cluster.nodes[3];
    let learner = json!({"id": 4, "api_addr": node4.api_addr, "raft_addr": node4.raft_addr});
    // Until the refusal names the build (a probe slower than its deadline on a loaded
    // machine gives another 409).
    let older = |path: &'static str, body: Value| {
        let cluster = &cluster;
        async move {
            common::eventually(|| async {
                let (status, answer) =
                    call(cluster, new_leader, Method::POST, path, Some(body.clone())).await;
                let error = answer["error"].as_str().unwrap_or_default();
                match status {
                    409 if error.contains("node 4")
                        && error.contains("older build")
                        && error.contains(&format!("form {LOG_FORMS_READ}")) =>
                    {
                        Ok(())
                    }
                    _ => Err(format!("{status}: {answer}")),
                }
            })
            .await
        }
    };
    older("/admin/add-learner", learner.clone()).await;
    let status = cluster.status(new_leader).await.expect("a status");
    assert!(!status.learners.contains(&4), "{status:?}");

    // Added while it does not run (it cannot be asked), it is asked again before it
    // votes.
    cluster.kill(4);
    post_until(&cluster, new_leader, "/admin/add-learner", &learner, 200).await;
    cluster.start_node(4);
    common::eventually(node4_up).await;
    common::eventually(|| async {
        let status = cluster.status(new_leader).await.ok_or("no status")?;
        match status.nodes.iter().find(|n| n.id == 4).and_then(|n| n.lag) {
            Some(0) => Ok(()),
            lag => Err(format!("node 4's lag: {lag:?}")),
        }
    })
    .await;
    let promote = json!({"id": 4});
    older("/admin/promote", promote.clone()).await;
    cluster.kill(4);
    cluster.clear_env(4);
    cluster.start_node(4);
    common::eventually(node4_up).await;
    post_until(&cluster, new_leader, "/admin/promote", &promote, 200).await;
    let status = cluster.status(new_leader).await.expect("a status");
    assert!(status.voters.contains(&4), "{status:?}");
}

#[tokio::test]
async fn a_wait_for_outcomes_returns_when_the_jobs_finish() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let adds = json!({"clientid": 1, "adds": [
        {"group": "w", "key": "a", "data": "1"},
        {"group": "w", "key": "b", "data": "2"}]});
    post(&cluster, leader, "/update", adds).await;

    // Not finished: the record as it is at the deadline.
    let waited = get(&cluster, follower, "/job?group=w&key=a&wait_ms=200").await;
    assert_eq!(waited["state"], "waiting");

    // Waiting through a follower for both; a worker finishes them meanwhile.
    let waiter = {
        let api = cluster.api(follower).to_string();
        let client = cluster.client.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let answer = client
                .get(
                    &api,
                    "/jobs/wait?group=w&key=a&key=b&wait_ms=30000",
                    std::time::Duration::from_secs(45),
                )
                .await
                .expect("answered");
            let json: Value = serde_json::from_slice(&answer.body).expect("JSON");
            (json, started.elapsed())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for _ in 0..2 {
        let task = first_task(&post(&cluster, leader, "/claim", claim("w", 5)).await);
        let body = json!({"clientid": 5, "id": task["id"], "result": {"done": task["key"]}});
        post(&cluster, leader, "/finish", body).await;
    }
    let (answer, waited) = waiter.await.expect("the wait ended");
    assert_eq!(answer["finished"], true, "{answer}");
    assert_eq!(answer["missing"], json!([]));
    let states: Vec<&str> = answer["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["state"].as_str())
        .collect();
    assert_eq!(states, vec!["succeeded", "succeeded"]);
    assert!(
        waited < std::time::Duration::from_secs(30),
        "woken by the finishes"
    );

    // A finished job answers at once; a key never added is listed as missing.
    let done = get(&cluster, follower, "/job?group=w&key=b&wait_ms=30000").await;
    assert_eq!(done["result"]["done"], "b");
    let partly = get(
        &cluster,
        leader,
        "/jobs/wait?group=w&key=a&key=zzz&wait_ms=100",
    )
    .await;
    assert_eq!(
        (partly["finished"].clone(), partly["missing"].clone()),
        (json!(false), json!(["zzz"]))
    );

    for (path, field) in [
        ("/jobs/wait?group=w&wait_ms=10", "key"),
        ("/jobs/wait?key=a", "group"),
        ("/jobs/wait?group=w&group=x&key=a", "group is given twice"),
        ("/jobs/wait?group=w&key=a&wait_ms=60001", "wait_ms"),
        ("/job?group=w&key=a&wait_ms=-1", "wait_ms"),
    ] {
        let (status, json) = call(&cluster, leader, Method::GET, path, None).await;
        assert_eq!(status, 400, "{path}: {json}");
        let message = json["error"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{path}: {message}");
    }
}

#[tokio::test]
async fn a_wait_for_more_keys_than_a_url_holds_goes_in_a_body() {
    // 1 000 keys of 256 bytes, each three times that once percent-encoded: far past what
    // a URL takes (hyper's HTTP/2 header limit is 16 KiB).
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let keys: Vec<String> = (0..1_000)
        .map(|i| format!("{i:04}{}", "é".repeat(126)))
        .collect();
    assert!(keys.iter().all(|k| k.len() == 256));
    for chunk in keys.chunks(250) {
        let adds: Vec<Value> = chunk
            .iter()
            .map(|key| json!({"group": "many", "key": key}))
            .collect();
        post(
            &cluster,
            leader,
            "/update",
            json!({"clientid": 1, "adds": adds}),
        )
        .await;
    }
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(
        rpc::job::jobs_wait_path("many", &key_refs, 100, rpc::job::WAIT_QUERY_BYTES_MAX_HTTP1),
        None
    );

    // Through a follower, which relays the body to the leader for a linearizable read.
    let mut named = keys.clone();
    named[999] = "never added".to_string();
    let body = json!({"group": "many", "keys": named, "wait_ms": 100});
    let answer = post(&cluster, follower, "/jobs/wait", body).await;
    assert_eq!(answer["finished"], false);
    assert_eq!(answer["missing"], json!(["never added"]));
    let jobs = answer["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 999);
    assert!(jobs.iter().zip(&keys).all(|(job, key)| job["key"] == *key));
    assert!(jobs.iter().all(|job| job["state"] == "waiting"));

    // The Rust client switches to the body by itself, and gets the same answer.
    let client = rpc::worker_client::WorkerClient::new([cluster.api(follower).to_string()], 2)
        .expect("a client");
    let waited = client
        .wait_jobs("many", &key_refs, std::time::Duration::from_millis(100))
        .await
        .expect("answered");
    assert_eq!((waited.finished, waited.jobs.len()), (false, 1_000));

    let too_many: Vec<String> = (0..1_001).map(|i| format!("k{i}")).collect();
    for (body, field) in [
        (json!({"group": "", "keys": ["a"]}), "group"),
        (json!({"group": "many", "keys": []}), "1 to 1000"),
        (json!({"group": "many", "keys": too_many}), "1001 given"),
        (json!({"group": "many", "keys": [""]}), "key"),
        (
            json!({"group": "many", "keys": ["a"], "wait_ms": 60_001}),
            "wait_ms",
        ),
        (
            json!({"group": "many", "keys": ["a"], "consistency": "soon"}),
            "consistency",
        ),
        (
            json!({"group": "many", "keys": ["a"], "key": "b"}),
            "unknown field",
        ),
    ] {
        let (status, json) = call(
            &cluster,
            leader,
            Method::POST,
            "/jobs/wait",
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 400, "{body}: {json}");
        let message = json["error"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
}

#[tokio::test]
async fn a_wait_for_outcomes_ends_when_a_job_dies() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_leader(&[1]).await;
    let adds = json!({"clientid": 1, "adds": [{"group": "d", "key": "once", "max_attempts": 1}]});
    post(&cluster, 1, "/update", adds).await;
    let task = first_task(&post(&cluster, 1, "/claim", claim("d", 5)).await);
    post(
        &cluster,
        1,
        "/fail",
        json!({"clientid": 5, "id": task["id"], "error": "no"}),
    )
    .await;
    let waited = get(&cluster, 1, "/jobs/wait?group=d&key=once&wait_ms=30000").await;
    assert_eq!(waited["finished"], true, "{waited}");
    assert_eq!(waited["jobs"][0]["state"], "dead");
}

#[tokio::test]
async fn a_groups_stats_count_its_tasks_and_jobs_and_a_cursor_pages_it() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_ready(&[1]).await;
    let adds: Vec<Value> = (0..6)
        .map(|i| json!({"group": "s", "data": format!("d{i}"), "key": format!("k{i}"), "max_attempts": 1}))
        .chain([json!({"group": "s", "data": "plain"})])
        .collect();
    post(&cluster, 1, "/update", json!({"clientid": 1, "adds": adds})).await;
    // One running, one dead (its only attempt failed), one succeeded.
    let running = first_task(&post(&cluster, 1, "/claim", claim("s", 2)).await);
    let doomed = first_task(&post(&cluster, 1, "/claim", claim("s", 2)).await);
    post(
        &cluster,
        1,
        "/fail",
        json!({"clientid": 2, "id": doomed["id"], "error": "no"}),
    )
    .await;
    let done = first_task(&post(&cluster, 1, "/claim", claim("s", 2)).await);
    post(
        &cluster,
        1,
        "/finish",
        json!({"clientid": 2, "id": done["id"]}),
    )
    .await;

    let stats = get(&cluster, 1, "/groups/s/stats").await;
    assert_eq!(stats["group"], "s");
    assert_eq!(stats["tasks"], 5, "{stats}");
    assert_eq!(
        (stats["available"].as_u64(), stats["owned"].as_u64()),
        (Some(4), Some(1)),
        "{stats}"
    );
    let jobs = &stats["jobs"];
    assert_eq!(
        [
            &jobs["waiting"],
            &jobs["running"],
            &jobs["failed"],
            &jobs["succeeded"],
            &jobs["dead"],
            &jobs["cancelled"]
        ],
        [
            &json!(3),
            &json!(1),
            &json!(0),
            &json!(1),
            &json!(1),
            &json!(0)
        ],
        "{stats}"
    );
    assert!(running["id"].is_u64());
    let empty = get(&cluster, 1, "/groups/none/stats").await;
    assert_eq!(empty["tasks"], 0);

    // Two at a time by cursor: the same tasks, in the same order, as one listing.
    let all = get(&cluster, 1, "/group/s?owned=1").await;
    let mut paged = Vec::new();
    let mut after = String::new();
    loop {
        let page = get(&cluster, 1, &format!("/group/s?owned=1&limit=2{after}")).await;
        let tasks = page.as_array().expect("a list").clone();
        let Some(last) = tasks.last() else { break };
        after = format!("&after={}:{}", last["timespec"], last["id"]);
        paged.extend(tasks);
    }
    assert_eq!(Value::Array(paged), all);
    let (status, error) = call(&cluster, 1, Method::GET, "/group/s?after=soon", None).await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap_or("")
            .contains("TIMESPEC:ID"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_of_many_ends_every_claim_or_none_through_any_node() {
    let cluster = TestCluster::start(3, "always");
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    post(
        &cluster,
        follower,
        "/update",
        json!({"clientid": 1, "adds": [
            {"group": "batch", "data": "a", "key": "a"},
            {"group": "batch", "data": "b", "key": "b"},
            {"group": "batch", "data": "c", "key": "c"},
        ]}),
    )
    .await;
    let mut three = claim("batch", 7);
    three["count"] = json!(3);
    let claimed = post(&cluster, follower, "/claim", three).await;
    let ids: Vec<u64> = claimed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["id"].as_u64().expect("an id"))
        .collect();
    assert_eq!(ids.len(), 3, "{claimed}");

    // Another client's finish of the three is refused whole, each task named.
    let refused = post(
        &cluster,
        leader,
        "/finish/many",
        json!({"clientid": 8, "finishes": ids.iter().map(|id| json!({"id": id})).collect::<Vec<_>>()}),
    )
    .await;
    let errors = refused["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 3, "{refused}");
    for id in &ids {
        assert!(
            errors.iter().any(|e| e
                .as_str()
                .is_some_and(|e| e.contains(&format!("task {id} ")))),
            "task {id} is named: {refused}"
        );
    }

    // The owner's: every job succeeds with its own result, once, retried or not.
    let body = json!({"clientid": 7, "requestid": "finish-three", "finishes": [
        {"id": ids[0], "result": {"n": 0}},
        {"id": ids[1]},
        {"id": ids[2], "result": "two"},
    ]});
    let first = post(&cluster, follower, "/finish/many", body.clone()).await;
    assert_eq!(first, json!({"tasks": []}));
    let again = post(&cluster, leader, "/finish/many", body).await;
    assert_eq!(
        again, first,
        "a retry with the same request id gets the first answer"
    );
    let a = get(&cluster, follower, "/job?group=batch&key=a").await;
    assert_eq!(
        (a["state"].clone(), a["result"].clone()),
        (json!("succeeded"), json!({"n": 0}))
    );
    let c = get(&cluster, follower, "/job?group=batch&key=c").await;
    assert_eq!(c["result"], "two");
    assert_eq!(
        get(&cluster, follower, "/job?group=batch&key=b").await["state"],
        "succeeded"
    );

    // Bad input is a 400 that says what to fix, and writes nothing.
    for (body, says) in [
        (
            json!({"clientid": 7, "finishes": []}),
            "name from 1 to 1000",
        ),
        (
            json!({"clientid": 7, "finishes": (0..1001).map(|id| json!({"id": id})).collect::<Vec<_>>()}),
            "name from 1 to 1000",
        ),
        (
            json!({"clientid": 7, "finishes": [{"id": 1, "bogus": 1}]}),
            "bogus",
        ),
        (json!({"clientid": 7, "id": 1}), "finishes"),
    ] {
        let (status, answer) =
            call(&cluster, follower, Method::POST, "/finish/many", Some(body)).await;
        assert_eq!(status, 400, "{answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{error:?} should say {says:?}");
    }
}

#[tokio::test]
async fn a_job_read_back_is_accepted_as_an_update_and_keeps_its_job_fields() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_ready(&[1]).await;
    let add = json!({"clientid": 1, "adds": [{"group": "r", "key": "k", "priority": 3}]});
    post(&cluster, 1, "/update", add).await;
    let claimed = first_task(&post(&cluster, 1, "/claim", claim("r", 4)).await);
    let id = claimed["id"].as_u64().expect("id");
    // As a seed worker renews: the task exactly as GET answered it, a new timespec.
    let mut read = get(&cluster, 1, &format!("/task/{id}")).await;
    assert_eq!(
        (read["key"].as_str(), read["attempt"].as_u64()),
        (Some("k"), Some(1))
    );
    read["timespec"] = json!(-60_000);
    let renewed = post(
        &cluster,
        1,
        "/update",
        json!({"clientid": 4, "updates": [read]}),
    )
    .await;
    let renewed = first_task(&renewed);
    assert_ne!(renewed["id"], id, "{renewed}");
    assert_eq!(renewed["key"], "k", "{renewed}");
    assert_eq!(renewed["priority"], 3, "{renewed}");
    assert_eq!(renewed["attempt"], 1, "{renewed}");

    // A settings change answers the group's running count as of the change.
    let (status, settings) = call(
        &cluster,
        1,
        Method::PUT,
        "/groups/r/settings",
        Some(json!({"clientid": 1, "max_running": 5})),
    )
    .await;
    assert_eq!(status, 200, "{settings}");
    assert_eq!(settings["running"], 1, "{settings}");
}

#[tokio::test]
async fn an_outcome_is_read_by_the_id_its_add_answered_through_any_node() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let adds = json!({"clientid": 1, "adds": [
        {"group": "ids", "key": "report", "data": "q3"},
        {"group": "ids", "data": "a seed task"}]});
    let added = post(&cluster, follower, "/update", adds).await;
    let id = added["tasks"][0]["id"].as_u64().expect("the job's task id");
    let seed = added["tasks"][1]["id"]
        .as_u64()
        .expect("the seed task's id");

    let job = get(&cluster, follower, &format!("/job?id={id}")).await;
    assert_eq!(
        (job["key"].clone(), job["id"].clone()),
        (json!("report"), json!(id))
    );
    assert_eq!(job["state"], "waiting");

    // A wait by id through a follower ends when a worker finishes the job.
    let waiter = spawn_get(&cluster, follower, format!("/job?id={id}&wait_ms=30000"));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let claimed = first_task(&post(&cluster, leader, "/claim", claim("ids", 5)).await);
    let running = get(&cluster, leader, &format!("/job?id={}", claimed["id"])).await;
    assert_eq!(
        (running["state"].clone(), running["id"].clone()),
        (json!("running"), json!(id)),
        "the live task's id names the job too"
    );
    let body = json!({"clientid": 5, "id": claimed["id"], "result": {"rows": 7}});
    post(&cluster, leader, "/finish", body).await;
    let (_, waited, _) = waiter.await.expect("the wait ended");
    assert_eq!(waited["state"], "succeeded", "{waited}");
    assert_eq!(waited["result"], json!({"rows": 7}));
    let read = get(&cluster, leader, &format!("/job?id={id}&consistency=stale")).await;
    assert_eq!(read["result"], json!({"rows": 7}));

    // A new run of the key has a new id; the old one, a seed task and an unknown id
    // name no job.
    let again = json!({"clientid": 1, "adds": [{"group": "ids", "key": "report"}]});
    let rerun = first_task(&post(&cluster, leader, "/update", again).await);
    let job = get(&cluster, follower, &format!("/job?id={}", rerun["id"])).await;
    assert_eq!(
        (job["run"].clone(), job["id"].clone()),
        (json!(2), rerun["id"].clone())
    );
    for gone in [id, seed, 1_000_000] {
        let path = format!("/job?id={gone}");
        let (status, json) = call(&cluster, follower, Method::GET, &path, None).await;
        assert_eq!(status, 404, "{path}: {json}");
        let message = json["error"].as_str().unwrap_or_default();
        assert!(message.contains("by group and key"), "{path}: {message}");
    }
    // A wait by id ends with the run its id names: a recurring job's next run begins at
    // the finish, and the answer shows it with the ended run's result and attempts.
    let recurring = json!({"clientid": 1, "adds": [
        {"group": "nightly", "key": "report", "every_ms": 600_000}]});
    let first_run = first_task(&post(&cluster, leader, "/update", recurring).await)["id"].clone();
    let path = format!("/job?id={first_run}&wait_ms=30000");
    let waiter = spawn_get(&cluster, follower, path);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let claimed = first_task(&post(&cluster, leader, "/claim", claim("nightly", 5)).await);
    let body = json!({"clientid": 5, "id": claimed["id"], "result": "run 1 done"});
    post(&cluster, leader, "/finish", body).await;
    let (status, waited, took) = waiter.await.expect("the wait ended");
    assert_eq!(status, 200, "{waited}");
    assert!(
        took < std::time::Duration::from_secs(20),
        "woken by the finish"
    );
    assert_eq!(
        (
            waited["run"].clone(),
            waited["state"].clone(),
            waited["result"].clone()
        ),
        (json!(2), json!("waiting"), json!("run 1 done")),
        "{waited}"
    );
    let ended = &waited["history"][0];
    assert_eq!(
        (ended["run"].clone(), ended["outcome"].clone()),
        (json!(1), json!("succeeded")),
        "{waited}"
    );
    let path = format!("/job?id={first_run}");
    let (status, json) = call(&cluster, leader, Method::GET, &path, None).await;
    assert_eq!(
        status, 404,
        "run 1's id names no job once run 2 began: {json}"
    );

    // With a retention of 0 the record goes with the finish: the wait ends with a 404.
    let settings = json!({"retention_ms": 0});
    let (status, json) = call(
        &cluster,
        leader,
        Method::PUT,
        "/groups/gone/settings",
        Some(settings),
    )
    .await;
    assert_eq!(status, 200, "{json}");
    let add = json!({"clientid": 1, "adds": [{"group": "gone", "key": "k"}]});
    let gone_id = first_task(&post(&cluster, leader, "/update", add).await)["id"].clone();
    let waiter = spawn_get(&cluster, leader, format!("/job?id={gone_id}&wait_ms=30000"));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let claimed = first_task(&post(&cluster, leader, "/claim", claim("gone", 5)).await);
    post(
        &cluster,
        leader,
        "/finish",
        json!({"clientid": 5, "id": claimed["id"]}),
    )
    .await;
    let (status, json, took) = waiter.await.expect("the wait ended");
    assert_eq!(status, 404, "{json}");
    assert!(
        took < std::time::Duration::from_secs(20),
        "ended by the drop"
    );

    for path in [
        "/job",
        "/job?consistency=stale",
        "/job?id=0",
        "/job?id=%2B5",
        "/job?id=abc",
        "/job?id=-3",
        "/job?id=",
        "/job?id=4&group=ids",
        "/job?id=4&key=report",
    ] {
        let (status, json) = call(&cluster, leader, Method::GET, path, None).await;
        assert_eq!(status, 400, "{path}: {json}");
        let message = json["error"].as_str().unwrap_or_default();
        assert!(message.contains("id"), "{path}: {message}");
    }
}
