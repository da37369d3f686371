//! The load-shedding layer (`layers::ShedLayer`) around a tower service the
//! test holds on a `Notify`: past the limit a call is answered at once with
//! RESOURCE_EXHAUSTED and the layer's message, without reaching the
//! service; a call that ends (succeeds, fails or is dropped) frees its slot;
//! readiness is the inner service's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use taskmesh_dispatcher::layers::ShedLayer;
use tokio::sync::Notify;
use tower::{Layer, Service};

const MESSAGE: &str = "server is at its limit of 1 requests in flight; retry with backoff";

/// A service whose calls wait until the test releases them, then succeed
/// (or fail, when `fail` is set); its readiness is scripted.
#[derive(Clone)]
struct Gate {
    release: Arc<Notify>,
    calls: Arc<AtomicUsize>,
    fail: bool,
    ready: Arc<Mutex<Poll<Result<(), String>>>>,
}

impl Gate {
    fn new(fail: bool) -> Self {
        Self {
            release: Arc::new(Notify::new()),
            calls: Arc::new(AtomicUsize::new(0)),
            fail,
            ready: Arc::new(Mutex::new(Poll::Ready(Ok(())))),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<http::Request<()>> for Gate {
    type Response = http::Response<String>;
    type Error = String;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), String>> {
        self.ready.lock().unwrap().clone()
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (release, fail) = (self.release.clone(), self.fail);
        Box::pin(async move {
            release.notified().await;
            if fail {
                Err("the inner service failed".to_string())
            } else {
                Ok(http::Response::new("served".to_string()))
            }
        })
    }
}

fn request() -> http::Request<()> {
    http::Request::new(())
}

/// Asserts `response` is the layer's refusal: gRPC status 8 with its message.
fn assert_shed(response: &http::Response<String>) {
    assert_eq!(
        response.status(),
        http::StatusCode::OK,
        "gRPC answers in-band"
    );
    let status = tonic::Status::from_header_map(response.headers()).expect("a grpc-status header");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), MESSAGE);
}

/// Waits (bounded) for a call that must complete.
async fn finish<F: std::future::Future>(call: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the call completes")
}

#[tokio::test]
async fn a_call_past_the_limit_is_refused_at_once_and_the_slot_comes_back() {
    let gate = Gate::new(false);
    let mut shed = ShedLayer::new(1).layer(gate.clone());

    let mut first = shed.call(request());
    assert!(
        futures::poll!(&mut first).is_pending(),
        "the first call waits"
    );
    assert_eq!(gate.calls(), 1);
    // The second answers at once, without waiting for the first and
    // without reaching the service.
    let second = shed
        .call(request())
        .now_or_never()
        .expect("a refusal needs no waiting")
        .expect("a refusal is a response, not an error");
    assert_shed(&second);
    assert_eq!(
        gate.calls(),
        1,
        "the refused call never reached the service"
    );

    gate.release.notify_one();
    let served = finish(first).await.expect("the first call is served");
    assert_eq!(served.body(), "served");

    // Its slot is free again: the next call reaches the service.
    let mut third = shed.call(request());
    assert!(futures::poll!(&mut third).is_pending());
    assert_eq!(gate.calls(), 2);
    gate.release.notify_one();
    assert_eq!(finish(third).await.unwrap().body(), "served");
}

#[tokio::test]
async fn a_failed_call_frees_its_slot() {
    let gate = Gate::new(true);
    let mut shed = ShedLayer::new(1).layer(gate.clone());
    let mut first = shed.call(request());
    assert!(futures::poll!(&mut first).is_pending());
    assert_shed(&shed.call(request()).now_or_never().unwrap().unwrap());
    gate.release.notify_one();
    assert_eq!(
        finish(first).await.unwrap_err(),
        "the inner service failed",
        "the inner error passes through unchanged"
    );
    let mut next = shed.call(request());
    assert!(futures::poll!(&mut next).is_pending());
    assert_eq!(gate.calls(), 2, "the slot was freed by the failure");
    gate.release.notify_one();
    assert!(finish(next).await.is_err());
}

#[tokio::test]
async fn a_dropped_call_frees_its_slot() {
    let gate = Gate::new(false);
    let mut shed = ShedLayer::new(1).layer(gate.clone());
    let mut first = shed.call(request());
    assert!(futures::poll!(&mut first).is_pending());
    assert_shed(&shed.call(request()).now_or_never().unwrap().unwrap());
    // A caller that gives up (a cancelled RPC) drops the call.
    drop(first);
    let mut next = shed.call(request());
    assert!(futures::poll!(&mut next).is_pending());
    assert_eq!(gate.calls(), 2, "the slot was freed by the drop");
    gate.release.notify_one();
    assert_eq!(finish(next).await.unwrap().body(), "served");
}

#[tokio::test]
async fn readiness_is_the_inner_services() {
    let gate = Gate::new(false);
    let mut shed = ShedLayer::new(1).layer(gate.clone());
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());

    *gate.ready.lock().unwrap() = Poll::Pending;
    assert!(shed.poll_ready(&mut cx).is_pending());
    *gate.ready.lock().unwrap() = Poll::Ready(Err("not ready".into()));
    assert_eq!(
        shed.poll_ready(&mut cx),
        Poll::Ready(Err("not ready".into()))
    );
    *gate.ready.lock().unwrap() = Poll::Ready(Ok(()));
    assert_eq!(shed.poll_ready(&mut cx), Poll::Ready(Ok(())));
    // Readiness does not take a slot: with the limit reached the service
    // is still ready, and the call is what is refused.
    let held = shed.call(request());
    assert_eq!(shed.poll_ready(&mut cx), Poll::Ready(Ok(())));
    assert_shed(&shed.call(request()).now_or_never().unwrap().unwrap());
    gate.release.notify_one();
    finish(held).await.unwrap();
}
