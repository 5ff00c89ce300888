//! Every limit and domain rule of Rota in one place, in the spirit of TigerBeetle's
//! `constants.zig`: the machine enforces them, and rpc, the node and the simulation
//! import them from here, so no number is written twice.
//!
//! A name ends in its unit, then in the kind of bound (`CLAIM_DURATION_MS_MAX`).

use crate::Millis;

/// Longest request id the machine accepts, in bytes (SPEC section 2, "Retries").
pub const REQUEST_ID_BYTES_MAX: usize = 64;

/// Most task ids (adds + updates + deletes + depends) one update or claim may name, and
/// most ids one read may ask for.
///
/// The HTTP body limit already bounds requests; this bound keeps the machine total on its own.
pub const REQUEST_ITEMS_MAX: usize = 10_000;

/// Most tasks one claim may take (`/claim` with `count`).
pub const CLAIM_COUNT_MAX: u32 = 1_000;

/// Most tasks one finish may end (`/finish/many`): as many as one claim takes.
pub const FINISH_COUNT_MAX: usize = CLAIM_COUNT_MAX as usize;

/// Task data one claim of several tasks answers at most, in bytes: a claim with `count`
/// stops taking tasks once their data reaches this (it always takes at least one), so
/// an answer stays a few MiB whatever the tasks hold.
pub const CLAIM_DATA_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Longest claim the machine grants, in milliseconds: a year, far beyond any real lease
/// and far from overflowing log time. A node's configured `claim-duration-max-ms` (the
/// edge's bound) may not exceed it, so a claim the edge accepts is never refused here.
pub const CLAIM_DURATION_MS_MAX: Millis = 365 * 24 * 60 * 60 * 1000;

/// Dedup entries kept beyond [`DEDUP_KEEP_MS`]: past this count the oldest go first.
pub const DEDUP_ENTRIES_MAX: usize = 100_000;

/// Approximate bytes of outcomes kept beyond [`DEDUP_KEEP_MS`]: past this the oldest go
/// first.
pub const DEDUP_BYTES_MAX: usize = 64 * 1024 * 1024;

/// How long, in log time, an outcome is remembered at most. A client retrying later than
/// this after its first attempt may apply twice; clients retry within seconds.
pub const DEDUP_WINDOW_MS: Millis = 10 * 60 * 1000;

/// How long, in log time, every outcome is remembered whatever the count and byte limits
/// above (from [`DEDUP_KEEP_FORM`] on), as long as they take less than
/// [`DEDUP_BYTES_HARD_MAX`]: twice the clients' 30 s give-up time, so that a retry the
/// clients make is not applied twice.
pub const DEDUP_KEEP_MS: Millis = 60 * 1000;

/// Approximate bytes of outcomes the table holds at most, however young: past this the
/// oldest go. At about 250 bytes an outcome, [`DEDUP_KEEP_MS`] holds at up to about
/// 35 000 small writes with a request id a second (8.7 MB of answers a second).
pub const DEDUP_BYTES_HARD_MAX: usize = 512 * 1024 * 1024;

/// The recorded log entry form (see [`RETAKEN_LEASE_FORM`]) from which the dedup table
/// keeps outcomes for [`DEDUP_KEEP_MS`] past the count and byte limits, up to
/// [`DEDUP_BYTES_HARD_MAX`]. Below it, as older builds apply, the oldest outcomes went
/// first past the limits, however young.
pub const DEDUP_KEEP_FORM: u32 = RULES_FORM;

/// The first log entry form that changes what the machine does with entries that older
/// builds read as well: it is recorded with [`crate::Request::RaiseRulesForm`], which
/// those builds cannot read, and machines that record it are written in snapshot format
/// 8, which they cannot read either. Each `*_FORM` rule below starts here.
pub const RULES_FORM: u32 = 4;

/// The recorded log entry form (`TaskMachine::log_form`; raft-node's `log_forms`) from
/// which a late renewal that takes a lapsed lease back is a running lease again: it
/// counts toward `max_running` and reopens its attempt. Below it, as older builds
/// apply, the task was owned but counted as waiting.
pub const RETAKEN_LEASE_FORM: u32 = RULES_FORM;

