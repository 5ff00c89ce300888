//! `rota cluster status`: the members, the leader, the indexes, each follower's lag, and
//! whether each member answers, as a table or as JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use rpc::admin::ClusterStatusJson;
use rpc::client::HttpMethod;
use serde::Serialize;

use crate::CliError;
use crate::nodes::Nodes;

/// Deadline of one member's health probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What `status --json` prints.
#[derive(Serialize)]
pub struct StatusReport {
    /// The cluster as the answering node sees it.
    pub cluster: ClusterStatusJson,
    /// Per member: `ok`, `unreachable`, or why it is not ready.
    pub health: BTreeMap<u64, String>,
}

/// Asks the cluster for its status and probes every member.
pub async fn status(urls: &[String]) -> Result<StatusReport, CliError> {
    let nodes = Nodes::new(urls)?;
    let cluster: ClusterStatusJson = nodes.get_json("/cluster").await?;
    let mut health = BTreeMap::new();
    for node in &cluster.nodes {
        let verdict = match nodes
            .client()
            .get(&node.api_addr, "/ready", PROBE_TIMEOUT)
            .await
        {
            Ok(r) if r.status.is_success() => "ok".to_string(),
            Ok(r) => serde_json::from_slice::<rpc::admin::ProbeJson>(&r.body)
                .map(|p| format!("not ready: {}", p.status))
                .unwrap_or_else(|_| format!("not ready ({})", r.status)),
            Err(_) => "unreachable".to_string(),
        };
        health.insert(node.id, verdict);
    }
    Ok(StatusReport { cluster, health })
}

/// The report as a table for people.
pub fn render_table(report: &StatusReport) -> String {
    let cluster = &report.cluster;
    let mut out = format!(
        "{:<4} {:<9} {:<22} {:<22} {:>6}  {}\n",
        "ID", "ROLE", "API", "RAFT", "LAG", "HEALTH"
    );
    for node in &cluster.nodes {
        out.push_str(&format!(
            "{:<4} {:<9} {:<22} {:<22} {:>6}  {}\n",
            node.id,
            node.role,
            node.api_addr,
            node.raft_addr,
            node.lag.map_or("-".to_string(), |lag| lag.to_string()),
            report.health.get(&node.id).map_or("?", String::as_str),
        ));
    }
    let index = |i: Option<u64>| i.map_or("-".to_string(), |i| i.to_string());
    out.push_str(&format!(
        "leader {}, term {}, commit {}, applied {} (as seen by node {})\n",
        cluster.leader.map_or("none".to_string(), |l| l.to_string()),
        cluster.term,
        index(cluster.commit_index),
        index(cluster.applied_index),
        cluster.id
    ));
    out
}

/// Deadline of a backup download.
pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(600);

/// What `rota cluster backup` wrote.
#[derive(Debug, Serialize)]
pub struct BackupReport {
    /// The snapshot file.
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// The log index it covers.
    pub applied_index: String,
    /// The cluster's state hash at that index.
    pub state_hash: String,
    /// SHA-256 of the file, also written to `FILE.sha256` in `sha256sum` format.
    pub file_sha256: String,
}

/// Downloads a consistent snapshot (it holds every write acknowledged before the call)
/// to `out`, atomically, with a `sha256sum` file beside it.
pub async fn backup(urls: &[String], out: &std::path::Path) -> Result<BackupReport, CliError> {
    use sha2::Digest;
    let (addr, response) = Nodes::new(urls)?
        .send(HttpMethod::GET, "/admin/backup", Vec::new(), BACKUP_TIMEOUT)
        .await?;
    let response = response
        .success(&addr)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let header = |name: &str| {
        response
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown")
            .to_string()
    };
    let file_sha256: String = sha2::Sha256::digest(&response.body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let io =
        |what: &str, e: std::io::Error| CliError::Failed(format!("{what} {}: {e}", out.display()));
    let temp = out.with_extension("partial");
    std::fs::write(&temp, &response.body).map_err(|e| io("writing", e))?;
    std::fs::rename(&temp, out).map_err(|e| io("renaming into", e))?;
    let name = out
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let sums = std::path::PathBuf::from(format!("{}.sha256", out.display()));
    std::fs::write(&sums, format!("{file_sha256}  {name}\n"))
        .map_err(|e| io("writing the checksum of", e))?;
    Ok(BackupReport {
        file: out.display().to_string(),
        bytes: response.body.len() as u64,
        applied_index: header("x-rota-applied-index"),
        state_hash: header("x-rota-state-hash"),
        file_sha256,
    })
}
