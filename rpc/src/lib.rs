//! Rota's wire protocol: the serde types of the worker and admin HTTP API and the typed
//! HTTP client used by the CLI, by node-to-node forwarding and by tests.
//!
//! Architecture invariant: only this crate defines JSON shapes, and every body a client
//! sends is one of its types serialised with serde; it links neither RocksDB nor
//! openraft.

pub mod admin;
pub mod auth;
pub mod client;
pub mod job;
pub mod lease;
pub mod retry;
pub mod schema;
pub mod tls;
pub mod watch;
pub mod worker;
pub mod worker_client;
