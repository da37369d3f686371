//! The deliverer against a real SQLite store and a real HTTP receiver on
//! loopback, driven round by round with a fake clock (no sleeps): a refused
//! try is retried after its backoff, a receiver that is not listening is a
//! transport error, the signature verifies, and tries run out into FAILED.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use taskmesh_callbacks::{
    CallbackOptions, DELIVERY_HEADER, Deliverer, SIGNATURE_HEADER, signature,
};
use taskmesh_core::{
    CallbackPolicy, CallbackState, Clock, Event, FakeClock, RetryPolicy, TaskRecord,
};
use taskmesh_store::conformance::{T0, new_task};
use taskmesh_store::{SqliteStore, Store};

/// Receives callbacks; answers each with the next scripted status (then 200).
#[derive(Clone, Default)]
struct Receiver {
    script: Arc<Mutex<Vec<u16>>>,
    seen: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    r.seen.lock().unwrap().push((headers, body));
    let mut script = r.script.lock().unwrap();
    let code = if script.is_empty() {
        200
    } else {
        script.remove(0)
    };
    StatusCode::from_u16(code).unwrap()
}

async fn start_receiver(script: Vec<u16>) -> (SocketAddr, Receiver) {
    let receiver = Receiver {
        script: Arc::new(Mutex::new(script)),
        ..Receiver::default()
    };
    let app = Router::new()
        .route("/cb", post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, receiver)
}

fn options(secret: Option<&str>, max_attempts: u32) -> CallbackOptions {
    CallbackOptions {
        secret: secret.map(str::to_string),
        policy: CallbackPolicy {
            max_attempts,
            backoff: RetryPolicy {
                max_attempts,
                initial_backoff_ms: 1_000,
                multiplier: 2.0,
                max_backoff_ms: 60_000,
            },
        },
        ..CallbackOptions::default()
    }
}

/// A task with `url` as callback that succeeded with output "ok".
async fn ended_task(store: &dyn Store, url: &str) -> TaskRecord {
    let mut task = new_task("echo");
    task.callback_url = url.to_string();
    let id = store.create_task(task, "fp", T0).await.unwrap().task.id;
    let steps = [
        Event::Dispatch {
            execution_id: "exec-1".into(),
            worker_id: "w".into(),
            ack_deadline: T0 + 5_000,
        },
        Event::Succeed {
            execution_id: "exec-1".into(),
            output: b"ok".to_vec(),
            content_type: "text/plain".into(),
        },
    ];
    for event in steps {
        store.transition(&id, &event, T0 + 1).await.unwrap();
    }
    store.get_task(&id).await.unwrap().unwrap()
}

async fn fixture() -> (tempfile::TempDir, Arc<dyn Store>, FakeClock) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in(dir.path()).await.unwrap());
    (dir, store, FakeClock::new(T0 + 1))
}

#[tokio::test]
async fn refused_then_accepted_signed_once_per_try() {
    let (_dir, store, clock) = fixture().await;
    let (addr, receiver) = start_receiver(vec![500, 503]).await;
    let task = ended_task(store.as_ref(), &format!("http://{addr}/cb")).await;
    let deliverer = Deliverer::build(
        options(Some("s3cret"), 5),
        store.clone(),
        Arc::new(clock.clone()),
    )
    .unwrap();

    assert_eq!(deliverer.deliver_due().await.unwrap(), 1);
    let entry = store
        .get_task(&task.id)
        .await
        .unwrap()
        .unwrap()
        .callback
        .unwrap();
    assert_eq!((entry.state, entry.attempts), (CallbackState::Pending, 1));
    assert_eq!(entry.last_error, "HTTP 500");
    let retry_at = entry.next_attempt_at.unwrap();
    assert!(
        (clock.now_millis() + 500..=clock.now_millis() + 1_000).contains(&retry_at),
        "first retry within the equal-jitter window: {retry_at}"
    );
    assert_eq!(
        deliverer.deliver_due().await.unwrap(),
        0,
        "not due before its backoff"
    );

    clock.set(retry_at);
    assert_eq!(deliverer.deliver_due().await.unwrap(), 1);
    let entry = store
        .get_task(&task.id)
        .await
        .unwrap()
        .unwrap()
        .callback
        .unwrap();
    assert_eq!((entry.attempts, entry.last_error.as_str()), (2, "HTTP 503"));
    clock.set(entry.next_attempt_at.unwrap());
    assert_eq!(deliverer.deliver_due().await.unwrap(), 1);
    let entry = store
        .get_task(&task.id)
        .await
        .unwrap()
        .unwrap()
        .callback
        .unwrap();
    assert_eq!((entry.state, entry.attempts), (CallbackState::Delivered, 3));
    assert_eq!(entry.delivered_at, Some(clock.now_millis()));
    clock.advance(10_000_000);
    assert_eq!(
        deliverer.deliver_due().await.unwrap(),
        0,
        "delivered is final"
    );

    let seen = receiver.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for (headers, body) in &seen {
        assert_eq!(body, &seen[0].1, "every try sends the same bytes");
        assert_eq!(headers[DELIVERY_HEADER], entry.delivery_id.as_str());
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(
            headers[SIGNATURE_HEADER].to_str().unwrap(),
            signature(b"s3cret", body)
        );
    }
    let json: serde_json::Value = serde_json::from_slice(&seen[0].1).unwrap();
    assert_eq!(json["deliveryId"], entry.delivery_id.as_str());
    assert_eq!(json["taskId"], task.id.as_str());
    assert_eq!(json["executionId"], "exec-1");
    assert_eq!(json["state"], "TASK_STATE_SUCCEEDED");
    assert_eq!(json["output"]["data"], "b2s=");
    assert_eq!(json["attempts"], 1);
}

#[tokio::test]
async fn an_absent_receiver_is_retried_then_given_up_unsigned() {
    let (_dir, store, clock) = fixture().await;
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let task = ended_task(store.as_ref(), &format!("http://127.0.0.1:{port}/cb")).await;
    let deliverer =
        Deliverer::build(options(None, 2), store.clone(), Arc::new(clock.clone())).unwrap();

    assert_eq!(deliverer.deliver_due().await.unwrap(), 1);
    let entry = store
        .get_task(&task.id)
        .await
        .unwrap()
        .unwrap()
        .callback
        .unwrap();
    assert_eq!((entry.state, entry.attempts), (CallbackState::Pending, 1));
    assert!(
        entry.last_error.contains("onnect"),
        "a transport error names the cause: {}",
        entry.last_error
    );

    // Now the receiver is up on that port, but it refuses: the last try.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let receiver = Receiver {
        script: Arc::new(Mutex::new(vec![500])),
        ..Receiver::default()
    };
    let app = Router::new()
        .route("/cb", post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    clock.set(entry.next_attempt_at.unwrap());
    assert_eq!(deliverer.deliver_due().await.unwrap(), 1);
    let entry = store
        .get_task(&task.id)
        .await
        .unwrap()
        .unwrap()
        .callback
        .unwrap();
    assert_eq!(
        (entry.state, entry.attempts, entry.last_error.as_str()),
        (CallbackState::Failed, 2, "HTTP 500")
    );
    assert_eq!(entry.next_attempt_at, None);
    let seen = receiver.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].0.get(SIGNATURE_HEADER).is_none(),
        "no secret, no signature"
    );
}
