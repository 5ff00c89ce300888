//! Request rate limits against abuse: one per connection (in `http::serve`, API listener
//! only) and one per token (after the token check), each a token bucket that refills at
//! its rate and holds one second's worth. A request over the limit gets 429 with
//! `Retry-After` and changes nothing; 0 turns a limit off.
//!
//! A connection's rate is per request it had in progress at once over the last
//! [`IN_PROGRESS_MEMORY`]: an HTTP/1.1 connection has one at a time, while one HTTP/2
//! connection may carry the requests of a whole process's workers at once. Counting an
//! HTTP/2 connection like a single HTTP/1.1 one held back exactly the clients that share
//! a connection, the cheaper way to send many requests (docs/performance.md, session
//! 17). Counted this way, it gets about what the same requests would get on as many
//! HTTP/1.1 connections, and a connection that sends one request after another is held
//! to the rate. It bounds a runaway connection, not a client: a client may open many
//! connections (up to `--connections-per-peer-max` from one address), and with tokens
//! on, the per-token limit is what bounds it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

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

/// How long a connection's most requests in progress at once counts toward its rate:
/// long enough to span the gaps of a fleet of workers between rounds of requests, short
/// enough that a connection that goes back to one request at a time is soon held to the
/// plain rate again.
pub const IN_PROGRESS_MEMORY: Duration = Duration::from_secs(10);

/// One connection's bucket, shared by the requests of that connection.
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    rate: u32,
    state: Arc<Mutex<ConnectionBucket>>,
}

/// A connection's bucket and the most admitted requests it had in progress at once, in
/// two halves of [`IN_PROGRESS_MEMORY`]: the current one and the one before it.
#[derive(Debug)]
struct ConnectionBucket {
    bucket: Bucket,
    most_now: u32,
    most_before: u32,
    half_started: Instant,
}

impl ConnectionBucket {
    /// Starts a new half of the memory when the current one is over.
    fn roll(&mut self, now: Instant) {
        let half = IN_PROGRESS_MEMORY / 2;
        let elapsed = now.saturating_duration_since(self.half_started);
        if elapsed < half {
            return;
        }
        // A whole memory without a request forgets both halves.
        self.most_before = if elapsed < half * 2 { self.most_now } else { 1 };
        self.most_now = 1;
        self.half_started = now;
    }
}

impl ConnectionLimit {
    /// A limit of `rate` requests a second for a new connection; `None` when off.
    pub fn new(rate: u32) -> Option<Self> {
        (rate > 0).then(|| Self {
            rate,
            state: Arc::new(Mutex::new(ConnectionBucket {
                bucket: Bucket::new(rate),
                most_now: 1,
                most_before: 1,
                half_started: Instant::now(),
            })),
        })
    }

    /// Takes one request's token, the connection having `in_progress` admitted requests
    /// in progress (this one included): the 429 answer when the connection is over its
    /// rate, `None` when the request may go on. The rate is per request the connection
    /// has had in progress at once over the last [`IN_PROGRESS_MEMORY`], at most
    /// [`rpc::client::HTTP2_STREAMS_MAX`]: the most, not the count at this instant,
    /// because many workers' requests on one connection arrive together after a quiet
    /// moment (their previous answers left together), and the first of them would see
    /// only itself. Only admitted requests raise it, so a refused one never raises its
    /// own connection's limit.
    pub fn refusal(&self, in_progress: usize) -> Option<Response> {
        self.refusal_at(in_progress, Instant::now())
    }

    fn refusal_at(&self, in_progress: usize, now: Instant) -> Option<Response> {
        let in_progress = u32::try_from(in_progress)
            .unwrap_or(u32::MAX)
            .min(rpc::client::HTTP2_STREAMS_MAX);
        let allowed = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.roll(now);
            let scale = in_progress.max(state.most_now).max(state.most_before);
            let allowed = state.bucket.take_scaled(now, scale);
            if allowed {
                state.most_now = state.most_now.max(in_progress);
            }
            allowed
        };
        if allowed {
            return None;
        }
        Some(too_many(format!(
            "this connection sends more than {} requests a second for each request it had in progress at once over the last {} s (--rate-limit-per-connection); slow down, or spread the work over more connections",
            self.rate,
            IN_PROGRESS_MEMORY.as_secs()
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
        let start = Instant::now();
        let served = |in_progress: usize, after_s: u64| {
            let at = start + Duration::from_secs(after_s);
            (0..2_000)
                .filter(|_| limit.refusal_at(in_progress, at).is_none())
                .count()
        };
        assert_eq!(served(1, 1), 5, "one request at a time: the rate");
        assert_eq!(served(4, 2), 20, "four: four times");
        assert_eq!(
            served(1, 3),
            20,
            "the next requests, arriving one by one, keep the most of the last seconds"
        );
        let most = 5 * rpc::client::HTTP2_STREAMS_MAX as usize;
        assert_eq!(
            served(10_000, 4),
            most,
            "no more than the streams one connection may have"
        );
        assert_eq!(served(1, 9), most, "remembered in the next half");
        assert_eq!(
            served(1, 16),
            5,
            "forgotten after the memory, one at a time"
        );
        assert!(ConnectionLimit::new(0).is_none(), "zero is off");
    }

    #[test]
    fn refused_requests_do_not_raise_their_connections_limit() {
        let limit = ConnectionLimit::new(5).expect("on");
        let second = Instant::now() + Duration::from_secs(1);
        let served = (0..100)
            .filter(|_| limit.refusal_at(1, second).is_none())
            .count();
        assert_eq!(served, 5);
        // A flood of concurrent requests at the same instant: all refused...
        assert!((0..100).all(|_| limit.refusal_at(50, second).is_some()));
        // ...and the connection is still held to the plain rate afterwards.
        let later = second + Duration::from_secs(1);
        let served = (0..1_000)
            .filter(|_| limit.refusal_at(1, later).is_none())
            .count();
        assert_eq!(served, 5);
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
