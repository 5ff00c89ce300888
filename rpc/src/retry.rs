//! One attempt of a write, sorted into a definite answer or "nothing known".
//!
//! A timeout, a dropped connection or a 5xx does not prove that a write had no effect, so
//! a client sends the same body (with its request id, which makes the cluster apply it
//! once) again, to the next node, until a node answers with the write's outcome: its
//! tasks or its refusal. [`crate::worker_client::WorkerClient`] does that with this.

use std::time::Duration;

use crate::client::ClientError;
use crate::client::HttpClient;
use crate::worker::WriteRequestJson;
use crate::worker::WriteResultJson;

/// One attempt of a write at `addr`: `Ok` with a definite answer (the write's outcome, or
/// the node's rejection of a malformed request), `Err` with why nothing is known (no
/// answer, a 5xx, a body that does not parse), so the write may be sent again.
pub(crate) async fn write_once(
    client: &HttpClient,
    addr: &str,
    request: &WriteRequestJson,
    timeout: Duration,
) -> Result<Result<WriteResultJson, ClientError>, String> {
    let response = client
        .post_json(addr, request.path(), request, timeout)
        .await
        .map_err(|e| e.to_string())?;
    // A 408 (the body came too slowly) or 429 (too many requests) says the node did not
    // take the request: sending it again is safe and may succeed.
    if matches!(response.status.as_u16(), 408 | 429) {
        return Err(format!("status {}", response.status));
    }
    if response.status.is_client_error() {
        return match response.success(addr) {
            Err(rejected) => Ok(Err(rejected)),
            Ok(_) => Err("a 4xx that is not an error".into()),
        };
    }
    if !response.status.is_success() {
        return Err(format!("status {}", response.status));
    }
    response
        .json::<WriteResultJson>(addr)
        .map(Ok)
        .map_err(|e| e.to_string())
}