/// The recorded log entry form (see [`RETAKEN_LEASE_FORM`]) from which a request through
/// a token limited to groups that names a cancelled job's task of another group is
/// refused as out of scope (no outcome remembered) instead of answered as cancelled with
/// the job's key (an outcome the dedup table remembers).
pub const SCOPE_OF_CANCELLED_FORM: u32 = RULES_FORM;

/// Largest correction of a node's log clock toward its wall clock, as a fraction of
/// elapsed time: log time runs at most this much faster or slower than real time, so a
/// lease lasts within this fraction of its length in real time under one leader.
pub const LOG_CLOCK_SLEW_RATE: f64 = 0.01;

/// Task ids a restored cluster starts above per millisecond of its log time (its first
/// id is at least log time in microseconds). Any cluster that hands out fewer ids than
/// this per millisecond on average (the fastest load measured is about 220) never
/// reaches that floor, so ids issued after a backup are never issued again by a
/// cluster restored from it; see `TaskMachine::start_restored_cluster`.
pub const RESTORED_IDS_PER_MS: u64 = 1_000;

/// Longest job key, in bytes (keys are at least one byte).
pub const JOB_KEY_BYTES_MAX: usize = 256;

/// Most prerequisite keys one add may name in `after`.
pub const JOB_AFTER_KEYS_MAX: usize = 1_000;

/// Most jobs that may wait for one job (its record's `dependants`): a record is read,
/// copied and sent whole, so its size stays bounded. An add naming a job that has this
/// many is refused (from [`DEPENDANTS_LIMIT_FORM`] on).
pub const JOB_DEPENDANTS_MAX: usize = 10_000;

/// The recorded log entry form (see [`RETAKEN_LEASE_FORM`]) from which adds beyond
/// [`JOB_DEPENDANTS_MAX`] are refused; older builds took them.
pub const DEPENDANTS_LIMIT_FORM: u32 = RULES_FORM;

/// Largest result a finish may record (JSON text), in bytes: room for a worker's last
/// 64 KiB of stdout and of stderr, escaped.
pub const JOB_RESULT_BYTES_MAX: usize = 256 * 1024;

/// Largest error a fail may record, in bytes.
pub const JOB_ERROR_BYTES_MAX: usize = 64 * 1024;

/// Attempts a job record keeps in its history; older ones are dropped (their count is
/// kept).
pub const JOB_ATTEMPT_HISTORY_MAX: usize = 10;

/// Longest interval of a recurring job and longest explicit `retry_in_ms`: a year.
pub const JOB_INTERVAL_MS_MAX: Millis = CLAIM_DURATION_MS_MAX;

/// Default first retry delay after a failure.
pub const BACKOFF_BASE_MS_DEFAULT: Millis = 1_000;

/// Default growth of the retry delay per attempt, in thousandths (doubling).
pub const BACKOFF_FACTOR_MILLI_DEFAULT: u32 = 2_000;

/// Default largest retry delay: five minutes.
pub const BACKOFF_MAX_MS_DEFAULT: Millis = 5 * 60 * 1000;

/// Largest back-off factor, in thousandths (a hundredfold per attempt).
pub const BACKOFF_FACTOR_MILLI_MAX: u32 = 100_000;

/// Default retention of finished job records: a week of log time.
pub const JOB_RETENTION_MS_DEFAULT: Millis = 7 * 24 * 60 * 60 * 1000;

/// Longest retention of finished job records, and longest back-off delay: a year.
pub const JOB_RETENTION_MS_MAX: Millis = CLAIM_DURATION_MS_MAX;

/// Most access tokens a cluster holds; adding one more is refused.
pub const TOKENS_MAX: usize = 10_000;

/// A token id's length in hex digits (8 random bytes).
pub const TOKEN_ID_BYTES: usize = 16;

/// Longest token name.
pub const TOKEN_NAME_BYTES_MAX: usize = 256;

/// Most group prefixes one worker token may be limited to.
pub const TOKEN_GROUPS_MAX: usize = 64;
