//! The token check in front of every API route, and the token endpoints
//! (`/admin/tokens`, `/admin/auth/bootstrap`): thin adapters over `service::auth`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;

use axum::Json;
use axum::Router;
use axum::extract::Path;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::http::HeaderName;
use axum::http::HeaderValue;
use axum::http::Method;
use axum::http::header::AUTHORIZATION;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::delete;
use axum::routing::get;
use axum::routing::post;
use bytes::Bytes;
use futures_util::future::Either;
use rpc::auth::BootstrapJson;
use rpc::auth::NewTokenJson;
use rpc::auth::TokenAddJson;
use rpc::auth::TokenJson;
use rpc::auth::TokenListJson;
use rpc::auth::check_token_add;
use rpc::job::JOBS_WAIT_PATH;
use store_sm::machine::Role;
use store_sm::machine::TokenRecord;
use tower::Layer;
use tower::Service;

use crate::http::ApiError;
use crate::node::FORWARD_TIMEOUT;
use crate::node::SharedNode;
use crate::relay::FORWARDED_HEADER;
use crate::relay::Incoming;
use crate::relay::respond;
use crate::service::Consistency;
use crate::service::ServiceError;
use crate::service::auth::Access;
use crate::service::auth::Caller;
use crate::service::auth::new_token;
use crate::service::auth::unauthorized;
use crate::service::auth::unknown_token;
use crate::worker_api::path_segment;
use crate::worker_api::query_params;

use rpc::auth::BOOTSTRAP_PATH;
use rpc::auth::WHOAMI_PATH;
use rpc::auth::WhoAmIJson;

/// The token routes.
pub fn routes() -> Router<SharedNode> {
    Router::new()
        .route("/admin/tokens", get(get_tokens).post(post_token))
        .route("/admin/tokens/{id}", delete(delete_token))
        .route(BOOTSTRAP_PATH, post(post_bootstrap))
        .route(WHOAMI_PATH, get(get_whoami))
}

/// `GET /auth/whoami`: the caller's token as this node knows it (any role). A node that
/// has not applied a token asks the leader this.
async fn get_whoami(incoming: Incoming) -> Response {
    let json = match &incoming.caller {
        Caller::Anyone => WhoAmIJson {
            auth: false,
            id: None,
            role: None,
            groups: Vec::new(),
        },
        Caller::Token { id, role, groups } => WhoAmIJson {
            auth: true,
            id: Some(id.clone()),
            role: Some(role.to_string()),
            groups: groups.clone(),
        },
    };
    Json(json).into_response()
}

/// What a request to `path` needs of its caller. A node that belongs to no cluster yet
/// holds nothing to protect and no token to check, so it answers its status and takes
/// the admin steps that give it a cluster (init, restore) from anyone.
fn access_needed(
    method: &Method,
    path: &str,
    metrics_open: bool,
    blank: impl Fn() -> bool,
) -> Access {
    match path {
        "/health" | "/ready" | "/openapi.json" | BOOTSTRAP_PATH => Access::Open,
        "/cluster" | "/admin/init" | "/admin/restore" if blank() => Access::Open,
        "/metrics" if metrics_open => Access::Open,
        "/metrics" | "/admin/state-hash" => Access::Observe,
        "/ui" => Access::Open,
        // A read, whether its keys come in the query or (too many for a URL) a body.
        JOBS_WAIT_PATH => Access::Read,
        _ if path.starts_with("/ui/") => Access::Open,
        _ if path.starts_with("/admin/") => Access::Admin,
        _ if path.starts_with("/groups/") && *method == Method::PUT => Access::Admin,
        _ if *method == Method::GET || *method == Method::HEAD => Access::Read,
        _ => Access::Write,
    }
}

/// The layer that finds the caller of every request, refuses it (401, 403) unless its
/// role allows the route, and hands it to the handler (`Incoming::caller`). A hand-written
/// tower layer: a caller known at once (authentication off, or a token this node has
/// applied) costs no allocation; only a token this node has not seen waits, boxed.
#[derive(Clone)]
pub struct TokenCheckLayer(SharedNode);

impl TokenCheckLayer {
    /// Checks tokens against `node`.
    pub fn new(node: SharedNode) -> Self {
        Self(node)
    }
}

impl<S> Layer<S> for TokenCheckLayer {
    type Service = TokenCheck<S>;

    fn layer(&self, inner: S) -> TokenCheck<S> {
        TokenCheck {
            inner,
            node: self.0.clone(),
        }
    }
}

/// A route's service behind [`TokenCheckLayer`].
#[derive(Clone)]
pub struct TokenCheck<S> {
    inner: S,
    node: SharedNode,
}

