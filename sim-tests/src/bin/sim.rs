//! `sim`: runs simulation scenarios over many seeds, in parallel, and says how to replay
//! any seed that fails. Built only with `--cfg madsim`; `scripts/sim` builds and runs it.

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "sim: this build has no simulator; run it through scripts/sim, which builds with RUSTFLAGS=\"--cfg madsim\""
    );
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() {
    std::process::exit(runner::main());
}

#[cfg(madsim)]
mod runner {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use clap::Parser;
    use sim_tests::scenario::RunFailure;
    use sim_tests::scenario::RunReport;
    use sim_tests::scenario::Scenario;
    use sim_tests::scenario::run_seed;
    use store_sm::planted::Bug;

    /// Runs Rota's deterministic simulation: each seed picks a cluster size, a fault
    /// schedule and every interleaving; the same seed replays the same run exactly.
    #[derive(Parser, Debug)]
    #[command(name = "sim")]
    struct Args {
        /// First seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How many seeds, from --seed on.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// A scenario (swarm, partition, crash, clock, membership) or all.
        #[arg(long, default_value = "all")]
        scenario: String,
        /// Plant a known bug (ack-before-sync, follower-read, wall-clock-lease, id-reuse,
        /// partial-transaction, ignore-max-running, unfenced-finish, watch-skip, local-token-check): the run should then fail.
        #[arg(long)]
        plant_bug: Option<Bug>,
        /// With --plant-bug: stop at the first seed that catches it, succeed if one does.
        #[arg(long)]
        expect_caught: bool,
        /// Runs at once (default: the machine's cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Run every seed twice and require identical trace digests.
        #[arg(long)]
        check_determinism: bool,
        /// Print each run's trace.
        #[arg(long)]
        trace: bool,
        /// Print only failures and the totals.
        #[arg(long)]
        quiet: bool,
    }

    /// What one (scenario, seed) run ended with.
    type Outcome = Result<RunReport, RunFailure>;

    pub fn main() -> i32 {
        let args = Args::parse();
        let scenarios = match args.scenario.as_str() {
            "all" => Scenario::ALL.to_vec(),
            name => match name.parse::<Scenario>() {
                Ok(s) => vec![s],
                Err(e) => {
                    eprintln!("sim: {e}");
                    return 2;
                }
            },
        };
        let jobs = args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        let runs: Vec<(Scenario, u64)> = scenarios
            .iter()
            .flat_map(|&s| (args.seed..args.seed + args.seeds).map(move |seed| (s, seed)))
            .collect();
        let started = Instant::now();
        let results = run_all(&runs, jobs, &args);
        let elapsed = started.elapsed();
        report(&results, &args, elapsed)
    }

