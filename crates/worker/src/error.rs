//! The error type of the worker SDK.

/// Why a worker could not start or a session failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The [`WorkerOptions`](crate::WorkerOptions) or handler set is unusable.
    #[error("invalid worker options: {0}")]
    InvalidOptions(String),
    /// The dispatcher could not be reached or the address is malformed.
    #[error("transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The `Connect` call or its stream failed.
    #[error("rpc failed: {0}")]
    Status(Box<tonic::Status>),
    /// The server broke the protocol (e.g. its first message was not `registered`).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The outbound half of the stream closed while the worker was writing.
    #[error("stream closed")]
    StreamClosed,
    /// Push mode: the `Worker` service could not listen on its address.
    #[error("cannot listen on the push address {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Error::Status(Box::new(status))
    }
}
