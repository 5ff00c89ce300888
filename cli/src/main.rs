//! `rota`: the command-line tool for Rota clusters.

use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use clap::Parser;
use clap::Subcommand;
use rpc::worker::AddJson;
use rpc::worker::ChangeJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::TaskJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteRequestJson;

/// Exit code: refused by the cluster or failed.
const EXIT_REFUSED: u8 = 1;

#[derive(Parser)]
#[command(
    name = "rota",
    version,
    about = "Rota: a replicated task store.",
    after_help = "Every command that talks to a cluster takes --url HOST:PORT[,HOST:PORT...] (or ROTA_URL),\ntrying each node in turn.\n\nExit codes: 0 done; 1 refused by the cluster or failed; 2 usage error; 3 no node answered\n(or a wait timed out)."
)]
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
    /// Tasks: add, claim, get, list, update, delete.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  rota completions bash > /etc/bash_completion.d/rota\n  rota completions zsh > \"${fpath[1]}/_rota\"\n  rota completions fish > ~/.config/fish/completions/rota.fish"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Names of the groups that hold tasks.
    #[command(after_help = "Example:\n  rota groups --url 127.0.0.1:7001")]
    Groups {
        #[command(flatten)]
        target: Target,
    },
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

/// Which nodes to talk to and how to print.
#[derive(clap::Args)]
struct Target {
    /// Nodes (host:port or http://host:port), comma-separated, tried in turn.
    #[arg(long, env = "ROTA_URL", value_delimiter = ',', required = true)]
    url: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Who writes, and how a retry is recognised.
#[derive(clap::Args)]
struct Writer {
    /// Client id that owns what this command writes (default: random per invocation).
    #[arg(long, allow_negative_numbers = true)]
    client_id: Option<i64>,
    /// Request id: a retry with the same one applies once.
    #[arg(long)]
    request_id: Option<String>,
}

#[derive(Subcommand)]
enum TaskCommand {
    /// Add a task to a group.
    #[command(
        after_help = "Examples:\n  rota task add --url 127.0.0.1:7001 --group map --data 'file:0:1024'\n  rota task add --url 127.0.0.1:7001 --group map --data @task.json\n  echo payload | rota task add --url 127.0.0.1:7001 --group map --data @-"
    )]
    Add {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        writer: Writer,
        /// The group.
        #[arg(long)]
        group: String,
        /// Payload: text, @FILE, or @- for standard input.
        #[arg(long)]
        data: Option<String>,
        /// Available time in ms since the epoch; negative: now + |t| (default: now).
        #[arg(long, allow_negative_numbers = true)]
        timespec: Option<i64>,
    },
    /// Claim the oldest available task of a group.
    #[command(
        after_help = "Example:\n  rota task claim --url 127.0.0.1:7001 --group map --duration-ms 60000 --client-id 7"
    )]
    Claim {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        writer: Writer,
        /// The group.
        #[arg(long)]
        group: String,
        /// How long the claim owns the task.
        #[arg(long, default_value_t = 60_000)]
        duration_ms: i64,
    },
    /// Show tasks by id.
    #[command(after_help = "Example:\n  rota task get --url 127.0.0.1:7001 12 13")]
    Get {
        #[command(flatten)]
        target: Target,
        /// Task ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// List a group's tasks in claim order.
    #[command(
        after_help = "Example:\n  rota task list --url 127.0.0.1:7001 --group map --owned --limit 10"
    )]
    List {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(long)]
        group: String,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// Include owned tasks.
        #[arg(long)]
        owned: bool,
    },
    /// Replace a task (new id, same group); renew a claim with a negative --timespec.
    #[command(
        after_help = "Example:\n  rota task update --url 127.0.0.1:7001 --id 12 --timespec -60000 --client-id 7"
    )]
    Update {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        writer: Writer,
        /// The task version to replace.
        #[arg(long)]
        id: u64,
        /// New payload: text, @FILE, or @- (default: empty, as the seed has it).
        #[arg(long)]
        data: Option<String>,
        /// Available time in ms since the epoch; negative: now + |t| (default: now).
        #[arg(long, allow_negative_numbers = true)]
        timespec: Option<i64>,
    },
    /// Delete tasks.
    #[command(after_help = "Example:\n  rota task delete --url 127.0.0.1:7001 --client-id 7 12 13")]
    Delete {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        writer: Writer,
        /// Task ids.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
}

