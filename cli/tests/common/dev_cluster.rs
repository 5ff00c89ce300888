//! A one-node `rota dev` cluster for the CLI's process tests, stopped however the test
//! ends. Included by the test files that use it (`#[path]`), so the others do not carry
//! it unused.
#![allow(dead_code, reason = "not every test binary uses every helper")]

use crate::common::Run;
use crate::common::node_binary;
use crate::common::rota;

/// A `rota dev` cluster, stopped however the test ends.
pub struct DevCluster {
    dir: tempfile::TempDir,
    /// Its first node's worker URL.
    pub url: String,
    /// Every node's worker URL, in node id order.
    pub urls: Vec<String>,
}

impl DevCluster {
    /// Starts a one-node cluster.
    pub async fn up() -> Self {
        Self::up_nodes(1).await
    }

    /// Starts a cluster of `nodes` nodes.
    pub async fn up_nodes(nodes: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir_arg = dir.path().to_str().expect("utf-8").to_string();
        let count = nodes.to_string();
        let urls = rota(&["dev", "up", "--nodes", &count, "--dir", &dir_arg]).await;
        assert_eq!(urls.code, 0, "{}", urls.stderr);
        let urls: Vec<String> = urls.stdout.lines().map(str::to_string).collect();
        let url = urls.first().expect("a URL").clone();
        Self { dir, url, urls }
    }

    /// Restarts every node that is not running (same ports and data).
    pub async fn restart_stopped(&self) {
        let dir_arg = self.dir.path().to_str().expect("utf-8");
        let count = self.urls.len().to_string();
        let run = rota(&["dev", "up", "--nodes", &count, "--dir", dir_arg]).await;
        assert_eq!(run.code, 0, "{}", run.stderr);
    }

    /// Kills node `id` (1-based) with SIGKILL.
    pub fn kill_node(&self, id: u64) {
        let pid = std::fs::read_to_string(self.dir.path().join(format!("node-{id}.pid")))
            .expect("the node's pid file");
        let status = std::process::Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -9 of node {id} ({pid})");
    }

    /// `rota args... --url URL`.
    pub async fn rota(&self, args: &[&str]) -> Run {
        let mut all = args.to_vec();
        all.extend(["--url", &self.url]);
        rota(&all).await
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        // Synchronously: the test's runtime may be gone by now.
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_rota"))
            .args(["dev", "down", "--dir"])
            .arg(self.dir.path())
            .env("ROTA_NODE_BIN", node_binary())
            .status();
    }
}
