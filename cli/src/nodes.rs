//! The nodes a command talks to: `--url` parsed once, each node tried in turn until one
//! answers, JSON answers decoded, refusals turned into [`CliError`]s.

use std::time::Duration;

use rpc::client::HeaderName;
use rpc::client::HeaderValue;
use rpc::client::HttpClient;
use rpc::client::HttpMethod;
use rpc::client::HttpResponse;
use rpc::job::JobWaitJson;
use rpc::worker::TaskJson;
use rpc::worker::WriteRequestJson;
use rpc::worker_client::WorkerClient;
use rpc::worker_client::WorkerError;

use crate::CliError;

/// Deadline of one call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a write is retried (over every node, asking who leads between rounds)
/// before the command gives up with exit 3: long enough to ride out an election after
/// one call to a frozen leader timed out.
pub const WRITE_GIVE_UP: Duration = Duration::from_secs(10);

/// Deadline of one probe of one node (health, status).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Turns `--url` values (`host:port` or `http://host:port`, comma-separated) into
/// addresses, in the order given.
pub fn addresses(urls: &[String]) -> Result<Vec<String>, CliError> {
    // Without a CA the client speaks plain HTTP, which a TLS port answers with bytes
    // that read as "invalid HTTP version": say what is missing instead.
    let https = urls
        .iter()
        .flat_map(|u| u.split(','))
        .find(|u| u.trim().starts_with("https://"));
    if let Some(url) = https
        && crate::tls().is_none()
    {
        return Err(CliError::Usage(format!(
            "{} is https, but no CA certificate was given: pass --ca FILE (or set ROTA_CA) \
             with the cluster's CA certificate",
            url.trim()
        )));
    }
    let addrs: Vec<String> = urls
        .iter()
        .flat_map(|u| u.split(','))
        .map(rpc::client::node_address)
        .filter(|u| !u.is_empty())
        .collect();
    if addrs.is_empty() {
        return Err(CliError::Usage(
            "no node to talk to: pass --url HOST:PORT (or set ROTA_URL)".into(),
        ));
    }
    Ok(addrs)
}

/// The `Content-Type` of a JSON body.
fn json_content_type() -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("application/json"),
    )
}

/// Percent-encodes a group name, key or state for a path segment or a query value.
pub fn encode(text: &str) -> String {
    rpc::client::percent_encode(text)
}

/// The nodes of `--url`, tried in turn until one answers.
pub struct Nodes {
    client: HttpClient,
    addrs: Vec<String>,
}

impl Nodes {
    /// A client for the nodes in `urls`.
    pub fn new(urls: &[String]) -> Result<Self, CliError> {
        Ok(Self {
            client: crate::http_client(),
            addrs: addresses(urls)?,
        })
    }

    /// A client for nodes at these `host:port` addresses, through `client`.
    pub fn with_client(client: HttpClient, addrs: Vec<String>) -> Self {
        Self { client, addrs }
    }

    /// The addresses of `--url`, in the order given.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The HTTP client, for calls to one particular node.
    pub fn client(&self) -> &HttpClient {
        &self.client
    }

