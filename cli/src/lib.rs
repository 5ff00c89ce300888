//! The `rota` command-line tool: a local cluster for development (`rota dev`), and, as
//! later issues add them, cluster administration, task commands and `rota bench`. It
//! talks to nodes over HTTP only and never links RocksDB.

pub mod dev;
