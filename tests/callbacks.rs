//! Callbacks end to end: a node with an in-process worker posts each ended
//! task to a receiver (a small axum server in the test) from the durable
//! outbox. The receiver gets exactly one accepted delivery per terminal
//! task, also when it answered 500 or was not listening for the first tries,
//! and verifies the HMAC-SHA256 signature itself; the delivery state is
//! visible on the task over REST.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::http::{Rest, state_of};
use common::*;
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::Sha256;
use taskmesh_core::{CallbackPolicy, RetryPolicy};

const SECRET: &str = "test-secret";
const LIMIT: Duration = Duration::from_secs(30);

/// Accepted deliveries per task id: (delivery id, body JSON).
type Accepted = Arc<Mutex<HashMap<String, Vec<(String, Value)>>>>;

/// The receiver: answers 500 while `refuse` is above zero (counting down),
/// else 200, recording what it accepted.
#[derive(Clone, Default)]
struct Receiver {
    refuse: Arc<Mutex<u32>>,
    tries: Arc<Mutex<u32>>,
    accepted: Accepted,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    *r.tries.lock().unwrap() += 1;
    // Verify as a receiver would: HMAC-SHA256 of the raw body under the secret.
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(&body);
    let want = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let given = headers
        .get("taskmesh-signature")
        .and_then(|v| v.to_str().ok());
    if given != Some(want.as_str()) {
        return StatusCode::UNAUTHORIZED;
    }
    {
        let mut refuse = r.refuse.lock().unwrap();
        if *refuse > 0 {
            *refuse -= 1;
            return StatusCode::INTERNAL_SERVER_ERROR;
        }
    }
    let json: Value = serde_json::from_slice(&body).unwrap();
    let delivery = headers["taskmesh-delivery-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(json["deliveryId"], delivery.as_str());
    let task = json["taskId"].as_str().unwrap().to_string();
    r.accepted
        .lock()
        .unwrap()
        .entry(task)
        .or_default()
        .push((delivery, json));
    StatusCode::OK
}

async fn serve_receiver(listener: tokio::net::TcpListener, receiver: Receiver) {
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(receiver);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
}

async fn node_with_callbacks(dir: &std::path::Path) -> taskmesh_cli::node::RunningNode {
    let mut opts = node_options(dir);
    opts.with_worker = Some(4);
    opts.callbacks.secret = Some(SECRET.into());
    opts.callbacks.policy = CallbackPolicy {
        max_attempts: 20,
        backoff: RetryPolicy {
            max_attempts: 20,
            initial_backoff_ms: 50,
            multiplier: 2.0,
            max_backoff_ms: 400,
        },
    };
    start_node(opts).await
}

async fn submit(rest: &Rest, body: Value) -> String {
    let reply = rest.call(Method::POST, "/api/tasks", Some(body)).await;
    assert_eq!(reply.status.as_u16(), 202, "{:?}", reply.json);
    reply.json["taskId"].as_str().unwrap().to_string()
}

/// Waits until the task's callback is DELIVERED; returns the task.
async fn delivered(rest: &Rest, id: &str) -> Value {
    wait_for(&format!("the callback of {id}"), LIMIT, || async {
        let task = rest.task(id).await;
        (task["callback"]["state"] == "CALLBACK_STATE_DELIVERED").then_some(task)
    })
    .await
}

#[tokio::test]
async fn one_signed_delivery_per_ended_task_even_through_failures() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_with_callbacks(dir.path()).await;
    let rest = Rest::new(node.http_addr);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let receiver = Receiver::default();
    serve_receiver(listener, receiver.clone()).await;

