//! What every request of one connection goes through before routing, in the
//! connection's own task: it is counted in the connection's [`Activity`] (see `idle.rs`),
//! held to the connection's rate limit, checked for its Host header (API listener), and
//! given the connection's client certificate (TLS). Done here once per request rather
//! than by axum middleware layered per connection, which cost a clone of the router's
//! service and two boxes per request and layer (docs/performance.md, session 14).

use std::pin::Pin;
use std::sync::Arc;

use axum::http::HeaderValue;
use axum::http::Request;
use axum::http::Version;
use axum::http::header::CONNECTION;
use axum::http::header::HOST;
use axum::response::IntoResponse;
use axum::response::Response;

use crate::api_error::ApiError;
use crate::idle::Activity;
use crate::metrics::requests::HttpMetrics;
use crate::rate_limit::ConnectionLimit;
use crate::tls::PeerCertificate;

/// What one listener asks of every request before routing it, the same for each of
/// its connections.
#[derive(Clone, Debug, Default)]
pub struct ListenerRules {
    /// Requests a second one connection may send for each request it had in progress at
    /// once lately (`rate_limit::IN_PROGRESS_MEMORY`; 0: no limit).
    pub requests_per_connection: u32,
    /// Whether an HTTP/1.1 request must carry exactly one Host header (RFC 9112).
    pub require_host: bool,
    /// Where a request refused before routing is counted (as endpoint `METHOD
    /// unrouted`), if anywhere.
    pub metrics: Option<Arc<HttpMetrics>>,
}

/// The checks one connection makes of every request before routing it: its listener's,
/// with a rate-limit bucket of its own and its TLS client certificate.
#[derive(Clone, Debug, Default)]
pub struct ConnectionRules {
    /// What the listener asks of every request.
    pub listener: ListenerRules,
    /// The connection's request rate limit, if any.
    pub limit: Option<ConnectionLimit>,
    /// The client certificate the connection's TLS handshake presented, if TLS is on.
    pub peer_certificate: Option<PeerCertificate>,
}

impl ConnectionRules {
    /// A new connection's rules under `listener`'s: a bucket of its own, no certificate yet.
    pub fn for_connection(listener: &ListenerRules) -> Self {
        Self {
            listener: listener.clone(),
            limit: ConnectionLimit::new(listener.requests_per_connection),
            peer_certificate: None,
        }
    }
}

/// A hyper service for one connection: [`ConnectionRules`] and activity, then `inner`.
#[derive(Clone, Debug)]
pub struct ConnectionService<S> {
    inner: S,
    activity: Arc<Activity>,
    rules: ConnectionRules,
}

impl<S> ConnectionService<S> {
    /// `inner` behind `rules`, its requests counted in `activity`.
    pub fn new(inner: S, activity: Arc<Activity>, rules: ConnectionRules) -> Self {
        Self {
            inner,
            activity,
            rules,
        }
    }

    /// The answer that refuses `request` before it is routed, if a rule does.
    fn refusal<B>(&self, request: &Request<B>) -> Option<Response> {
        if let Some(too_many) = self.rules.limit.as_ref().and_then(|limit| {
            // This request and the admitted ones already in progress.
            limit.refusal(self.activity.admitted_in_progress() + 1)
        }) {
            return Some(too_many);
        }
        if self.rules.listener.require_host && request.version() == Version::HTTP_11 {
            let hosts = request.headers().get_all(HOST).iter().count();
            if hosts != 1 {
                let problem = if hosts == 0 {
                    "has no Host header"
                } else {
                    "has more than one Host header"
                };
                let mut refused = ApiError::bad_request(format!(
                    "the request {problem}; an HTTP/1.1 request needs exactly one (RFC 9112)"
                ))
                .into_response();
                // As after any malformed request: the connection ends with this answer.
                refused
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                return Some(refused);
            }
        }
        None
    }
}

type Answer =
    Pin<Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

impl<S, B> hyper::service::Service<Request<B>> for ConnectionService<S>
where
    S: hyper::service::Service<Request<B>, Response = Response, Error = std::convert::Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Answer;

    fn call(&self, mut request: Request<B>) -> Self::Future {
        let mut in_progress = self.activity.begin();
        if let Some(refused) = self.refusal(&request) {
            if let Some(metrics) = &self.rules.listener.metrics {
                metrics.record_unrouted(request.method(), refused.status().as_u16());
            }
            return Box::pin(std::future::ready(Ok(Activity::until_sent(
                refused,
                in_progress,
            ))));
        }
        in_progress.admit();
        if let Some(certificate) = &self.rules.peer_certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            answer
                .await
                .map(|response| Activity::until_sent(response, in_progress))
        })
    }
}
