//! The gateway's errors and their one JSON shape,
//! `{"code": <gRPC code number>, "message": "...", "details": []}`, with the
//! HTTP status decided by `taskmesh_core::ErrorCode` so REST and gRPC agree.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use taskmesh_core::ErrorCode;

/// What can go wrong building the gateway.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The descriptor set cannot be read or holds a rule the gateway cannot serve.
    #[error("descriptors: {0}")]
    Descriptor(String),
    /// The gRPC target is not a valid URI.
    #[error("gRPC target {0:?} is not a valid URI")]
    Target(String),
}

/// gRPC code numbers the gateway produces itself.
pub mod code {
    /// INVALID_ARGUMENT.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// DEADLINE_EXCEEDED.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// NOT_FOUND.
    pub const NOT_FOUND: i32 = 5;
    /// RESOURCE_EXHAUSTED.
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// UNIMPLEMENTED (a method the path does not serve, as grpc-gateway says).
    pub const UNIMPLEMENTED: i32 = 12;
    /// INTERNAL.
    pub const INTERNAL: i32 = 13;
}

/// An error answered to a REST caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// gRPC code number.
    pub code: i32,
    /// What went wrong, for a human.
    pub message: String,
    /// Extra headers (e.g. `Allow` on 405).
    pub allow: Option<String>,
    /// `Retry-After`, in seconds (from the status's `retry-after-ms`).
    pub retry_after: Option<u64>,
}

/// The JSON body of every error.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// gRPC code number.
    pub code: i32,
    /// What went wrong.
    pub message: &'a str,
    /// Always present; empty for now (no `google.rpc` details are produced).
    pub details: [(); 0],
}

impl ApiError {
    /// An error with an explicit HTTP status.
    pub fn new(status: StatusCode, code: i32, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            allow: None,
            retry_after: None,
        }
    }

    /// 400 INVALID_ARGUMENT.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code::INVALID_ARGUMENT, message)
    }

    /// An error for a gRPC status code number and message, mapped as
    /// grpc-gateway maps it: codes outside the shared vocabulary are 500.
    pub fn from_grpc(code: i32, message: impl Into<String>) -> Self {
        let status = ErrorCode::from_grpc_code(code)
            .and_then(|c| StatusCode::from_u16(c.http_status()).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, code, message)
    }

    /// The JSON text of the body.
    pub fn body_json(&self) -> String {
        serde_json::to_string(&ErrorBody {
            code: self.code,
            message: &self.message,
            details: [],
        })
        .unwrap_or_else(|_| format!("{{\"code\":{},\"message\":\"\",\"details\":[]}}", self.code))
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        let mut err = ApiError::from_grpc(status.code() as i32, status.message());
        // Whole seconds, rounded up: a client waiting that long finds room.
        err.retry_after = status
            .metadata()
            .get("retry-after-ms")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|ms| ms.div_ceil(1_000).max(1));
        err
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), code = self.code, error = %self.message, "rest request failed");
        }
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body_json(),
        )
            .into_response();
        if let Some(allow) = self.allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
            response.headers_mut().insert(header::ALLOW, allow);
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_map_like_grpc_gateway() {
        let cases = [
            (3, 400),
            (5, 404),
            (6, 409),
            (9, 400),
            (10, 409),
            (16, 401),
            (7, 403),
            (8, 429),
            (14, 503),
            (4, 504),
            (13, 500),
            (2, 500),
            (12, 500),
            (1, 500),
        ];
        for (grpc, http) in cases {
            let err = ApiError::from_grpc(grpc, "m");
            assert_eq!(err.status.as_u16(), http, "code {grpc}");
            let body: serde_json::Value = serde_json::from_str(&err.body_json()).unwrap();
            assert_eq!(
                body,
                serde_json::json!({"code": grpc, "message": "m", "details": []})
            );
        }
    }
}
