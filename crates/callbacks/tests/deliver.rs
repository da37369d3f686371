//! The deliverer against a real SQLite store and a real HTTP receiver on
//! loopback, driven round by round with a fake clock (no sleeps): a refused
//! try is retried after its backoff, a receiver that is not listening is a
//! transport error, the signature verifies, and tries run out into FAILED.

use std::sync::Arc;

use taskmesh_callbacks::{
    CallbackOptions, DELIVERY_HEADER, Deliverer, SIGNATURE_HEADER, TIMESTAMP_HEADER, signature,
};
use taskmesh_core::{
    CallbackPolicy, CallbackState, Clock, Event, FakeClock, RetryPolicy, TaskRecord,
};
use taskmesh_store::conformance::{T0, new_task};
use taskmesh_store::{SqliteStore, Store};
use taskmesh_testkit::callbacks::CallbackReceiver;

/// A receiver answering `script` first (then 200); it checks no signature
/// (the tests check it themselves).
async fn start_receiver(script: &[u16]) -> CallbackReceiver {
    let receiver = CallbackReceiver::start(None).await;
    receiver.script(script);
    receiver
}

fn options(secret: Option<&str>, max_attempts: u32) -> CallbackOptions {
    CallbackOptions {
        secrets: secret.map(str::to_string).into_iter().collect(),
        egress: taskmesh_core::egress::EgressPolicy::allowing_loopback(),
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
    let receiver = start_receiver(&[500, 503]).await;
    let task = ended_task(store.as_ref(), &receiver.url()).await;
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

    let seen = receiver.received();
    assert_eq!(seen.len(), 3);
    for r in &seen {
        let (headers, body) = (&r.headers, &r.body);
        assert_eq!(body, &seen[0].body, "every try sends the same bytes");
        assert_eq!(headers[DELIVERY_HEADER], entry.delivery_id.as_str());
        assert_eq!(headers["content-type"], "application/json");
        // The try's own time (the fake clock's, in seconds), signed with
        // id and body.
        let timestamp = headers[TIMESTAMP_HEADER].to_str().unwrap();
        let seconds: i64 = timestamp.parse().unwrap();
        assert!(
            (T0 / 1_000..=clock.now_millis() / 1_000).contains(&seconds),
            "timestamp {seconds} is the clock's"
        );
        assert_eq!(
            headers[SIGNATURE_HEADER].to_str().unwrap(),
            signature(
                b"s3cret",
                &entry.delivery_id,
                timestamp.parse().unwrap(),
                body
            )
        );
    }
    let json = seen[0].json();
    assert_eq!(json["deliveryId"], entry.delivery_id.as_str());
    assert_eq!(json["taskId"], task.id.as_str());
    assert_eq!(json["executionId"], "exec-1");
    assert_eq!(json["state"], "TASK_STATE_SUCCEEDED");
    assert_eq!(json["output"]["data"], "b2s=");
    assert_eq!(json["attempts"], 1);
    receiver.stop().await;
}

#[tokio::test]
async fn an_absent_receiver_is_retried_then_given_up_unsigned() {
    let (_dir, store, clock) = fixture().await;
    // A port nothing listens on: bound, then released.
    let port = taskmesh_testkit::free_port();
    let url = format!(
        "http://127.0.0.1:{port}{}",
        taskmesh_testkit::callbacks::PATH
    );
    let task = ended_task(store.as_ref(), &url).await;
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
    assert_eq!(
        entry.last_error, "connect failed",
        "a transport error is stored as its class (the detail is logged)"
    );

    // Now the receiver is up on that port, but it refuses: the last try.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let receiver = CallbackReceiver::start_on(listener, None);
    receiver.script(&[500]);
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
    let seen = receiver.received();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].headers.get(SIGNATURE_HEADER).is_none(),
        "no secret, no signature"
    );
    receiver.stop().await;
}
