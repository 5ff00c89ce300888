//! Rota's task state machine and everything that persists it.
//!
//! - [`machine`]: the pure, deterministic task machine (the seed's semantics), which is
//!   its own crate, `task-machine`, so that its purity is a compile-time fact.
//! - [`snapshot`]: its versioned, checksummed snapshot format and state hash.
//! - [`raft_types`]: the openraft types the storage is written for.
//! - [`state_machine`]: openraft's state machine around the task machine.
//! - [`memory`]: a log and snapshot store in memory with a crash model (tests, simulation).
//! - [`snapshot_dir`]: snapshot persistence in a directory (production).
//! - `background` (not in the simulation build): snapshot builds on a thread of their
//!   own at a low CPU priority (nice 10).
//! - [`planted`]: known bugs the simulation plants to test its checkers (feature `planted-bugs`).
//! - `rocks` (feature `rocksdb`): the RocksDB log store (production), with `log_tail`,
//!   the newest entries it keeps in memory.

#[cfg(not(madsim))]
pub mod background;
pub mod codec;
pub mod log_stats;
#[cfg(feature = "rocksdb")]
pub mod log_tail;
pub mod memory;
pub mod planted;
pub mod raft_types;
pub mod snapshot;
pub mod snapshot_data;
pub mod snapshot_dir;
pub mod state_machine;

/// The task machine, re-exported so that `store_sm::machine::...` names it everywhere.
pub use task_machine as machine;

#[cfg(feature = "rocksdb")]
pub mod rocks;
