//! What clients nobody on the project wrote found (issue 20): oversized bodies read
//! their 413 with Python's standard client, slow bodies and connection floods are cut,
//! and every error answer, hyper's own included, is JSON. Issue 18: one peer holding
//! idle connections past its share, trickling headers a byte a second and opening and
//! dropping connections in a loop, all at once, does not keep another peer from being
//! served.

mod common;

use std::io::Read;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::TestCluster;
use serde_json::json;

/// Sends `request` as raw bytes and reads the whole answer (the node closes after it,
/// or `read_for` passes).
fn raw_exchange(addr: &str, request: &[u8], read_for: Duration) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(read_for)).expect("timeout");
    stream.write_all(request).expect("send");
    read_answer(&mut stream)
}

/// Reads until the peer closes or stops sending.
fn read_answer(stream: &mut TcpStream) -> String {
    read_answer_and_close(stream).0
}

/// Reads until the peer closes or stops sending; whether it closed.
fn read_answer_and_close(stream: &mut TcpStream) -> (String, bool) {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Err(_) => break false,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    };
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

/// The status code and JSON `error` of a raw answer; fails the test if the body is not
/// `{"error": ...}`.
fn status_and_error(answer: &str) -> (u16, String) {
    let status: u16 = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .unwrap_or_else(|| panic!("no body in {answer:?}"));
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("body {body:?} is not JSON: {e}"));
    let error = json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {body}"))
        .to_string();
    (status, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_json_errors() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let addr = cluster.api(1).to_string();
    let read_for = Duration::from_secs(5);
    let cases: [(&str, &[u8]); 4] = [
        ("garbage request line", b"HELLO THERE\r\n\r\n"),
        (
            "absurd Content-Length",
            b"POST /update HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999999\r\n\r\n",
        ),
        (
            "two Content-Lengths that differ",
            b"POST /update HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        ),
        ("HTTP/1.1 without Host", b"GET /groups HTTP/1.1\r\n\r\n"),
    ];
    for (what, request) in cases {
        // Each is answered and the connection closed: after a malformed request nothing
        // on it can be trusted to frame the next.
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream.set_read_timeout(Some(read_for)).expect("timeout");
        stream.write_all(request).expect("send");
        let (answer, closed) = read_answer_and_close(&mut stream);
        assert!(closed, "{what}: the connection stayed open after {answer}");
        let (status, error) = status_and_error(&answer);
        assert_eq!(status, 400, "{what}: {answer}");
        assert!(!error.is_empty(), "{what}: {answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{what}: {answer}"
        );
    }
    // HTTP/1.0 has no Host requirement.
    let answer = raw_exchange(&addr, b"GET /groups HTTP/1.0\r\n\r\n", read_for);
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    // The request without a Host header was refused before routing, and counted so.
    let metrics = raw_exchange(
        &addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        read_for,
    );
    assert!(
        metrics.contains("rota_http_requests_total{endpoint=\"GET unrouted\",status=\"400\"} 1"),
        "{metrics}"
    );
    // A path no route has says which paths the worker API has, with their methods.
    let answer = raw_exchange(
        &addr,
        b"PUT /task HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
        read_for,
    );
    let (status, error) = status_and_error(&answer);
    assert_eq!(status, 404, "{answer}");
    for route in [
        "GET /task/{id}",
        "POST /update",
        "POST /claim",
        "/openapi.json",
    ] {
        assert!(error.contains(route), "{route} is not named: {error}");
    }
    // The node serves on.
    assert!(cluster.status(1).await.is_some());
}

/// The relay's own header, sent by a client, is refused with a reason instead of
/// leaving a follower unable to relay the request (a 503 for as long as it retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_up_relay_header_is_refused_and_a_follower_still_relays() {
    let cluster = TestCluster::start(3, "never");
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = leader % 3 + 1;
    let addr = cluster.api(follower).to_string();
    let read_for = Duration::from_secs(5);
    let body = r#"{"clientid":1,"adds":[{"group":"h","data":"x"}]}"#;
    let own = follower.to_string();
    let other = leader.to_string();
    let twice = format!("{other}\r\nX-Rota-Forwarded-By: {other}");
    for value in ["me", "0", "-1", own.as_str(), twice.as_str()] {
        let request = format!(
            "POST /update HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Rota-Forwarded-By: {value}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = raw_exchange(&addr, request.as_bytes(), read_for);
        let (status, error) = status_and_error(&answer);
        assert_eq!(status, 400, "{value:?}: {answer}");
        assert!(
            error.contains("x-rota-forwarded-by header is for the nodes' own relays (once,"),
            "{value:?}: {error}"
        );
    }
    // Every route, not only the worker API's.
    let answer = raw_exchange(
        &addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Rota-Forwarded-By: me\r\n\r\n",
        read_for,
    );
    assert_eq!(status_and_error(&answer).0, 400, "{answer}");
    // Without it, the follower relays the write to the leader.
    let request = format!(
        "POST /update HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = raw_exchange(&addr, request.as_bytes(), read_for);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_expects_100_continue_gets_413_before_it_sends() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let request = format!(
        "POST /update HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        2 * 1024 * 1024
    );
    // Nothing of the body is sent: the answer must come anyway.
    let answer = raw_exchange(cluster.api(1), request.as_bytes(), Duration::from_secs(5));
    let (status, error) = status_and_error(&answer);
    assert_eq!(status, 413, "{answer}");
    assert!(error.contains("larger than"), "{error}");
}

/// Python's standard client sends the whole body before it reads; it must read the 413
/// and its JSON every time, with writers busy on the same node meanwhile.
const PYTHON_OVERSIZED_POSTS: &str = r#"
import json, sys, urllib.error, urllib.request
url, rounds = sys.argv[1], int(sys.argv[2])
body = b'{"clientid": 1, "adds": [{"group": "big", "data": "' + b"x" * (2 * 1024 * 1024) + b'"}]}'
for i in range(rounds):
    request = urllib.request.Request(url + "/update", data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30)
        sys.exit(f"round {i}: an oversized body was accepted")
    except urllib.error.HTTPError as e:
        if e.code != 413:
            sys.exit(f"round {i}: status {e.code}, not 413")
        error = json.loads(e.read())["error"]
        if "larger than" not in error:
            sys.exit(f"round {i}: unexpected error {error!r}")
print(f"{rounds} oversized bodies, {rounds} answers of 413 with a JSON error")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_clients_read_the_413_of_an_oversized_body_under_load() {
    let cluster = Arc::new(TestCluster::start(3, "always"));
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;

    // Writers keep every node busy while the oversized bodies arrive.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for worker in 0..16u64 {
        let (cluster, stop, acknowledged) = (cluster.clone(), stop.clone(), acknowledged.clone());
        writers.push(tokio::spawn(async move {
            let node = 1 + worker % 3;
            while !stop.load(Ordering::Relaxed) {
                let add = json!({"clientid": worker, "adds": [{"group": "load", "data": "x"}]});
                if cluster.write(node, "/update", &add).await.is_ok() {
                    acknowledged.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    for node in [leader, 1 + leader % 3] {
        let url = format!("http://{}", cluster.api(node));
        let script = PYTHON_OVERSIZED_POSTS.to_string();
        let output = tokio::task::spawn_blocking(move || {
            Command::new("python3")
                .args(["-c", &script, &url, "10"])
                .output()
                .expect("python3 runs (it is a test prerequisite)")
        })
        .await
        .expect("python finished");
        assert!(
            output.status.success(),
            "node {node}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer");
    }
    assert!(
        acknowledged.load(Ordering::Relaxed) > 0,
        "the writers made progress"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_cut_with_408() {
    let cluster = TestCluster::start(1, "always");
    cluster.wait_ready(&[1]).await;
    let mut stream = TcpStream::connect(cluster.api(1)).expect("connect");
    // Headers and part of the body, then nothing: the node must not wait forever.
    stream
        .write_all(
            b"POST /update HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"clientid\": 1",
        )
        .expect("send");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let answer = tokio::task::spawn_blocking(move || read_answer(&mut stream))
        .await
        .expect("read");
    let (status, error) = status_and_error(&answer);
    assert_eq!(status, 408, "{answer}");
    assert!(error.contains("did not arrive"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limits_get_503_and_the_rest_are_served() {
    let cluster = TestCluster::start_with(
        1,
        "always",
        &[
            "--connections-max",
            "64",
            "--connections-per-peer-max",
            "24",
        ],
    );
    cluster.wait_ready(&[1]).await;
    // The test's own HTTP client keeps a pooled connection or two open as well.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..30 {
        let mut stream = TcpStream::connect(cluster.api(1)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let mut first = [0u8; 1];
        // An admitted connection waits silently for a request; a refused one is answered.
        match stream.peek(&mut first) {
            Ok(n) if n > 0 => {
                refused = Some(read_answer(&mut stream));
                break;
            }
            _ => held.push(stream),
        }
    }
    let answer = refused.expect("a connection over the per-peer limit is refused");
    assert!(held.len() <= 24, "{} connections were admitted", held.len());
    let (status, error) = status_and_error(&answer);
    assert_eq!(status, 503, "{answer}");
    assert!(error.contains("limit of 24"), "{error}");
    // Closing connections frees their places.
    drop(held);
    common::eventually(|| async {
        let answer = raw_exchange(
            cluster.api(1),
            b"GET /groups HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        );
        if answer.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(format!("still refused: {answer}"))
        }
    })
    .await;
}

/// A request from 127.0.0.2 (another peer address on loopback), answered in full.
async fn get_from_other_peer(addr: &str, path: &str) -> String {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.2:0".parse().expect("an address"))
        .expect("bind to another loopback address");
    let mut stream = socket
        .connect(addr.parse().expect("the node's address"))
        .await
        .expect("connect from the other address");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer));
    let _ = read.await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holding_idle_connections_trickling_headers_and_churning_does_not_starve_others() {
    let cluster = TestCluster::start_with(
        1,
        "never",
        &[
            "--connections-max",
            "400",
            "--connections-per-peer-max",
            "150",
        ],
    );
    cluster.wait_ready(&[1]).await;
    let addr = cluster.api(1).to_string();
    let stop = Arc::new(AtomicBool::new(false));

    // 1. Idle connections from 127.0.0.1, beyond its per-peer share.
    let mut idle = Vec::new();
    for _ in 0..200 {
        if let Ok(stream) = TcpStream::connect(&addr) {
            idle.push(stream);
        }
    }
    // 2. Headers one byte a second, on a few more connections.
    let tricklers: Vec<_> = (0..8)
        .map(|_| {
            let (addr, stop) = (addr.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let Ok(mut stream) = TcpStream::connect(&addr) else {
                    return false;
                };
                let request = b"GET /groups HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
                for byte in request {
                    if stop.load(Ordering::Relaxed) {
                        return false;
                    }
                    if stream.write_all(&[*byte]).is_err() {
                        // Cut by the node: its header timeout.
                        return true;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                false
            })
        })
        .collect();
    // 3. Connections opened and dropped in a loop.
    let churned = Arc::new(AtomicU64::new(0));
    let churner = {
        let (addr, stop, churned) = (addr.clone(), Arc::clone(&stop), Arc::clone(&churned));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if TcpStream::connect(&addr).is_ok() {
                    churned.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // Meanwhile another peer is served, request after request.
    // Past the node's 10 s header timeout, so the tricklers have been cut by the end.
    let served_until = std::time::Instant::now() + Duration::from_secs(14);
    let mut served = 0;
    while std::time::Instant::now() < served_until {
        let answer = get_from_other_peer(&addr, "/groups").await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "another peer was refused: {answer}"
        );
        served += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    churner.join().expect("the churner ends");
    let cut = tricklers
        .into_iter()
        .map(|t| t.join().expect("a trickler ends"))
        .filter(|&cut| cut)
        .count();
    assert!(served > 10, "served {served} requests");
    assert!(churned.load(Ordering::Relaxed) > 100, "the churn ran");
    assert_eq!(
        cut, 8,
        "every trickling connection was cut before its headers ended"
    );
    // The idle connections beyond the per-peer limit were refused, not held.
    let answered = idle
        .iter_mut()
        .filter(|stream| {
            stream
                .set_read_timeout(Some(Duration::from_millis(50)))
                .is_ok()
                && stream.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0)
        })
        .count();
    assert!(
        answered >= 50,
        "connections over the per-peer limit were answered 503: {answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_say_nothing_or_stall_in_http2_are_closed() {
    let cluster = TestCluster::start(1, "never");
    cluster.wait_ready(&[1]).await;
    let addr = cluster.api(1).to_string();
    // An empty HTTP/2 SETTINGS frame: length 0, type 4, no flags, stream 0.
    let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0];
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let idle_http2: Vec<u8> = preface.iter().chain(settings.iter()).copied().collect();
    let openings: Vec<(&str, Vec<u8>)> = vec![
        ("nothing at all", Vec::new()),
        ("half the HTTP/2 preface", preface[..12].to_vec()),
        ("an HTTP/2 connection without a request", idle_http2),
    ];
    let started = std::time::Instant::now();
    let closers: Vec<_> = openings
        .into_iter()
        .map(|(what, bytes)| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(&addr).expect("connect");
                stream.write_all(&bytes).expect("send");
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                // Whatever the node says (HTTP/2 settings, a GOAWAY), it ends with a close.
                let mut buf = [0u8; 1024];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) => return (what, true),
                        Ok(_) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                            return (what, true);
                        }
                        Err(_) => return (what, false),
                    }
                }
            })
        })
        .collect();
    for closer in closers {
        let (what, closed) = closer.join().expect("a reader ends");
        assert!(
            closed,
            "a connection that sent {what} was still open after 30 s"
        );
    }
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "not closed before the idle deadline: {:?}",
        started.elapsed()
    );
}