    // Three ways to end: success, failure with no retries left, cancel.
    let ok = submit(
        &rest,
        json!({"handler": "echo", "callbackUrl": url, "payload": {"data": "aGk="}}),
    )
    .await;
    let failed = submit(
        &rest,
        json!({"handler": "fail", "callbackUrl": url, "payload": {"data": "eyJ0aW1lcyI6NX0="},
               "retryPolicy": {"maxAttempts": 1}}),
    )
    .await;
    let cancelled = submit(
        &rest,
        json!({"handler": "echo", "callbackUrl": url, "delay": "3600s"}),
    )
    .await;
    let reply = rest
        .call(
            Method::POST,
            &format!("/api/tasks/{cancelled}/cancel"),
            Some(json!({})),
        )
        .await;
    assert_eq!(state_of(&reply.json["task"]), "TASK_STATE_CANCELLED");
    // A task without a callback URL has no delivery.
    let plain = submit(&rest, json!({"handler": "echo"})).await;

    for (id, state) in [
        (&ok, "TASK_STATE_SUCCEEDED"),
        (&failed, "TASK_STATE_FAILED"),
        (&cancelled, "TASK_STATE_CANCELLED"),
    ] {
        let task = delivered(&rest, id).await;
        assert_eq!(state_of(&task), state);
        assert_eq!(task["callback"]["attempts"], 1);
        assert!(task["callback"]["deliveredTime"].is_string());
        let accepted = receiver.accepted.lock().unwrap()[id.as_str()].clone();
        assert_eq!(accepted.len(), 1, "one accepted delivery for {id}");
        let body = &accepted[0].1;
        assert_eq!(body["state"], state);
        assert_eq!(body["handler"], task["handler"]);
        match state {
            "TASK_STATE_SUCCEEDED" => {
                assert_eq!(body["output"]["data"], "aGk=");
                assert_eq!(body["executionId"], task["attempts"][0]["executionId"]);
            }
            "TASK_STATE_FAILED" => assert!(body["errorMessage"].is_string()),
            _ => assert!(body.get("executionId").is_none(), "never ran: {body}"),
        }
    }
    let plain = wait_for("the plain task to end", LIMIT, || async {
        let t = rest.task(&plain).await;
        (state_of(&t) == "TASK_STATE_SUCCEEDED").then_some(t)
    })
    .await;
    assert!(plain.get("callback").is_none(), "{plain}");
    assert_eq!(
        *receiver.tries.lock().unwrap(),
        3,
        "no retries after acceptance"
    );

    // The receiver fails its next two answers: retried, accepted once.
    *receiver.refuse.lock().unwrap() = 2;
    let flaky = submit(&rest, json!({"handler": "echo", "callbackUrl": url})).await;
    let task = delivered(&rest, &flaky).await;
    assert_eq!(task["callback"]["attempts"], 3);
    assert_eq!(receiver.accepted.lock().unwrap()[flaky.as_str()].len(), 1);
    assert_eq!(*receiver.tries.lock().unwrap(), 6);
    node.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_receiver_that_is_down_at_first_still_gets_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_with_callbacks(dir.path()).await;
    let rest = Rest::new(node.http_addr);
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let url = format!("http://{addr}/hook");

    let id = submit(&rest, json!({"handler": "echo", "callbackUrl": url})).await;
    // Nothing listens: wait until two tries have failed, visible on the task.
    let task = wait_for("two failed tries", LIMIT, || async {
        let t = rest.task(&id).await;
        (t["callback"]["attempts"].as_u64() >= Some(2)).then_some(t)
    })
    .await;
    assert_eq!(task["callback"]["state"], "CALLBACK_STATE_PENDING");
    assert!(
        task["callback"]["lastError"]
            .as_str()
            .unwrap()
            .contains("onnect"),
        "{task}"
    );
    assert!(task["callback"]["nextAttemptTime"].is_string());

    let receiver = Receiver::default();
    serve_receiver(
        tokio::net::TcpListener::bind(addr).await.unwrap(),
        receiver.clone(),
    )
    .await;
    let task = delivered(&rest, &id).await;
    assert!(task["callback"]["attempts"].as_u64().unwrap() >= 3);
    assert!(task["callback"].get("nextAttemptTime").is_none());
    let accepted = receiver.accepted.lock().unwrap()[id.as_str()].clone();
    assert_eq!(accepted.len(), 1);
    assert_eq!(
        *receiver.tries.lock().unwrap(),
        1,
        "only the try after it came up"
    );
    node.stop(Duration::from_secs(5)).await;
}
