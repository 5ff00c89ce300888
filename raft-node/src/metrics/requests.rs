//! Request counts and latencies per endpoint, recorded by a middleware around the API
//! router and rendered into `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::MatchedPath;
use axum::extract::Request;
use axum::extract::State;
use axum::middleware::Next;
use axum::response::Response;

use super::text::escape;
use super::text::header;

/// Upper bounds of the request latency buckets, in seconds.
pub const LATENCY_BUCKETS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

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
pub async fn track(
    State(metrics): State<Arc<HttpMetrics>>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().clone();
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.record(
        format!("{method} {endpoint}"),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// Requests answered and their latency, per endpoint.
pub fn render(out: &mut String, metrics: &HttpMetrics) {
    let endpoints = metrics.endpoints.lock().unwrap_or_else(|p| p.into_inner());
    header(
        out,
        "rota_http_requests_total",
        "counter",
        "Requests answered, by endpoint and status.",
    );
    for (endpoint, stats) in endpoints.iter() {
        for (code, count) in &stats.by_status {
            let endpoint = escape(endpoint);
            let _ = writeln!(
                out,
                "rota_http_requests_total{{endpoint=\"{endpoint}\",status=\"{code}\"}} {count}"
            );
        }
    }
    header(
        out,
        "rota_http_request_seconds",
        "histogram",
        "Request latency, by endpoint.",
    );
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
        let count = stats.count;
        let _ = writeln!(
            out,
            "rota_http_request_seconds_bucket{{endpoint=\"{endpoint}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "rota_http_request_seconds_sum{{endpoint=\"{endpoint}\"}} {}",
            stats.sum_s
        );
        let _ = writeln!(
            out,
            "rota_http_request_seconds_count{{endpoint=\"{endpoint}\"}} {count}"
        );
    }
}
