//! Deterministic simulation of real Rota nodes under madsim: a `SimCluster` running the
//! production node entry point with faults, workloads and checkers.
//!
//! Compiled for real only with `RUSTFLAGS="--cfg madsim"` in its own target directory.
//! The harness arrives with the simulation issue (5); until then the crate is empty on
//! purpose.
