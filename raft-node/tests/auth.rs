//! Tokens and roles through real nodes (issue 16): requests without a token, with a
//! revoked one, or with a role that does not allow them are refused with 401 or 403 and
//! a JSON error, and change nothing; a worker token limited to `jobs-` cannot touch
//! another group, through the leader or a follower.

mod common;

use common::CALL_TIMEOUT;
use common::TestCluster;
use common::eventually;
use hyper::Method;
use hyper::header::AUTHORIZATION;
use hyper::header::CONTENT_TYPE;
use hyper::header::HeaderValue;
use serde_json::Value;
use serde_json::json;

/// Sends `body` (or nothing) with `method` to node `via` with `token` (or none); the
/// status and JSON body.
async fn call(
    cluster: &TestCluster,
    via: u64,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_within(cluster, via, token, method, path, body, CALL_TIMEOUT).await
}

/// [`call`] with a deadline of `within`, for requests that wait.
async fn call_within(
    cluster: &TestCluster,
    via: u64,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
    within: std::time::Duration,
) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let mut headers = vec![(CONTENT_TYPE, HeaderValue::from_static("application/json"))];
    if let Some(token) = token {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("a header value");
        headers.push((AUTHORIZATION, value));
    }
    let response = cluster
        .client
        .send(
            cluster.api(via),
            method,
            path,
            &headers,
            bytes.into(),
            within,
        )
        .await
        .expect("the node answered");
    let json = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status.as_u16(), json)
}

