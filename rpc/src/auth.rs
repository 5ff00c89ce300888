//! The token API's JSON shapes (`/admin/tokens`, `/admin/auth/bootstrap`) and the rules
//! the clients and the node share about bearer tokens.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::Serialize;
use task_machine::Role;

/// The environment variable every client reads a bearer token from.
pub const TOKEN_ENV: &str = "ROTA_TOKEN";

/// The path of the one-time bootstrap that makes a cluster's first admin token.
pub const BOOTSTRAP_PATH: &str = "/admin/auth/bootstrap";

/// The path where a caller learns which token it sends (and a node that has not applied
/// a token asks the leader).
pub const WHOAMI_PATH: &str = "/auth/whoami";

/// `GET /auth/whoami`: the caller's token, never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "WhoAmI")]
pub struct WhoAmIJson {
    /// Whether the node checks tokens at all (`false`: `--auth=off`, and nothing else is set).
    pub auth: bool,
    /// The token's public id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its role: `worker`, `reader` or `admin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Group prefixes it is limited to; empty: every group.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// `POST /admin/tokens`: a token to make. It takes no request id: its secret is made
/// by the node and shown once, so a retry could not be answered with the first one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TokenAdd")]
pub struct TokenAddJson {
    /// A name for people (at most 256 bytes), shown by `rota auth token list`.
    pub name: String,
    /// `worker` (the seed and job API), `reader` (reads, watches, metrics) or `admin`.
    pub role: String,
    /// Group name prefixes a worker token is limited to; absent or empty: every group.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// `POST /admin/auth/bootstrap`: the cluster's first admin token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Bootstrap")]
pub struct BootstrapJson {
    /// A name for people; `first admin` if absent.
    #[serde(default)]
    pub name: Option<String>,
}

/// A token as the API shows it: never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Token")]
pub struct TokenJson {
    /// Public id: the part of the bearer token after `rota_` and before the secret.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// Group prefixes it is limited to; empty: every group.
    pub groups: Vec<String>,
    /// When it was made, log time in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
}

/// A token just made, with its bearer form, shown this once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NewToken")]
pub struct NewTokenJson {
    /// The token.
    #[serde(flatten)]
    pub token: TokenJson,
    /// The bearer token (`Authorization: Bearer <this>`); the cluster keeps only its
    /// hash, so it cannot be shown again.
    pub bearer: String,
}

/// `GET /admin/tokens`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "TokenList")]
pub struct TokenListJson {
    /// Every current token, by id.
    pub tokens: Vec<TokenJson>,
}

/// Checks a token request's fields before it is sent: the role is known, prefixes are
/// not empty, and only worker tokens have any.
pub fn check_token_add(add: &TokenAddJson) -> Result<(), String> {
    if Role::parse(&add.role).is_none() {
        return Err(format!(
            "role {:?} is not one of worker, reader, admin",
            add.role
        ));
    }
    if add.groups.iter().any(String::is_empty) {
        return Err("groups: a prefix is empty; leave the list out for every group".into());
    }
    if add.role != "worker" && !add.groups.is_empty() {
        return Err(format!(
            "groups: only worker tokens are limited to groups, not {} tokens",
            add.role
        ));
    }
    Ok(())
}
