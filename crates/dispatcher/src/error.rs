//! The dispatcher's error type and its one mapping to `tonic::Status`, driven
//! by the shared [`ErrorCode`] so gRPC and REST agree.

use taskmesh_core::ErrorCode;

/// What went wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The caller is known but may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// The request is well formed but the thing it names is not in a state
    /// that allows it (retrying a task that succeeded).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A quota or rate of the caller's namespace is used up.
    #[error("{message}")]
    ResourceExhausted {
        /// Which limit, and what to do.
        message: String,
        /// When trying again may work (sent as `retry-after-ms`).
        retry_after: Option<std::time::Duration>,
    },
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] taskmesh_store::Error),
    /// Coordination failed.
    #[error(transparent)]
    Coord(#[from] taskmesh_coord::Error),
    /// The gRPC server could not start or failed while serving.
    #[error("grpc server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not be built from the descriptor set.
    #[error("grpc reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The contract's request rules could not be loaded.
    #[error("request rules: {0}")]
    Rules(String),
}

impl Error {
    /// The transport-independent code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            Error::ResourceExhausted { .. } => ErrorCode::ResourceExhausted,
            Error::Store(e) => e.code(),
            Error::Coord(e) => e.code(),
            Error::Transport(_) | Error::Reflection(_) | Error::Rules(_) => ErrorCode::Internal,
        }
    }
}

/// The gRPC status code for an [`ErrorCode`].
pub fn grpc_code(code: ErrorCode) -> tonic::Code {
    tonic::Code::from_i32(code.grpc_code())
}

/// The metadata key saying how long to wait before retrying, in
/// milliseconds (the REST gateway turns it into `Retry-After`).
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        if let Error::ResourceExhausted {
            message,
            retry_after: Some(wait),
        } = &err
        {
            let mut status = tonic::Status::resource_exhausted(message.clone());
            if let Ok(v) = wait.as_millis().to_string().parse() {
                status.metadata_mut().insert(RETRY_AFTER_MS, v);
            }
            return status;
        }
        let code = err.code();
        let class = match (&err, code) {
            (_, ErrorCode::Internal) => "internal error",
            (Error::Coord(_), ErrorCode::Unavailable) => {
                "coordination unavailable; retry with backoff"
            }
            (_, ErrorCode::Unavailable) => "store unavailable; retry with backoff",
            (Error::Store(taskmesh_store::Error::StorageFull(_)), _) => {
                "the store is out of disk space; nothing was written; retry with backoff"
            }
            // Our own words (what was not found, which key is taken, why
            // the input is refused): the caller needs them.
            _ => return tonic::Status::new(grpc_code(code), err.to_string()),
        };
        opaque(grpc_code(code), class, &err)
    }
}

/// A status saying only `class` and a reference; what the database, Redis
/// or the runtime said (host names, SQL, driver text) goes to the log under
/// that reference, never to the caller.
pub fn opaque(code: tonic::Code, class: &str, detail: &dyn std::fmt::Display) -> tonic::Status {
    let reference = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    if code == tonic::Code::Internal {
        tracing::error!(error = %detail, reference, "{class}");
    } else {
        tracing::warn!(error = %detail, reference, "{class}");
    }
    tonic::Status::new(code, format!("{class} (ref {reference})"))
}
