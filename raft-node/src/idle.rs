//! How long a connection has had nothing to do, so that [`crate::http::serve`] can close
//! one that stays idle.
//!
//! hyper bounds an idle HTTP/1.1 connection by its header-read deadline, but not an
//! HTTP/2 connection, nor one that never sends enough bytes to tell which version it
//! speaks. Counting requests from their start to the end of their answer's body (a
//! server-sent event stream included) gives one rule for both versions; the connection
//! looks at the count every [`crate::http::CONNECTION_IDLE_TIMEOUT`] / 4.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::task::Poll;

use axum::body::Body;
use axum::body::HttpBody;
use axum::response::Response;
use bytes::Bytes;

/// One connection's requests in progress, and a count of every start and end, so that
/// a look now and then can tell that nothing happened in between without reading a
/// clock per request.
#[derive(Debug, Default)]
pub struct Activity {
    open: AtomicUsize,
    /// Of `open`, those that passed the connection's rules (not refused before routing).
    admitted: AtomicUsize,
    events: AtomicU64,
}

/// What a look at a connection's [`Activity`] saw, to compare with the next look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Look {
    open: usize,
    events: u64,
}

impl Look {
    /// Whether the connection had no request in progress at either look and none began
    /// or ended between them.
    pub fn quiet_since(self, earlier: Look) -> bool {
        self.open == 0 && earlier.open == 0 && self.events == earlier.events
    }
}

impl Activity {
    /// A connection with nothing in progress.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// How many admitted requests (see [`InProgress::admit`]) are in progress now.
    pub fn admitted_in_progress(&self) -> usize {
        self.admitted.load(Ordering::Acquire)
    }

    /// What is in progress now.
    pub fn look(&self) -> Look {
        Look {
            open: self.open.load(Ordering::Acquire),
            events: self.events.load(Ordering::Acquire),
        }
    }

    /// Counts a request as in progress until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InProgress {
        self.events.fetch_add(1, Ordering::AcqRel);
        self.open.fetch_add(1, Ordering::AcqRel);
        InProgress {
            activity: Arc::clone(self),
            admitted: false,
        }
    }

    /// `response`, its body holding `in_progress` until it is sent or dropped.
    pub fn until_sent(response: Response, in_progress: InProgress) -> Response {
        response.map(|body| {
            Body::new(Tracked {
                body,
                _in_progress: in_progress,
            })
        })
    }
}

/// A request in progress; dropping it ends it.
#[derive(Debug)]
pub struct InProgress {
    activity: Arc<Activity>,
    admitted: bool,
}

impl InProgress {
    /// Counts the request among the admitted ones too (it passed the connection's rules),
    /// which the rate limit scales by: a refused request must not raise its own
    /// connection's limit.
    pub fn admit(&mut self) {
        if !self.admitted {
            self.admitted = true;
            self.activity.admitted.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        if self.admitted {
            self.activity.admitted.fetch_sub(1, Ordering::AcqRel);
        }
        self.activity.events.fetch_add(1, Ordering::AcqRel);
        self.activity.open.fetch_sub(1, Ordering::AcqRel);
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

    #[test]
    fn a_connection_is_quiet_only_without_requests_between_two_looks() {
        let activity = Activity::new();
        let start = activity.look();
        assert!(activity.look().quiet_since(start), "nothing happened");
        let first = activity.begin();
        let busy = activity.look();
        assert!(!busy.quiet_since(start), "a request began");
        assert!(!activity.look().quiet_since(busy), "one is in progress");
        drop(first);
        let ended = activity.look();
        assert!(!ended.quiet_since(busy), "it ended in between");
        assert!(activity.look().quiet_since(ended), "quiet since it ended");
        // A request that began and ended between two looks is seen too.
        drop(activity.begin());
        assert!(!activity.look().quiet_since(ended));
    }
}