/// Prints `value` as JSON for scripts, or `human(value)` for people.
fn emit<T: serde::Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> Result<(), cli::CliError> {
    if json {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| cli::CliError::Failed(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", human(value));
    }
    Ok(())
}

fn print_tasks(tasks: &[Option<TaskJson>], json: bool) -> Result<(), cli::CliError> {
    emit(json, &tasks, |tasks| cli::task::render_tasks(tasks))
}

impl Writer {
    /// An update by this writer that changes nothing yet.
    fn update(&self) -> UpdateRequestJson {
        UpdateRequestJson::by(cli::task::client_id(self.client_id))
    }

    /// A claim by this writer.
    fn claim(&self, group: String, duration_ms: i64) -> ClaimRequestJson {
        ClaimRequestJson::new(cli::task::client_id(self.client_id), group, duration_ms)
    }

    /// Sends `request` under this writer's request id to the nodes of `target`; the
    /// tasks it wrote, as `print_tasks` shows them.
    async fn write(
        &self,
        target: &Target,
        request: impl Into<WriteRequestJson>,
    ) -> Result<Vec<Option<TaskJson>>, cli::CliError> {
        let request = request.into().with_request_id(self.request_id.clone());
        let written = cli::nodes::Nodes::new(&target.url)?.write(&request).await?;
        Ok(written.into_iter().map(Some).collect())
    }
}

async fn run_task(command: TaskCommand) -> Result<(), cli::CliError> {
    use cli::nodes::Nodes;
    use cli::task::read_data;
    match command {
        TaskCommand::Add {
            target,
            writer,
            group,
            data,
            timespec,
        } => {
            let add = AddJson {
                data: read_data(data.as_deref())?,
                timespec,
                ..AddJson::in_group(group)
            };
            let written = writer.write(&target, writer.update().with_add(add)).await?;
            print_tasks(&written, target.json)
        }
        TaskCommand::Claim {
            target,
            writer,
            group,
            duration_ms,
        } => {
            let written = writer
                .write(&target, writer.claim(group, duration_ms))
                .await?;
            print_tasks(&written, target.json)
        }
        TaskCommand::Get { target, ids } => {
            let client = Nodes::new(&target.url)?;
            let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let tasks: Vec<Option<TaskJson>> = client.get_json(&format!("/tasks/{list}")).await?;
            print_tasks(&tasks, target.json)
        }
        TaskCommand::List {
            target,
            group,
            limit,
            owned,
        } => {
            let client = Nodes::new(&target.url)?;
            let mut path = format!("/group/{}?owned={}", encode_path(&group), u8::from(owned));
            if let Some(limit) = limit {
                path.push_str(&format!("&limit={limit}"));
            }
            let tasks: Vec<TaskJson> = client.get_json(&path).await?;
            let listed: Vec<Option<TaskJson>> = tasks.into_iter().map(Some).collect();
            print_tasks(&listed, target.json)
        }
        TaskCommand::Update {
            target,
            writer,
            id,
            data,
            timespec,
        } => {
            let change = ChangeJson {
                data: read_data(data.as_deref())?,
                timespec,
                ..ChangeJson::of_task(id)
            };
            let written = writer
                .write(&target, writer.update().with_change(change))
                .await?;
            print_tasks(&written, target.json)
        }
        TaskCommand::Delete {
            target,
            writer,
            ids,
        } => {
            writer
                .write(&target, writer.update().with_deletes(ids))
                .await?;
            if target.json {
                println!("[]");
            } else {
                println!("deleted");
            }
            Ok(())
        }
    }
}

/// Percent-encodes a group name for a path segment.
fn encode_path(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// How long a membership command may wait for a leader, a catch-up or a transfer.
#[derive(clap::Args)]
struct Wait {
    /// Longest wait, in seconds, for a leader, a learner's catch-up or a new leader.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

impl Wait {
    fn duration(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Form a cluster from nodes started without --initial-cluster.
    #[command(
        after_help = "Example:\n  rota cluster init --url 10.0.0.1:7001 \\\n    --initial-cluster 1=10.0.0.1:7001/10.0.0.1:8001,2=10.0.0.2:7001/10.0.0.2:8001,3=10.0.0.3:7001/10.0.0.3:8001\n\nEvery member must run and belong to no cluster. Nodes started with --initial-cluster\nform their cluster by themselves; this command is for those started without it."
    )]
    Init {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
        /// The voters: ID=API_HOST:PORT/RAFT_HOST:PORT, comma-separated.
        #[arg(long)]
        initial_cluster: String,
    },
    /// Add a node as a learner (it replicates without voting) and wait until it catches up.
    #[command(
        after_help = "Example (grow 3 -> 4; then promote):\n  rota-node --id 4 --data-dir /var/lib/rota --listen-api 0.0.0.0:7001 --listen-raft 0.0.0.0:8001 \\\n    --advertise-api 10.0.0.4:7001 --advertise-raft 10.0.0.4:8001 &\n  rota cluster add-learner --url 10.0.0.1:7001 --id 4 --api-addr 10.0.0.4:7001 --raft-addr 10.0.0.4:8001\n\nRefused while another membership change is in flight, for an id that is or was a member\n(ids are never reused), and for a node that does not answer or already has a cluster."
    )]
    AddLearner {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
        /// The new node's id: never one that was a member before.
        #[arg(long)]
        id: u64,
        /// Where workers reach it (host:port).
        #[arg(long)]
        api_addr: String,
        /// Where Raft traffic goes (host:port).
        #[arg(long)]
        raft_addr: String,
        /// Return once the learner is added, without waiting for it to catch up.
        #[arg(long)]
        no_wait: bool,
    },
    /// Make a learner a voter, once it has caught up.
    #[command(
        after_help = "Example:\n  rota cluster promote --url 10.0.0.1:7001 --id 4\n\nWaits until node 4 is within 100 entries of the leader, promotes it, and checks the\nleader's configuration afterwards. Refused while another change is in flight."
    )]
    Promote {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
        /// The learner.
        #[arg(long)]
        id: u64,
    },
    /// Remove a voter or learner; its id is retired for good.
    #[command(
        after_help = "Examples:\n  rota cluster remove --url 10.0.0.1:7001 --id 5\n  rota cluster remove --url 10.0.0.1:7001 --id 2 --force   # even if writes stop\n\nRefused (unless --force) when the voters now, or after the change, would not have a\nmajority that answers: e.g. removing a healthy voter from a three-node cluster with one\nnode already down. Removing the node that is down is allowed."
    )]
    Remove {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
        /// The node to remove.
        #[arg(long)]
        id: u64,
        /// Remove even if no reachable majority would remain.
        #[arg(long)]
        force: bool,
    },
    /// Hand leadership to another voter and wait until it leads.
    #[command(after_help = "Example:\n  rota cluster transfer-leader --url 10.0.0.1:7001 --id 2")]
    TransferLeader {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
        /// The voter to lead.
        #[arg(long)]
        id: u64,
    },
    /// Have each node of --url build a snapshot now, compacting its log.
    #[command(
        after_help = "Examples:\n  rota cluster snapshot --url 10.0.0.1:7001\n  rota cluster snapshot --url 10.0.0.1:7001,10.0.0.2:7001,10.0.0.3:7001"
    )]
    Snapshot {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
    },
    /// Start a new cluster from a backup.
    #[command(
        after_help = "Procedure:\n  1. Start the new nodes with empty data directories and without --initial-cluster.\n  2. rota cluster restore --file rota.snapshot \\\n       --initial-cluster 1=10.0.1.1:7001/10.0.1.1:8001,2=10.0.1.2:7001/10.0.1.2:8001,3=10.0.1.3:7001/10.0.1.3:8001\n  3. Point the workers at the new cluster.\n\nThe file is checked against FILE.sha256 when that exists, every member must answer and\nbe empty, the backup is installed on the member with the lowest id, and the command\nreturns once every member holds it, printing each member's state hash (equal to the\nbackup's). Ids retired in the old cluster stay retired in the new one."
    )]
    Restore {
        /// The backup written by `rota cluster backup`.
        #[arg(long)]
        file: PathBuf,
        /// The new cluster's voters: ID=API_HOST:PORT/RAFT_HOST:PORT, comma-separated.
        #[arg(long)]
        initial_cluster: String,
        #[command(flatten)]
        wait: Wait,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Download a consistent snapshot of the whole store to a file (with FILE.sha256).
    #[command(
        after_help = "Example:\n  rota cluster backup --url 127.0.0.1:7001 --out rota-$(date +%F).snapshot\n  sha256sum -c rota-$(date +%F).snapshot.sha256"
    )]
    Backup {
        #[command(flatten)]
        target: Target,
        /// Where to write the snapshot.
        #[arg(long)]
        out: PathBuf,
    },
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

