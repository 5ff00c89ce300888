//! One attempt of a write, sorted into a definite answer or "nothing known".
//!
//! A timeout, a dropped connection or a 5xx does not prove that a write had no effect, so
//! a client sends the same body (with its request id, which makes the cluster apply it
//! once) again, to the next node, until a node answers with the write's outcome: its
//! tasks or its refusal. [`crate::worker_client::WorkerClient`] does that with this.
//!
//! A 429 is different: the node is up and asks for fewer requests. Another node would
//! only relay the write to the same leader (or hold a limit of its own), so the client
//! waits as long as the node's `Retry-After` says and asks the same node again.

use std::time::Duration;

use crate::client::ClientError;
use crate::client::HttpClient;
use crate::client::HttpResponse;
use crate::worker::WriteRequestJson;
use crate::worker::WriteResultJson;

/// Longest pause a 429's `Retry-After` can impose on one attempt; a longer one is cut to
/// this, so that a misconfigured proxy cannot park a worker for an hour.
pub const SLOW_DOWN_MAX: Duration = Duration::from_secs(10);

/// Pause after a 429 without a usable `Retry-After` (Rota's nodes send 1 s).
const SLOW_DOWN_DEFAULT: Duration = Duration::from_secs(1);

/// Most characters of an error answer's body kept in the error it becomes.
const ERROR_CHARS_MAX: usize = 200;

/// Why one attempt gave no definite answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// No answer, a 5xx, a 408, a body that does not parse: nothing known; try the next
    /// node.
    Unknown(String),
    /// The node does not speak HTTP to this client (it answered in TLS, most likely):
    /// no other answer will come from it as the client is set up.
    NotHttp(ClientError),
    /// A 429: the node did not take the request and asks to be called again after
    /// `pause`.
    SlowDown {
        /// What the node said.
        error: String,
        /// How long to wait before asking it again.
        pause: Duration,
    },
}

impl Unanswered {
    /// An exchange that failed before any answer: nothing known, unless the node does
    /// not speak HTTP to this client.
    pub(crate) fn from_error(error: ClientError) -> Self {
        match error {
            ClientError::NotHttp { .. } => Unanswered::NotHttp(error),
            other => Unanswered::Unknown(other.to_string()),
        }
    }

    /// The answer as "nothing known", unless it is a 429.
    pub(crate) fn from_status(response: &HttpResponse) -> Self {
        // A proxy's error page can be long: the start says enough.
        let body = String::from_utf8_lossy(&response.body);
        let said: String = body.trim().chars().take(ERROR_CHARS_MAX).collect();
        let error = format!("status {}: {said}", response.status);
        match slow_down_pause(response) {
            Some(pause) => Unanswered::SlowDown { error, pause },
            None => Unanswered::Unknown(error),
        }
    }
}

/// For a 429, how long the node asks the client to wait: its `Retry-After` in seconds
/// (the HTTP-date form and nonsense count as [`SLOW_DOWN_DEFAULT`]), at most
/// [`SLOW_DOWN_MAX`]. `None` for any other status.
pub(crate) fn slow_down_pause(response: &HttpResponse) -> Option<Duration> {
    if response.status.as_u16() != 429 {
        return None;
    }
    let seconds = response
        .headers
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok());
    Some(
        seconds
            .map_or(SLOW_DOWN_DEFAULT, Duration::from_secs)
            .min(SLOW_DOWN_MAX),
    )
}

/// One attempt of a write at `addr`: `Ok` with a definite answer (the write's outcome, or
/// the node's rejection of a malformed request), `Err` with why nothing is known (no
/// answer, a 5xx, a body that does not parse) or that the node asks to be called later.
pub(crate) async fn write_once(
    client: &HttpClient,
    addr: &str,
    request: &WriteRequestJson,
    timeout: Duration,
) -> Result<Result<WriteResultJson, ClientError>, Unanswered> {
    let response = client
        .post_json(addr, request.path(), request, timeout)
        .await
        .map_err(Unanswered::from_error)?;
    // A 408 (the body came too slowly) or 429 (too many requests) says the node did not
    // take the request: sending it again is safe and may succeed.
    if matches!(response.status.as_u16(), 408 | 429) {
        return Err(Unanswered::from_status(&response));
    }
    if response.status.is_client_error() {
        return match response.success(addr) {
            Err(rejected) => Ok(Err(rejected)),
            Ok(_) => Err(Unanswered::Unknown("a 4xx that is not an error".into())),
        };
    }
    if !response.status.is_success() {
        return Err(Unanswered::from_status(&response));
    }
    response
        .json::<WriteResultJson>(addr)
        .map(Ok)
        .map_err(|e| Unanswered::Unknown(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;
    use hyper::header::HeaderMap;
    use hyper::header::HeaderValue;

    fn response(status: u16, retry_after: Option<&str>) -> HttpResponse {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert("retry-after", HeaderValue::from_str(value).expect("header"));
        }
        HttpResponse {
            status: StatusCode::from_u16(status).expect("status"),
            headers,
            body: bytes::Bytes::from_static(b"{\"error\":\"too many requests\"}"),
        }
    }

    #[test]
    fn a_429_waits_as_long_as_its_retry_after_says_within_the_cap() {
        assert_eq!(
            slow_down_pause(&response(429, Some("2"))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            slow_down_pause(&response(429, Some("0"))),
            Some(Duration::ZERO)
        );
        assert_eq!(
            slow_down_pause(&response(429, Some("3600"))),
            Some(SLOW_DOWN_MAX)
        );
    }

    #[test]
    fn a_429_without_a_number_of_seconds_waits_the_default() {
        assert_eq!(
            slow_down_pause(&response(429, None)),
            Some(SLOW_DOWN_DEFAULT)
        );
        let date = Some("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(
            slow_down_pause(&response(429, date)),
            Some(SLOW_DOWN_DEFAULT)
        );
    }

    #[test]
    fn only_a_429_asks_to_slow_down() {
        for status in [408, 500, 503] {
            assert_eq!(slow_down_pause(&response(status, Some("1"))), None);
            assert!(matches!(
                Unanswered::from_status(&response(status, Some("1"))),
                Unanswered::Unknown(_)
            ));
        }
        let Unanswered::SlowDown { error, pause } =
            Unanswered::from_status(&response(429, Some("1")))
        else {
            panic!("a 429 is a request to slow down");
        };
        assert_eq!(pause, Duration::from_secs(1));
        assert!(
            error.contains("429") && error.contains("too many requests"),
            "{error}"
        );
    }

    #[test]
    fn a_long_error_page_is_cut_in_the_error() {
        let mut page = response(502, None);
        page.body = bytes::Bytes::from("x".repeat(10_000));
        let Unanswered::Unknown(error) = Unanswered::from_status(&page) else {
            panic!("a 502 is nothing known");
        };
        assert!(error.len() < 300, "{error}");
    }
}
