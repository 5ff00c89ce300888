//! `rota`: the command-line tool for Rota clusters.

use std::path::PathBuf;
use std::process::ExitCode;

/// The allocator: see the note on `tikv-jemallocator` in the workspace's Cargo.toml.
#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    after_help = "Every command that talks to a cluster takes --url HOST:PORT[,HOST:PORT...] (or ROTA_URL),\ntrying each node in turn.\n\nExit codes: 0 done; 1 refused by the cluster or failed (`rota job wait`: a job had not\nfinished in time); 2 usage error; 3 no node answered, or a cluster command's --timeout\nran out waiting for a leader or a catch-up."
)]
struct Cli {
    /// Bearer token sent with every request (a node with --auth=tokens needs one; `rota
    /// cluster init` prints the first admin token).
    #[arg(long, global = true, env = "ROTA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The cluster's CA certificate (PEM): talk TLS to the nodes and trust certificates
    /// it signed (`rota dev up --secure` makes one in DIR/tls/ca.pem).
    #[arg(long, global = true, env = "ROTA_CA")]
    ca: Option<PathBuf>,
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
    /// Jobs (tasks with a key): add, get, list, dead, finish, fail, cancel, retry.
    #[command(subcommand)]
    Job(JobCommand),
    /// A group's job settings: show or change them, pause, resume.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Access tokens: add, list, revoke (an admin token's work).
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Certificates: a cluster CA and node certificates for TLS.
    #[command(subcommand)]
    Cert(CertCommand),
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
    /// Run a command once per task of a group: claim, run, renew, finish or fail.
    #[command(
        after_help = "Examples:\n  rota worker --url 127.0.0.1:7001,127.0.0.1:7002 --group thumbs --concurrency 4 -- ./thumbnail.sh\n  rota worker --url 127.0.0.1:7001 --group etl --lease 2m --metrics-addr 127.0.0.1:9464 -- python3 step.py\n  rota worker --config worker.toml\n\nThe command gets the task's data on stdin and ROTA_TASK_ID, ROTA_TASK_KEY, ROTA_ATTEMPT,\nROTA_GROUP and ROTA_FENCE_FILE (a file holding the current fence, rewritten at each\nrenewal) in its environment. Exit 0 finishes the task (result: exit status, duration,\nthe last 64 KiB of stdout and stderr); anything else fails it (retried after the\ngroup's back-off). A lost lease or a cancel kills the command's process group.\nSIGTERM or Ctrl-C: stop claiming, give running commands --grace, then kill them and give\ntheir tasks back to run elsewhere (a second signal ends the grace at once).\nWhat goes wrong is logged on stderr (docs/worker.md).\n\nA --config file (TOML) works several groups, each with its own command:\n  url = [\"127.0.0.1:7001\", \"127.0.0.1:7002\"]\n  grace = \"10s\"\n  metrics_addr = \"127.0.0.1:9464\"\n  [[group]]\n  name = \"map\"\n  concurrency = 4\n  lease = \"30s\"\n  command = [\"./map.sh\"]"
    )]
    Worker {
        /// Nodes (host:port or http://host:port), comma-separated, tried in turn.
        #[arg(long, env = "ROTA_URL", value_delimiter = ',')]
        url: Vec<String>,
        /// The group to take tasks from (or the groups of --config).
        #[arg(long, conflicts_with = "config")]
        group: Option<String>,
        /// Commands run at once.
        #[arg(long, default_value_t = 1, conflicts_with = "config")]
        concurrency: usize,
        /// Each claim's lease, renewed at a third of it: 30s, 2m (at least 1s).
        #[arg(long, value_parser = duration_ms, default_value = "30s", conflicts_with = "config")]
        lease: i64,
        /// After SIGTERM, how long running commands may go on before they are killed.
        #[arg(long, value_parser = duration_ms, default_value = "10s", conflicts_with = "config")]
        grace: i64,
        /// A TOML file naming several groups, each with its command, concurrency and lease.
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464).
        #[arg(long, env = "ROTA_WORKER_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Client id the worker claims as (default: random per invocation).
        #[arg(long, allow_negative_numbers = true)]
        client_id: Option<i64>,
        /// The command and its arguments.
        #[arg(last = true, conflicts_with = "config")]
        command: Vec<String>,
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
        /// cycle: add, claim, delete; job: add with a key, claim, finish; add: add only;
        /// wake: latency from an add to a blocking claim's answer; idle: log entries per
        /// second while the workers wait in blocking claims.
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
        /// Tasks per request in the cycle, job and add modes: one update adds them, one
        /// claim takes up to as many (`count`), one update deletes them or one
        /// `/finish/many` finishes them (1 to 1 000).
        #[arg(long, default_value_t = 1)]
        batch: u32,
        /// Cycles per second for all workers together (paced evenly), to measure latency
        /// at a chosen load; as fast as possible when absent.
        #[arg(long)]
        rate: Option<f64>,
        /// The HTTP version the workers speak. 1: each worker its own HTTP/1.1
        /// connection. 2 (cycle, job and add modes only): each 128 workers share one
        /// connection per node (HTTP/2 with prior knowledge, with or without TLS; a
        /// node serves 128 requests of one connection at once). auto: 2 for more than
        /// one worker in those modes, whose requests then travel together (fewer system
        /// calls and wake-ups on every side), else 1.
        #[arg(long, default_value = "auto", value_parser = ["auto", "1", "2"])]
        http: String,
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
    #[arg(long, visible_alias = "client", allow_negative_numbers = true)]
    client_id: Option<i64>,
    /// Request id: a retry with the same one and the same --client-id applies once
    /// (default: fresh per invocation).
    #[arg(long)]
    request_id: Option<String>,
}

