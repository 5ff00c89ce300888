//! The `rota-node` daemon: configuration, openraft wiring and its HTTP transport, the
//! request path (leader forwarding, linearizable reads, log-time stamping, batching),
//! the axum router, metrics and graceful shutdown.
//!
//! It arrives with the cluster (issue 3); until then the crate is empty on purpose.
