//! Request rate limits against abuse: one per connection (in `http::serve`, API listener
//! only) and one per token (after the token check), each a token bucket that refills at
//! its rate and holds one second's worth. A request over the limit gets 429 with
//! `Retry-After` and changes nothing; 0 turns a limit off.

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
        let elapsed = if now > self.last {
            (now - self.last).as_secs_f64()
        } else {
            0.0
        };
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
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
    bucket: Arc<Mutex<Bucket>>,
}

impl ConnectionLimit {
    /// A limit of `rate` requests a second for a new connection; `None` when off.
    pub fn new(rate: u32) -> Option<Self> {
        (rate > 0).then(|| Self {
            rate,
            bucket: Arc::new(Mutex::new(Bucket::new(rate))),
        })
    }

    /// Takes one request's token: the 429 answer when the connection is over its rate,
    /// `None` when the request may go on.
    pub fn refusal(&self) -> Option<Response> {
        let allowed = self
            .bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        if allowed {
            return None;
        }
        Some(too_many(format!(
            "this connection sends more than {} requests a second (--rate-limit-per-connection); slow down, or spread the work over more connections",
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
    fn tokens_have_buckets_of_their_own_and_zero_is_off() {
        let limits = TokenLimits::new(2);
        assert!(limits.check("a").is_ok() && limits.check("a").is_ok());
        assert!(limits.check("a").is_err());
        assert!(limits.check("b").is_ok(), "another token is not held back");
        let off = TokenLimits::new(0);
        assert!((0..1000).all(|_| off.check("a").is_ok()));
    }
}
