//! Request rate limits (issue 16): a connection or a token over its rate gets 429 with
//! `Retry-After` and a JSON error, and other connections and tokens are served.

mod common;

use common::CALL_TIMEOUT;
use common::TestCluster;
use hyper::Method;
use hyper::header::AUTHORIZATION;
use hyper::header::HeaderValue;
use hyper::header::RETRY_AFTER;
use rpc::client::HttpClient;
use rpc::client::HttpResponse;
use serde_json::Value;
use std::time::Duration;
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

/// `GET path` on node 1 through `client`, with `token` if any.
async fn get(
    cluster: &TestCluster,
    client: &HttpClient,
    path: &str,
    token: Option<&str>,
) -> HttpResponse {
    let mut headers = Vec::new();
    if let Some(token) = token {
        let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("a header value");
        headers.push((AUTHORIZATION, value));
    }
    client
        .send(
            cluster.api(1),
            Method::GET,
            path,
            &headers,
            Default::default(),
            CALL_TIMEOUT,
        )
        .await
        .expect("the node answered")
}

fn assert_too_many(answer: &HttpResponse) {
    assert_eq!(answer.status, 429);
    assert_eq!(
        answer
            .headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = serde_json::from_slice(&answer.body).expect("a JSON body");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("requests a second")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_its_rate_gets_429_and_others_are_served() {
    let cluster = TestCluster::start_with(1, "always", &["--rate-limit-per-connection=20"]);
    cluster.wait_ready(&[1]).await;
    // 60 requests pipelined on one connection: a burst of 20 passes, the rest are held.
    let mut requests = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n".repeat(59);
    requests.push_str("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut stream = tokio::net::TcpStream::connect(cluster.api(1))
        .await
        .expect("connects");
    stream.write_all(requests.as_bytes()).await.expect("sent");
    let mut answers = Vec::new();
    tokio::time::timeout(CALL_TIMEOUT, stream.read_to_end(&mut answers))
        .await
        .expect("answered in time")
        .expect("read");
    let answers = String::from_utf8_lossy(&answers);
    let served = answers.matches("HTTP/1.1 200").count();
    let refused = answers.matches("HTTP/1.1 429").count();
    assert_eq!(served + refused, 60, "{answers}");
    assert!((20..=30).contains(&served), "{served} of 60 served");
    assert!(
        answers.contains("retry-after: 1") && answers.contains("requests a second"),
        "{answers}"
    );
    // A new connection has a bucket of its own.
    let fresh = get(&cluster, &HttpClient::new(), "/health", None).await;
    assert_eq!(fresh.status, 200);
    // The refusals, made before routing, are counted apart from every route.
    let metrics = get(&cluster, &HttpClient::new(), "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body);
    let counted =
        format!("rota_http_requests_total{{endpoint=\"GET unrouted\",status=\"429\"}} {refused}");
    assert!(
        metrics.lines().any(|l| l == counted),
        "{counted} in:\n{metrics}"
    );
}

/// How many of `count` health checks, sent one after another through `client`, node 1
/// served.
async fn served_of(cluster: &TestCluster, client: &HttpClient, count: usize) -> usize {
    let mut served = 0;
    for _ in 0..count {
        let answer = get(cluster, client, "/health", None).await;
        match answer.status.as_u16() {
            200 => served += 1,
            429 => assert_too_many(&answer),
            other => panic!("health answered {other}"),
        }
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_gets_the_rate_for_each_request_in_progress() {
    let cluster = TestCluster::start_with(1, "always", &["--rate-limit-per-connection=20"]);
    cluster.wait_ready(&[1]).await;
    let client = HttpClient::new().with_http2(true);
    // Nine watches of a quiet group, held on the one shared connection: with a health
    // check, ten requests are in progress, so the connection may send 200 a second.
    let watch_for = Duration::from_secs(4);
    let watches: Vec<_> = (0..9)
        .map(|_| {
            let client = client.clone();
            let api = cluster.api(1).to_string();
            tokio::spawn(async move {
                let started = Instant::now();
                let status = client
                    .get(
                        &api,
                        "/watch?group=quiet&wait_ms=4000",
                        Duration::from_secs(15),
                    )
                    .await
                    .map(|answer| answer.status.as_u16());
                (status, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let busy = served_of(&cluster, &client, 150).await;
    assert_eq!(busy, 150, "ten in progress: ten times the rate");
    for watch in watches {
        let (status, took) = watch.await.expect("joined");
        assert_eq!(status.expect("the watch answered"), 200);
        // Held for its whole wait, so it was in progress through the health checks.
        assert!(took >= watch_for - Duration::from_millis(500), "{took:?}");
    }
    // A new HTTP/2 connection that sends one request at a time is held to the rate, as
    // an HTTP/1.1 connection is: a second's burst, then what refills meanwhile.
    let started = Instant::now();
    let alone = served_of(&cluster, &HttpClient::new().with_http2(true), 150).await;
    let refilled = (20.0 * started.elapsed().as_secs_f64()).ceil() as usize;
    assert!(
        (20..=22 + refilled).contains(&alone),
        "{alone} of 150 served in {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_rate_gets_429_on_any_connection_and_others_are_served() {
    let cluster = TestCluster::start_with(
        1,
        "always",
        &[
            "--auth=tokens",
            "--rate-limit-per-token=20",
            "--rate-limit-per-connection=0",
        ],
    );
    cluster.wait_ready(&[1]).await;
    let made = cluster
        .client
        .send(
            cluster.api(1),
            Method::POST,
            "/admin/auth/bootstrap",
            &[],
            Default::default(),
            CALL_TIMEOUT,
        )
        .await
        .expect("bootstrapped");
    let made: Value = serde_json::from_slice(&made.body).expect("json");
    let admin = made["bearer"].as_str().expect("a token").to_string();
    let add = serde_json::json!({"name": "busy", "role": "reader"}).to_string();
    let busy = cluster
        .client
        .send(
            cluster.api(1),
            Method::POST,
            "/admin/tokens",
            &[(
                AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {admin}")).expect("value"),
            )],
            add.into(),
            CALL_TIMEOUT,
        )
        .await
        .expect("made");
    let busy: Value = serde_json::from_slice(&busy.body).expect("json");
    let busy = busy["bearer"].as_str().expect("a token").to_string();

    // Every request on a connection of its own: the token's bucket holds them back.
    let mut refused = Vec::new();
    for _ in 0..60 {
        let answer = get(
            &cluster,
            &HttpClient::new(),
            "/groups?consistency=stale",
            Some(&busy),
        )
        .await;
        if answer.status != 200 {
            refused.push(answer);
        }
    }
    assert!(refused.len() >= 30, "only {} of 60 refused", refused.len());
    refused.iter().for_each(assert_too_many);
    let other = get(
        &cluster,
        &HttpClient::new(),
        "/groups?consistency=stale",
        Some(&admin),
    )
    .await;
    assert_eq!(other.status, 200, "another token is served");
}
