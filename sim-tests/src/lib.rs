//! Deterministic simulation of Rota: the production node (router, request path, Raft
//! transport, state machine) runs on madsim's simulated network, clock and scheduler,
//! on the memory store, so every fault and every interleaving replays from a seed.
//!
//! The node, the cluster, the workloads and the scenarios are compiled only with
//! `RUSTFLAGS="--cfg madsim"` in their own target directory (`scripts/test` does it);
//! the checkers ([`history`], [`linearizability`]) are plain code, unit-tested in the
//! normal build too.

pub mod history;
pub mod linearizability;

#[cfg(madsim)]
pub mod cluster;
#[cfg(madsim)]
pub mod scenario;
#[cfg(madsim)]
pub mod workload;
