//! `rota cluster status`: the members, the leader, the indexes, each follower's lag, and
//! whether each member answers, as a table or as JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use rpc::admin::ClusterStatusJson;
use rpc::admin::MemberJson;
use rpc::admin::StateHashJson;
use rpc::client::HeaderName;
use rpc::client::HeaderValue;
use rpc::client::HttpClient;
use rpc::client::HttpMethod;
use serde::Serialize;

use crate::CliError;
use crate::membership::status_of;
use crate::nodes::Nodes;
use crate::nodes::PROBE_TIMEOUT;
use crate::wait::Look;
use crate::wait::POLL_INTERVAL;
use crate::wait::poll_until;

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
    /// The log index it covers (`None` if the node did not say).
    pub applied_index: Option<u64>,
    /// The cluster's state hash at that index.
    pub state_hash: String,
    /// SHA-256 of the file, also written to `FILE.sha256` in `sha256sum` format.
    pub file_sha256: String,
}

/// Largest backup `backup` downloads: what a restore accepts by default.
pub const BACKUP_BYTES_MAX: u64 = rpc::admin::RESTORE_BYTES_MAX as u64;

/// Downloads a consistent snapshot (it holds every write acknowledged before the call)
/// to `out`, atomically, with a `sha256sum` file beside it. The body goes to disk as it
/// arrives (a backup of millions of tasks is hundreds of MiB); each node of `urls` is
/// tried in turn until one answers.
pub async fn backup(urls: &[String], out: &std::path::Path) -> Result<BackupReport, CliError> {
    use std::io::Write;

    use sha2::Digest;
    let nodes = Nodes::new(urls)?;
    let io =
        |what: &str, e: std::io::Error| CliError::Failed(format!("{what} {}: {e}", out.display()));
    let temp = out.with_extension("partial");
    let mut failures = Vec::new();
    let mut downloaded = None;
    for addr in nodes.addrs() {
        let file = std::fs::File::create(&temp).map_err(|e| io("creating", e))?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut hasher = sha2::Sha256::new();
        let mut sink = |bytes: &[u8]| {
            hasher.update(bytes);
            writer.write_all(bytes)
        };
        let answer = nodes
            .client()
            .download(
                addr,
                "/admin/backup",
                BACKUP_TIMEOUT,
                BACKUP_BYTES_MAX,
                &mut sink,
            )
            .await;
        match answer {
            Ok(download) if download.status.is_success() => {
                let file = writer
                    .into_inner()
                    .map_err(|e| io("writing", e.into_error()))?;
                file.sync_all().map_err(|e| io("syncing", e))?;
                downloaded = Some((download, hex(&hasher.finalize())));
                break;
            }
            Ok(download) if !download.status.is_server_error() => {
                let _ = std::fs::remove_file(&temp);
                let refused = rpc::client::HttpResponse {
                    status: download.status,
                    headers: download.headers,
                    body: download.error_body,
                }
                .success(addr);
                return Err(CliError::Failed(match refused {
                    Err(e) => e.to_string(),
                    Ok(_) => format!("{addr} answered {}", download.status),
                }));
            }
            Ok(download) => failures.push(format!("{addr}: {}", download.status)),
            Err(e) => failures.push(e.to_string()),
        }
    }
    let Some((download, file_sha256)) = downloaded else {
        let _ = std::fs::remove_file(&temp);
        return Err(CliError::Unreachable(format!(
            "no node gave a backup: {}",
            failures.join("; ")
        )));
    };
    let header = |name: &str| {
        download
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown")
            .to_string()
    };
    std::fs::rename(&temp, out).map_err(|e| io("renaming into", e))?;
    let name = out
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let sums = std::path::PathBuf::from(format!("{}.sha256", out.display()));
    std::fs::write(&sums, format!("{file_sha256}  {name}\n"))
        .map_err(|e| io("writing the checksum of", e))?;
    Ok(BackupReport {
        file: out.display().to_string(),
        bytes: download.bytes,
        applied_index: header(rpc::admin::BACKUP_INDEX_HEADER).parse().ok(),
        state_hash: header(rpc::admin::BACKUP_HASH_HEADER),
        file_sha256,
    })
}

/// Largest backup `restore` sends; the node refuses more.
pub const RESTORE_BYTES_MAX: u64 = rpc::admin::RESTORE_BYTES_MAX as u64;