    /// Runs `runs` on `jobs` threads, printing each as it ends; stops early when a
    /// planted bug is expected and caught.
    fn run_all(
        runs: &[(Scenario, u64)],
        jobs: usize,
        args: &Args,
    ) -> BTreeMap<(Scenario, u64), Outcome> {
        let next = AtomicU64::new(0);
        let caught = std::sync::atomic::AtomicBool::new(false);
        let results = Mutex::new(BTreeMap::new());
        std::thread::scope(|scope| {
            for _ in 0..jobs.max(1) {
                scope.spawn(|| {
                    loop {
                        let index = next.fetch_add(1, Ordering::SeqCst) as usize;
                        let Some(&(scenario, seed)) = runs.get(index) else {
                            return;
                        };
                        if args.expect_caught && caught.load(Ordering::SeqCst) {
                            return;
                        }
                        let outcome = run_checked(scenario, seed, args);
                        print_run(scenario, seed, &outcome, args);
                        if outcome.is_err() {
                            caught.store(true, Ordering::SeqCst);
                        }
                        results
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert((scenario, seed), outcome);
                    }
                });
            }
        });
        results.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// One run, or two with --check-determinism (a differing digest is a failure).
    fn run_checked(scenario: Scenario, seed: u64, args: &Args) -> Outcome {
        let first = run_seed(scenario, seed, args.plant_bug);
        if !args.check_determinism {
            return first;
        }
        let second = run_seed(scenario, seed, args.plant_bug);
        let digest = |o: &Outcome| match o {
            Ok(r) => r.digest.clone(),
            Err(f) => f.digest.clone(),
        };
        if digest(&first) == digest(&second) {
            return first;
        }
        Err(RunFailure {
            problems: vec![format!(
                "not deterministic: two runs of seed {seed} left traces {} and {}",
                digest(&first),
                digest(&second)
            )],
            faults: Vec::new(),
            trace: Vec::new(),
            digest: digest(&first),
        })
    }

    fn replay_command(scenario: Scenario, seed: u64, bug: Option<Bug>) -> String {
        let bug = bug.map_or(String::new(), |b| format!(" --plant-bug {b}"));
        format!("scripts/sim --seed {seed} --scenario {scenario}{bug} --trace")
    }

    fn print_run(scenario: Scenario, seed: u64, outcome: &Outcome, args: &Args) {
        match outcome {
            Ok(_) if args.quiet => {}
            Ok(r) => {
                println!(
                    "ok   {scenario:<10} seed {seed:<6} {} nodes, {} faults, {} ops ({} writes, {} claims ({} of several tasks), {} job claims, {} job successes, {} watched), longest group {} ops, digest {}",
                    r.nodes,
                    r.faults.len(),
                    r.ops,
                    r.check.writes,
                    r.check.claims,
                    r.check.claims_of_several,
                    r.jobs.claims,
                    r.jobs.successes,
                    r.watched.changes,
                    r.longest_group_history,
                    &r.digest[..16.min(r.digest.len())]
                );
                if args.trace {
                    for line in &r.trace {
                        println!("     {line}");
                    }
                }
            }
            Err(f) => {
                println!("FAIL {scenario:<10} seed {seed:<6} digest {}", f.digest);
                if args.trace {
                    for line in &f.trace {
                        println!("     {line}");
                    }
                }
                println!("     faults: {:?}", f.faults);
                for problem in f.problems.iter().take(10) {
                    println!("     violation: {problem}");
                }
                if f.problems.len() > 10 {
                    println!("     ... and {} more", f.problems.len() - 10);
                }
                println!(
                    "     replay: {}",
                    replay_command(scenario, seed, args.plant_bug)
                );
            }
        }
    }

    /// Prints the totals; the exit code says whether the run met its expectation.
    fn report(
        results: &BTreeMap<(Scenario, u64), Outcome>,
        args: &Args,
        elapsed: std::time::Duration,
    ) -> i32 {
        let minutes = elapsed.as_secs_f64() / 60.0;
        let mut fault_kinds: BTreeMap<String, u64> = BTreeMap::new();
        let mut longest = 0;
        let mut gave_up = 0;
        for r in results.values().flatten() {
            longest = longest.max(r.longest_group_history);
            gave_up += r.groups_gave_up;
            for fault in &r.faults {
                let kind = fault
                    .split(|c: char| c.is_ascii_digit() || c == '[' || c == ':')
                    .next()
                    .unwrap_or(fault)
                    .trim()
                    .to_string();
                *fault_kinds.entry(kind).or_default() += 1;
            }
        }
        let failed: Vec<&(Scenario, u64)> = results
            .iter()
            .filter(|(_, o)| o.is_err())
            .map(|(k, _)| k)
            .collect();
        println!(
            "{} runs in {:.1} s ({:.0} seeds per minute), {} failed; longest group history checked for linearizability: {longest} ops; searches given up: {gave_up}",
            results.len(),
            elapsed.as_secs_f64(),
            results.len() as f64 / minutes.max(1e-9),
            failed.len()
        );
        println!("faults injected: {fault_kinds:?}");
        // The line scripts/test totals, in cargo test's words.
        println!(
            "sim result: {} passed; {} failed",
            results.len() - failed.len(),
            failed.len()
        );
        match (args.plant_bug, args.expect_caught) {
            (Some(bug), true) => match failed.first() {
                Some((scenario, seed)) => {
                    println!("planted bug {bug} caught by {scenario} seed {seed}");
                    0
                }
                None => {
                    println!("planted bug {bug} NOT caught in {} runs", results.len());
                    1
                }
            },
            _ => i32::from(!failed.is_empty()),
        }
    }
}
