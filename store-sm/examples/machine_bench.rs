//! Measures the task machine on one core: apply rate per command kind, memory per task,
//! and snapshot build and restore times, at a given number of tasks.
//!
//! ```text
//! cargo run --release -p store-sm --no-default-features --example machine_bench -- 1000000
//! ```

use std::time::Instant;

use store_sm::machine::AddTask;
use store_sm::machine::ClaimRequest;
use store_sm::machine::Command;
use store_sm::machine::FinishRequest;
use store_sm::machine::LogTime;
use store_sm::machine::Outcome;
use store_sm::machine::Request;
use store_sm::machine::TaskMachine;
use store_sm::machine::UpdateRequest;
use store_sm::snapshot::decode_snapshot;
use store_sm::snapshot::encode_snapshot;
use store_sm::snapshot::state_hash;

const T0: i64 = 1_700_000_000_000;
const GROUPS: u64 = 16;

/// Resident memory of this process in bytes (Linux).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn command(i: u64, request: Request) -> Command {
    Command {
        stamp: LogTime::from_millis(T0 + (i / 1000) as i64),
        request_id: Some(format!("req-{i}")),
        request,
    }
}

fn report(what: &str, count: u64, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{what:<28} {count:>9} commands in {seconds:>7.3} s = {:>10.0} commands/s",
        count as f64 / seconds
    );
}

fn main() {
    let tasks: u64 = std::env::args()
        .nth(1)
        .map(|arg| {
            arg.parse()
                .expect("the first argument is a number of tasks")
        })
        .unwrap_or(1_000_000);
    println!("task machine benchmark: {tasks} tasks, {GROUPS} groups, 32-byte payloads, one core");

    let rss_before = rss_bytes();
    let mut machine = TaskMachine::new();
    let started = Instant::now();
    for i in 0..tasks {
        // A seed update, logged as the node logs one (the pre-job encoding).
        let add = Request::LegacyUpdate(UpdateRequest {
            client: (i % 64) as i64,
            adds: vec![AddTask::seed(
                format!("group-{}", i % GROUPS),
                format!("{i:032}"),
                Some(0),
            )],
            ..Default::default()
        });
        machine.apply(&command(i, add));
    }
    report("add (one task each)", tasks, started);
    let rss_after = rss_bytes();
    println!(
        "memory: {:.0} bytes per task (resident set grew {} MiB for {tasks} tasks, dedup table included)",
        rss_after.saturating_sub(rss_before) as f64 / tasks as f64,
        rss_after.saturating_sub(rss_before) / (1024 * 1024)
    );

    let started = Instant::now();
    let bytes = encode_snapshot(&machine.clone());
    let build_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let restored = decode_snapshot(&bytes).expect("the snapshot decodes");
    let restore_seconds = started.elapsed().as_secs_f64();
    println!(
        "snapshot: {} tasks, {:.1} MiB, build {build_seconds:.3} s, restore {restore_seconds:.3} s",
        machine.task_count(),
        bytes.len() as f64 / (1024.0 * 1024.0)
    );
    let started = Instant::now();
    let original = state_hash(&machine);
    let hash_seconds = started.elapsed().as_secs_f64();
    assert_eq!(
        state_hash(&restored),
        original,
        "restore gives an identical machine"
    );
    println!("state hash {original} ({hash_seconds:.3} s), equal after restore");

    let cycles = tasks.min(200_000);
    let mut claimed = Vec::with_capacity(cycles as usize);
    let started = Instant::now();
    for i in 0..cycles {
        let claim = Request::Claim(ClaimRequest {
            client: (i % 64) as i64,
            group: format!("group-{}", i % GROUPS),
            duration_ms: 60_000,
            depends: vec![],
        });
        if let Outcome::Tasks(tasks) = &*machine.apply(&command(tasks + i, claim)) {
            claimed.extend(tasks.iter().map(|t| (t.id, t.owner)));
        }
    }
    report("claim", cycles, started);
    let started = Instant::now();
    for (n, (id, owner)) in claimed.iter().enumerate() {
        let delete = Request::LegacyUpdate(UpdateRequest {
            client: *owner,
            deletes: vec![*id],
            ..Default::default()
        });
        machine.apply(&command(tasks + cycles + n as u64, delete));
    }
    report("delete (claimed task)", claimed.len() as u64, started);

    // The job cycle: add with a key, claim, finish with a result.
    let jobs = cycles;
    let base = tasks + 2 * cycles;
    let started = Instant::now();
    for i in 0..jobs {
        let mut add = AddTask::seed("jobs", format!("{i:032}"), Some(0));
        add.job.key = Some(format!("job-{i}"));
        let add = Request::Update(UpdateRequest {
            client: 1,
            adds: vec![add],
            ..Default::default()
        });
        machine.apply(&command(base + 3 * i, add));
        let claim = Request::Claim(ClaimRequest {
            client: 2,
            group: "jobs".into(),
            duration_ms: 60_000,
            depends: vec![],
        });
        let Outcome::Tasks(claimed) = &*machine.apply(&command(base + 3 * i + 1, claim)) else {
            panic!("the claim is refused");
        };
        let finish = Request::Finish(FinishRequest {
            client: 2,
            id: claimed[0].id,
            result: Some("{\"ok\":true}".into()),
        });
        machine.apply(&command(base + 3 * i + 2, finish));
    }
    report("job cycle (3 commands)", 3 * jobs, started);

    claims_over_many_priorities(base + 3 * jobs);
}

