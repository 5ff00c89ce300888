//! The `rota` command-line tool: a local cluster for development (`rota dev`), cluster
//! administration (`rota cluster`), task and job commands and `rota bench`. It talks to nodes
//! over HTTP only and never links RocksDB.

pub mod auth;
pub mod bench;
pub mod bench_wait;
pub mod cert;
pub mod cluster;
pub mod dev;
pub mod job;
pub mod membership;
pub mod nodes;
pub mod task;
pub mod wait;
pub mod worker;
pub mod worker_metrics;

static TOKEN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Sets the bearer token every request of this process sends (`--token`, `ROTA_TOKEN`);
/// refused if it cannot be a header value. Only the first call counts.
pub fn set_token(token: Option<String>) -> Result<(), CliError> {
    let token = token.filter(|t| !t.trim().is_empty());
    rpc::client::HttpClient::new()
        .with_token(token.as_deref())
        .map_err(|e| CliError::Usage(format!("--token: {e}")))?;
    let _ = TOKEN.set(token);
    Ok(())
}

/// The bearer token set by [`set_token`], if any.
pub fn token() -> Option<&'static str> {
    TOKEN.get().and_then(|t| t.as_deref())
}

static TLS: std::sync::OnceLock<Option<std::sync::Arc<rpc::tls::ClientTls>>> =
    std::sync::OnceLock::new();

/// Makes every connection of this process TLS, trusting the CA bundle at `ca` (`--ca`,
/// `ROTA_CA`); `None`: plain HTTP. Only the first call counts.
pub fn set_ca(ca: Option<std::path::PathBuf>) -> Result<(), CliError> {
    let tls = match ca {
        Some(ca) => Some(
            rpc::tls::ClientTls::load(rpc::tls::ClientTlsFiles { ca, identity: None })
                .map_err(|e| CliError::Usage(format!("--ca: {e}")))?,
        ),
        None => None,
    };
    let _ = TLS.set(tls);
    Ok(())
}

/// The TLS configuration set by [`set_ca`], if any.
pub fn tls() -> Option<std::sync::Arc<rpc::tls::ClientTls>> {
    TLS.get().cloned().flatten()
}

/// An HTTP client that sends this process's token, over TLS when `--ca` is given.
pub fn http_client() -> rpc::client::HttpClient {
    // The token was checked by `set_token`.
    rpc::client::HttpClient::new()
        .with_token(token())
        .unwrap_or_default()
        .with_tls(tls())
}

/// A failed command, with the documented exit code: 1 refused or failed, 2 usage,
/// 3 unreachable.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    /// The cluster refused, or a local step failed.
    #[error("{0}")]
    Failed(String),
    /// The cluster processed a write and refused it, nothing changed: every reason, one
    /// per line.
    #[error("refused by the cluster:{}", .0.iter().map(|e| format!("\n  {e}")).collect::<String>())]
    Refused(Vec<String>),
    /// The cluster could not be reached or did not become ready.
    #[error("{0}")]
    Unreachable(String),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Failed(_) | CliError::Refused(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Unreachable(_) => 3,
        }
    }
}

/// `value` as the pretty JSON that `--json` prints.
pub fn json_text<T: serde::Serialize>(value: &T) -> Result<String, CliError> {
    serde_json::to_string_pretty(value).map_err(|e| CliError::Failed(e.to_string()))
}

impl From<dev::DevError> for CliError {
    fn from(e: dev::DevError) -> Self {
        match e {
            dev::DevError::Usage(_) => CliError::Usage(e.to_string()),
            dev::DevError::NotReady(_) => CliError::Unreachable(e.to_string()),
            dev::DevError::Io { .. } | dev::DevError::NoNodeBinary => {
                CliError::Failed(e.to_string())
            }
        }
    }
}

impl From<bench::BenchError> for CliError {
    fn from(e: bench::BenchError) -> Self {
        match e {
            bench::BenchError::Usage(_) => CliError::Usage(e.to_string()),
            bench::BenchError::NothingWorked(_) => CliError::Unreachable(e.to_string()),
        }
    }
}