/// The client that holds a claimed task, and how a retry is recognised.
#[derive(clap::Args)]
struct Owner {
    /// The client that claimed the task (its --client-id at `rota task claim`).
    #[arg(long, visible_alias = "client", allow_negative_numbers = true)]
    client_id: i64,
    /// Request id: a retry with the same one applies once (default: fresh per invocation).
    #[arg(long)]
    request_id: Option<String>,
}

/// Who asks for a change of jobs or settings, and how a retry is recognised.
#[derive(clap::Args)]
struct Asker {
    /// Client id recorded as the one who asked (in a cancelled job's reason).
    #[arg(
        long,
        visible_alias = "client",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    client_id: i64,
    /// Request id: a retry with the same one applies once (default: fresh per invocation).
    #[arg(long)]
    request_id: Option<String>,
}

impl Owner {
    fn request_id(&self) -> Option<String> {
        Some(cli::task::request_id(self.request_id.as_deref()))
    }
}

impl Asker {
    fn request_id(&self) -> Option<String> {
        Some(cli::task::request_id(self.request_id.as_deref()))
    }

    /// The body of a cancel or retry of `keys` in `group`, checked.
    fn keys(
        &self,
        group: String,
        keys: Vec<String>,
    ) -> Result<rpc::job::KeysRequestJson, cli::CliError> {
        let body = rpc::job::KeysRequestJson {
            clientid: self.client_id,
            group,
            keys,
            requestid: self.request_id(),
        };
        rpc::job::check_keys_request(&body).map_err(cli::CliError::Usage)?;
        Ok(body)
    }
}

/// `--every`, `--retry-in`, `--backoff-*`, `--retention`: a duration in milliseconds.
fn duration_ms(text: &str) -> Result<i64, String> {
    cli::job::parse_duration(text)
}

/// What `rota job add` does when its key names a live task of the group.
#[derive(Clone, Copy, clap::ValueEnum)]
enum OnConflict {
    /// Refuse the add (and the whole request), naming the live task.
    Refuse,
    /// Answer the live task instead; nothing is added.
    Keep,
    /// As keep, and run a running task once more after it succeeds.
    Resubmit,
}

impl From<OnConflict> for rpc::job::OnConflictJson {
    fn from(choice: OnConflict) -> Self {
        match choice {
            OnConflict::Refuse => Self::Refuse,
            OnConflict::Keep => Self::Keep,
            OnConflict::Resubmit => Self::Resubmit,
        }
    }
}

/// The job states `rota job list --state` takes.
const JOB_STATES: [&str; 6] = [
    "waiting",
    "running",
    "failed",
    "succeeded",
    "dead",
    "cancelled",
];

/// Which page of a group's job records to show.
#[derive(clap::Args)]
struct Paging {
    /// The group.
    #[arg(long)]
    group: String,
    /// Start after this key (a page's `next`).
    #[arg(long)]
    after: Option<String>,
    /// Jobs per page: 1 to 1000 (default: the node's, 100).
    #[arg(long)]
    limit: Option<usize>,
    /// Follow the pages to the last one.
    #[arg(long)]
    all: bool,
}

