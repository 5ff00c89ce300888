//! Deterministic simulation of Rota: the production node (router, request path, Raft
//! transport, state machine) runs on madsim's simulated network, clock and scheduler,
//! on the memory store, so every fault and every interleaving replays from a seed.
//!
//! The node, the cluster, the workloads and the scenarios are compiled only with
//! `RUSTFLAGS="--cfg madsim"` in their own target directory (`scripts/test` does it);
//! the checkers ([`history`], [`linearizability`]) are plain code, unit-tested in the
//! normal build too.

pub mod history;
pub mod job_checks;
pub mod linearizability;
pub mod watch_checks;

/// The group the simulated workers use for jobs (keys, dependencies, finish, fail,
/// cancel); the other groups carry the seed API's traffic.
pub const JOB_GROUP: &str = "jobs";

/// The job group's `max_running`, set before the workers start.
pub const JOB_MAX_RUNNING: u32 = 2;

/// The job group's `max_attempts`, set before the workers start: low, so that jobs the
/// workers fail die and the checkers see that dead jobs are never handed out.
pub const JOB_MAX_ATTEMPTS: u32 = 3;

/// How long a job claim lasts: longer than any run, so a job's lease never lapses while
/// the workers run and the checkers need no log time for finish, fail or cancel.
pub const JOB_LEASE_MS: i64 = 3_600_000;

#[cfg(madsim)]
pub mod cluster;
#[cfg(madsim)]
pub mod scenario;
#[cfg(madsim)]
pub mod workload;
