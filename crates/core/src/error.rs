//! The one error vocabulary. Every crate's `Error` maps onto an [`ErrorCode`],
//! and the code alone decides the gRPC status and the HTTP status, so both
//! front doors always agree.

use serde::Serialize;

/// What kind of failure an error is, independent of transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The request is malformed; nothing was changed.
    InvalidArgument,
    /// The named resource does not exist.
    NotFound,
    /// A resource with this identity exists with different content.
    AlreadyExists,
    /// The resource is not in a state that allows the operation.
    FailedPrecondition,
    /// A concurrent change won; the caller may retry.
    Aborted,
    /// The server is over its limits; retry later with backoff.
    ResourceExhausted,
    /// The caller did not prove who it is.
    Unauthenticated,
    /// The caller is known but may not do this.
    PermissionDenied,
    /// A dependency (store, coordination) cannot be reached; retry later.
    Unavailable,
    /// The operation ran out of time.
    DeadlineExceeded,
    /// A bug or an unexpected state of the server.
    Internal,
}

impl ErrorCode {
    /// The HTTP status for this code, as grpc-gateway maps it.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument | ErrorCode::FailedPrecondition => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists | ErrorCode::Aborted => 409,
            ErrorCode::ResourceExhausted => 429,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::Unavailable => 503,
            ErrorCode::DeadlineExceeded => 504,
            ErrorCode::Internal => 500,
        }
    }

    /// The canonical gRPC status code number (see `google.rpc.Code`).
    pub fn grpc_code(self) -> i32 {
        match self {
            ErrorCode::InvalidArgument => 3,
            ErrorCode::DeadlineExceeded => 4,
            ErrorCode::NotFound => 5,
            ErrorCode::AlreadyExists => 6,
            ErrorCode::PermissionDenied => 7,
            ErrorCode::ResourceExhausted => 8,
            ErrorCode::FailedPrecondition => 9,
            ErrorCode::Aborted => 10,
            ErrorCode::Internal => 13,
            ErrorCode::Unavailable => 14,
            ErrorCode::Unauthenticated => 16,
        }
    }

    /// The code for a gRPC status code number, `None` for codes outside this
    /// vocabulary (which front doors report as internal errors, HTTP 500).
    pub fn from_grpc_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.grpc_code() == code)
    }

    /// Every code.
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::FailedPrecondition,
        ErrorCode::Aborted,
        ErrorCode::ResourceExhausted,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::Unavailable,
        ErrorCode::DeadlineExceeded,
        ErrorCode::Internal,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_like_grpc_gateway() {
        let cases = [
            (ErrorCode::InvalidArgument, 400, 3),
            (ErrorCode::NotFound, 404, 5),
            (ErrorCode::AlreadyExists, 409, 6),
            (ErrorCode::FailedPrecondition, 400, 9),
            (ErrorCode::Aborted, 409, 10),
            (ErrorCode::ResourceExhausted, 429, 8),
            (ErrorCode::Unauthenticated, 401, 16),
            (ErrorCode::PermissionDenied, 403, 7),
            (ErrorCode::Unavailable, 503, 14),
            (ErrorCode::DeadlineExceeded, 504, 4),
            (ErrorCode::Internal, 500, 13),
        ];
        for (code, http, grpc) in cases {
            assert_eq!(code.http_status(), http, "{code:?}");
            assert_eq!(code.grpc_code(), grpc, "{code:?}");
            assert_eq!(ErrorCode::from_grpc_code(grpc), Some(code));
        }
        assert_eq!(cases.len(), ErrorCode::ALL.len());
        // OK, CANCELLED, UNKNOWN, OUT_OF_RANGE, UNIMPLEMENTED, DATA_LOSS.
        for other in [0, 1, 2, 11, 12, 15, 99] {
            assert_eq!(ErrorCode::from_grpc_code(other), None, "{other}");
        }
    }
}
