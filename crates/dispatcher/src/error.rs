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
}

impl Error {
    /// The transport-independent code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::Store(e) => e.code(),
            Error::Coord(e) => e.code(),
            Error::Transport(_) | Error::Reflection(_) => ErrorCode::Internal,
        }
    }
}

/// The gRPC status code for an [`ErrorCode`].
pub fn grpc_code(code: ErrorCode) -> tonic::Code {
    tonic::Code::from_i32(code.grpc_code())
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        let code = err.code();
        if code == ErrorCode::Internal {
            tracing::error!(error = %err, "internal error");
        }
        tonic::Status::new(grpc_code(code), err.to_string())
    }
}
