//! The REST gateway through the front door: a real node on ephemeral ports,
//! a real HTTP client, workers in process. Submit answers 202 with a
//! Location and the task runs to SUCCEEDED; an idempotent repeat answers 200;
//! cancel, ack, list, batch and workers work over JSON; the SSE watch sees
//! every state change; trace context is forwarded.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use taskmesh_testkit::http::{Events, Rest, assert_error, state_of};
use taskmesh_testkit::*;

const LIMIT: Duration = Duration::from_secs(20);

fn echo(payload: &str) -> Value {
    json!({
        "handler": "echo",
        "payload": {"data": b64(payload), "contentType": "application/json"},
    })
}

fn b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[tokio::test]
async fn submit_is_accepted_then_polling_sees_it_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let ledger = Ledger::default();
    let worker = counting_worker(&[node.grpc_addr], "w-rest", 4, ledger.clone());

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let reply = rest
        .raw(
            Method::POST,
            "/api/tasks",
            &[
                ("content-type", "application/json"),
                ("traceparent", traceparent),
            ],
            Some(echo(r#"{"hi":1}"#).to_string().into_bytes()),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{:?}", reply.json);
    let id = reply.json["taskId"].as_str().expect("taskId").to_string();
    assert_eq!(
        reply.headers["location"],
        format!("/api/tasks/{id}").as_str()
    );
    assert_eq!(reply.json["task"]["taskId"], id.as_str());
    // int64 as a string: 1 as created, 2 when the worker's free slot took
    // the task at submit (dispatch at submit writes it DISPATCHING).
    let version = reply.json["task"]["version"].as_str();
    assert!(
        matches!(version, Some("1" | "2")),
        "int64 as a string: {:?}",
        reply.json["task"]["version"]
    );
    assert!(reply.json.get("existing").is_none(), "false is left out");

    let done = rest.wait_state(&id, "TASK_STATE_SUCCEEDED", LIMIT).await;
    assert_eq!(done["output"]["data"], b64(r#"{"hi":1}"#));
    assert_eq!(done["traceparent"], traceparent, "traceparent forwarded");
    assert_eq!(done["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(ledger.count(&id), 1);
    let location = reply.headers["location"].to_str().unwrap();
    assert_eq!(
        rest.call(Method::GET, location, None).await.json["task"],
        done
    );

    // Idempotent repeat: 200, the same task, no Location.
    let mut keyed = echo("{}");
    keyed["clientRequestId"] = "order-7".into();
    let first = rest
        .call(Method::POST, "/api/tasks", Some(keyed.clone()))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    let again = rest.call(Method::POST, "/api/tasks", Some(keyed)).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.json);
    assert_eq!(again.json["existing"], true);
    assert_eq!(again.json["taskId"], first.json["taskId"]);
    assert!(again.headers.get("location").is_none());

    // Listing by query parameters, workers, and a batch.
    rest.wait_state(
        first.json["taskId"].as_str().unwrap(),
        "TASK_STATE_SUCCEEDED",
        LIMIT,
    )
    .await;
    let list = rest
        .call(
            Method::GET,
            "/api/tasks?state=TASK_STATE_SUCCEEDED&handler=echo&pageSize=1",
            None,
        )
        .await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.json["tasks"].as_array().unwrap().len(), 1);
    assert!(list.json["nextPageToken"].is_string());
    let workers = rest
        .call(Method::GET, "/api/workers?handler=echo", None)
        .await;
    assert_eq!(workers.json["workers"][0]["workerId"], "w-rest");
    let batch = rest
        .call(
            Method::POST,
            "/api/tasks:batch",
            Some(json!({"tasks": [echo("1"), {"handler": "no spaces allowed"}]})),
        )
        .await;
    // An entry breaking a contract rule refuses the batch, naming it.
    assert_eq!(batch.status, StatusCode::BAD_REQUEST, "{:?}", batch.json);
    assert!(
        batch.json["message"]
            .as_str()
            .unwrap()
            .starts_with("tasks[1].handler: "),
        "{:?}",
        batch.json
    );
    // An entry the server's policy refuses is refused alone.
    let batch = rest
        .call(
            Method::POST,
            "/api/tasks:batch",
            Some(json!({"tasks": [echo("1"), {"handler": "echo", "callbackUrl": "http://10.0.0.5/hook"}]})),
        )
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{:?}", batch.json);
    let results = batch.json["results"].as_array().unwrap();
    assert!(results[0]["accepted"]["taskId"].is_string());
    assert_eq!(results[1]["errorCode"], 7);
    assert!(
        results[1]["errorMessage"]
            .as_str()
            .unwrap()
            .contains("does not connect to")
    );

    worker.stop().await;
    stop_node(node).await;
}

#[tokio::test]
async fn cancel_and_ack_over_rest() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);

    let mut later = echo("{}");
    later["delay"] = "3600s".into();
    let id = rest
        .call(Method::POST, "/api/tasks", Some(later))
        .await
        .json["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(state_of(&rest.task(&id).await), "TASK_STATE_PENDING");
    let cancel = format!("/api/tasks/{id}/cancel");
    let reply = rest
        .call(Method::POST, &cancel, Some(json!({"reason": "not needed"})))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert_eq!(state_of(&reply.json["task"]), "TASK_STATE_CANCELLED");
    assert_eq!(reply.json["task"]["errorMessage"], "not needed");
    // Cancelling an ended task reports it unchanged; an empty body is fine.
    let again = rest.raw(Method::POST, &cancel, &[], None).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json["task"]["version"], reply.json["task"]["version"]);

    // Out-of-band ACK of an assignment a raw worker received.
    let mut raw = RawWorker::connect(node.grpc_addr, "w-ack", &["acked"], 1).await;
    let id = rest
        .call(
            Method::POST,
            "/api/tasks",
            Some(json!({"handler": "acked"})),
        )
        .await
        .json["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    let assignment = raw.next_assign(LIMIT).await.expect("an assignment");
    assert_eq!(assignment.task_id, id);
    let ack = format!("/api/tasks/{id}/ack");
    // The execution id alone (GetTask shows it) acknowledges nothing.
    let forged = rest
        .call(
            Method::POST,
            &ack,
            Some(json!({"executionId": assignment.execution_id})),
        )
        .await;
    assert_error(&forged, 403, 7, "report_secret");
    let with_secret = json!({
        "executionId": assignment.execution_id,
        "reportSecret": assignment.report_secret,
    });
    let reply = rest
        .call(Method::POST, &ack, Some(with_secret.clone()))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert_eq!(state_of(&reply.json["task"]), "TASK_STATE_RUNNING");
    let twice = rest.call(Method::POST, &ack, Some(with_secret)).await;
    assert_error(&twice, 400, 9, "RUNNING");
    raw.succeed(&assignment).await;
    rest.wait_state(&id, "TASK_STATE_SUCCEEDED", LIMIT).await;
    raw.close().await;
    stop_node(node).await;
}

#[tokio::test]
async fn sse_watch_sees_every_state_change() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let id = rest
        .call(
            Method::POST,
            "/api/tasks",
            Some(json!({"handler": "watched"})),
        )
        .await
        .json["taskId"]
        .as_str()
        .unwrap()
        .to_string();

    let (status, headers, mut events) =
        Events::open(&rest, &format!("/api/tasks/{id}/watch")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream");
    let mut next_state = async || {
        let (name, data) = events.next(LIMIT).await.expect("an event");
        assert_eq!(name, "message");
        assert_eq!(data["task"]["taskId"], id.as_str());
        state_of(&data["task"])
    };
    assert_eq!(next_state().await, "TASK_STATE_READY", "the snapshot first");

    // A worker connects: each step is seen before the next is taken.
    let mut raw = RawWorker::connect(node.grpc_addr, "w-watch", &["watched"], 1).await;
    let assignment = raw.next_assign(LIMIT).await.expect("an assignment");
    assert_eq!(next_state().await, "TASK_STATE_DISPATCHING");
    raw.ack(&assignment).await;
    assert_eq!(next_state().await, "TASK_STATE_RUNNING");
    raw.succeed(&assignment).await;
    assert_eq!(next_state().await, "TASK_STATE_SUCCEEDED");
    assert!(
        events.next(LIMIT).await.is_none(),
        "the stream ends after a terminal state"
    );

    // Errors before the stream starts are ordinary JSON errors.
    let (status, _, _) = Events::open(&rest, "/api/tasks/nope/watch").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let missing = rest
        .call(
            Method::GET,
            "/api/tasks/0190b5c8-0000-7000-8000-000000000000/watch",
            None,
        )
        .await;
    assert_error(&missing, 404, 5, "not found");
    raw.close().await;
    stop_node(node).await;
}

#[tokio::test]
async fn health_readiness_and_the_served_document() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let alive = rest.call(Method::GET, "/healthz", None).await;
    assert_eq!(
        (alive.status, alive.json.clone()),
        (StatusCode::OK, json!({"status": "alive"}))
    );
    let ready = rest.call(Method::GET, "/readyz", None).await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(
        ready.json,
        json!({"status": "ready", "checks": {"store": "ok", "coordination": "ok"}})
    );
    let served = rest.call(Method::GET, "/openapi.json", None).await;
    assert_eq!(served.status, StatusCode::OK);
    let checked_in: Value =
        serde_json::from_str(include_str!("../docs/openapi.json")).expect("docs/openapi.json");
    assert_eq!(
        served.json, checked_in,
        "the node serves the checked-in document"
    );
    stop_node(node).await;
}
