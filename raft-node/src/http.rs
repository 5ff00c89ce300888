//! Serving an axum router over HTTP/1.1 with hyper's connection API, and the JSON error
//! answers every endpoint shares.
//!
//! The accept loop uses hyper directly (not `axum::serve`) so the same code can accept on
//! a simulated listener. Deadlines that hyper would otherwise not enforce: reading a
//! request's headers, and how long an idle keep-alive connection stays open.

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header::RETRY_AFTER;
use axum::response::IntoResponse;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::LengthLimitError;
use http_body_util::Limited;
use hyper_util::rt::TokioIo;

use hyper_util::service::TowerToHyperService;
use rpc::worker::ErrorJson;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::service::ServiceError;

/// Deadline for a client to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` turns true.
pub async fn serve(listener: TcpListener, router: Router, mut shutdown: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(crate::runtime::HyperTimer)
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                biased;
                _ = shutdown.changed() => connection.as_mut().graceful_shutdown(),
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
            }
            let _ = connection.await;
        });
    }
}

/// An answer other than 200, with a JSON body that says what to do.
#[derive(Debug)]
pub struct ApiError {
    /// Status code.
    pub status: StatusCode,
    /// What happened and what to do.
    pub message: String,
    /// Seconds after which a retry may succeed (503).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 Not Found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 503 with `Retry-After: 1`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            retry_after_s: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 500 Internal Server Error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// Any status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after_s: None,
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        let message = error.to_string();
        match error {
            // Routers relay NotLeader; one that reaches here met a non-leader twice.
            ServiceError::NotLeader { .. } | ServiceError::Unavailable(_) => {
                Self::unavailable(message)
            }
            ServiceError::Invalid(_) => Self::bad_request(message),
            ServiceError::Conflict(_) => Self::new(StatusCode::CONFLICT, message),
            ServiceError::NotFound(_) => Self::not_found(message),
            ServiceError::Internal(_) => Self::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorJson {
                error: self.message,
            }),
        )
            .into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// Reads a request body of at most `limit` bytes; 413 beyond it, decided from the
/// `Content-Length` header before reading when the client sends one.
pub async fn read_body(
    headers: &axum::http::HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {limit} bytes; split the request"),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// The answer to paths no route has.
pub async fn not_found_fallback(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "no such endpoint: {}; the worker API is /groups, /task, /tasks, /group, /update and /claim",
        uri.path()
    ))
}

/// The answer to a known path with the wrong method.
pub async fn method_not_allowed_fallback(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}
