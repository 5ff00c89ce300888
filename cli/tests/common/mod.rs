//! What the CLI's process tests share.

use std::path::PathBuf;

/// The workspace's `rota-node`, built beside this test by `cargo test --workspace`.
pub fn node_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = dir.join("rota-node");
    assert!(
        binary.is_file(),
        "{} is missing: run the workspace tests (cargo test --workspace) or build -p raft-node first",
        binary.display()
    );
    binary
}