fn parse_members(list: &str) -> Result<Vec<rpc::admin::MemberJson>, cli::CliError> {
    rpc::admin::parse_members(list)
        .map_err(|e| cli::CliError::Usage(format!("--initial-cluster: {e}")))
}

fn emit_change(json: bool, report: &cli::membership::ChangeReport) -> Result<(), cli::CliError> {
    emit(json, report, |r| format!("{}\n", r.summary))
}

async fn run_cluster(command: ClusterCommand) -> Result<(), cli::CliError> {
    use cli::membership::Admin;
    match command {
        ClusterCommand::Init {
            target,
            wait,
            initial_cluster,
        } => {
            let admin = Admin::new(&target.url, wait.duration())?;
            let report = admin.init(parse_members(&initial_cluster)?).await?;
            emit_change(target.json, &report)
        }
        ClusterCommand::AddLearner {
            target,
            wait,
            id,
            api_addr,
            raft_addr,
            no_wait,
        } => {
            let admin = Admin::new(&target.url, wait.duration())?;
            let member = rpc::admin::MemberJson {
                id,
                api_addr,
                raft_addr,
            };
            emit_change(target.json, &admin.add_learner(member, !no_wait).await?)
        }
        ClusterCommand::Promote { target, wait, id } => {
            let admin = Admin::new(&target.url, wait.duration())?;
            emit_change(target.json, &admin.promote(id).await?)
        }
        ClusterCommand::Remove {
            target,
            wait,
            id,
            force,
        } => {
            let admin = Admin::new(&target.url, wait.duration())?;
            emit_change(target.json, &admin.remove(id, force).await?)
        }
        ClusterCommand::TransferLeader { target, wait, id } => {
            let admin = Admin::new(&target.url, wait.duration())?;
            emit_change(target.json, &admin.transfer_leader(id).await?)
        }
        ClusterCommand::Snapshot { target, wait } => {
            let admin = Admin::new(&target.url, wait.duration())?;
            let reports = admin.snapshot().await?;
            emit(target.json, &reports, |reports| {
                let index = |i: Option<u64>| i.map_or("none".to_string(), |i| i.to_string());
                reports
                    .iter()
                    .map(|r| {
                        format!(
                            "node {}: snapshot at log index {}, log purged up to {}\n",
                            r.node,
                            index(r.snapshot_index),
                            r.purged_index
                                .map_or("nothing yet".to_string(), |i| i.to_string())
                        )
                    })
                    .collect()
            })
        }
        ClusterCommand::Restore {
            file,
            initial_cluster,
            wait,
            json,
        } => {
            let members = parse_members(&initial_cluster)?;
            let report = cli::cluster::restore(&file, members, wait.duration()).await?;
            emit(json, &report, |r| {
                let mut out = format!(
                    "restored {} ({} tasks, state hash {}); node {} leads\n",
                    r.file, r.tasks, r.backup_state_hash, r.leader
                );
                for (id, hash) in &r.members {
                    out.push_str(&format!(
                        "node {id}: applied {}, state hash {}\n",
                        hash.applied_index
                            .map_or("none".to_string(), |i| i.to_string()),
                        hash.state_hash
                    ));
                }
                out
            })
        }
        ClusterCommand::Backup { target, out } => {
            let report = cli::cluster::backup(&target.url, &out).await?;
            emit(target.json, &report, |report| {
                format!(
                    "wrote {} ({} bytes): log index {}, state hash {}; checksum in {}.sha256\n",
                    report.file, report.bytes, report.applied_index, report.state_hash, report.file
                )
            })
        }
        ClusterCommand::Status { url, json } => {
            let report = cli::cluster::status(&url).await?;
            emit(json, &report, cli::cluster::render_table)
        }
    }
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
            Command::Task(command) => run_task(command).await,
            Command::Cluster(command) => run_cluster(command).await,
            Command::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "rota", &mut std::io::stdout());
                Ok(())
            }
            Command::Groups { target } => {
                let client = cli::nodes::Nodes::new(&target.url)?;
                let groups: Vec<String> = client.get_json("/groups").await?;
                emit(target.json, &groups, |groups| {
                    groups.iter().map(|g| format!("{g}\n")).collect()
                })
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
                    addrs: cli::nodes::addresses(&url)?,
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