/// Deadline of the upload of a backup to the first new node.
pub const RESTORE_UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// What `rota cluster restore` did.
#[derive(Debug, Serialize)]
pub struct RestoreReport {
    /// The backup file.
    pub file: String,
    /// The state hash recorded in the backup.
    pub backup_state_hash: String,
    /// The hash of the state the new cluster starts from: the backup's, with log time
    /// moved to the restore and task ids above a floor from it (so no id issued after
    /// the backup is issued again).
    pub restored_state_hash: String,
    /// Tasks restored.
    pub tasks: u64,
    /// The id the new cluster's next task version gets.
    pub next_id: u64,
    /// The new cluster's log time at the restore, in ms since the Unix epoch.
    pub log_time: i64,
    /// Per member of the new cluster: its applied index and state hash once it holds the
    /// restored state.
    pub members: BTreeMap<u64, StateHashJson>,
    /// The new cluster's leader.
    pub leader: u64,
}

/// Checks a backup file's framing and checksum (the node decodes it fully) and returns
/// the state hash in its trailer. Layout: `ROTASNAP`, version (4 bytes), body, SHA-256
/// of the body.
pub fn backup_state_hash(bytes: &[u8]) -> Result<String, String> {
    use sha2::Digest;
    const HEADER: usize = 12;
    const DIGEST: usize = 32;
    if !bytes.starts_with(b"ROTASNAP") {
        return Err("not a Rota backup (it does not start with ROTASNAP)".into());
    }
    if bytes.len() < HEADER + DIGEST {
        return Err(format!("truncated: {} bytes", bytes.len()));
    }
    let (body, trailer) = bytes[HEADER..].split_at(bytes.len() - HEADER - DIGEST);
    if sha2::Sha256::digest(body).as_slice() != trailer {
        return Err("its checksum does not match: the file is corrupt".into());
    }
    Ok(hex(trailer))
}

/// Lower-case hex, as `sha256sum` prints it.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares `file` with `FILE.sha256` (as `backup` wrote it) when that file exists.
fn check_sums_file(file: &std::path::Path, bytes: &[u8]) -> Result<(), CliError> {
    use sha2::Digest;
    let sums = std::path::PathBuf::from(format!("{}.sha256", file.display()));
    let Ok(text) = std::fs::read_to_string(&sums) else {
        return Ok(());
    };
    let recorded = text.split_whitespace().next().unwrap_or_default();
    let actual = hex(&sha2::Sha256::digest(bytes));
    if recorded != actual {
        return Err(CliError::Failed(format!(
            "{} does not match {} (sha256 {actual}, recorded {recorded}); the backup was changed or damaged",
            file.display(),
            sums.display()
        )));
    }
    Ok(())
}

