//! `GET /metrics` in the Prometheus text format: Raft state, per-follower lag, tasks per
//! group, log appends and fsync latency, and request counts and latencies per endpoint.

pub mod requests;
mod text;

use std::fmt::Write;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::response::Response;
use store_sm::log_stats::LATENCY_BUCKETS_US;
use store_sm::log_stats::LatencySnapshot;
use store_sm::log_stats::LogStatsSnapshot;

pub use self::requests::LATENCY_BUCKETS_S;
pub use self::requests::TrackLayer;
use self::text::counter;
use self::text::escape;
use self::text::gauge;
use self::text::header;
use crate::node::Node;
use crate::node::SharedNode;
use crate::waiting::WaitKind;

/// Groups listed in `rota_group_tasks` at most; the rest are summed in one series.
pub const GROUP_SERIES_MAX: usize = 1000;

/// Renders every metric of `node`.
pub fn render(node: &Node) -> String {
    let mut out = String::new();
    render_raft(&mut out, node);
    render_tasks(&mut out, node);
    render_waiting(&mut out, node);
    if let Some(stats) = &node.log_stats {
        render_log(&mut out, &stats.snapshot());
    }
    latency(
        &mut out,
        "rota_raft_append_seconds",
        "Round trips of log appends with entries this node sent to followers while leading, from send to answer.",
        &node.replication.append_latency.snapshot(),
    );
    counter(
        &mut out,
        "rota_raft_append_streams_total",
        "Replication streams this node opened to followers while leading: one per follower, another after a break, a conflict, 20 s idle or 5 min.",
        node.replication
            .streams_opened
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let (batches, batched_writes) = node.group_commit.batched();
    counter(
        &mut out,
        "rota_write_batches_total",
        "Log entries this node proposed for more than one write at once (group commit), while leading.",
        batches,
    );
    counter(
        &mut out,
        "rota_batched_writes_total",
        "Writes this node proposed in entries shared with other writes (rota_write_batches_total).",
        batched_writes,
    );
    requests::render(&mut out, &node.http_metrics);
    out
}

/// Role, term, indexes and each follower's lag.
fn render_raft(out: &mut String, node: &Node) {
    let status = node.cluster_status();
    let last_log_index = node.last_log_index();
    let role = status
        .nodes
        .iter()
        .find(|n| n.id == status.id)
        .map_or("none", |n| n.role.as_str());
    header(
        out,
        "rota_role",
        "gauge",
        "This node's Raft role (1 for the current one).",
    );
    for name in ["leader", "follower", "candidate", "learner", "shutdown"] {
        let _ = writeln!(
            out,
            "rota_role{{role=\"{name}\"}} {}",
            u8::from(role == name)
        );
    }
    gauge(out, "rota_term", "Current Raft term.", status.term);
    gauge(
        out,
        "rota_leader_id",
        "Known leader (0: none).",
        status.leader.unwrap_or(0),
    );
    gauge(
        out,
        "rota_ready",
        "1 when GET /ready answers 200 (a usable leader known, caught up), else 0.",
        u64::from(node.readiness().is_ok()),
    );
    let indexes = [
        (
            "rota_last_log_index",
            "Last index in this node's log.",
            last_log_index,
        ),
        (
            "rota_commit_index",
            "Highest index known committed.",
            status.commit_index,
        ),
        (
            "rota_applied_index",
            "Highest index applied here.",
            status.applied_index,
        ),
        (
            "rota_snapshot_index",
            "Last index in the current snapshot.",
            status.snapshot_index,
        ),
    ];
    for (name, help, index) in indexes {
        gauge(out, name, help, index.unwrap_or(0));
    }
    gauge(
        out,
        "rota_applied_time_ms",
        "Log time of the last applied entry.",
        status.applied_time_ms,
    );
    header(
        out,
        "rota_follower_lag_entries",
        "gauge",
        "Entries a member is behind the leader (leader only).",
    );
    for member in &status.nodes {
        if let Some(lag) = member.lag {
            let _ = writeln!(
                out,
                "rota_follower_lag_entries{{node=\"{}\"}} {lag}",
                member.id
            );
        }
    }
}

/// Live tasks, in all and per group (at most [`GROUP_SERIES_MAX`] series).
fn render_tasks(out: &mut String, node: &Node) {
    // A cheap clone, so that walking the groups never holds up apply.
    let state = node.state.snapshot();
    let machine = &state.machine;
    gauge(out, "rota_tasks", "Live tasks.", machine.task_count());
    header(
        out,
        "rota_group_tasks",
        "gauge",
        &format!(
            "Live tasks per group (the first {GROUP_SERIES_MAX} groups; the rest under group=\"(other)\")."
        ),
    );
    let groups = machine.groups();
    for group in groups.iter().take(GROUP_SERIES_MAX) {
        let len = machine.group_len(group);
        let _ = writeln!(out, "rota_group_tasks{{group=\"{}\"}} {len}", escape(group));
    }
    if groups.len() > GROUP_SERIES_MAX {
        let other: usize = groups
            .iter()
            .skip(GROUP_SERIES_MAX)
            .map(|g| machine.group_len(g))
            .sum();
        let _ = writeln!(out, "rota_group_tasks{{group=\"(other)\"}} {other}");
    }
}

/// One series per kind of waiter.
fn per_kind(out: &mut String, name: &str, kind: &str, help: &str, value: impl Fn(WaitKind) -> u64) {
    header(out, name, kind, help);
    for wait in WaitKind::ALL {
        let _ = writeln!(out, "{name}{{kind=\"{}\"}} {}", wait.as_str(), value(wait));
    }
}

/// Waiting requests by kind, their wake-ups, and the change feed's size.
fn render_waiting(out: &mut String, node: &Node) {
    let waiters = &node.waiters;
    per_kind(
        out,
        "rota_waiters",
        "gauge",
        "Requests waiting now, by kind (claim, job, watch).",
        |kind| waiters.waiting(kind) as u64,
    );
    gauge(
        out,
        "rota_waiters_max",
        "Most waiting requests this node holds (--max-waiters).",
        waiters.max(),
    );
    per_kind(
        out,
        "rota_waiter_wakeups_total",
        "counter",
        "Times a waiting request was woken to look again, by kind.",
        |kind| waiters.wakeups(kind),
    );
    per_kind(
        out,
        "rota_waiter_wasted_wakeups_total",
        "counter",
        "Wake-ups that found nothing to answer with and waited again, by kind.",
        |kind| waiters.wasted(kind),
    );
    gauge(
        out,
        "rota_feed_changes",
        "Changes the watch feed keeps.",
        node.feed.kept(),
    );
    gauge(
        out,
        "rota_feed_revision",
        "The feed's revision: the last applied log index.",
        node.feed.revision(),
    );
    counter(
        out,
        "rota_applied_commands_total",
        "Commands this node applied since it started: each write of an entry that several share, and one for every entry without a command.",
        node.feed.commands_applied(),
    );
}

/// Log appends, entries and the latency of synced writes.
fn render_log(out: &mut String, s: &LogStatsSnapshot) {
    counter(
        out,
        "rota_log_appends_total",
        "Log append calls (each one write, one fsync under --sync=always).",
        s.appends,
    );
    counter(
        out,
        "rota_log_entries_total",
        "Log entries appended.",
        s.entries,
    );
    latency(
        out,
        "rota_log_sync_seconds",
        "Latency of synced log writes.",
        &s.syncs,
    );
}

/// A latency histogram in seconds, from its counts in microseconds.
fn latency(out: &mut String, name: &str, help: &str, s: &LatencySnapshot) {
    header(out, name, "histogram", help);
    let mut cumulative = 0;
    for (bound, count) in LATENCY_BUCKETS_US.iter().zip(&s.buckets) {
        cumulative += count;
        let le = *bound as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
    let _ = writeln!(out, "{name}_sum {}", s.us_total as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {}", s.count);
}

/// The `/metrics` handler.
pub async fn get_metrics(State(node): State<SharedNode>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        render(&node),
    )
        .into_response()
}
