//! Callbacks end to end: a node with an in-process worker posts each ended
//! task to a receiver (a small axum server in the test) from the durable
//! outbox. The receiver gets exactly one accepted delivery per terminal
//! task, also when it answered 500 or was not listening for the first tries,
//! and verifies the Standard Webhooks signature and timestamp itself; the delivery state is
//! visible on the task over REST.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use taskmesh_core::{CallbackPolicy, RetryPolicy};
use taskmesh_testkit::callbacks::CallbackReceiver;
use taskmesh_testkit::http::{Rest, state_of};
use taskmesh_testkit::*;

/// The receiver's secret (Standard Webhooks form); the node signs with it
/// and with an older key, as during a rotation.
const SECRET: &str = "whsec_dGhlIG5ldyBjYWxsYmFjayBrZXkgb2YgdGhlIHRlc3Rz";
const OLD_SECRET: &str = "the-old-plain-key";
const LIMIT: Duration = Duration::from_secs(30);
const DELIVERED: &str = "CALLBACK_STATE_DELIVERED";

async fn node_with_callbacks(dir: &std::path::Path) -> taskmesh_cli::node::RunningNode {
    let mut opts = node_options(dir);
    opts.with_worker = Some(4);
    opts.callbacks.secrets = vec![OLD_SECRET.into(), SECRET.into()];
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

#[tokio::test]
async fn one_signed_delivery_per_ended_task_even_through_failures() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_with_callbacks(dir.path()).await;
    let rest = Rest::new(node.http_addr);
    let receiver = CallbackReceiver::start(Some(SECRET)).await;
    let url = receiver.url();

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
        let task = rest.wait_callback(id, DELIVERED, LIMIT).await;
        assert_eq!(state_of(&task), state);
        assert_eq!(task["callback"]["attempts"], 1);
        assert!(task["callback"]["deliveredTime"].is_string());
        let accepted = receiver.accepted(id);
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
    let plain = rest.wait_state(&plain, "TASK_STATE_SUCCEEDED", LIMIT).await;
    assert!(plain.get("callback").is_none(), "{plain}");
    assert_eq!(receiver.tries(), 3, "no retries after acceptance");

    // The receiver fails its next two answers: retried, accepted once.
    receiver.script(&[500, 500]);
    let flaky = submit(&rest, json!({"handler": "echo", "callbackUrl": url})).await;
    let task = rest.wait_callback(&flaky, DELIVERED, LIMIT).await;
    assert_eq!(task["callback"]["attempts"], 3);
    assert_eq!(receiver.accepted(&flaky).len(), 1);
    assert_eq!(receiver.tries(), 6);
    assert!(
        receiver.mismatches().is_empty(),
        "{:?}",
        receiver.mismatches()
    );
    stop_node(node).await;
    receiver.stop().await;
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

    let receiver = CallbackReceiver::start_on(
        tokio::net::TcpListener::bind(addr).await.unwrap(),
        Some(SECRET),
    );
    let task = rest.wait_callback(&id, DELIVERED, LIMIT).await;
    assert!(task["callback"]["attempts"].as_u64().unwrap() >= 3);
    assert!(task["callback"].get("nextAttemptTime").is_none());
    let accepted = receiver.accepted(&id);
    assert_eq!(accepted.len(), 1);
    assert_eq!(receiver.tries(), 1, "only the try after it came up");
    assert!(
        receiver.mismatches().is_empty(),
        "{:?}",
        receiver.mismatches()
    );
    stop_node(node).await;
    receiver.stop().await;
}