/// Starts a new cluster of `members` from the backup in `file`. The members must run,
/// started without `--initial-cluster`, with empty data directories. The backup goes to
/// the member with the lowest id, which replicates it to the others; returns once every
/// member holds the restored state, or gives up after `timeout`.
pub async fn restore(
    file: &std::path::Path,
    members: Vec<MemberJson>,
    timeout: Duration,
) -> Result<RestoreReport, CliError> {
    let Some(first) = members.first().cloned() else {
        return Err(CliError::Usage(
            "--initial-cluster lists no member; give ID=API/RAFT,...".into(),
        ));
    };
    let (bytes, backup_hash) = read_backup(file)?;
    let client = crate::http_client();
    crate::membership::check_empty_members(&client, &members).await?;
    let restored = install_backup(&client, &first, &members, bytes).await?;
    if restored.state_hash != backup_hash {
        return Err(CliError::Failed(format!(
            "node {} restored state hash {} but the backup records {backup_hash}",
            first.id, restored.state_hash
        )));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let leader = wait_all_applied(&client, &members, restored.applied_index, deadline)
        .await
        .map_err(|(caught_up, leader)| {
            CliError::Unreachable(format!(
                "the backup is installed on node {}, but after {timeout:?} only nodes {caught_up:?} hold it (leader {leader:?}); check `rota cluster status` on the new cluster",
                first.id
            ))
        })?;
    let holding = check_members_hold(&client, &members, &restored.restored_state_hash).await?;
    Ok(RestoreReport {
        file: file.display().to_string(),
        backup_state_hash: backup_hash,
        restored_state_hash: restored.restored_state_hash,
        tasks: restored.tasks,
        next_id: restored.next_id,
        log_time: restored.log_time,
        members: holding,
        leader,
    })
}

/// Reads a backup file, checked against its size limit, its `.sha256` file and its own
/// checksum; its bytes and the state hash it records.
fn read_backup(file: &std::path::Path) -> Result<(Vec<u8>, String), CliError> {
    let io = |e: std::io::Error| CliError::Failed(format!("reading {}: {e}", file.display()));
    let size = std::fs::metadata(file).map_err(io)?.len();
    if size > RESTORE_BYTES_MAX {
        return Err(CliError::Failed(format!(
            "{} is {size} bytes, more than the {RESTORE_BYTES_MAX} a node accepts",
            file.display()
        )));
    }
    let bytes = std::fs::read(file).map_err(io)?;
    check_sums_file(file, &bytes)?;
    let backup_hash = backup_state_hash(&bytes)
        .map_err(|e| CliError::Failed(format!("{}: {e}", file.display())))?;
    Ok((bytes, backup_hash))
}

/// Uploads the backup to `first`, naming the new cluster's `members` in a header (the
/// body is the backup itself); what the node installed.
async fn install_backup(
    client: &HttpClient,
    first: &MemberJson,
    members: &[MemberJson],
    bytes: Vec<u8>,
) -> Result<rpc::admin::RestoreJson, CliError> {
    let header = serde_json::to_string(&rpc::admin::InitRequestJson {
        members: members.to_vec(),
    })
    .map_err(|e| CliError::Failed(e.to_string()))?;
    let header = HeaderValue::from_str(&header)
        .map_err(|e| CliError::Usage(format!("the member list cannot be sent: {e}")))?;
    let headers = [
        (
            HeaderName::from_static(rpc::admin::RESTORE_MEMBERS_HEADER),
            header,
        ),
        (
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("application/octet-stream"),
        ),
    ];
    client
        .send(
            &first.api_addr,
            HttpMethod::POST,
            "/admin/restore",
            &headers,
            bytes.into(),
            RESTORE_UPLOAD_TIMEOUT,
        )
        .await
        .map_err(|e| CliError::Unreachable(e.to_string()))?
        .success(&first.api_addr)
        .map_err(|e| CliError::Failed(format!("refused: {e}")))?
        .json(&first.api_addr)
        .map_err(|e| CliError::Failed(e.to_string()))
}

/// Waits on the cheap status until every member has applied `index` and one names a
/// leader; that leader, or at the deadline the members that had applied it and the
/// leader seen.
async fn wait_all_applied(
    client: &HttpClient,
    members: &[MemberJson],
    index: u64,
    deadline: tokio::time::Instant,
) -> Result<u64, (Vec<u64>, Option<u64>)> {
    let look = async || {
        let mut caught_up = Vec::new();
        let mut leader = None;
        for member in members {
            if let Some(view) = status_of(client, &member.api_addr).await {
                leader = leader.or(view.leader);
                if view.applied_index >= Some(index) {
                    caught_up.push(member.id);
                }
            }
        }
        Ok(match leader {
            Some(leader) if caught_up.len() == members.len() => Look::Done(leader),
            _ => Look::NotYet((caught_up, leader)),
        })
    };
    poll_until(deadline, POLL_INTERVAL, look, |seen| seen).await
}

/// Hashes each member's state once (hashing is O(tasks), so only after the wait) and
/// checks it is the restored state's; each member's applied index and hash.
async fn check_members_hold(
    client: &HttpClient,
    members: &[MemberJson],
    restored_hash: &str,
) -> Result<BTreeMap<u64, StateHashJson>, CliError> {
    let mut holding = BTreeMap::new();
    for member in members {
        let hash: StateHashJson = client
            .get(
                &member.api_addr,
                "/admin/state-hash",
                RESTORE_UPLOAD_TIMEOUT,
            )
            .await
            .map_err(|e| CliError::Unreachable(e.to_string()))?
            .json(&member.api_addr)
            .map_err(|e| CliError::Failed(e.to_string()))?;
        if hash.state_hash != restored_hash {
            return Err(CliError::Failed(format!(
                "node {} holds state hash {} after the restore, not the restored state's {restored_hash}",
                member.id, hash.state_hash
            )));
        }
        holding.insert(member.id, hash);
    }
    Ok(holding)
}
