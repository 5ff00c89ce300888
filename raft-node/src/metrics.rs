//! `GET /metrics` in the Prometheus text format: Raft state, per-follower lag, tasks per
//! group, log appends and fsync latency, and request counts and latencies per endpoint.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::MatchedPath;
use axum::extract::Request;
use axum::extract::State;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use openraft::async_runtime::WatchReceiver;
use store_sm::log_stats::SYNC_BUCKETS_US;

use crate::admin_api::cluster_status;
use crate::node::SharedNode;

/// Upper bounds of the request latency buckets, in seconds.
pub const LATENCY_BUCKETS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Groups listed in `rota_group_tasks` at most; the rest are summed in one series.
pub const GROUP_SERIES_MAX: usize = 1000;

#[derive(Debug, Default)]
struct EndpointStats {
    by_status: BTreeMap<u16, u64>,
    buckets: [u64; LATENCY_BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

/// Request counts and latencies per endpoint (the route pattern, not the raw path, so
/// the number of series stays bounded).
#[derive(Debug, Default)]
pub struct HttpMetrics {
    endpoints: Mutex<BTreeMap<String, EndpointStats>>,
}

impl HttpMetrics {
    fn record(&self, endpoint: String, status: u16, seconds: f64) {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let stats = endpoints.entry(endpoint).or_default();
        *stats.by_status.entry(status).or_default() += 1;
        stats.count += 1;
        stats.sum_s += seconds;
        if let Some(bucket) = LATENCY_BUCKETS_S.iter().position(|&bound| seconds <= bound) {
            stats.buckets[bucket] += 1;
        }
    }
}

/// Middleware that records every request of the router it wraps.
pub async fn track(State(node): State<SharedNode>, request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().clone();
    let started = Instant::now();
    let response = next.run(request).await;
    node.http_metrics.record(
        format!("{method} {endpoint}"),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders every metric of `node`.
pub fn render(node: &SharedNode) -> String {
    let mut out = String::new();
    let status = cluster_status(node);
    let last_log_index = node.raft.metrics().borrow_watched().last_log_index;
    let role = status
        .nodes
        .iter()
        .find(|n| n.id == status.id)
        .map_or("none", |n| n.role.as_str())
        .to_string();
    let gauge = |out: &mut String, name: &str, help: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    };
    let _ = writeln!(
        out,
        "# HELP rota_role This node's Raft role (1 for the current one)."
    );
    let _ = writeln!(out, "# TYPE rota_role gauge");
    for name in ["leader", "follower", "candidate", "learner", "shutdown"] {
        let _ = writeln!(
            out,
            "rota_role{{role=\"{name}\"}} {}",
            u8::from(role == name)
        );
    }
    gauge(
        &mut out,
        "rota_term",
        "Current Raft term.",
        status.term.to_string(),
    );
    gauge(
        &mut out,
        "rota_leader_id",
        "Known leader (0: none).",
        status.leader.unwrap_or(0).to_string(),
    );
    gauge(
        &mut out,
        "rota_last_log_index",
        "Last index in this node's log.",
        last_log_index.unwrap_or(0).to_string(),
    );
    gauge(
        &mut out,
        "rota_commit_index",
        "Highest index known committed.",
        status.commit_index.unwrap_or(0).to_string(),
    );
    gauge(
        &mut out,
        "rota_applied_index",
        "Highest index applied here.",
        status.applied_index.unwrap_or(0).to_string(),
    );
    gauge(
        &mut out,
        "rota_snapshot_index",
        "Last index in the current snapshot.",
        status.snapshot_index.unwrap_or(0).to_string(),
    );
    gauge(
        &mut out,
        "rota_applied_time_ms",
        "Log time of the last applied entry.",
        status.applied_time_ms.to_string(),
    );

    let _ = writeln!(
        out,
        "# HELP rota_follower_lag_entries Entries a member is behind the leader (leader only)."
    );
    let _ = writeln!(out, "# TYPE rota_follower_lag_entries gauge");
    for member in &status.nodes {
        if let Some(lag) = member.lag {
            let _ = writeln!(
                out,
                "rota_follower_lag_entries{{node=\"{}\"}} {lag}",
                member.id
            );
        }
    }

    // A cheap clone, so that walking the groups never holds up apply.
    let state = node.state.snapshot();
    let tasks = state.machine.task_count();
    let groups: Vec<(String, usize)> = state
        .machine
        .groups()
        .iter()
        .map(|g| (g.to_string(), state.machine.group_len(g)))
        .collect();
    gauge(&mut out, "rota_tasks", "Live tasks.", tasks.to_string());
    let _ = writeln!(
        out,
        "# HELP rota_group_tasks Live tasks per group (the first {GROUP_SERIES_MAX} groups; the rest under group=\"(other)\")."
    );
    let _ = writeln!(out, "# TYPE rota_group_tasks gauge");
    for (group, len) in groups.iter().take(GROUP_SERIES_MAX) {
        let _ = writeln!(out, "rota_group_tasks{{group=\"{}\"}} {len}", escape(group));
    }
    let other: usize = groups
        .iter()
        .skip(GROUP_SERIES_MAX)
        .map(|(_, len)| len)
        .sum();
    if groups.len() > GROUP_SERIES_MAX {
        let _ = writeln!(out, "rota_group_tasks{{group=\"(other)\"}} {other}");
    }

    if let Some(stats) = &node.log_stats {
        let s = stats.snapshot();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        counter(
            &mut out,
            "rota_log_appends_total",
            "Log append calls (each one write, one fsync under --sync=always).",
            s.appends,
        );
        counter(
            &mut out,
            "rota_log_entries_total",
            "Log entries appended.",
            s.entries,
        );
        let _ = writeln!(
            out,
            "# HELP rota_log_sync_seconds Latency of synced log writes."
        );
        let _ = writeln!(out, "# TYPE rota_log_sync_seconds histogram");
        let mut cumulative = 0;
        for (bound, count) in SYNC_BUCKETS_US.iter().zip(&s.sync_buckets) {
            cumulative += count;
            let _ = writeln!(
                out,
                "rota_log_sync_seconds_bucket{{le=\"{}\"}} {cumulative}",
                *bound as f64 / 1e6
            );
        }
        let _ = writeln!(
            out,
            "rota_log_sync_seconds_bucket{{le=\"+Inf\"}} {}",
            s.syncs
        );
        let _ = writeln!(
            out,
            "rota_log_sync_seconds_sum {}",
            s.sync_us_total as f64 / 1e6
        );
        let _ = writeln!(out, "rota_log_sync_seconds_count {}", s.syncs);
    }

    let endpoints = node
        .http_metrics
        .endpoints
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(
        out,
        "# HELP rota_http_requests_total Requests answered, by endpoint and status."
    );
    let _ = writeln!(out, "# TYPE rota_http_requests_total counter");
    for (endpoint, stats) in endpoints.iter() {
        for (code, count) in &stats.by_status {
            let _ = writeln!(
                out,
                "rota_http_requests_total{{endpoint=\"{}\",status=\"{code}\"}} {count}",
                escape(endpoint)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP rota_http_request_seconds Request latency, by endpoint."
    );
    let _ = writeln!(out, "# TYPE rota_http_request_seconds histogram");
    for (endpoint, stats) in endpoints.iter() {
        let endpoint = escape(endpoint);
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS_S.iter().zip(&stats.buckets) {
            cumulative += count;
            let _ = writeln!(
                out,
                "rota_http_request_seconds_bucket{{endpoint=\"{endpoint}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "rota_http_request_seconds_bucket{{endpoint=\"{endpoint}\",le=\"+Inf\"}} {}",
            stats.count
        );
        let _ = writeln!(
            out,
            "rota_http_request_seconds_sum{{endpoint=\"{endpoint}\"}} {}",
            stats.sum_s
        );
        let _ = writeln!(
            out,
            "rota_http_request_seconds_count{{endpoint=\"{endpoint}\"}} {}",
            stats.count
        );
    }
    out
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
