//! Request rate limits against abuse: one per connection (in `http::serve`, API listener
//! only) and one per token (after the token check), each a token bucket that refills at
//! its rate and holds one second's worth. A request over the limit gets 429 with
//! `Retry-After` and changes nothing; 0 turns a limit off.
//!
//! A connection's rate is per request it has had in progress at once: an HTTP/1.1
//! connection has one at a time, while one HTTP/2 connection may carry the requests of
//! a whole process's workers at once. Counting an HTTP/2 connection like a single
//! HTTP/1.1 one held back exactly the clients that share a connection, the cheaper way
//! to send many requests (docs/performance.md, session 17). Counted this way, it gets
//! what the same requests would get on as many HTTP/1.1 connections, and a connection
//! that sends one request after another is held to the rate either way.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use tokio::time::Instant;

use crate::api_error::ApiError;

/// A token bucket: `rate` requests a second, bursts of up to `rate`.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket for `rate` requests a second.
    pub fn new(rate: u32) -> Self {
        Self {
            rate: f64::from(rate),
            tokens: f64::from(rate),
            last: Instant::now(),
        }
    }

    /// Takes one request's token at `now`; whether there was one.
    pub fn take(&mut self, now: Instant) -> bool {
        self.take_scaled(now, 1)
    }

    /// Takes one request's token at `now` from the bucket as if its rate (and so its
    /// size) were `scale` times its own (at least once); whether there was one.
    pub fn take_scaled(&mut self, now: Instant, scale: u32) -> bool {
        let rate = self.rate * f64::from(scale.max(1));
        let elapsed = if now > self.last {
            (now - self.last).as_secs_f64()
        } else {
            0.0
        };
        self.last = now;
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The answer to a request over a limit.
pub fn too_many(message: String) -> Response {
    let mut error = ApiError::new(StatusCode::TOO_MANY_REQUESTS, message);
    error.retry_after_s = Some(1);
    error.into_response()
}

/// One connection's bucket, shared by the requests of that connection.
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    rate: u32,
    state: Arc<Mutex<ConnectionBucket>>,
}

/// A connection's bucket and the most requests it has had in progress at once.
#[derive(Debug)]
struct ConnectionBucket {
    bucket: Bucket,
    most_in_progress: u32,
}

impl ConnectionLimit {
    /// A limit of `rate` requests a second for a new connection; `None` when off.
    pub fn new(rate: u32) -> Option<Self> {
        (rate > 0).then(|| Self {
            rate,
            state: Arc::new(Mutex::new(ConnectionBucket {
                bucket: Bucket::new(rate),
                most_in_progress: 1,
            })),
        })
    }

    /// Takes one request's token, the connection having `in_progress` requests in
    /// progress (this one included): the 429 answer when the connection is over its
    /// rate, `None` when the request may go on. The rate is per request the connection
    /// has had in progress at once, at most [`crate::http::HTTP2_STREAMS_MAX`]: its
    /// most so far, not the count at this instant, because many workers' requests on one
    /// connection arrive together after a quiet moment (their previous answers, which
    /// left together), and the first of them would see one in progress.
    pub fn refusal(&self, in_progress: usize) -> Option<Response> {
        self.refusal_at(in_progress, Instant::now())
    }

    fn refusal_at(&self, in_progress: usize, now: Instant) -> Option<Response> {
        let in_progress = u32::try_from(in_progress)
            .unwrap_or(u32::MAX)
            .min(crate::http::HTTP2_STREAMS_MAX);
        let allowed = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.most_in_progress = state.most_in_progress.max(in_progress);
            let scale = state.most_in_progress;
            state.bucket.take_scaled(now, scale)
        };
        if allowed {
            return None;
        }
        Some(too_many(format!(
            "this connection sends more than {} requests a second for each request it has had in progress at once (--rate-limit-per-connection); slow down, or spread the work over more connections",
            self.rate
        )))
    }
}

