//! `rota auth token add|list|revoke` and the first admin token of `rota cluster init`:
//! each change is made through one node and then waited for on every member, so that
//! when the command returns, every node accepts (or refuses) the token.

use std::time::Duration;

use rpc::admin::ClusterStatusJson;
use rpc::auth::BOOTSTRAP_PATH;
use rpc::auth::BootstrapJson;
use rpc::auth::NewTokenJson;
use rpc::auth::TokenAddJson;
use rpc::auth::TokenJson;
use rpc::auth::TokenListJson;
use rpc::auth::check_token_add;
use rpc::client::HttpClient;
use tokio::time::Instant;

use crate::CliError;
use crate::nodes::Nodes;
use crate::nodes::encode;
use crate::wait::Look;
use crate::wait::poll_until;

/// How long a token change may take to reach every member.
pub const SPREAD_TIMEOUT: Duration = Duration::from_secs(15);

const POLL: Duration = Duration::from_millis(50);

/// The API addresses of every member, as the first of `nodes` that answers `client`
/// knows them.
async fn member_addrs(client: &HttpClient, nodes: &Nodes) -> Result<Vec<String>, CliError> {
    let mut failures = Vec::new();
    for addr in nodes.addrs() {
        let answer = client.get(addr, "/cluster", Duration::from_secs(2)).await;
        match answer.and_then(|r| r.success(addr)?.json::<ClusterStatusJson>(addr)) {
            Ok(cluster) => return Ok(cluster.nodes.into_iter().map(|n| n.api_addr).collect()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(CliError::Unreachable(format!(
        "no node listed the members: {}",
        failures.join("; ")
    )))
}

/// Waits until `check` holds on every member (listed through `client`).
async fn on_every_member(
    client: &HttpClient,
    nodes: &Nodes,
    what: &str,
    check: impl AsyncFn(&str) -> bool,
) -> Result<(), CliError> {
    let members = member_addrs(client, nodes).await?;
    let look = async || {
        let mut behind = Vec::new();
        for addr in &members {
            if !check(addr).await {
                behind.push(addr.clone());
            }
        }
        Ok(if behind.is_empty() {
            Look::Done(())
        } else {
            Look::NotYet(behind)
        })
    };
    let timed_out = |behind: Vec<String>| {
        CliError::Failed(format!(
            "{what} was made, but {} did not see it within {SPREAD_TIMEOUT:?}; they may be down or partitioned",
            behind.join(", ")
        ))
    };
    poll_until(Instant::now() + SPREAD_TIMEOUT, POLL, look, timed_out).await
}

/// `nodes`' client, sending `bearer` instead of its own token.
fn bearing(nodes: &Nodes, bearer: &str) -> Result<HttpClient, CliError> {
    nodes
        .client()
        .clone()
        .with_token(Some(bearer))
        .map_err(|e| CliError::Failed(format!("the node answered an unusable token: {e}")))
}

/// Waits until every member accepts the token just made.
async fn until_accepted(nodes: &Nodes, what: &str, made: &NewTokenJson) -> Result<(), CliError> {
    let client = bearing(nodes, &made.bearer)?;
    on_every_member(&client, nodes, what, async |addr| {
        client
            .get(addr, "/cluster", Duration::from_secs(2))
            .await
            .is_ok_and(|r| r.status.is_success())
    })
    .await
}

/// Makes a token and waits until every member accepts it.
pub async fn add(nodes: &Nodes, add: TokenAddJson) -> Result<NewTokenJson, CliError> {
    check_token_add(&add).map_err(CliError::Usage)?;
    let made: NewTokenJson = nodes.post_for("/admin/tokens", &add).await?;
    until_accepted(nodes, "the token", &made).await?;
    Ok(made)
}

/// Every token of the cluster.
pub async fn list(nodes: &Nodes) -> Result<Vec<TokenJson>, CliError> {
    let list: TokenListJson = nodes.get_json("/admin/tokens").await?;
    Ok(list.tokens)
}

/// Revokes a token and waits until no member lists it.
pub async fn revoke(nodes: &Nodes, id: &str) -> Result<TokenJson, CliError> {
    let revoked: TokenJson = nodes
        .delete_for(&format!("/admin/tokens/{}", encode(id)))
        .await?;
    let client = nodes.client().clone();
    on_every_member(&client, nodes, "the revocation", async |addr| {
        let path = "/admin/tokens?consistency=stale";
        match client.get(addr, path, Duration::from_secs(2)).await {
            Ok(r) if r.status.is_success() => r
                .json::<TokenListJson>(addr)
                .is_ok_and(|list| list.tokens.iter().all(|t| t.id != id)),
            _ => false,
        }
    })
    .await?;
    Ok(revoked)
}

/// Makes the cluster's first admin token (once in its life) and waits until every
/// member accepts it.
pub async fn bootstrap(nodes: &Nodes) -> Result<NewTokenJson, CliError> {
    let made: NewTokenJson = nodes
        .post_for(BOOTSTRAP_PATH, &BootstrapJson::default())
        .await?;
    until_accepted(nodes, "the first admin token", &made).await?;
    Ok(made)
}

/// A token as one line of `rota auth token list`.
pub fn token_line(token: &TokenJson) -> String {
    let groups = if token.groups.is_empty() {
        "*".to_string()
    } else {
        token.groups.join(",")
    };
    format!(
        "{:<16}  {:<6}  {:<24}  {}",
        token.id, token.role, groups, token.name
    )
}