#[derive(Subcommand)]
enum JobCommand {
    /// Add a job: a task with a key, unique among the group's live tasks.
    #[command(
        after_help = "Examples:\n  rota job add --url 127.0.0.1:7001 --group mail --key welcome-42 --data 'to=42'\n  rota job add --url 127.0.0.1:7001 --group etl --key load --after extract,transform --max-attempts 3\n  rota job add --url 127.0.0.1:7001 --group ops --key nightly --every 24h --at 2030-01-02T03:00:00Z\n  rota job add --url 127.0.0.1:7001 --group mail --key welcome-42 --on-conflict keep --data-file msg.txt\n\nPrints the written task (or, with --on-conflict keep or resubmit, the live one). --after,\n--max-attempts, --every and --on-conflict need --key."
    )]
    Add {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        writer: Writer,
        /// The group.
        #[arg(long)]
        group: String,
        /// The job's key (1 to 256 bytes); without one the task is a plain task.
        #[arg(long)]
        key: Option<String>,
        /// Payload: text, @FILE, or @- for standard input.
        #[arg(long, conflicts_with = "data_file")]
        data: Option<String>,
        /// Payload from a file; - for standard input.
        #[arg(long)]
        data_file: Option<String>,
        /// Keys of the group that must succeed first, comma-separated.
        #[arg(long, value_delimiter = ',', requires = "key")]
        after: Vec<String>,
        /// Claims take higher priorities first (default 0).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i64>,
        /// Attempts before the job is dead; 0: unlimited (default: the group's setting).
        #[arg(long, requires = "key")]
        max_attempts: Option<u32>,
        /// Run again this long after each success: 90s, 5m, 1h, 7d.
        #[arg(long, value_parser = duration_ms, requires = "key", conflicts_with = "every_ms")]
        every: Option<i64>,
        /// As --every, in milliseconds.
        #[arg(long, requires = "key")]
        every_ms: Option<i64>,
        /// What to do when the key names a live task of the group (default: refuse).
        #[arg(long, value_enum, requires = "key")]
        on_conflict: Option<OnConflict>,
        /// When it becomes claimable: now (default), +DURATION (+10m), an RFC 3339 time
        /// (2030-01-02T03:04:05Z) or milliseconds since the epoch.
        #[arg(long, allow_hyphen_values = true)]
        at: Option<String>,
    },
    /// Show a job's record: state, attempts and their history, result, reason.
    #[command(
        after_help = "Examples:\n  rota job get --url 127.0.0.1:7001 --group mail --key welcome-42\n  rota job get --url 127.0.0.1:7001 --id 17"
    )]
    Get {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(long, requires = "key")]
        group: Option<String>,
        /// The job's key.
        #[arg(long, requires = "group")]
        key: Option<String>,
        /// Instead of --group and --key: the job's id (the task id its add printed,
        /// until its next run) or its live task's id.
        #[arg(long, conflicts_with_all = ["group", "key"])]
        id: Option<u64>,
    },
    /// Wait until jobs have finished (succeeded, dead or cancelled) and show them; exit 1
    /// if some have not within --timeout.
    #[command(
        after_help = "Examples:\n  rota job wait --url 127.0.0.1:7001 --group etl extract transform load\n  rota job wait --url 127.0.0.1:7001 --group mail --timeout 30s welcome-42 --json"
    )]
    Wait {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(long)]
        group: String,
        /// Give up after this long: 90s, 5m, 1h (default 5m).
        #[arg(long, value_parser = duration_ms, default_value = "5m")]
        timeout: i64,
        /// The jobs' keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// List a group's job records in key order, one page at a time (or --all).
    #[command(
        after_help = "Examples:\n  rota job list --url 127.0.0.1:7001 --group mail --state failed\n  rota job list --url 127.0.0.1:7001 --group mail --all --json"
    )]
    List {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        paging: Paging,
        /// Only jobs in this state.
        #[arg(long, value_parser = JOB_STATES)]
        state: Option<String>,
    },
    /// List a group's dead jobs (dead letters); `rota job retry` re-drives them.
    #[command(after_help = "Example:\n  rota job dead --url 127.0.0.1:7001 --group mail --all")]
    Dead {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        paging: Paging,
    },
    /// Claim a group's next job (highest priority, then oldest), waiting for one if asked.
    #[command(
        after_help = "Example:\n  rota job claim --url 127.0.0.1:7001 --group mail --client-id 7 --duration 5m --wait-ms 30000\n\nPrints the claimed task with its key and attempt, or nothing when none came in time;\nfinish or fail it with its id."
    )]
    Claim {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        writer: Writer,
        /// The group.
        #[arg(long)]
        group: String,
        /// How long the claim owns the job: 90s, 5m, 1h (default 1m).
        #[arg(long, value_parser = duration_ms, default_value = "1m")]
        duration: i64,
        /// When nothing is claimable, wait up to this many milliseconds (at most 60000).
        #[arg(long, value_name = "MS")]
        wait_ms: Option<u64>,
        /// Claim up to this many tasks at once (1 to 1000), each its own version and fence.
        #[arg(long)]
        count: Option<u32>,
    },
    /// End a claim with success, recording a result.
    #[command(
        after_help = "Example:\n  rota job finish --url 127.0.0.1:7001 --client-id 7 --id 12 --result '{\"rows\": 3}'\n\nOnly the client holding the claim may finish it, and only the claimed version (the id\nis the fence)."
    )]
    Finish {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        owner: Owner,
        /// The claimed task version.
        #[arg(long)]
        id: u64,
        /// The result: any JSON value (at most 256 KiB), @FILE or @-.
        #[arg(long)]
        result: Option<String>,
    },
    /// End a claim with an error: retried after the back-off, or dead after its last attempt.
    #[command(
        after_help = "Examples:\n  rota job fail --url 127.0.0.1:7001 --client-id 7 --id 12 --error 'smtp: timeout'\n  rota job fail --url 127.0.0.1:7001 --client-id 7 --id 12 --error @err.log --retry-in 30s"
    )]
    Fail {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        owner: Owner,
        /// The claimed task version.
        #[arg(long)]
        id: u64,
        /// What went wrong (at most 64 KiB): text, @FILE or @-.
        #[arg(long)]
        error: String,
        /// Retry after this long instead of the group's back-off: 0s, 30s, 5m.
        #[arg(long, value_parser = duration_ms)]
        retry_in: Option<i64>,
    },
    /// Cancel jobs, running or not; jobs waiting for them are cancelled too.
    #[command(
        after_help = "Example:\n  rota job cancel --url 127.0.0.1:7001 --group etl load transform\n\nA running job's owner is refused, with the reason, on its next renewal or finish."
    )]
    Cancel {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        asker: Asker,
        /// The jobs' group.
        #[arg(long)]
        group: String,
        /// The jobs' keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Re-drive dead jobs with a fresh attempt budget.
    #[command(
        after_help = "Example:\n  rota job retry --url 127.0.0.1:7001 --group mail welcome-42"
    )]
    Retry {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        asker: Asker,
        /// The jobs' group.
        #[arg(long)]
        group: String,
        /// The dead jobs' keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
}

