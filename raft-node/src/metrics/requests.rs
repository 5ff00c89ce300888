//! Request counts and latencies per endpoint, recorded by a middleware around the API
//! router and rendered into `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;

use axum::extract::MatchedPath;
use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;
use tower::Layer;
use tower::Service;

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
    endpoints: Mutex<Endpoints>,
}

/// The series by `"METHOD /pattern"`, and a buffer to spell a request's key in, so that
/// recording a request allocates nothing once its endpoint has been seen.
#[derive(Debug, Default)]
struct Endpoints {
    by_key: BTreeMap<String, EndpointStats>,
    key: String,
}

impl HttpMetrics {
    /// Counts a request refused before routing (over its connection's rate limit, or
    /// without exactly one Host header), as endpoint `METHOD unrouted`, answered at once.
    pub fn record_unrouted(&self, method: &Method, status: u16) {
        self.record(method, Some("unrouted"), status, 0.0);
    }

    fn record(&self, method: &Method, endpoint: Option<&str>, status: u16, seconds: f64) {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let Endpoints { by_key, key } = &mut *endpoints;
        key.clear();
        key.push_str(method.as_str());
        key.push(' ');
        key.push_str(endpoint.unwrap_or("unmatched"));
        let stats = match by_key.get_mut(key.as_str()) {
            Some(stats) => stats,
            None => by_key.entry(key.clone()).or_default(),
        };
        *stats.by_status.entry(status).or_default() += 1;
        stats.count += 1;
        stats.sum_s += seconds;
        if let Some(bucket) = LATENCY_BUCKETS_S.iter().position(|&bound| seconds <= bound) {
            stats.buckets[bucket] += 1;
        }
    }
}

/// The layer that records every request of the routes it wraps (a hand-written tower
/// layer: `axum::middleware::from_fn` boxes a clone of the inner service and a future
/// per request, which cost the leader about 1 us per command).
#[derive(Clone, Debug)]
pub struct TrackLayer(Arc<HttpMetrics>);

impl TrackLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Arc<HttpMetrics>) -> Self {
        Self(metrics)
    }
}

impl<S> Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

/// A route's service, recorded by [`TrackLayer`].
#[derive(Clone, Debug)]
pub struct Track<S> {
    inner: S,
    metrics: Arc<HttpMetrics>,
}

impl<S> Service<Request> for Track<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = TrackFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let endpoint = request.extensions().get::<MatchedPath>().cloned();
        let method = request.method().clone();
        TrackFuture {
            answer: self.inner.call(request),
            record: Some(Pending {
                metrics: Arc::clone(&self.metrics),
                method,
                endpoint,
                started: Instant::now(),
            }),
        }
    }
}

/// What a request's record needs once its answer is ready.
#[derive(Debug)]
struct Pending {
    metrics: Arc<HttpMetrics>,
    method: Method,
    endpoint: Option<MatchedPath>,
    started: Instant,
}

pin_project_lite::pin_project! {
    /// A route's answer, recorded when it is ready.
    pub struct TrackFuture<F> {
        #[pin]
        answer: F,
        record: Option<Pending>,
    }
}

impl<F, E> Future for TrackFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx));
        if let (Ok(response), Some(pending)) = (&answer, this.record.take()) {
            pending.metrics.record(
                &pending.method,
                pending.endpoint.as_ref().map(MatchedPath::as_str),
                response.status().as_u16(),
                pending.started.elapsed().as_secs_f64(),
            );
        }
        Poll::Ready(answer)
    }
}

/// Requests answered and their latency, per endpoint.
pub fn render(out: &mut String, metrics: &HttpMetrics) {
    let endpoints = metrics.endpoints.lock().unwrap_or_else(|p| p.into_inner());
    let endpoints = &endpoints.by_key;
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
