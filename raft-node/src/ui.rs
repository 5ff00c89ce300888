//! The dashboard: the files of `raft-node/ui` compiled into the binary and served at
//! `/ui`, so every node has it with nothing to install and nothing fetched at run time.
//! Every answer carries a content security policy that lets the page load and call
//! only this node, so an injected payload can neither run inline script nor send data
//! elsewhere. `/ui/config` tells the page whether this node allows actions
//! (`--ui-actions`); the actions themselves are ordinary API calls.

use axum::Json;
use axum::Router;
use axum::extract::Path;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use include_dir::Dir;
use include_dir::include_dir;
use serde::Serialize;

use crate::http::ApiError;
use crate::node::SharedNode;

static UI: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/ui");

/// Loads scripts, styles, images and data from this node only; no inline script or
/// style, no plugins, no framing, no forms posting elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes.
pub fn routes() -> Router<SharedNode> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/config", get(config))
        .route("/ui/{*path}", get(asset))
}

/// What the page needs to know about this node.
#[derive(Serialize)]
struct UiConfigJson {
    /// Whether the page may offer retry, cancel, pause and resume.
    actions: bool,
    /// The node serving the page.
    node_id: u64,
}

async fn config(State(node): State<SharedNode>) -> Response {
    let config = UiConfigJson {
        actions: node.config.ui_actions,
        node_id: node.config.id,
    };
    with_policy(Json(config).into_response())
}

async fn index() -> Result<Response, ApiError> {
    serve("index.html")
}

async fn asset(Path(path): Path<String>) -> Result<Response, ApiError> {
    serve(&path)
}

/// The embedded file at `path`, with its content type and the policy headers.
fn serve(path: &str) -> Result<Response, ApiError> {
    let file = UI
        .get_file(path)
        .ok_or_else(|| ApiError::not_found(format!("no dashboard file {path:?}; open /ui")))?;
    let mut response = (StatusCode::OK, file.contents()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(path)),
    );
    // The files change only with the binary; revalidating is cheap and never stale.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(with_policy(response))
}

fn with_policy(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "json" => "application/json",
        "txt" | "md" => "text/plain; charset=utf-8",
        _ if path.ends_with("LICENSE") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_is_embedded_small_and_self_contained() {
        assert!(
            UI.get_file("index.html").is_some(),
            "ui/index.html is embedded"
        );
        let mut total = 0;
        let mut stack = vec![&UI];
        while let Some(dir) = stack.pop() {
            total += dir.files().map(|f| f.contents().len()).sum::<usize>();
            stack.extend(dir.dirs());
        }
        assert!(
            total < 200 * 1024,
            "the dashboard is {total} bytes; keep it under 200 KiB"
        );
    }

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(
            content_type("vendor/a.min.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("vendor/LICENSE"), "text/plain; charset=utf-8");
        assert_eq!(content_type("data.bin"), "application/octet-stream");
    }
}
