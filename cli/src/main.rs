//! `rota`: the command-line tool for Rota clusters.

use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use clap::Parser;
use clap::Subcommand;

/// Exit code: refused by the cluster or failed.
const EXIT_REFUSED: u8 = 1;

#[derive(Parser)]
#[command(name = "rota", version, about = "Rota: a replicated task store.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A local cluster on 127.0.0.1 for development.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Cluster administration.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Drive a cluster with concurrent workers and print throughput and latency.
    #[command(
        after_help = "Example:\n  rota bench --url 127.0.0.1:7001,127.0.0.1:7002 --workers 16 --duration 10"
    )]
    Bench {
        /// API addresses (host:port or http://host:port), comma-separated; workers spread over them.
        #[arg(long, env = "ROTA_URL", value_delimiter = ',')]
        url: Vec<String>,
        /// Concurrent workers.
        #[arg(long, default_value_t = 16)]
        workers: u64,
        /// cycle: add, claim, delete; add: add only.
        #[arg(long, value_enum, default_value = "cycle")]
        mode: cli::bench::BenchMode,
        /// Longest run, in seconds.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Most cycles in all.
        #[arg(long, default_value_t = 1_000_000)]
        max_cycles: u64,
        /// Group the benchmark's tasks go to.
        #[arg(long, default_value = "rota-bench")]
        group: String,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Members, leader, term, indexes, each follower's lag and each member's health.
    #[command(
        after_help = "Examples:\n  rota cluster status --url 127.0.0.1:7001\n  rota cluster status --url 127.0.0.1:7001,127.0.0.1:7002 --json"
    )]
    Status {
        /// Nodes to ask (host:port or http://host:port), comma-separated, tried in turn.
        #[arg(long, env = "ROTA_URL", value_delimiter = ',', required = true)]
        url: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DevCommand {
    /// Start (or restart) a local cluster and print one worker URL per line.
    #[command(after_help = "Example:\n  urls=$(rota dev up --nodes 3 --dir /tmp/rota-dev)")]
    Up {
        /// Number of nodes (1 to 9).
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Directory for the nodes' data, logs and process ids.
        #[arg(long, default_value = "rota-dev")]
        dir: PathBuf,
        /// Durability mode passed to every node: always or never.
        #[arg(long, default_value = "always")]
        sync: String,
    },
    /// Stop the local cluster in DIR.
    #[command(after_help = "Example:\n  rota dev down --dir /tmp/rota-dev")]
    Down {
        /// The directory given to `rota dev up`.
        #[arg(long, default_value = "rota-dev")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rota: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Dev(DevCommand::Up { nodes, dir, sync }) => {
                let urls = cli::dev::up(&dir, nodes, &sync).await?;
                for url in urls {
                    println!("{url}");
                }
                Ok::<(), cli::CliError>(())
            }
            Command::Dev(DevCommand::Down { dir }) => Ok(cli::dev::down(&dir).await?),
            Command::Cluster(ClusterCommand::Status { url, json }) => {
                let report = cli::cluster::status(&url).await?;
                if json {
                    let text = serde_json::to_string_pretty(&report)
                        .map_err(|e| cli::CliError::Failed(e.to_string()))?;
                    println!("{text}");
                } else {
                    print!("{}", cli::cluster::render_table(&report));
                }
                Ok(())
            }
            Command::Bench {
                url,
                workers,
                mode,
                duration,
                max_cycles,
                group,
            } => {
                let config = cli::bench::BenchConfig {
                    addrs: cli::cluster::addresses(&url)?,
                    workers,
                    mode,
                    duration: Duration::from_secs(duration),
                    max_cycles,
                    group,
                };
                print!("{}", cli::bench::run(config).await?);
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rota: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
