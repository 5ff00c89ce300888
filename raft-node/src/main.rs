//! `rota-node`: one member of a Rota cluster.

use clap::Parser;
use raft_node::config::Flags;
use raft_node::config::LogFormat;
use raft_node::config::NodeConfig;
use tracing_subscriber::EnvFilter;

/// The allocator: see the note on `tikv-jemallocator` in the workspace's Cargo.toml.
#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The log filter unless `ROTA_LOG` names one. openraft's heartbeat worker warns of a
/// peer it cannot reach at every heartbeat, about ten times a second, while replication
/// to that peer warns too, at its backoff's pace: only the latter is kept.
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,openraft::core::heartbeat=error";

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("ROTA_LOG").unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::SignalKind;
    use tokio::signal::unix::signal;
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Reloads the TLS files on every SIGHUP; a reload that fails keeps the old ones.
fn reload_tls_on_sighup(tls: std::sync::Arc<raft_node::tls::NodeTls>) {
    use tokio::signal::unix::SignalKind;
    use tokio::signal::unix::signal;
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; TLS files are read at start only");
            return;
        }
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificates and keys reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: TLS reload failed; the previous certificates stay in use")
                }
            }
        }
    });
}

fn main() -> std::process::ExitCode {
    let config = match NodeConfig::load(Flags::parse()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("rota-node: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    // One thread runs every task of the node: a command's journey (HTTP, Raft core,
    // replication, apply, answer) then costs no wake-up of another thread, which made a
    // command about 20% cheaper in CPU under load (docs/performance.md). The log writer
    // and the snapshot work have their own threads, so nothing here blocks on the disk.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rota-node: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let running = match raft_node::start(config).await {
            Ok(running) => running,
            Err(e) => {
                tracing::error!("{e}");
                return if e.is_invalid_setting() {
                    std::process::ExitCode::from(2)
                } else {
                    std::process::ExitCode::FAILURE
                };
            }
        };
        if let Some(tls) = &running.tls {
            reload_tls_on_sighup(tls.clone());
        }
        wait_for_signal().await;
        tracing::info!("signal received; shutting down");
        running.shutdown().await;
        std::process::ExitCode::SUCCESS
    })
}