/// The buckets of the tokens seen on this node. Only current tokens reach it (after the
/// token check), and a cluster holds at most `TOKENS_MAX` of them, so it is bounded.
#[derive(Debug, Default)]
pub struct TokenLimits {
    rate: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl TokenLimits {
    /// `rate` requests a second per token on this node; 0: no limit.
    pub fn new(rate: u32) -> Self {
        Self {
            rate,
            buckets: Mutex::default(),
        }
    }

    /// `Ok` if the token with this id may send one more request now, else why not.
    pub fn check(&self, id: &str) -> Result<(), String> {
        if self.rate == 0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets
            .entry(id.to_string())
            .or_insert_with(|| Bucket::new(self.rate));
        if bucket.take(Instant::now()) {
            return Ok(());
        }
        Err(format!(
            "token {id} sends more than {} requests a second to this node (--rate-limit-per-token); slow down, or spread the work over the nodes",
            self.rate
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_bucket_allows_its_rate_in_a_burst_then_refills() {
        let start = Instant::now();
        let mut bucket = Bucket::new(10);
        bucket.last = start;
        let taken = (0..15).filter(|_| bucket.take(start)).count();
        assert_eq!(taken, 10, "a second's worth at once");
        assert!(
            !bucket.take(start + Duration::from_millis(50)),
            "half a token"
        );
        assert!(bucket.take(start + Duration::from_millis(110)), "refilled");
        let later = start + Duration::from_secs(60);
        let taken = (0..15).filter(|_| bucket.take(later)).count();
        assert_eq!(taken, 10, "never more than a second's worth");
    }

    #[test]
    fn a_scaled_bucket_allows_and_holds_its_scale_times_the_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(10);
        bucket.last = start;
        let later = start + Duration::from_secs(1);
        let taken = (0..100).filter(|_| bucket.take_scaled(later, 4)).count();
        assert_eq!(taken, 40, "a second's worth at four times the rate");
        assert!(
            bucket.take_scaled(later + Duration::from_millis(30), 4),
            "refilled at four times the rate"
        );
        let much_later = later + Duration::from_secs(60);
        let taken = (0..100).filter(|_| bucket.take(much_later)).count();
        assert_eq!(
            taken, 10,
            "back at scale one, it holds one second's worth again"
        );
        let zero = (0..100)
            .filter(|_| bucket.take_scaled(much_later + Duration::from_secs(2), 0))
            .count();
        assert_eq!(zero, 10, "a scale of zero counts as one");
    }

    #[test]
    fn a_connection_limit_scales_with_the_most_requests_it_had_in_progress() {
        let limit = ConnectionLimit::new(5).expect("on");
        let second = Instant::now() + Duration::from_secs(1);
        let served = |in_progress: usize, at: Instant| {
            (0..2_000)
                .filter(|_| limit.refusal_at(in_progress, at).is_none())
                .count()
        };
        assert_eq!(served(1, second), 5, "one request at a time: the rate");
        assert_eq!(
            served(4, second + Duration::from_secs(1)),
            20,
            "four: four times"
        );
        assert_eq!(
            served(1, second + Duration::from_secs(2)),
            20,
            "the same connection's next requests, arriving one by one, keep its most"
        );
        let most = 5 * crate::http::HTTP2_STREAMS_MAX as usize;
        assert_eq!(
            served(10_000, second + Duration::from_secs(3)),
            most,
            "no more than the streams one connection may have"
        );
        assert!(ConnectionLimit::new(0).is_none(), "zero is off");
    }

    #[test]
    fn tokens_have_buckets_of_their_own_and_zero_is_off() {
        let limits = TokenLimits::new(2);
        assert!(limits.check("a").is_ok() && limits.check("a").is_ok());
        assert!(limits.check("a").is_err());
        assert!(limits.check("b").is_ok(), "another token is not held back");
        let off = TokenLimits::new(0);
        assert!((0..1000).all(|_| off.check("a").is_ok()));
    }
}