/// Asserts a refusal with `status` and a JSON `error` that says something.
fn assert_refused((status, body): (u16, Value), expected: u16, doing: &str) {
    assert_eq!(status, expected, "{doing}: {body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(!error.is_empty(), "{doing}: no error message in {body}");
}

/// Makes a token with `admin` through node 1 and waits until every node accepts it.
async fn token(cluster: &TestCluster, admin: &str, body: Value) -> (String, String) {
    let (status, made) = call(
        cluster,
        1,
        Some(admin),
        Method::POST,
        "/admin/tokens",
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let bearer = made["bearer"].as_str().expect("a bearer").to_string();
    let id = made["id"].as_str().expect("an id").to_string();
    for node in 1..=3 {
        let bearer = bearer.clone();
        eventually(|| {
            let bearer = bearer.clone();
            async move {
                let (status, _) =
                    call(cluster, node, Some(&bearer), Method::GET, "/cluster", None).await;
                (status == 200)
                    .then_some(())
                    .ok_or(format!("node {node} answers {status}"))
            }
        })
        .await;
    }
    (id, bearer)
}

/// Makes the cluster's first admin token through node `via`; the answer.
async fn bootstrap(cluster: &TestCluster, via: u64) -> Value {
    let (status, first) = call(
        cluster,
        via,
        None,
        Method::POST,
        "/admin/auth/bootstrap",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    first
}

/// Every group the admin sees.
async fn groups(cluster: &TestCluster, admin: &str) -> Value {
    call(cluster, 1, Some(admin), Method::GET, "/groups", None)
        .await
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_roles_refuse_what_they_do_not_allow_and_change_nothing() {
    let cluster = TestCluster::start_with(3, "always", &["--auth=tokens"]);
    cluster.wait_ready(&[1, 2, 3]).await;

    // Probes stay open; everything else needs a token, and none exists yet.
    assert_eq!(
        call(&cluster, 1, None, Method::GET, "/health", None)
            .await
            .0,
        200
    );
    let add = json!({"clientid": 1, "adds": [{"group": "jobs-a", "data": "x"}]});
    assert_refused(
        call(
            &cluster,
            1,
            None,
            Method::POST,
            "/update",
            Some(add.clone()),
        )
        .await,
        401,
        "an update without a token",
    );
    assert_refused(
        call(&cluster, 1, None, Method::GET, "/cluster", None).await,
        401,
        "/cluster without a token",
    );

    // The first admin token, once (through node 2, whichever leads).
    let first = bootstrap(&cluster, 2).await;
    assert_eq!(first["role"], "admin");
    let admin = first["bearer"].as_str().expect("a bearer").to_string();
    assert_refused(
        call(
            &cluster,
            1,
            None,
            Method::POST,
            "/admin/auth/bootstrap",
            None,
        )
        .await,
        409,
        "a second bootstrap",
    );
    let (_, listed) = eventually(|| async {
        let answer = call(
            &cluster,
            1,
            Some(&admin),
            Method::GET,
            "/admin/tokens",
            None,
        )
        .await;
        (answer.0 == 200)
            .then_some(answer.clone())
            .ok_or(format!("{answer:?}"))
    })
    .await;
    assert_eq!(listed["tokens"].as_array().map(Vec::len), Some(1));
    assert!(
        !listed.to_string().contains(&admin[admin.len() - 20..]),
        "no secret is listed"
    );
    assert_eq!(
        groups(&cluster, &admin).await,
        json!([]),
        "nothing was written"
    );
    let (_, status) = call(&cluster, 1, Some(&admin), Method::GET, "/cluster", None).await;
    let leader = status["leader"].as_u64().expect("a leader");
    let follower = if leader == 1 { 2 } else { 1 };

    let (_, worker) = token(&cluster, &admin, json!({"name": "all", "role": "worker"})).await;
    let (limited_id, limited) = token(
        &cluster,
        &admin,
        json!({"name": "jobs", "role": "worker", "groups": ["jobs-"]}),
    )
    .await;
    let (_, reader) = token(&cluster, &admin, json!({"name": "look", "role": "reader"})).await;
    assert_refused(
        call(
            &cluster,
            1,
            Some(&admin),
            Method::POST,
            "/admin/tokens",
            Some(json!({"name": "x", "role": "reader", "groups": ["a"]})),
        )
        .await,
        400,
        "a reader token limited to groups",
    );

    // Roles.
    for via in [leader, follower] {
        assert_refused(
            call(
                &cluster,
                via,
                Some(&worker),
                Method::GET,
                "/admin/tokens",
                None,
            )
            .await,
            403,
            "a worker listing tokens",
        );
        assert_refused(
            call(
                &cluster,
                via,
                Some(&worker),
                Method::POST,
                "/admin/snapshot",
                None,
            )
            .await,
            403,
            "a worker asking for a snapshot",
        );
        assert_refused(
            call(
                &cluster,
                via,
                Some(&reader),
                Method::POST,
                "/update",
                Some(add.clone()),
            )
            .await,
            403,
            "a reader writing",
        );
        assert_refused(
            call(&cluster, via, Some(&worker), Method::GET, "/metrics", None).await,
            403,
            "a worker reading metrics",
        );
        assert_eq!(
            call(&cluster, via, Some(&reader), Method::GET, "/metrics", None)
                .await
                .0,
            200
        );
    }
    assert_eq!(
        groups(&cluster, &admin).await,
        json!([]),
        "nothing was written"
    );

    // A worker token limited to jobs-: in its groups it works, through any node.
    let (status, written) = call(
        &cluster,
        follower,
        Some(&limited),
        Method::POST,
        "/update",
        Some(add.clone()),
    )
    .await;
    assert_eq!(status, 200, "{written}");
    let other = json!({"clientid": 2, "adds": [{"group": "other", "data": "theirs"}]});
    let (status, theirs) = call(
        &cluster,
        1,
        Some(&worker),
        Method::POST,
        "/update",
        Some(other.clone()),
    )
    .await;
    assert_eq!(status, 200, "{theirs}");
    let theirs_id = theirs["tasks"][0]["id"].as_u64().expect("an id");
    let their_job = json!({"clientid": 2, "adds": [{"group": "other", "key": "k"}]});
    let (status, their_job) = call(
        &cluster,
        1,
        Some(&worker),
        Method::POST,
        "/update",
        Some(their_job),
    )
    .await;
    assert_eq!(status, 200, "{their_job}");
    let their_job_id = their_job["tasks"][0]["id"].as_u64().expect("an id");

    for via in [leader, follower] {
        assert_refused(
            call(
                &cluster,
                via,
                Some(&limited),
                Method::POST,
                "/update",
                Some(other.clone()),
            )
            .await,
            403,
            "a limited worker adding to another group",
        );
        let delete = json!({"clientid": 2, "deletes": [theirs_id]});
        let refused = call(
            &cluster,
            via,
            Some(&limited),
            Method::POST,
            "/update",
            Some(delete),
        )
        .await;
        // Not naming the group: a read of the task answers 404, as if it did not exist.
        let error = refused.1["error"].as_str().unwrap_or_default().to_string();
        assert!(!error.contains("other"), "{error}");
        assert_refused(
            refused,
            403,
            "a limited worker deleting another group's task",
        );
        let claim = json!({"clientid": 3, "group": "other", "duration": 1000});
        assert_refused(
            call(
                &cluster,
                via,
                Some(&limited),
                Method::POST,
                "/claim",
                Some(claim),
            )
            .await,
            403,
            "a limited worker claiming from another group",
        );
        assert_refused(
            call(
                &cluster,
                via,
                Some(&limited),
                Method::GET,
                "/group/other",
                None,
            )
            .await,
            403,
            "a limited worker listing another group",
        );
        let (status, visible) = call(
            &cluster,
            via,
            Some(&limited),
            Method::GET,
            "/groups?consistency=stale",
            None,
        )
        .await;
        assert_eq!(status, 200);
        assert!(
            visible
                .as_array()
                .is_some_and(|g| g.iter().all(|g| g != "other")),
            "another group is not listed: {visible}"
        );
        let (status, task) = call(
            &cluster,
            via,
            Some(&limited),
            Method::GET,
            &format!("/task/{theirs_id}?consistency=stale"),
            None,
        )
        .await;
        assert_eq!(status, 404, "another group's task is not there: {task}");
        let (status, job) = call(
            &cluster,
            via,
            Some(&limited),
            Method::GET,
            &format!("/job?id={their_job_id}"),
            None,
        )
        .await;
        assert_eq!(status, 404, "another group's job is not there by id: {job}");
    }
    let (status, job) = call(
        &cluster,
        follower,
        Some(&worker),
        Method::GET,
        &format!("/job?id={their_job_id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "a token of every group reads it by id: {job}");
    assert_eq!(job["key"], "k");
    let (status, still) = call(
        &cluster,
        leader,
        Some(&admin),
        Method::GET,
        &format!("/task/{theirs_id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "the other group's task is untouched: {still}");
    assert_eq!(still["data"], "theirs");
    assert_eq!(groups(&cluster, &admin).await, json!(["jobs-a", "other"]));

    // Revoked: refused everywhere, once every node has applied the revocation.
    let (status, revoked) = call(
        &cluster,
        follower,
        Some(&admin),
        Method::DELETE,
        &format!("/admin/tokens/{limited_id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{revoked}");
    for via in 1..=3 {
        eventually(|| {
            let add = add.clone();
            let limited = limited.clone();
            let cluster = &cluster;
            async move {
                let answer = call(
                    cluster,
                    via,
                    Some(&limited),
                    Method::POST,
                    "/update",
                    Some(add),
                )
                .await;
                (answer.0 == 401)
                    .then_some(())
                    .ok_or(format!("node {via} answered {answer:?}"))
            }
        })
        .await;
    }
    let (_, page) = call(
        &cluster,
        1,
        Some(&admin),
        Method::GET,
        "/group/jobs-a",
        None,
    )
    .await;
    assert_eq!(
        page.as_array().map(Vec::len),
        Some(1),
        "the revoked token wrote nothing: {page}"
    );
    assert_refused(
        call(
            &cluster,
            1,
            Some("rota_0123456789abcdef_nonsense"),
            Method::GET,
            "/groups",
            None,
        )
        .await,
        401,
        "a malformed token",
    );
}

/// A follower that has not applied a token yet (it was stopped while the token was
/// made) never refuses it: it asks the leader (`/auth/whoami`), which knows the token,
/// and serves the request as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_on_tokens_relays_instead_of_refusing() {
    let cluster = TestCluster::start_with(3, "always", &["--auth=tokens"]);
    cluster.wait_ready(&[1, 2, 3]).await;
    let first = eventually(|| {
        let cluster = &cluster;
        async move {
            let (status, first) = call(
                cluster,
                1,
                None,
                Method::POST,
                "/admin/auth/bootstrap",
                Some(json!({})),
            )
            .await;
            (status == 200)
                .then_some(first.clone())
                .ok_or(format!("bootstrap answered {status} {first}"))
        }
    })
    .await;
    let admin = first["bearer"].as_str().expect("a bearer").to_string();
    let (status, cluster_status) =
        call(&cluster, 1, Some(&admin), Method::GET, "/cluster", None).await;
    assert_eq!(status, 200, "{cluster_status}");
    let leader = cluster_status["leader"].as_u64().expect("a leader");
    let behind = if leader == 1 { 2 } else { 1 };

    for round in 0..5 {
        cluster.signal(behind, "STOP");
        let (status, made) = call(
            &cluster,
            leader,
            Some(&admin),
            Method::POST,
            "/admin/tokens",
            Some(json!({"name": format!("made while {behind} slept"), "role": "worker"})),
        )
        .await;
        assert_eq!(status, 200, "{made}");
        let bearer = made["bearer"].as_str().expect("a bearer").to_string();
        cluster.signal(behind, "CONT");
        // Sent at once: the follower may or may not have applied the token by then.
        let add = json!({"clientid": 7, "adds": [{"group": "g", "data": format!("r{round}")}]});
        let (status, answer) = call(
            &cluster,
            behind,
            Some(&bearer),
            Method::POST,
            "/update",
            Some(add),
        )
        .await;
        assert_eq!(
            status, 200,
            "round {round}: node {behind} answered {answer}"
        );
        eventually(|| {
            let (cluster, bearer) = (&cluster, bearer.clone());
            async move {
                let (status, read) = call(
                    cluster,
                    behind,
                    Some(&bearer),
                    Method::GET,
                    "/group/g?consistency=stale",
                    None,
                )
                .await;
                assert_ne!(status, 401, "round {round}: a stale read answered {read}");
                let caught_up = read.as_array().is_some_and(|tasks| tasks.len() > round);
                (status == 200 && caught_up)
                    .then_some(())
                    .ok_or(format!("{status} {read}"))
            }
        })
        .await;
    }

    // Any node says which token a caller sends.
    let (status, who) = call(
        &cluster,
        behind,
        Some(&admin),
        Method::GET,
        "/auth/whoami",
        None,
    )
    .await;
    assert_eq!(status, 200, "{who}");
    assert_eq!(
        (who["auth"].clone(), who["role"].clone()),
        (json!(true), json!("admin"))
    );
    assert_eq!(who["id"].as_str().map(str::len), Some(16), "{who}");

    // A token nobody made is still refused, by the leader's word, through the follower.
    let unknown = format!("rota_{}_{}", "0".repeat(16), "1".repeat(64));
    assert_refused(
        call(
            &cluster,
            behind,
            Some(&unknown),
            Method::GET,
            "/groups",
            None,
        )
        .await,
        401,
        "a token nobody made, through a follower",
    );
}

/// A request that waits (a blocking claim, a long-poll watch) checks its token again
/// before it claims or answers: one revoked meanwhile claims nothing and reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waited_takes_nothing_once_its_token_is_revoked() {
    let cluster = TestCluster::start_with(3, "always", &["--auth=tokens"]);
    cluster.wait_ready(&[1, 2, 3]).await;
    let first = bootstrap(&cluster, 1).await;
    let admin = first["bearer"].as_str().expect("a bearer").to_string();
    let (worker_id, worker) = token(&cluster, &admin, json!({"name": "w", "role": "worker"})).await;
    let (_, status) = call(&cluster, 1, Some(&admin), Method::GET, "/cluster", None).await;
    let leader = status["leader"].as_u64().expect("a leader");
    let follower = leader % 3 + 1;
    let (status, page) = call(
        &cluster,
        follower,
        Some(&worker),
        Method::GET,
        "/watch?group=rv",
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let revision = page["revision"].as_u64().expect("a revision");

    let wait = std::time::Duration::from_secs(30);
    let claim = {
        let (cluster, worker) = (&cluster, worker.clone());
        let body = json!({"clientid": 77, "group": "rv", "duration": 60000, "wait_ms": 20000});
        async move {
            call_within(
                cluster,
                follower,
                Some(&worker),
                Method::POST,
                "/claim",
                Some(body),
                wait,
            )
            .await
        }
    };
    let watch = {
        let (cluster, worker) = (&cluster, worker.clone());
        let path = format!("/watch?group=rv&after={revision}&wait_ms=20000");
        async move {
            call_within(
                cluster,
                follower,
                Some(&worker),
                Method::GET,
                &path,
                None,
                wait,
            )
            .await
        }
    };
    let revoke_then_add = async {
        // Both requests are waiting by now.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (status, revoked) = call(
            &cluster,
            leader,
            Some(&admin),
            Method::DELETE,
            &format!("/admin/tokens/{worker_id}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{revoked}");
        let add = json!({"clientid": 1, "adds": [{"group": "rv", "data": "x"}]});
        let (status, added) = call(
            &cluster,
            leader,
            Some(&admin),
            Method::POST,
            "/update",
            Some(add),
        )
        .await;
        assert_eq!(status, 200, "{added}");
    };
    let (claimed, watched, ()) = tokio::join!(claim, watch, revoke_then_add);
    assert_refused(claimed, 401, "a blocking claim whose token was revoked");
    assert_refused(watched, 401, "a long-poll watch whose token was revoked");
    // The task was not claimed: the admin's claim gets it.
    let body = json!({"clientid": 2, "group": "rv", "duration": 60000});
    let (status, tasks) = call(
        &cluster,
        leader,
        Some(&admin),
        Method::POST,
        "/claim",
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{tasks}");
    assert_eq!(
        tasks["tasks"][0]["data"], "x",
        "the task was still claimable: {tasks}"
    );
}

/// An event stream checks its token at every change it sends: once the token is revoked,
/// the stream ends with an `error` event. (A node serves a stream only once it holds the
/// stream's token, waiting up to a second for it, so that it sees the revocation; this
/// test opens the stream on a follower just after the token was made, but cannot force
/// the follower to be behind.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_ends_once_its_token_is_revoked() {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    let cluster = TestCluster::start_with(3, "never", &["--auth=tokens"]);
    cluster.wait_ready(&[1, 2, 3]).await;
    let first = bootstrap(&cluster, 1).await;
    let admin = first["bearer"].as_str().expect("a bearer").to_string();
    let (_, status) = call(&cluster, 1, Some(&admin), Method::GET, "/cluster", None).await;
    let leader = status["leader"].as_u64().expect("a leader");
    let follower = leader % 3 + 1;
    let (worker_id, worker) = token(&cluster, &admin, json!({"name": "w", "role": "worker"})).await;

    let addr = cluster.api(follower).to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!(
        "GET /watch?group=sse HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nAuthorization: Bearer {worker}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut text = String::new();
    let mut buffer = [0u8; 4096];
    let mut read_until = async |stream: &mut tokio::net::TcpStream, want: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !text.contains(want) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {want:?} in: {text}"
            );
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut buffer))
                    .await
                    .expect("the stream went quiet")
                    .expect("read");
            if read == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buffer[..read]));
        }
        text.clone()
    };
    let opened = read_until(&mut stream, "\r\n\r\n").await;
    assert!(opened.starts_with("HTTP/1.1 200"), "{opened}");

    let add = |data: &'static str| json!({"clientid": 1, "adds": [{"group": "sse", "data": data}]});
    let (status, added) = call(
        &cluster,
        leader,
        Some(&admin),
        Method::POST,
        "/update",
        Some(add("before")),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    let seen = read_until(&mut stream, "event: task").await;
    assert!(seen.contains("before"), "{seen}");

    let (status, revoked) = call(
        &cluster,
        leader,
        Some(&admin),
        Method::DELETE,
        &format!("/admin/tokens/{worker_id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{revoked}");
    let (status, added) = call(
        &cluster,
        leader,
        Some(&admin),
        Method::POST,
        "/update",
        Some(add("after")),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    let ended = read_until(&mut stream, "event: error").await;
    assert!(
        ended.contains("event: error"),
        "ended without saying why: {ended}"
    );
    assert!(
        !ended.contains("after"),
        "a revoked token read a change: {ended}"
    );
}

/// A blocking claim of a token limited to some groups, depending on another group's
/// job cancelled while it ran, gets the answer the same claim without a wait gets (403, naming
/// neither the group nor the key), not a `Missing` from the check before its wait.
#[tokio::test]
async fn a_blocking_claim_on_another_groups_cancelled_task_is_out_of_scope() {
    let cluster = TestCluster::start_with(3, "never", &["--auth=tokens"]);
    cluster.wait_ready(&[1, 2, 3]).await;
    let first = bootstrap(&cluster, 1).await;
    let admin = first["bearer"].as_str().expect("a bearer").to_string();
    let (_, limited) = token(
        &cluster,
        &admin,
        json!({"name": "mine", "role": "worker", "groups": ["mine-"]}),
    )
    .await;
    // The rule is the log form 4 one: wait until the new cluster has recorded it.
    eventually(|| async {
        let (_, status) = call(&cluster, 1, Some(&admin), Method::GET, "/cluster", None).await;
        let form = status["log_form"].as_u64().unwrap_or_default();
        (form >= u64::from(raft_node::log_forms::LOG_FORMS_READ))
            .then_some(())
            .ok_or(format!("log form {form}"))
    })
    .await;
    let add = json!({"clientid": 1, "adds": [{"group": "other", "key": "secret-key"}]});
    let (status, added) = call(
        &cluster,
        1,
        Some(&admin),
        Method::POST,
        "/update",
        Some(add),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    // Running when it is cancelled: the cluster then remembers the cancel for its owner.
    let claim = json!({"clientid": 2, "group": "other", "duration": 60_000});
    let (status, claimed) = call(
        &cluster,
        1,
        Some(&admin),
        Method::POST,
        "/claim",
        Some(claim),
    )
    .await;
    assert_eq!(status, 200, "{claimed}");
    let theirs = claimed["tasks"][0]["id"].as_u64().expect("an id");
    let cancel = json!({"clientid": 1, "group": "other", "keys": ["secret-key"]});
    let (status, cancelled) = call(
        &cluster,
        1,
        Some(&admin),
        Method::POST,
        "/cancel",
        Some(cancel),
    )
    .await;
    assert_eq!(status, 200, "{cancelled}");

    for wait_ms in [0, 2_000] {
        let claim = json!({"clientid": 3, "group": "mine-a", "duration": 60_000,
            "depends": [theirs], "wait_ms": wait_ms});
        let (status, refused) = call(
            &cluster,
            1,
            Some(&limited),
            Method::POST,
            "/claim",
            Some(claim),
        )
        .await;
        assert_eq!(status, 403, "wait_ms {wait_ms}: {refused}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(
            !error.contains("other") && !error.contains("secret-key"),
            "wait_ms {wait_ms}: {error}"
        );
    }
}