#[derive(Subcommand)]
enum GroupCommand {
    /// Show a group's settings, or change the ones given (the others keep their value).
    #[command(
        after_help = "Examples:\n  rota group settings --url 127.0.0.1:7001 mail\n  rota group settings --url 127.0.0.1:7001 mail --max-running 4 --max-attempts 5\n  rota group settings --url 127.0.0.1:7001 mail --backoff-base 1s --backoff-factor 2 --backoff-max 5m --retention 7d\n\nA back-off changes as a whole: flags not given take the group's current values, read\nfirst. Durations: 500ms, 90s, 5m, 1h, 7d."
    )]
    Settings {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        asker: Asker,
        /// The group.
        group: String,
        /// Claims answer empty while this many of the group's tasks are leased (0: no limit).
        #[arg(long)]
        max_running: Option<u32>,
        /// Attempts before a job is dead, unless it sets its own (0: unlimited).
        #[arg(long)]
        max_attempts: Option<u32>,
        /// The first retry's delay.
        #[arg(long, value_parser = duration_ms)]
        backoff_base: Option<i64>,
        /// Growth of the delay per attempt, 1 to 100.
        #[arg(long)]
        backoff_factor: Option<f64>,
        /// The longest delay.
        #[arg(long, value_parser = duration_ms)]
        backoff_max: Option<i64>,
        /// How long finished job records are kept.
        #[arg(long, value_parser = duration_ms)]
        retention: Option<i64>,
    },
    /// Pause a group: claims answer empty (adds are still accepted) until resumed.
    #[command(after_help = "Example:\n  rota group pause --url 127.0.0.1:7001 mail")]
    Pause {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        asker: Asker,
        /// The group.
        group: String,
    },
    /// Resume a paused group's claims.
    #[command(after_help = "Example:\n  rota group resume --url 127.0.0.1:7001 mail")]
    Resume {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        asker: Asker,
        /// The group.
        group: String,
    },
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
        /// When nothing is claimable, wait up to this many milliseconds (at most 60000)
        /// for a task instead of answering empty at once.
        #[arg(long, value_name = "MS")]
        wait_ms: Option<u64>,
        /// Claim up to this many tasks at once (1 to 1000), each its own version and fence.
        #[arg(long)]
        count: Option<u32>,
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
    /// List a group's tasks by available time, then id (claims take higher priorities first).
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
        println!("{}", cli::json_text(value)?);
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

    /// A claim by this writer of up to `count` tasks (one if not given), waiting up to
    /// `wait_ms` for a task if given.
    fn claim(
        &self,
        group: String,
        duration_ms: i64,
        wait_ms: Option<u64>,
        count: Option<u32>,
    ) -> ClaimRequestJson {
        ClaimRequestJson {
            wait_ms,
            count,
            ..ClaimRequestJson::new(cli::task::client_id(self.client_id), group, duration_ms)
        }
    }

    /// Sends `request` under this writer's request id to the nodes of `target`; the
    /// tasks it wrote, as `print_tasks` shows them.
    async fn write(
        &self,
        target: &Target,
        request: impl Into<WriteRequestJson>,
    ) -> Result<Vec<Option<TaskJson>>, cli::CliError> {
        let request = request
            .into()
            .with_request_id(cli::task::request_id(self.request_id.as_deref()));
        let written = cli::nodes::Nodes::new(&target.url)?.write(&request).await?;
        Ok(written.into_iter().map(Some).collect())
    }
}