type Answered = std::future::Ready<Result<Response, Infallible>>;
type Waited = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<S> Service<axum::extract::Request> for TokenCheck<S>
where
    S: Service<axum::extract::Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Either<Answered, S::Future>, Waited>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: axum::extract::Request) -> Self::Future {
        let node = &self.node;
        let answered =
            |response: Response| Either::Left(Either::Left(std::future::ready(Ok(response))));
        if let Err(forged) = crate::relay::check_forwarded_by(request.headers(), node.id()) {
            return answered(forged.into_response());
        }
        let access = access_needed(
            request.method(),
            request.uri().path(),
            node.config.metrics_open,
            || node.is_blank(),
        );
        let header = authorization(&request);
        let known = if access == Access::Open {
            Some(Ok(node.authenticate(header).unwrap_or(Caller::Anyone)))
        } else {
            node.authenticate_known(header)
        };
        match known {
            Some(Ok(caller)) => {
                if let Some(refused) = refusal(node, &caller, access) {
                    return answered(refused);
                }
                request.extensions_mut().insert(caller);
                Either::Left(Either::Right(self.inner.call(request)))
            }
            Some(Err(refused)) => answered(ApiError::from(refused).into_response()),
            None => {
                // `poll_ready` readied `self.inner`: the wait takes it, a clone stays.
                let ready = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, ready);
                Either::Right(Box::pin(confirm_then_call(
                    node.clone(),
                    access,
                    inner,
                    request,
                )))
            }
        }
    }
}

/// The request's Authorization header, as text (a header that is not text is no token).
fn authorization(request: &axum::extract::Request) -> Option<&str> {
    request
        .headers()
        .get(AUTHORIZATION)
        .map(|value| value.to_str().unwrap_or("(not text)"))
}

/// The answer that refuses `caller`'s request: its role may not make it, or its token is
/// over its rate; `None` when it may go on.
fn refusal(node: &SharedNode, caller: &Caller, access: Access) -> Option<Response> {
    if let Err(refused) = caller.may(access) {
        return Some(ApiError::from(refused).into_response());
    }
    if let Caller::Token { id, .. } = caller
        && let Err(why) = node.token_limits.check(id)
    {
        return Some(crate::rate_limit::too_many(why));
    }
    None
}

/// For a token this node has not applied: confirms it (a linearizable read on the
/// leader, else asks the leader), then calls `inner` with the caller.
async fn confirm_then_call<S>(
    node: SharedNode,
    access: Access,
    mut inner: S,
    mut request: axum::extract::Request,
) -> Result<Response, Infallible>
where
    S: Service<axum::extract::Request, Response = Response, Error = Infallible>,
{
    let header = authorization(&request).map(str::to_owned);
    let forwarded = request.headers().contains_key(FORWARDED_HEADER);
    let caller = match node
        .authenticate_confirmed(header.as_deref(), forwarded)
        .await
    {
        Ok(caller) => caller,
        Err(ServiceError::NotLeader { leader_api }) => {
            match ask_leader_who(&node, &leader_api, header.as_deref().unwrap_or_default()).await {
                Ok(caller) => caller,
                Err(refused) => return Ok(ApiError::from(refused).into_response()),
            }
        }
        Err(refused) => return Ok(ApiError::from(refused).into_response()),
    };
    if let Some(refused) = refusal(&node, &caller, access) {
        return Ok(refused);
    }
    request.extensions_mut().insert(caller);
    inner.call(request).await
}

/// The caller the leader at `leader_api` finds for `authorization`: for a token this node
/// has not applied yet (the request is marked forwarded, so the leader asks no one).
async fn ask_leader_who(
    node: &SharedNode,
    leader_api: &str,
    authorization: &str,
) -> Result<Caller, ServiceError> {
    let cannot = |why: String| {
        ServiceError::Unavailable(format!(
            "this node has not applied the token yet and {why}; retry shortly"
        ))
    };
    let value = HeaderValue::from_str(authorization)
        .map_err(|_| unauthorized("the Authorization header is not a bearer token"))?;
    let headers = [
        (AUTHORIZATION, value),
        (
            HeaderName::from_static(FORWARDED_HEADER),
            HeaderValue::from(node.id()),
        ),
    ];
    let answer = node
        .client
        .send(
            leader_api,
            Method::GET,
            WHOAMI_PATH,
            &headers,
            Bytes::new(),
            FORWARD_TIMEOUT,
        )
        .await
        .map_err(|e| cannot(format!("the leader could not be asked ({e})")))?;
    match answer.status.as_u16() {
        200 => {
            let who: WhoAmIJson = serde_json::from_slice(&answer.body)
                .map_err(|e| cannot(format!("the leader's answer is unreadable ({e})")))?;
            let role = who.role.as_deref().and_then(Role::parse);
            match (who.auth, who.id, role) {
                (true, Some(id), Some(role)) => Ok(Caller::Token {
                    id,
                    role,
                    groups: who.groups,
                }),
                _ => Err(cannot("the leader does not check tokens".into())),
            }
        }
        401 => Err(unknown_token()),
        status => Err(cannot(format!("the leader answered {status}"))),
    }
}

