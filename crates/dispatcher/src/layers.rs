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
            let status = tonic::Status::resource_exhausted(format!(
                "server is at its limit of {} requests in flight; retry with backoff",
                self.limit
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        // Take the service that was driven to readiness, leave a clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(req).await;
            drop(permit);
            response
        })
    }
}
