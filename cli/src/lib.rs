//! The `rota` command-line tool: cluster administration, task commands, `rota dev` for a
//! local cluster and `rota bench`. It talks to nodes over HTTP only and never links
//! RocksDB.
//!
//! It arrives with the cluster and CLI issues (3 and 4); until then the crate is empty
//! on purpose.
