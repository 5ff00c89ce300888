//! Architecture invariants of the node's request path: the service layer knows no HTTP,
//! and the HTTP adapters reach Raft only through the service.

mod common;

use std::fs;
use std::path::PathBuf;

/// The Rust files of `src/<dir>` (or the one file `src/<dir>.rs`).
fn sources(entries: &[&str]) -> Vec<PathBuf> {
    let src = common::manifest_dir().join("src");
    let mut files = Vec::new();
    for entry in entries {
        let path = src.join(entry);
        if path.is_dir() {
            for file in fs::read_dir(&path).expect("source directory") {
                files.push(file.expect("directory entry").path());
            }
        } else {
            assert!(path.is_file(), "{} is missing", path.display());
            files.push(path);
        }
    }
    files
}

/// Fails on each line of code in `files` (comments aside) that names a `forbidden` word.
fn assert_none_use(files: &[PathBuf], forbidden: &[&str], rule: &str) {
    assert!(!files.is_empty(), "no files to check for: {rule}");
    for path in files {
        let source = fs::read_to_string(path).expect("readable source");
        for (number, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in forbidden {
                assert!(
                    !code.contains(word),
                    "{}:{}: {rule}, but it uses `{word}`: {line}",
                    path.display(),
                    number + 1
                );
            }
        }
    }
}

#[test]
fn the_service_layer_knows_no_http() {
    assert_none_use(
        &sources(&["service"]),
        &[
            "axum",
            "hyper",
            "StatusCode",
            "HeaderMap",
            "crate::http",
            "crate::relay",
        ],
        "the service layer returns plain values and ServiceError",
    );
}

#[test]
fn the_routers_reach_raft_only_through_the_service() {
    assert_none_use(
        &sources(&[
            "worker_api.rs",
            "admin_api.rs",
            "relay.rs",
            "http.rs",
            "metrics",
        ]),
        &["openraft", ".raft.", "client_write", "ensure_linearizable"],
        "HTTP adapters call the service, never openraft",
    );
}