fn token_json(record: &TokenRecord) -> TokenJson {
    TokenJson {
        id: record.id.clone(),
        name: record.name.clone(),
        role: record.role.to_string(),
        groups: record.groups.clone(),
        created_at_ms: record.created_at.as_millis(),
    }
}

fn new_token_json(record: &TokenRecord, bearer: String) -> NewTokenJson {
    NewTokenJson {
        token: token_json(record),
        bearer,
    }
}

async fn get_tokens(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let params = query_params(Some(incoming.query()))?;
    let consistency = Consistency::parse(params.get("consistency").map(String::as_str))?;
    Ok(
        crate::worker_api::read(&node, incoming, consistency, |view| {
            let tokens = view.state.machine.tokens().map(token_json).collect();
            Ok(Json(TokenListJson { tokens }).into_response())
        })
        .await,
    )
}

async fn post_token(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: TokenAddJson = serde_json::from_slice(&incoming.body)
        .map_err(|e| ApiError::bad_request(format!("bad /admin/tokens body: {e}")))?;
    check_token_add(&json).map_err(ApiError::bad_request)?;
    let role = Role::parse(&json.role)
        .ok_or_else(|| ApiError::bad_request(format!("unknown role {:?}", json.role)))?;
    let made = node
        .add_token(new_token(0, json.name, role, json.groups))
        .await;
    Ok(respond(&node, incoming, made, |(record, bearer)| {
        Json(new_token_json(&record, bearer)).into_response()
    })
    .await)
}

async fn delete_token(
    State(node): State<SharedNode>,
    id: Result<Path<String>, PathRejection>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let id = path_segment(id)?;
    let request_id = crate::worker_api::request_id(&incoming, None)?;
    let incoming = incoming.write_with(request_id.as_deref());
    let revoked = node.revoke_token(0, id, request_id).await;
    Ok(respond(&node, incoming, revoked, |record| {
        Json(token_json(&record)).into_response()
    })
    .await)
}

async fn post_bootstrap(
    State(node): State<SharedNode>,
    incoming: Incoming,
) -> Result<Response, ApiError> {
    let json: BootstrapJson = if incoming.body.is_empty() {
        BootstrapJson::default()
    } else {
        serde_json::from_slice(&incoming.body)
            .map_err(|e| ApiError::bad_request(format!("bad {BOOTSTRAP_PATH} body: {e}")))?
    };
    let name = json.name.unwrap_or_else(|| "first admin".into());
    let made = node
        .bootstrap_auth(new_token(0, name, Role::Admin, vec![]))
        .await;
    Ok(respond(&node, incoming, made, |(record, bearer)| {
        Json(new_token_json(&record, bearer)).into_response()
    })
    .await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_needs_what_its_role_table_says() {
        let get = Method::GET;
        let post = Method::POST;
        let put = Method::PUT;
        let needs = |method: &Method, path| access_needed(method, path, false, || false);
        assert_eq!(needs(&get, "/health"), Access::Open);
        assert_eq!(needs(&get, "/ready"), Access::Open);
        assert_eq!(needs(&post, BOOTSTRAP_PATH), Access::Open);
        assert_eq!(needs(&get, "/ui/app.js"), Access::Open);
        assert_eq!(needs(&get, "/metrics"), Access::Observe);
        assert_eq!(
            access_needed(&get, "/metrics", true, || false),
            Access::Open
        );
        assert_eq!(needs(&get, "/cluster"), Access::Read);
        assert_eq!(needs(&get, "/group/map"), Access::Read);
        assert_eq!(needs(&get, "/watch"), Access::Read);
        assert_eq!(needs(&post, "/update"), Access::Write);
        assert_eq!(needs(&post, "/claim"), Access::Write);
        assert_eq!(needs(&post, "/cancel"), Access::Write);
        assert_eq!(needs(&get, "/jobs/wait"), Access::Read);
        assert_eq!(needs(&post, "/jobs/wait"), Access::Read);
        assert_eq!(needs(&put, "/groups/map/settings"), Access::Admin);
        assert_eq!(needs(&get, "/groups/map/settings"), Access::Read);
        assert_eq!(needs(&post, "/admin/remove"), Access::Admin);
        assert_eq!(needs(&get, "/admin/backup"), Access::Admin);
        assert_eq!(needs(&post, "/admin/tokens"), Access::Admin);
        assert_eq!(needs(&post, "/admin/init"), Access::Admin);
        assert_eq!(needs(&post, "/uix"), Access::Write);
        // A node in no cluster yet answers its status and takes init and restore.
        for path in ["/cluster", "/admin/init", "/admin/restore"] {
            assert_eq!(access_needed(&get, path, false, || true), Access::Open);
        }
        assert_eq!(
            access_needed(&post, "/admin/remove", false, || true),
            Access::Admin
        );
    }
}