/// Claims in a group whose tasks each have a priority of their own: first while every
/// task is scheduled for later (an empty claim), then with one available task at the
/// lowest priority. What a claim costs per priority level shows here.
fn claims_over_many_priorities(first: u64) {
    const LEVELS: u64 = 50_000;
    const CLAIMS: u64 = 2_000;
    let mut machine = TaskMachine::new();
    let adds = (0..LEVELS).map(|level| {
        let mut add = AddTask::seed("levels", format!("{level:032}"), Some(-3_600_000));
        add.job.priority = level as i64 + 1;
        add
    });
    let adds: Vec<AddTask> = adds.collect();
    for (n, chunk) in adds.chunks(5_000).enumerate() {
        let update = Request::Update(UpdateRequest {
            client: 1,
            adds: chunk.to_vec(),
            ..Default::default()
        });
        machine.apply(&command(first + n as u64, update));
    }
    let claim = || {
        Request::Claim(ClaimRequest {
            client: 2,
            group: "levels".into(),
            duration_ms: 60_000,
            depends: vec![],
        })
    };
    let base = first + LEVELS;
    let started = Instant::now();
    for i in 0..CLAIMS {
        machine.apply(&command(base + i, claim()));
    }
    report(&format!("empty claim, {LEVELS} levels"), CLAIMS, started);

    let mut add = AddTask::seed("levels", "now", Some(0));
    add.job.priority = 0;
    let update = Request::Update(UpdateRequest {
        client: 1,
        adds: vec![add],
        ..Default::default()
    });
    machine.apply(&command(base + CLAIMS, update));
    let started = Instant::now();
    for i in 0..CLAIMS {
        // Claimed, then given back at once: the next claim finds it again.
        let Outcome::Tasks(claimed) = &*machine.apply(&command(base + CLAIMS + 1 + 2 * i, claim()))
        else {
            panic!("the claim is refused");
        };
        let task = claimed.first().expect("the available task");
        let release = Request::Update(UpdateRequest {
            client: 2,
            updates: vec![store_sm::machine::UpdateTask {
                id: task.id,
                data: task.data.clone(),
                timespec: Some(0),
            }],
            ..Default::default()
        });
        machine.apply(&command(base + CLAIMS + 2 + 2 * i, release));
    }
    report(
        &format!("claim+release, {LEVELS} levels"),
        2 * CLAIMS,
        started,
    );
}
