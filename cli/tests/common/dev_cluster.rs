//! A one-node `rota dev` cluster for the CLI's process tests, stopped however the test
//! ends. Included by the test files that use it (`#[path]`), so the others do not carry
//! it unused.

use crate::common::Run;
use crate::common::node_binary;
use crate::common::rota;

/// A `rota dev` cluster, stopped however the test ends.
pub struct DevCluster {
    dir: tempfile::TempDir,
    /// Its worker URL.
    pub url: String,
}

impl DevCluster {
    /// Starts it.
    pub async fn up() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir_arg = dir.path().to_str().expect("utf-8").to_string();
        let urls = rota(&["dev", "up", "--nodes", "1", "--dir", &dir_arg]).await;
        assert_eq!(urls.code, 0, "{}", urls.stderr);
        let url = urls.stdout.lines().next().expect("a URL").to_string();
        Self { dir, url }
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
