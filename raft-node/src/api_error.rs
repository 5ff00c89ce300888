//! The answer a handler or check gives instead of 200: a status and a JSON body that
//! says what to do, and how each service error maps to one. Apart from the accept loop
//! (`http.rs`), so that the checks in front of routing (`connection.rs`,
//! `rate_limit.rs`) answer with it without importing the loop that calls them.

use axum::Json;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header::RETRY_AFTER;
use axum::response::IntoResponse;
use axum::response::Response;
use rpc::worker::ErrorJson;

use crate::service::ServiceError;

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
            ServiceError::ReusedRequestId(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, message)
            }
            ServiceError::NotFound(_) => Self::not_found(message),
            ServiceError::Unauthorized(_) => Self::new(StatusCode::UNAUTHORIZED, message),
            ServiceError::Forbidden(_) => Self::new(StatusCode::FORBIDDEN, message),
            ServiceError::Internal(_) => Self::internal(message),
            // Not Retry-After: retrying here never helps; the message names the members.
            ServiceError::Removed { .. } => Self::new(StatusCode::SERVICE_UNAVAILABLE, message),
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
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"rota\""),
            );
        }
        response
    }
}
