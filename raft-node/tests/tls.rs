//! TLS through real nodes (issue 16): a cluster that speaks only TLS, refuses plain
//! HTTP, refuses Raft traffic from a certificate of another CA or of a node that is no
//! member, never lets a node with another CA's certificate join, keeps serving through 2 000 idle or half-finished handshakes, and reloads its
//! certificates on SIGHUP under load without failing a request.

mod common;

use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::CALL_TIMEOUT;
use common::TestCluster;
use common::eventually;
use hyper::Method;
use rcgen::BasicConstraints;
use rcgen::CertificateParams;
use rcgen::ExtendedKeyUsagePurpose;
use rcgen::IsCa;
use rcgen::Issuer;
use rcgen::KeyPair;
use rpc::client::ClientError;
use rpc::client::HttpClient;
use rpc::client::HttpResponse;
use rpc::tls::ClientTls;
use rpc::tls::ClientTlsFiles;
use rpc::worker::UpdateRequestJson;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

/// A CA in `dir` as `<name>-ca.pem`; its issuer.
fn make_ca(dir: &Path, name: &str) -> (PathBuf, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("a CA");
    let path = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&path, cert.pem()).expect("written");
    (path, Issuer::new(params, key))
}

/// A certificate for `names`, signed by `issuer`, as `<file>.pem` and `<file>.key`.
fn make_cert(
    dir: &Path,
    file: &str,
    issuer: &Issuer<'_, KeyPair>,
    names: &[&str],
) -> (PathBuf, PathBuf) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("names");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().expect("a key");
    let cert = params.signed_by(&key, issuer).expect("signed");
    let (cert_path, key_path) = (
        dir.join(format!("{file}.pem")),
        dir.join(format!("{file}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).expect("written");
    std::fs::write(&key_path, key.serialize_pem()).expect("written");
    (cert_path, key_path)
}

/// A client that trusts `ca` and presents `identity`, if any.
fn client(ca: &Path, identity: Option<(PathBuf, PathBuf)>) -> HttpClient {
    let tls = ClientTls::load(ClientTlsFiles {
        ca: ca.to_path_buf(),
        identity,
    })
    .expect("client TLS");
    HttpClient::new().with_tls(Some(tls))
}

struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    node: (PathBuf, PathBuf),
}

/// One certificate that names all three nodes and 127.0.0.1 (the test harness gives every
/// node the same flags).
fn pki() -> Pki {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (ca, issuer) = make_ca(dir.path(), "cluster");
    let node = make_cert(
        dir.path(),
        "nodes",
        &issuer,
        &["rota-node-1", "rota-node-2", "rota-node-3", "127.0.0.1"],
    );
    Pki {
        dir,
        ca,
        issuer,
        node,
    }
}

fn start(pki: &Pki) -> TestCluster {
    let args = [
        format!("--tls-cert={}", pki.node.0.display()),
        format!("--tls-key={}", pki.node.1.display()),
        format!("--tls-ca={}", pki.ca.display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = TestCluster::start_with(3, "always", &args);
    cluster.client = client(&pki.ca, None);
    cluster
}

fn one_add(group: &str) -> bytes::Bytes {
    let request =
        UpdateRequestJson::by(7).with_add(rpc::worker::AddJson::in_group(group).with_data("x"));
    serde_json::to_vec(&request).expect("json").into()
}

/// `client` posts one add in `group` to the node at `addr`.
async fn post_one_add(
    client: &HttpClient,
    addr: &str,
    group: &str,
) -> Result<HttpResponse, ClientError> {
    client
        .send(
            addr,
            Method::POST,
            "/update",
            &[],
            one_add(group),
            CALL_TIMEOUT,
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_tls_from_the_cluster_ca_and_members_is_served() {
    let pki = pki();
    let cluster = start(&pki);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let follower = if leader == 1 { 2 } else { 1 };

    // Writes through a follower: relayed to the leader over TLS, replicated over TLS.
    let answer = post_one_add(&cluster.client, cluster.api(follower), "g")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    // HTTP/2 over TLS (prior knowledge, as `rota bench --http 2` speaks it) is served too.
    let answer = post_one_add(
        &client(&pki.ca, None).with_http2(true),
        cluster.api(leader),
        "g",
    )
    .await
    .expect("an answer over HTTP/2");
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    cluster.wait_converged(&[1, 2, 3]).await;

    // Plain HTTP gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(cluster.api(1))
        .await
        .expect("connects");
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("sent");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut reply)).await;
    assert!(
        !reply.starts_with(b"HTTP/"),
        "plain HTTP was answered: {:?}",
        String::from_utf8_lossy(&reply)
    );

    // The Raft port: a certificate of another CA is refused in the handshake; one of the
    // cluster's CA naming no member gets 403; a member's is served.
    let raft = cluster.nodes[0].raft_addr.clone();
    let path = "/raft/clock-estimate";
    let (_, other_issuer) = make_ca(pki.dir.path(), "other");
    let stranger = make_cert(
        pki.dir.path(),
        "stranger",
        &other_issuer,
        &["rota-node-2", "127.0.0.1"],
    );
    let refused = client(&pki.ca, Some(stranger))
        .send(&raft, Method::POST, path, &[], "{}".into(), CALL_TIMEOUT)
        .await;
    assert!(
        refused
            .as_ref()
            .map_or(true, |r| !r.status.is_success() && r.status != 400),
        "a certificate of another CA reached the handler: {refused:?}"
    );
    let outsider = make_cert(
        pki.dir.path(),
        "outsider",
        &pki.issuer,
        &["rota-node-9", "127.0.0.1"],
    );
    let answer = client(&pki.ca, Some(outsider))
        .send(&raft, Method::POST, path, &[], "{}".into(), CALL_TIMEOUT)
        .await
        .expect("an answer");
    assert_eq!(answer.status, 403, "{:?}", answer.body);
    let answer = client(&pki.ca, Some(pki.node.clone()))
        .send(&raft, Method::POST, path, &[], "{}".into(), CALL_TIMEOUT)
        .await
        .expect("an answer");
    assert_ne!(answer.status, 403, "a member's certificate is served");
    let answer = client(&pki.ca, None)
        .send(&raft, Method::POST, path, &[], "{}".into(), CALL_TIMEOUT)
        .await;
    assert!(
        answer
            .as_ref()
            .map_or(true, |r| !r.status.is_success() && r.status != 400),
        "no certificate reached the handler: {answer:?}"
    );

    // 2 000 idle connections and half-finished handshakes from another address: the node
    // goes on serving others at once.
    let mut idle = Vec::new();
    for n in 0..2000 {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind("127.0.0.2:0".parse().expect("an address"))
            .expect("bound");
        let Ok(mut stream) = socket
            .connect(cluster.api(1).parse().expect("an address"))
            .await
        else {
            continue;
        };
        if n % 2 == 0 {
            // The first bytes of a ClientHello, and then nothing.
            let _ = stream
                .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
                .await;
        }
        idle.push(stream);
    }
    for _ in 0..5 {
        let health = cluster
            .client
            .get(cluster.api(1), "/health", Duration::from_secs(2))
            .await
            .expect("served beside 2 000 idle connections");
        assert_eq!(health.status, 200);
    }
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_reload_on_sighup_under_load_without_a_failed_request() {
    let pki = pki();
    let cluster = Arc::new(start(&pki));
    cluster.wait_ready(&[1, 2, 3]).await;
    cluster.wait_leader(&[1, 2, 3]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (cluster, stop, done) = (cluster.clone(), stop.clone(), done.clone());
        let ca = pki.ca.clone();
        writers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                // A fresh connection now and then, so new handshakes meet new certificates.
                let client = if done.load(Ordering::Relaxed) % 10 == 0 {
                    client(&ca, None)
                } else {
                    cluster.client.clone()
                };
                let via = cluster.api(1 + (w % 3));
                match post_one_add(&client, via, "reload").await {
                    Ok(answer) if answer.status == 200 => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    other => failures.push(format!("{other:?}")),
                }
            }
            failures
        }));
    }
    // New certificates from the same CA, swapped in place, then SIGHUP to every node.
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let fresh = make_cert(
            pki.dir.path(),
            &format!("fresh-{round}"),
            &pki.issuer,
            &["rota-node-1", "rota-node-2", "rota-node-3", "127.0.0.1"],
        );
        std::fs::copy(&fresh.0, &pki.node.0).expect("copied");
        std::fs::copy(&fresh.1, &pki.node.1).expect("copied");
        for id in 1..=3 {
            cluster.signal(id, "HUP");
        }
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for writer in writers {
        failures.extend(writer.await.expect("a writer"));
    }
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert!(
        done.load(Ordering::Relaxed) > 20,
        "too few writes to mean anything"
    );
    for id in 1..=3 {
        let log = std::fs::read_to_string(cluster.log_path(id)).unwrap_or_default();
        assert_eq!(
            log.matches("TLS certificates and keys reloaded").count(),
            3,
            "node {id} reloaded on each SIGHUP"
        );
    }
    // Connections made now get the new certificate and are served.
    eventually(|| async {
        let answer = client(&pki.ca, None)
            .get(cluster.api(2), "/health", CALL_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        (answer.status == 200)
            .then_some(())
            .ok_or("not served".to_string())
    })
    .await;
}

/// A free `127.0.0.1` port, as `host:port`.
fn free_port() -> String {
    common::free_addr().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_certificate_of_another_ca_cannot_join() {
    let pki = pki();
    let cluster = start(&pki);
    cluster.wait_ready(&[1, 2, 3]).await;
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    let answer = post_one_add(&cluster.client, cluster.api(leader), "g")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{:?}", answer.body);

    // Node 4 has a certificate naming it, but from another CA, which it trusts.
    let (other_ca, other_issuer) = make_ca(pki.dir.path(), "other");
    let (cert, key) = make_cert(
        pki.dir.path(),
        "impostor",
        &other_issuer,
        &["rota-node-4", "127.0.0.1"],
    );
    let (api, raft) = (free_port(), free_port());
    let data_dir = pki.dir.path().join("node-4");
    let mut impostor = std::process::Command::new(env!("CARGO_BIN_EXE_rota-node"))
        .args([
            "--id",
            "4",
            "--listen-api",
            &api,
            "--listen-raft",
            &raft,
            "--auth=off",
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg(format!("--tls-cert={}", cert.display()))
        .arg(format!("--tls-key={}", key.display()))
        .arg(format!("--tls-ca={}", other_ca.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("node 4 starts");

    // The admin adds it; the leader's replication to it never gets past the handshake.
    let body = serde_json::json!({"id": 4, "api_addr": api, "raft_addr": raft}).to_string();
    let added = cluster
        .client
        .send(
            cluster.api(leader),
            Method::POST,
            "/admin/add-learner",
            &[],
            body.into(),
            CALL_TIMEOUT,
        )
        .await
        .expect("an answer");
    assert_eq!(added.status, 200, "{:?}", added.body);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let own_ca = client(&other_ca, None);
    let hash = own_ca
        .get(&api, "/admin/state-hash", CALL_TIMEOUT)
        .await
        .expect("node 4 answers its own CA's clients");
    let hash: serde_json::Value = serde_json::from_slice(&hash.body).expect("JSON");
    assert_eq!(hash["tasks"], 0, "node 4 got the cluster's state: {hash}");
    assert!(
        hash["applied_index"].is_null(),
        "node 4 applied entries of the cluster: {hash}"
    );
    let status = cluster.status(leader).await.expect("the leader's status");
    assert!(
        status.learners.contains(&4) || status.nodes.iter().any(|n| n.id == 4),
        "{status:?}"
    );

    // The cluster goes on serving.
    let answer = post_one_add(&cluster.client, cluster.api(leader), "g")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let _ = impostor.kill();
    let _ = impostor.wait();
}

#[test]
fn missing_tls_files_are_an_invalid_setting_with_exit_status_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rota-node"))
        .args([
            "--id",
            "1",
            "--listen-api",
            &free_port(),
            "--listen-raft",
            &free_port(),
        ])
        .arg("--data-dir")
        .arg(dir.path().join("node"))
        .arg(format!(
            "--tls-cert={}",
            dir.path().join("missing.pem").display()
        ))
        .arg(format!(
            "--tls-key={}",
            dir.path().join("missing.key").display()
        ))
        .arg(format!(
            "--tls-ca={}",
            dir.path().join("missing-ca.pem").display()
        ))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("rota-node ran");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("missing.pem"), "names the file: {said}");
}
