//! Deterministic simulation of Rota: the production node (router, request path, Raft
//! transport, state machine) runs on madsim's simulated network, clock and scheduler,
//! on the memory store, so every fault and every interleaving replays from a seed.
//!
//! Compiled for real only with `RUSTFLAGS="--cfg madsim"` in its own target directory
//! (`scripts/test` does it); a normal build sees an empty crate.

#[cfg(madsim)]
pub mod cluster;
#[cfg(madsim)]
pub mod workload;
