//! How long a connection has had nothing to do, so that [`crate::http::serve`] can close
//! one that stays idle.
//!
//! hyper bounds an idle HTTP/1.1 connection by its header-read deadline, but not an
//! HTTP/2 connection, nor one that never sends enough bytes to tell which version it
//! speaks. Counting requests from their start to the end of their answer's body (a
//! server-sent event stream included) gives one rule for both versions.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use axum::body::HttpBody;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use tokio::time::Instant;

/// One connection's requests in progress and when the last one ended.
#[derive(Debug)]
pub struct Activity {
    open: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    /// A connection that starts now, with nothing in progress.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        })
    }

    /// How long the connection has had no request in progress (zero while it has one).
    pub fn idle_for(&self) -> Duration {
        if self.open.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    fn begin(self: &Arc<Self>) -> InProgress {
        self.open.fetch_add(1, Ordering::AcqRel);
        InProgress(Arc::clone(self))
    }

    /// Middleware: counts `request` as in progress until its answer's body is done.
    pub async fn track(self: Arc<Self>, request: Request, next: Next) -> Response {
        let in_progress = self.begin();
        next.run(request).await.map(|body| {
            Body::new(Tracked {
                body,
                _in_progress: in_progress,
            })
        })
    }
}

/// A request in progress; dropping it ends it.
struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request in progress until it is sent or dropped.
struct Tracked {
    body: Body,
    _in_progress: InProgress,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_between_requests_and_their_bodies() {
        let activity = Activity::new();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(activity.idle_for(), Duration::from_secs(3));
        let first = activity.begin();
        let second = activity.begin();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(activity.idle_for(), Duration::ZERO, "two in progress");
        drop(first);
        assert_eq!(activity.idle_for(), Duration::ZERO, "one still in progress");
        drop(second);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            activity.idle_for(),
            Duration::from_secs(2),
            "from the last end"
        );
    }
}