    /// Sends to each node in turn until one answers without a server error; returns
    /// that node's address and answer.
    async fn send(
        &self,
        method: HttpMethod,
        path: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(String, HttpResponse), CliError> {
        let mut failures = Vec::new();
        let mut answered = false;
        for addr in &self.addrs {
            let sent = self
                .client
                .send(
                    addr,
                    method.clone(),
                    path,
                    headers,
                    body.clone().into(),
                    timeout,
                )
                .await;
            match sent {
                // The node's own words (no quorum, "ask with consistency=stale") say what
                // to do better than the status does.
                Ok(response) if response.status.is_server_error() => {
                    answered = true;
                    if let Err(refused) = response.success(addr) {
                        failures.push(refused.to_string());
                    }
                }
                Ok(response) => return Ok((addr.clone(), response)),
                Err(e) => failures.push(e.to_string()),
            }
        }
        let what = if answered {
            "no node could serve the request"
        } else {
            "no node answered"
        };
        Err(CliError::Unreachable(format!(
            "{what}: {}; check --url and that the nodes run and have a leader",
            failures.join("; ")
        )))
    }

    /// `GET path` from the first node that answers; its address and answer.
    pub async fn get(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<(String, HttpResponse), CliError> {
        self.send(HttpMethod::GET, path, &[], Vec::new(), timeout)
            .await
    }

    /// `POST path` with `body` (one of rpc's types) as JSON to the first node that
    /// answers; its address and answer.
    pub async fn post_json<T: serde::Serialize>(
        &self,
        path: &str,
        body: &T,
        timeout: Duration,
    ) -> Result<(String, HttpResponse), CliError> {
        let bytes = serde_json::to_vec(body).map_err(|e| CliError::Failed(e.to_string()))?;
        self.send(
            HttpMethod::POST,
            path,
            &[json_content_type()],
            bytes,
            timeout,
        )
        .await
    }

    /// `GET path`, parsed as JSON; a 4xx is a refusal (exit 1).
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, CliError> {
        self.get_json_waiting(path, Duration::ZERO).await
    }

    /// As [`Nodes::get_json`], for a read that may wait `wait` at the node first.
    pub async fn get_json_waiting<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        wait: Duration,
    ) -> Result<T, CliError> {
        let (addr, response) = self.get(path, CALL_TIMEOUT + wait).await?;
        answer(&addr, response)
    }

    /// Sends a worker write (`/update`, `/claim`, `/finish`, `/fail`, `/cancel`,
    /// `/retry`) through [`WorkerClient`]: to the leader, retried under the request's id
    /// (a fresh one if it has none) for up to [`WRITE_GIVE_UP`], so it applies once. The
    /// written tasks, or a refusal (exit 1), or no node answered (exit 3).
    pub async fn write(&self, request: &WriteRequestJson) -> Result<Vec<TaskJson>, CliError> {
        let client = self.worker_client()?;
        let request_id = request
            .request_id()
            .map_or_else(|| client.next_request_id(), str::to_string);
        match client.write_as(request.clone(), request_id.clone()).await {
            Ok(tasks) => Ok(tasks),
            Err(WorkerError::Refused(errors)) => Err(CliError::Refused(errors)),
            Err(WorkerError::Unavailable {
                waited, last_error, ..
            }) => Err(CliError::Unreachable(format!(
                "no definite answer after {waited:.1?}: {last_error}; check that the nodes have a \
                 leader. The write may or may not have applied: the same \
                 command with --client-id {} --request-id {request_id} applies it once",
                request.client_id()
            ))),
            Err(e) => Err(CliError::Failed(e.to_string())),
        }
    }

    /// The records of jobs `keys` of `group` once all have finished, or as they are after
    /// `wait`, through [`WorkerClient::wait_jobs`] (which sends long lists in a body);
    /// a 4xx is a failure (exit 1), no node answering is exit 3.
    pub async fn wait_jobs(
        &self,
        group: &str,
        keys: &[&str],
        wait: Duration,
    ) -> Result<JobWaitJson, CliError> {
        match self.worker_client()?.wait_jobs(group, keys, wait).await {
            Ok(answer) => Ok(answer),
            Err(e @ WorkerError::Unavailable { .. }) => Err(CliError::Unreachable(e.to_string())),
            Err(e) => Err(CliError::Failed(e.to_string())),
        }
    }

    /// A [`WorkerClient`] of these nodes, with the CLI's token, TLS and timeouts.
    fn worker_client(&self) -> Result<WorkerClient, CliError> {
        Ok(WorkerClient::new(&self.addrs, 0)
            .and_then(|c| c.with_token(crate::token()))
            .map(|c| c.with_tls(crate::tls()))
            .map_err(|e| CliError::Usage(e.to_string()))?
            .with_timeouts(rpc::worker_client::CALL_TIMEOUT, WRITE_GIVE_UP))
    }

    /// `POST path` with `body` as JSON, the answer parsed as JSON; a 4xx is a refusal
    /// (exit 1) with the node's message. Not retried on another node once one answered.
    pub async fn post_for<T: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<R, CliError> {
        let (addr, response) = self.post_json(path, body, CALL_TIMEOUT).await?;
        answer(&addr, response)
    }

    /// `DELETE path`, the answer parsed as JSON; a 4xx is a refusal (exit 1).
    pub async fn delete_for<R: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<R, CliError> {
        let (addr, response) = self
            .send(HttpMethod::DELETE, path, &[], Vec::new(), CALL_TIMEOUT)
            .await?;
        answer(&addr, response)
    }

    /// `PUT path` with `body` (one of rpc's types) as JSON, the answer parsed as JSON; a
    /// 4xx is a refusal (exit 1) with the node's message.
    pub async fn put_json<T: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<R, CliError> {
        let bytes = serde_json::to_vec(body).map_err(|e| CliError::Failed(e.to_string()))?;
        let (addr, response) = self
            .send(
                HttpMethod::PUT,
                path,
                &[json_content_type()],
                bytes,
                CALL_TIMEOUT,
            )
            .await?;
        answer(&addr, response)
    }
}

/// `addr`'s answer parsed as JSON; a 4xx is a refusal (exit 1) with the node's message.
fn answer<T: serde::de::DeserializeOwned>(
    addr: &str,
    response: HttpResponse,
) -> Result<T, CliError> {
    response
        .success(addr)
        .and_then(|response| response.json(addr))
        .map_err(|e| CliError::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_split_and_https_without_a_ca_is_a_usage_error() {
        let urls = ["http://a:1/, b:2".to_string(), "c:3".to_string()];
        assert_eq!(addresses(&urls).expect("plain"), ["a:1", "b:2", "c:3"]);
        // No test of this process sets a CA.
        let secure = ["a:1,https://b:2".to_string()];
        match addresses(&secure) {
            Err(CliError::Usage(message)) => assert!(message.contains("--ca"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
}