/// `rota job wait`: long polls of `/jobs/wait` until every job has finished or
/// `timeout_ms` passed.
async fn wait_for_jobs(
    target: &Target,
    group: &str,
    keys: &[String],
    timeout_ms: i64,
) -> Result<(), cli::CliError> {
    if keys.len() > rpc::job::WAIT_KEYS_MAX {
        return Err(cli::CliError::Usage(format!(
            "name at most {} jobs at once",
            rpc::job::WAIT_KEYS_MAX
        )));
    }
    let nodes = cli::nodes::Nodes::new(&target.url)?;
    let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let wait = left.min(Duration::from_millis(rpc::watch::WAIT_MS_MAX));
        let answer = nodes.wait_jobs(group, &key_refs, wait).await?;
        if answer.finished || left.is_zero() {
            if target.json {
                println!("{}", cli::json_text(&answer)?);
            } else {
                print!("{}", cli::job::render_jobs(&answer.jobs));
                for key in &answer.missing {
                    println!("{key}: no such job in {group}");
                }
            }
            if answer.finished {
                return Ok(());
            }
            return Err(cli::CliError::Failed(format!(
                "not every job had finished after {}",
                cli::job::format_duration(timeout_ms)
            )));
        }
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
            wait_ms,
            count,
        } => {
            let claim = writer.claim(group, duration_ms, wait_ms, count);
            let written = writer.write(&target, claim).await?;
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
            let mut path = format!(
                "/group/{}?owned={}",
                cli::nodes::encode(&group),
                u8::from(owned)
            );
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

/// Reads a flag that takes text, @FILE or @-.
fn text_or_file(flag: &str, text: String) -> Result<String, cli::CliError> {
    match text.strip_prefix('@') {
        Some(source) => cli::task::read_source(&format!("{flag} {text}"), source),
        None => Ok(text),
    }
}

/// Prints the node's page, or a table with a hint at the next page.
fn print_page(page: &rpc::job::JobPageJson, json: bool) -> Result<(), cli::CliError> {
    emit(json, page, |page| {
        let mut out = cli::job::render_jobs(&page.jobs);
        if let Some(next) = &page.next {
            out.push_str(&format!(
                "(more follow: --after {next:?} for the next page, or --all)\n"
            ));
        }
        out
    })
}

async fn run_job(command: JobCommand) -> Result<(), cli::CliError> {
    use cli::job::JobQuery;
    use cli::nodes::Nodes;
    use cli::nodes::encode;
    use cli::task::read_data;
    use rpc::job::FailRequestJson;
    use rpc::job::FinishRequestJson;
    match command {
        JobCommand::Add {
            target,
            writer,
            group,
            key,
            data,
            data_file,
            after,
            priority,
            max_attempts,
            every,
            every_ms,
            on_conflict,
            at,
        } => {
            let data = match data_file {
                Some(file) => Some(cli::task::read_source(
                    &format!("--data-file {file}"),
                    &file,
                )?),
                None => read_data(data.as_deref())?,
            };
            let timespec = at
                .as_deref()
                .map(cli::job::parse_at)
                .transpose()
                .map_err(cli::CliError::Usage)?
                .flatten();
            let add = AddJson {
                data,
                timespec,
                key,
                after,
                priority,
                max_attempts,
                every_ms: every.or(every_ms),
                on_conflict: on_conflict.map(Into::into),
                ..AddJson::in_group(group)
            };
            rpc::job::check_add_job(0, &add).map_err(cli::CliError::Usage)?;
            let written = writer.write(&target, writer.update().with_add(add)).await?;
            print_tasks(&written, target.json)
        }
        JobCommand::Get {
            target,
            group,
            key,
            id,
        } => {
            let path = match (id, group, key) {
                (Some(id), _, _) => format!("/job?id={id}"),
                (None, Some(group), Some(key)) => {
                    format!("/job?group={}&key={}", encode(&group), encode(&key))
                }
                _ => {
                    return Err(cli::CliError::Usage(
                        "name the job with --group and --key, or with --id".into(),
                    ));
                }
            };
            let job: rpc::job::JobJson = Nodes::new(&target.url)?.get_json(&path).await?;
            emit(target.json, &job, cli::job::render_job)
        }
        JobCommand::Wait {
            target,
            group,
            timeout,
            keys,
        } => wait_for_jobs(&target, &group, &keys, timeout).await,
        JobCommand::Claim {
            target,
            writer,
            group,
            duration,
            wait_ms,
            count,
        } => {
            let claim = writer.claim(group, duration, wait_ms, count);
            let written = writer.write(&target, claim).await?;
            print_tasks(&written, target.json)
        }
        JobCommand::List {
            target,
            paging,
            state,
        } => {
            let query = JobQuery {
                path: "/jobs",
                group: &paging.group,
                state: state.as_deref(),
                after: paging.after.as_deref(),
                limit: paging.limit,
                all: paging.all,
            };
            let page = query.read(&Nodes::new(&target.url)?).await?;
            print_page(&page, target.json)
        }
        JobCommand::Dead { target, paging } => {
            let query = JobQuery {
                path: "/dead",
                group: &paging.group,
                state: None,
                after: paging.after.as_deref(),
                limit: paging.limit,
                all: paging.all,
            };
            let page = query.read(&Nodes::new(&target.url)?).await?;
            print_page(&page, target.json)
        }
        JobCommand::Finish {
            target,
            owner,
            id,
            result,
        } => {
            let result = result
                .map(|text| {
                    let text = text_or_file("--result", text)?;
                    serde_json::from_str(&text).map_err(|e| {
                        cli::CliError::Usage(format!(
                            "--result is not JSON ({e}); quote text as JSON, e.g. --result '\"done\"'"
                        ))
                    })
                })
                .transpose()?;
            let body = FinishRequestJson {
                clientid: owner.client_id,
                id,
                result,
                requestid: owner.request_id(),
                next: None,
            };
            let written = Nodes::new(&target.url)?
                .write(&WriteRequestJson::Finish(body))
                .await?;
            emit(target.json, &written, |_| format!("finished task {id}\n"))
        }
        JobCommand::Fail {
            target,
            owner,
            id,
            error,
            retry_in,
        } => {
            let body = FailRequestJson {
                clientid: owner.client_id,
                id,
                error: text_or_file("--error", error)?,
                retry_in_ms: retry_in,
                requestid: owner.request_id(),
            };
            rpc::job::check_fail(&body).map_err(cli::CliError::Usage)?;
            let written = Nodes::new(&target.url)?
                .write(&WriteRequestJson::Fail(body))
                .await?;
            emit(target.json, &written, |written| {
                if written.is_empty() {
                    format!("failed task {id}; that was its last attempt: its job is dead\n")
                } else {
                    let retry: Vec<Option<TaskJson>> = written.iter().cloned().map(Some).collect();
                    format!(
                        "failed task {id}; its retry:\n{}",
                        cli::task::render_tasks(&retry)
                    )
                }
            })
        }
        JobCommand::Cancel {
            target,
            asker,
            group,
            keys,
        } => {
            let body = asker.keys(group, keys)?;
            let written = Nodes::new(&target.url)?
                .write(&WriteRequestJson::Cancel(body.clone()))
                .await?;
            emit(target.json, &written, |_| {
                format!(
                    "cancelled {} in group {} (and the jobs waiting for them)\n",
                    body.keys.join(", "),
                    body.group
                )
            })
        }
        JobCommand::Retry {
            target,
            asker,
            group,
            keys,
        } => {
            let body = asker.keys(group, keys)?;
            let written = Nodes::new(&target.url)?
                .write(&WriteRequestJson::Retry(body))
                .await?;
            let written: Vec<Option<TaskJson>> = written.into_iter().map(Some).collect();
            print_tasks(&written, target.json)
        }
    }
}

/// Changes `group`'s settings as `change` says; prints the settings afterwards.
async fn change_settings(
    target: &Target,
    group: &str,
    change: rpc::job::SettingsChangeJson,
    summary: Option<String>,
) -> Result<(), cli::CliError> {
    rpc::job::check_settings_change(&change).map_err(cli::CliError::Usage)?;
    let settings: rpc::job::SettingsJson = cli::nodes::Nodes::new(&target.url)?
        .put_json(&settings_path(group), &change)
        .await?;
    emit(target.json, &settings, |settings| {
        let mut out = summary.unwrap_or_default();
        out.push_str(&cli::job::render_settings(settings, false));
        out
    })
}

fn settings_path(group: &str) -> String {
    format!("/groups/{}/settings", cli::nodes::encode(group))
}

async fn run_group(command: GroupCommand) -> Result<(), cli::CliError> {
    use rpc::job::BackoffJson;
    use rpc::job::SettingsChangeJson;
    use rpc::job::SettingsJson;
    match command {
        GroupCommand::Settings {
            target,
            asker,
            group,
            max_running,
            max_attempts,
            backoff_base,
            backoff_factor,
            backoff_max,
            retention,
        } => {
            let nodes = cli::nodes::Nodes::new(&target.url)?;
            let backoff_given =
                backoff_base.is_some() || backoff_factor.is_some() || backoff_max.is_some();
            let changes = max_running.is_some()
                || max_attempts.is_some()
                || backoff_given
                || retention.is_some();
            if !changes {
                let settings: SettingsJson = nodes.get_json(&settings_path(&group)).await?;
                return emit(target.json, &settings, |s| {
                    cli::job::render_settings(s, true)
                });
            }
            let backoff = match (backoff_base, backoff_factor, backoff_max) {
                (None, None, None) => None,
                (Some(base_ms), Some(factor), Some(max_ms)) => Some(BackoffJson {
                    base_ms,
                    factor,
                    max_ms,
                }),
                (base, factor, max) => {
                    // A back-off changes as a whole: fill in what was not given.
                    let current: SettingsJson = nodes.get_json(&settings_path(&group)).await?;
                    Some(BackoffJson {
                        base_ms: base.unwrap_or(current.backoff.base_ms),
                        factor: factor.unwrap_or(current.backoff.factor),
                        max_ms: max.unwrap_or(current.backoff.max_ms),
                    })
                }
            };
            let change = SettingsChangeJson {
                clientid: asker.client_id,
                max_running: max_running.map(i64::from),
                paused: None,
                max_attempts: max_attempts.map(i64::from),
                backoff,
                retention_ms: retention,
                requestid: asker.request_id(),
            };
            change_settings(&target, &group, change, None).await
        }
        GroupCommand::Pause {
            target,
            asker,
            group,
        } => {
            let change = SettingsChangeJson {
                clientid: asker.client_id,
                paused: Some(true),
                requestid: asker.request_id(),
                ..SettingsChangeJson::default()
            };
            let summary =
                format!("paused {group}: claims answer empty until `rota group resume {group}`\n");
            change_settings(&target, &group, change, Some(summary)).await
        }
        GroupCommand::Resume {
            target,
            asker,
            group,
        } => {
            let change = SettingsChangeJson {
                clientid: asker.client_id,
                paused: Some(false),
                requestid: asker.request_id(),
                ..SettingsChangeJson::default()
            };
            change_settings(&target, &group, change, Some(format!("resumed {group}\n"))).await
        }
    }
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
enum CertCommand {
    /// Make a CA (DIR/ca.pem, DIR/ca.key); refuses to overwrite one.
    #[command(
        after_help = "Example:\n  rota cert ca --dir /etc/rota/tls\n\nKeep ca.key offline once the node certificates are made; give every node and client ca.pem."
    )]
    Ca {
        /// Where the files go.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Make node ID's certificate (DIR/node-ID.pem, DIR/node-ID.key), signed by the CA in DIR.
    #[command(
        after_help = "Example:\n  rota cert node --dir /etc/rota/tls --id 3 --host rota-3.example.internal,10.0.0.3\n\nThe certificate names rota-node-ID (the node's identity on the Raft port) and every\n--host (the names and addresses clients and other nodes dial). Start the node with\n--tls-cert DIR/node-ID.pem --tls-key DIR/node-ID.key --tls-ca DIR/ca.pem."
    )]
    Node {
        /// Where the CA is and the files go.
        #[arg(long)]
        dir: PathBuf,
        /// The node's id.
        #[arg(long)]
        id: u64,
        /// Host names and IP addresses the node is reached at, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        host: Vec<String>,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Bearer tokens: add, list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a token and print it once; returns when every member accepts it.
    #[command(
        after_help = "Examples:\n  rota auth token add --url 10.0.0.1:7001 --name thumbs-workers --role worker --groups thumbs-,resize-\n  rota auth token add --url 10.0.0.1:7001 --name grafana --role reader\n  rota auth token add --url 10.0.0.1:7001 --name ops --role admin\n\nRoles: worker (the task and job API, limited to --groups prefixes if given), reader\n(reads, /watch, /metrics, the dashboard), admin (everything). The cluster keeps only the\ntoken's hash: store the printed token now."
    )]
    Add {
        #[command(flatten)]
        target: Target,
        /// A name for people.
        #[arg(long)]
        name: String,
        /// worker, reader or admin.
        #[arg(long)]
        role: String,
        /// Group name prefixes a worker token is limited to, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
    },
    /// List the cluster's tokens (never their secrets).
    #[command(after_help = "Example:\n  rota auth token list --url 10.0.0.1:7001")]
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Revoke a token by id; returns when no member accepts it any more.
    #[command(
        after_help = "Example:\n  rota auth token revoke --url 10.0.0.1:7001 3f9c0a1b2c3d4e5f"
    )]
    Revoke {
        #[command(flatten)]
        target: Target,
        /// The token's id (the 16 hex digits after `rota_`).
        id: String,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Form a cluster from nodes started without --initial-cluster, and make its first
    /// admin token.
    #[command(
        after_help = "Examples:\n  rota cluster init --url 10.0.0.1:7001 \\\n    --initial-cluster 1=10.0.0.1:7001/10.0.0.1:8001,2=10.0.0.2:7001/10.0.0.2:8001,3=10.0.0.3:7001/10.0.0.3:8001\n  rota cluster init --url 10.0.0.1:7001    # a cluster its nodes formed from --initial-cluster\n\nWith --initial-cluster, every member must run and belong to no cluster. Without it, the\ncluster exists already (its nodes formed it by themselves) and only the token is made.\nThe first admin token is printed once: the cluster keeps only its hash. It can be made\nonce in a cluster's life, by anyone who reaches a node, so run this as soon as the\ncluster is up; make further tokens with `rota auth token add`."
    )]
    Init {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        wait: Wait,
        /// The voters: ID=API_HOST:PORT/RAFT_HOST:PORT, comma-separated.
        #[arg(long)]
        initial_cluster: Option<String>,
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
        after_help = "Procedure:\n  1. Start the new nodes with empty data directories and without --initial-cluster.\n  2. rota cluster restore --file rota.snapshot \\\n       --initial-cluster 1=10.0.1.1:7001/10.0.1.1:8001,2=10.0.1.2:7001/10.0.1.2:8001,3=10.0.1.3:7001/10.0.1.3:8001\n  3. Point the workers at the new cluster.\n\nThe file is checked against FILE.sha256 when that exists, every member must answer and\nbe empty, the backup is installed on the member with the lowest id, and the command\nreturns once every member holds it, printing each member's state hash (all equal: the\nbackup's state, with log time moved to the restore and task ids above the old ones, so\nnot the backup's own hash, which it checks first).\nIds retired in the old cluster stay retired in the new one."
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
        /// Where to write the snapshot (and its checksum, in OUT.sha256).
        #[arg(long)]
        out: PathBuf,
        /// Replace OUT if it exists (by default an existing backup is never overwritten).
        #[arg(long)]
        force: bool,
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

async fn run_token(command: TokenCommand) -> Result<(), cli::CliError> {
    match command {
        TokenCommand::Add {
            target,
            name,
            role,
            groups,
        } => {
            let add = rpc::auth::TokenAddJson { name, role, groups };
            let made = cli::auth::add(&cli::nodes::Nodes::new(&target.url)?, add).await?;
            emit(target.json, &made, |made| {
                format!(
                    "{}\n(id {}; shown once: the cluster keeps only its hash)\n",
                    made.bearer, made.token.id
                )
            })
        }
        TokenCommand::List { target } => {
            let tokens = cli::auth::list(&cli::nodes::Nodes::new(&target.url)?).await?;
            emit(target.json, &tokens, |tokens| {
                let header = format!("{:<16}  {:<6}  {:<24}  NAME\n", "ID", "ROLE", "GROUPS");
                tokens
                    .iter()
                    .fold(header, |out, t| out + &cli::auth::token_line(t) + "\n")
            })
        }
        TokenCommand::Revoke { target, id } => {
            let revoked = cli::auth::revoke(&cli::nodes::Nodes::new(&target.url)?, &id).await?;
            emit(target.json, &revoked, |t| {
                format!("revoked token {} ({}, {})\n", t.id, t.role, t.name)
            })
        }
    }
}

async fn run_cluster(command: ClusterCommand) -> Result<(), cli::CliError> {
    use cli::membership::Admin;
    match command {
        ClusterCommand::Init {
            target,
            wait,
            initial_cluster,
        } => {
            if let Some(initial_cluster) = initial_cluster {
                let admin = Admin::new(&target.url, wait.duration())?;
                let report = admin.init(parse_members(&initial_cluster)?).await?;
                emit_change(target.json, &report)?;
            }
            let made = cli::auth::bootstrap(&cli::nodes::Nodes::new(&target.url)?).await?;
            emit(target.json, &made, |made| {
                format!(
                    "first admin token (shown once; the cluster keeps only its hash):\n{}\n",
                    made.bearer
                )
            })
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
                    "restored {} ({} tasks, backup state hash {}); node {} leads\n\
                     new cluster: state hash {}, next task id {}, log time {} ms\n",
                    r.file,
                    r.tasks,
                    r.backup_state_hash,
                    r.leader,
                    r.restored_state_hash,
                    r.next_id,
                    r.log_time
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
        ClusterCommand::Backup { target, out, force } => {
            if !force && out.exists() {
                return Err(cli::CliError::Usage(format!(
                    "{} exists; name another file, or pass --force to replace it",
                    out.display()
                )));
            }
            let report = cli::cluster::backup(&target.url, &out).await?;
            emit(target.json, &report, |report| {
                format!(
                    "wrote {} ({} bytes): log index {}, state hash {}; checksum in {}.sha256\n",
                    report.file,
                    report.bytes,
                    report
                        .applied_index
                        .map_or_else(|| "unknown".to_string(), |i| i.to_string()),
                    report.state_hash,
                    report.file
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
        /// A flag for every node this command starts, e.g. --node-arg=--ui-actions
        /// (repeat for several; nodes already running keep theirs).
        #[arg(long = "node-arg", allow_hyphen_values = true)]
        node_args: Vec<String>,
        /// Nodes that require tokens: the first admin token is printed on stderr and
        /// kept in DIR/admin.token. Without it the nodes run with --auth=off.
        #[arg(long)]
        secure: bool,
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
        cli::set_token(cli.token)?;
        cli::set_ca(cli.ca)?;
        match cli.command {
            Command::Dev(DevCommand::Up {
                nodes,
                dir,
                sync,
                node_args,
                secure,
            }) => {
                let urls = cli::dev::up(&dir, nodes, &sync, &node_args, secure).await?;
                // `urls=$(rota dev up ... | head -1)` closes the pipe after one line: the
                // nodes run either way, so a closed stdout is not an error.
                let mut stdout = std::io::stdout().lock();
                for url in urls {
                    if std::io::Write::write_all(&mut stdout, format!("{url}\n").as_bytes())
                        .is_err()
                    {
                        break;
                    }
                }
                Ok::<(), cli::CliError>(())
            }
            Command::Dev(DevCommand::Down { dir }) => Ok(cli::dev::down(&dir).await?),
            Command::Task(command) => run_task(command).await,
            Command::Job(command) => run_job(command).await,
            Command::Group(command) => run_group(command).await,
            Command::Cluster(command) => run_cluster(command).await,
            Command::Auth(AuthCommand::Token(command)) => run_token(command).await,
            Command::Cert(CertCommand::Ca { dir }) => {
                let made = cli::cert::make_ca(&dir)?;
                println!("{}\n{}", made.cert.display(), made.key.display());
                Ok(())
            }
            Command::Cert(CertCommand::Node { dir, id, host }) => {
                let made = cli::cert::make_node(&dir, id, &host)?;
                println!("{}\n{}", made.cert.display(), made.key.display());
                Ok(())
            }
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
            Command::Worker {
                url,
                group,
                concurrency,
                lease,
                grace,
                config,
                metrics_addr,
                client_id,
                command,
            } => {
                let wait = rpc::lease::WorkerOptions::new("").wait;
                let (file_urls, file_client_id, file_metrics, groups) = match config {
                    Some(path) => {
                        let file = cli::worker::ConfigFile::read(&path)?;
                        let groups = file.groups(wait)?;
                        let metrics = match file.metrics_addr.as_deref() {
                            Some(addr) => Some(addr.parse().map_err(|e| {
                                cli::CliError::Usage(format!("metrics_addr {addr:?}: {e}"))
                            })?),
                            None => None,
                        };
                        (file.url, file.client_id, metrics, groups)
                    }
                    None => {
                        let Some(group) = group else {
                            return Err(cli::CliError::Usage(
                                "give --group G -- CMD, or --config FILE".into(),
                            ));
                        };
                        let options = rpc::lease::WorkerOptions {
                            concurrency,
                            lease: Duration::from_millis(lease.max(0) as u64),
                            grace: Duration::from_millis(grace.max(0) as u64),
                            ..rpc::lease::WorkerOptions::new(group)
                        };
                        let group = cli::worker::GroupWork { options, command };
                        (Vec::new(), None, None, vec![group])
                    }
                };
                let urls = if url.is_empty() { file_urls } else { url };
                if urls.is_empty() {
                    return Err(cli::CliError::Usage(
                        "give the nodes: --url, ROTA_URL, or url = [...] in --config".into(),
                    ));
                }
                let config = cli::worker::WorkerConfig {
                    urls: cli::nodes::addresses(&urls)?,
                    client_id: cli::task::client_id(client_id.or(file_client_id)),
                    metrics_addr: metrics_addr.or(file_metrics),
                    groups,
                };
                let finished = cli::worker::run(config).await?;
                eprintln!("rota worker: stopped after finishing {finished} task(s)");
                Ok(())
            }
            Command::Bench {
                url,
                workers,
                mode,
                duration,
                max_cycles,
                group,
                batch,
                rate,
                http,
            } => {
                let config = cli::bench::BenchConfig {
                    addrs: cli::nodes::addresses(&url)?,
                    workers,
                    mode,
                    duration: Duration::from_secs(duration),
                    max_cycles,
                    group,
                    batch,
                    rate,
                    http2: match http.as_str() {
                        "1" => false,
                        "2" => true,
                        _ => cli::bench::shares_http2_by_default(workers, mode),
                    },
                };
                let report = match config.mode {
                    cli::bench::BenchMode::Wake => cli::bench_wait::wake(config).await?,
                    cli::bench::BenchMode::Idle => cli::bench_wait::idle(config).await?,
                    _ => cli::bench::run(config).await?,
                };
                print!("{report}");
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
