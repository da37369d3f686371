//! Tower middleware of the gRPC server.
//!
//! [`ShedLayer`] is the concurrency limit with load shedding: tower's own
//! `ConcurrencyLimit` queues callers and `LoadShed` turns its refusal into an
//! opaque error that tonic reports as UNKNOWN. We want neither: a request
//! over the limit is answered at once with RESOURCE_EXHAUSTED and a message
//! that says what to do, and nothing is dropped silently.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// Takes the inner service that `poll_ready` drove to readiness and leaves
/// a clone in its place (tower's rule for services called from a future:
/// the clone has not been polled ready, the taken one has).
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// Limits requests in flight; the rest are refused with RESOURCE_EXHAUSTED.
#[derive(Debug, Clone)]
pub struct ShedLayer {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl ShedLayer {
    /// At most `limit` requests in flight at once. A streaming RPC holds a
    /// permit only until its response starts, so long-lived streams do not
    /// starve unary calls.
    pub fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Shed {
            inner,
            permits: self.permits.clone(),
            limit: self.limit,
        }
    }
}

/// The service made by [`ShedLayer`].
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Shed<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let mut status = tonic::Status::resource_exhausted(format!(
                "server is at its limit of {} requests in flight; retry with backoff",
                self.limit
            ));
            // A slot frees as soon as any request ends: a short hint,
            // jittered so refused clients do not come back together.
            let wait_ms = 50 + rand::random::<u64>() % 100;
            status
                .metadata_mut()
                .insert(crate::error::RETRY_AFTER_MS, wait_ms.into());
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let mut inner = take_ready(&mut self.inner);
        Box::pin(async move {
            let response = inner.call(req).await;
            drop(permit);
            response
        })
    }
}

/// Reads a request's whole body before passing it on, within `timeout` and
/// `limit` bytes, for every method whose client sends a bounded request
/// (unary and server-streaming: all but the bidirectional ones). Outside
/// the shedder: a request holds a concurrency slot only once it has
/// arrived, so clients that send headers and never a body hold nothing
/// but their own HTTP/2 streams (bounded per connection), and each such
/// stream is answered DEADLINE_EXCEEDED after `timeout`.
#[derive(Debug, Clone)]
pub struct WholeBodyLayer {
    timeout: std::time::Duration,
    limit: usize,
}

impl WholeBodyLayer {
    /// Bodies must arrive within `timeout` and hold at most `limit` bytes.
    pub fn new(timeout: std::time::Duration, limit: usize) -> Self {
        Self { timeout, limit }
    }
}

impl<S> Layer<S> for WholeBodyLayer {
    type Service = WholeBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WholeBody {
            inner,
            timeout: self.timeout,
            limit: self.limit,
        }
    }
}

/// The whole body [`WholeBodyLayer`] read, in the request's extensions (a
/// reference-counted handle on the same bytes as the body).
#[derive(Debug, Clone)]
pub struct WholeBytes(pub bytes::Bytes);

/// The service made by [`WholeBodyLayer`].
#[derive(Debug, Clone)]
pub struct WholeBody<S> {
    inner: S,
    timeout: std::time::Duration,
    limit: usize,
}

/// Methods whose clients stream requests: their bodies are never whole.
fn streams_requests(path: &str) -> bool {
    path == "/taskmesh.v1.Dispatcher/Connect"
        || path.ends_with("ServerReflection/ServerReflectionInfo")
}

impl<S, ResBody> Service<http::Request<tonic::body::Body>> for WholeBody<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        if streams_requests(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        let (timeout, limit) = (self.timeout, self.limit);
        Box::pin(async move {
            use http_body_util::BodyExt;
            let (parts, body) = req.into_parts();
            let read = http_body_util::Limited::new(body, limit).collect();
            let bytes = match tokio::time::timeout(timeout, read).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(err)) => {
                    let status = if err.is::<http_body_util::LengthLimitError>() {
                        tonic::Status::resource_exhausted(format!(
                            "the request is over the limit of {limit} bytes"
                        ))
                    } else {
                        tonic::Status::cancelled("the request's body ended in an error")
                    };
                    return Ok(status.into_http());
                }
                Err(_) => {
                    return Ok(tonic::Status::deadline_exceeded(format!(
                        "the request's body did not arrive within {timeout:?}"
                    ))
                    .into_http());
                }
            };
            let mut parts = parts;
            // Layers further in read the bytes from here, not the body again.
            parts.extensions.insert(WholeBytes(bytes.clone()));
            let body = tonic::body::Body::new(http_body_util::Full::new(bytes));
            inner.call(http::Request::from_parts(parts, body)).await
        })
    }
}
