//! Connections to push workers under the egress policy: the address's host
//! is resolved on every (re)connect and only addresses the policy allows
//! are dialled, so a name that later resolves to loopback or a metadata
//! service (DNS rebinding) is refused at connect time too, not only at
//! registration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use taskmesh_core::egress::{EgressError, EgressPolicy};
use tokio::net::TcpStream;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

/// Why a connection to a push worker was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The policy refuses every address the host resolves to.
    #[error("egress policy: {0}")]
    Refused(#[from] EgressError),
    /// Resolution or the TCP connect failed (or took too long).
    #[error("connect: {0}")]
    Io(#[from] std::io::Error),
}

/// A lazily connecting channel to `address` that dials only what `policy`
/// allows, each try bounded by `timeout`.
pub(crate) fn channel(endpoint: Endpoint, policy: Arc<EgressPolicy>, timeout: Duration) -> Channel {
    endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
        let policy = policy.clone();
        async move {
            let stream = tokio::time::timeout(timeout, dial(&policy, &uri))
                .await
                .map_err(|_| {
                    ConnectError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connect timed out",
                    ))
                })??;
            Ok::<_, ConnectError>(TokioIo::new(stream))
        }
    }))
}

/// Resolves `host:port` and keeps what the policy allows.
pub(crate) async fn resolve(
    policy: &EgressPolicy,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, ConnectError> {
    // A bracketed IPv6 literal comes from the URI as "[::1]".
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs = tokio::net::lookup_host((host, port)).await?;
    Ok(policy.filter_resolved(addrs)?)
}

async fn dial(policy: &EgressPolicy, uri: &Uri) -> Result<TcpStream, ConnectError> {
    let host = uri.host().unwrap_or_default();
    let port = uri.port_u16().unwrap_or(80);
    let mut last = None;
    for addr in resolve(policy, host, port).await? {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(err) => last = Some(err),
        }
    }
    Err(ConnectError::Io(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
    })))
}
