//! `rota task ...` and `rota groups` against a one-node local cluster.

mod common;

use common::node_binary;
use std::io::Write;
use std::process::Command;
use std::process::Stdio;

/// Runs rota with `stdin`; returns (exit code, stdout, stderr).
fn rota(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(args)
        .env("ROTA_NODE_BIN", node_binary())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rota runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("writes stdin");
    let output = child.wait_with_output().expect("finishes");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn tasks(json: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"))
}

#[test]
fn task_commands_speak_the_worker_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_arg = dir.path().to_str().expect("utf-8");
    let (code, urls, stderr) = rota(&["dev", "up", "--nodes", "1", "--dir", dir_arg], "");
    assert_eq!(code, 0, "{stderr}");
    let url = urls.lines().next().expect("a URL").to_string();

    let (code, out, err) = rota(
        &[
            "task", "add", "--url", &url, "--group", "map", "--data", "@-", "--json",
        ],
        "from stdin",
    );
    assert_eq!(code, 0, "{err}");
    let added = tasks(&out);
    assert_eq!(added[0]["data"], "from stdin");
    let first = added[0]["id"].as_u64().expect("id");

    let (code, out, _) = rota(&["groups", "--url", &url], "");
    assert_eq!((code, out.trim()), (0, "map"));

    let (code, out, err) = rota(
        &[
            "task",
            "claim",
            "--url",
            &url,
            "--group",
            "map",
            "--client-id",
            "7",
            "--json",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let claimed = tasks(&out)[0]["id"].as_u64().expect("claimed id");
    assert!(claimed > first);

    // Renew the claim: a new version, still owned by client 7.
    let (code, out, err) = rota(
        &[
            "task",
            "update",
            "--url",
            &url,
            "--id",
            &claimed.to_string(),
            "--client-id",
            "7",
            "--timespec",
            "-60000",
            "--json",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let renewed = tasks(&out)[0]["id"].as_u64().expect("renewed id");

    let (code, out, _) = rota(&["task", "list", "--url", &url, "--group", "map"], "");
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().count(),
        1,
        "only the header: the task is owned: {out}"
    );
    let (code, out, _) = rota(
        &["task", "list", "--url", &url, "--group", "map", "--owned"],
        "",
    );
    assert_eq!(code, 0);
    assert!(out.contains(&renewed.to_string()), "{out}");

    // Another client is refused (exit 1) and told why.
    let (code, _, err) = rota(
        &[
            "task",
            "delete",
            "--url",
            &url,
            "--client-id",
            "8",
            &renewed.to_string(),
        ],
        "",
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is owned by client 7"), "{err}");
    let (code, _, err) = rota(
        &[
            "task",
            "delete",
            "--url",
            &url,
            "--client-id",
            "7",
            &renewed.to_string(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = rota(
        &[
            "task",
            "get",
            "--url",
            &url,
            "--json",
            &first.to_string(),
            &renewed.to_string(),
        ],
        "",
    );
    assert_eq!(code, 0);
    assert_eq!(
        tasks(&out),
        vec![serde_json::Value::Null, serde_json::Value::Null]
    );

    // A backup with a checksum that sha256sum accepts.
    let file = dir.path().join("backup.snapshot");
    let (code, out, err) = rota(
        &[
            "cluster",
            "backup",
            "--url",
            &url,
            "--out",
            file.to_str().expect("utf-8"),
            "--json",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        report["state_hash"].as_str().map(str::len),
        Some(64),
        "{out}"
    );
    let check = Command::new("sha256sum")
        .arg("-c")
        .arg("backup.snapshot.sha256")
        .current_dir(dir.path())
        .output()
        .expect("sha256sum runs");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    assert!(std::fs::read(&file).expect("file").starts_with(b"ROTASNAP"));

    // Shell completions name the subcommands.
    for shell in ["bash", "zsh", "fish"] {
        let (code, script, _) = rota(&["completions", shell], "");
        assert_eq!(code, 0);
        assert!(
            script.contains("claim") && script.contains("cluster"),
            "{shell}"
        );
    }

    // Usage errors exit 2; an unreachable cluster exits 3.
    assert_eq!(rota(&["task", "add", "--url", &url], "").0, 2);
    assert_eq!(rota(&["groups", "--url", "127.0.0.1:9"], "").0, 3);
    assert_eq!(rota(&["dev", "down", "--dir", dir_arg], "").0, 0);
}
