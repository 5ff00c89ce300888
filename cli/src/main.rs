//! `rota`: the command-line tool for Rota clusters.

use std::path::PathBuf;
use std::process::ExitCode;

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
                cli::dev::up(&dir, nodes, &sync).await.map(|urls| {
                    for url in urls {
                        println!("{url}");
                    }
                })
            }
            Command::Dev(DevCommand::Down { dir }) => cli::dev::down(&dir).await,
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
