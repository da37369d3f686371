//! Errors at the REST front door: every gRPC error class answers its HTTP
//! status with the JSON body `{"code", "message", "details"}`; malformed
//! JSON, wrong types, unknown fields and oversized bodies are refused with
//! a 4xx and a message, and nothing is written.
//!
//! The classes the real TaskApi can be made to produce are checked against
//! a real node. The others (UNAUTHENTICATED, PERMISSION_DENIED,
//! RESOURCE_EXHAUSTED, ...) are produced by a scripted gRPC server on
//! loopback that answers every call with the status code named in the
//! forwarded `authorization` header, so the gateway under test is the real
//! one, over real gRPC.

use std::convert::Infallible;
use std::net::SocketAddr;

use reqwest::{Method, StatusCode};
use serde_json::json;
use taskmesh_gateway::{Gateway, GatewayOptions, Readiness};
use taskmesh_testkit::background::BackgroundServer;
use taskmesh_testkit::http::{Rest, assert_error};
use taskmesh_testkit::*;

/// A `TaskApi` answering every RPC with the code in `authorization: code N`
/// (UNAUTHENTICATED without one).
#[derive(Clone)]
struct Scripted;

impl tonic::server::NamedService for Scripted {
    const NAME: &'static str = "taskmesh.v1.TaskApi";
}

impl tower::Service<::http::Request<tonic::body::Body>> for Scripted {
    type Response = ::http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ::http::Request<tonic::body::Body>) -> Self::Future {
        let code = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("code "))
            .and_then(|n| n.parse::<i32>().ok());
        let status = match code {
            Some(n) => tonic::Status::new(tonic::Code::from_i32(n), format!("scripted {n}")),
            None => tonic::Status::unauthenticated("no credentials"),
        };
        std::future::ready(Ok(status.into_http()))
    }
}

async fn scripted_grpc() -> (SocketAddr, BackgroundServer) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = BackgroundServer::spawn("the scripted gRPC server", |stop| {
        tonic::transport::Server::builder()
            .add_service(Scripted)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.cancelled_owned(),
            )
    });
    (addr, server)
}

/// A gateway alone, in front of `target`, with `readiness`.
async fn gateway(target: SocketAddr, readiness: Readiness) -> (Rest, BackgroundServer) {
    let gw = Gateway::build(GatewayOptions::new(format!("http://{target}")), readiness).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rest = Rest::new(listener.local_addr().unwrap());
    let server = BackgroundServer::spawn("the gateway", |stop| gw.serve(listener, stop));
    (rest, server)
}

#[tokio::test]
async fn every_grpc_error_class_has_its_status_and_json_body() {
    let (target, scripted) = scripted_grpc().await;
    let (rest, gateway) = gateway(target, Readiness::new()).await;
    let cases = [
        (3, 400),  // INVALID_ARGUMENT
        (9, 400),  // FAILED_PRECONDITION
        (5, 404),  // NOT_FOUND
        (6, 409),  // ALREADY_EXISTS
        (10, 409), // ABORTED
        (16, 401), // UNAUTHENTICATED
        (7, 403),  // PERMISSION_DENIED
        (8, 429),  // RESOURCE_EXHAUSTED
        (14, 503), // UNAVAILABLE
        (4, 504),  // DEADLINE_EXCEEDED
        (13, 500), // INTERNAL
        (2, 500),  // UNKNOWN: others are 500
        (12, 500), // UNIMPLEMENTED
    ];
    for (code, status) in cases {
        let auth = format!("code {code}");
        for (method, path, body) in [
            (Method::GET, "/api/tasks/x", None),
            (Method::POST, "/api/tasks", Some(b"{}".to_vec())),
            (Method::GET, "/api/tasks/x/watch", None),
        ] {
            let reply = rest
                .raw(method, path, &[("authorization", &auth)], body)
                .await;
            assert_error(&reply, status, code, &format!("scripted {code}"));
        }
    }
    // Without the header the backend sees no credentials: it was forwarded above.
    let reply = rest.raw(Method::GET, "/api/workers", &[], None).await;
    assert_error(&reply, 401, 16, "no credentials");
    gateway.stop().await;
    scripted.stop().await;
}

#[tokio::test]
async fn an_unreachable_service_is_503_and_a_failing_check_is_not_ready() {
    let closed = ([127, 0, 0, 1], free_port()).into();
    let readiness = Readiness::new()
        .check("store", || async { Ok(()) })
        .check("coordination", || async {
            Err("redis: connection refused".to_string())
        })
        .check("hangs", futures::future::pending::<Result<(), String>>);
    let (rest, server) = gateway(closed, readiness).await;
    let reply = rest.call(Method::GET, "/api/tasks", None).await;
    assert_error(&reply, 503, 14, "");
    let ready = rest.call(Method::GET, "/readyz", None).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        ready.json,
        json!({
            "status": "unavailable",
            "reason": "coordination: redis: connection refused",
            "checks": {
                "store": "ok",
                "coordination": "redis: connection refused",
                "hangs": "no answer within 2s",
            },
        })
    );
    assert_eq!(
        rest.call(Method::GET, "/healthz", None).await.status,
        StatusCode::OK
    );
    server.stop().await;
}

#[tokio::test]
async fn a_real_node_answers_each_class_it_can_produce() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let missing = "0190b5c8-0000-7000-8000-000000000000";

    let reply = rest
        .call(Method::POST, "/api/tasks", Some(json!({"handler": "a b"})))
        .await;
    assert_error(&reply, 400, 3, "handler: does not match regex pattern");
    let reply = rest
        .call(Method::GET, &format!("/api/tasks/{missing}"), None)
        .await;
    assert_error(&reply, 404, 5, "not found");
    let reply = rest.call(Method::GET, "/api/tasks/not-a-uuid", None).await;
    assert_error(&reply, 400, 3, "task_id: value must be a valid UUID");
    let keyed =
        |data: &str| json!({"handler": "h", "clientRequestId": "k", "payload": {"data": data}});
    let first = rest
        .call(Method::POST, "/api/tasks", Some(keyed("AA==")))
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    let reply = rest
        .call(Method::POST, "/api/tasks", Some(keyed("AQ==")))
        .await;
    assert_error(&reply, 409, 6, "already used");
    let id = first.json["taskId"].as_str().unwrap();
    let reply = rest
        .call(
            Method::POST,
            &format!("/api/tasks/{id}/ack"),
            Some(json!({"executionId": "e"})),
        )
        .await;
    assert_error(&reply, 403, 7, "report_secret");
    let reply = rest
        .call(Method::GET, &format!("/api/schedules/{missing}"), None)
        .await;
    assert_error(&reply, 404, 5, missing);

    // The gateway's own refusals.
    assert_error(
        &rest.call(Method::GET, "/api/nowhere", None).await,
        404,
        5,
        "/api/nowhere",
    );
    let reply = rest.call(Method::DELETE, "/api/tasks", None).await;
    assert_error(&reply, 405, 12, "DELETE");
    assert_eq!(reply.headers["allow"], "POST, GET");
    let reply = rest.call(Method::POST, "/healthz", None).await;
    assert_error(&reply, 405, 12, "POST");
    let reply = rest
        .raw(
            Method::POST,
            "/api/tasks",
            &[("content-type", "text/plain")],
            Some(b"{}".to_vec()),
        )
        .await;
    assert_error(&reply, 415, 3, "application/json");
    assert_eq!(
        rest.count_tasks().await,
        1,
        "only the first keyed submit wrote"
    );
    stop_node(node).await;
}

#[tokio::test]
async fn malformed_bodies_are_refused_with_a_message_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.max_body_bytes = 2_048;
    let node = start_node(opts).await;
    let rest = Rest::new(node.http_addr);
    let json = |text: &str| Some(text.as_bytes().to_vec());
    let cases: Vec<(&str, Option<Vec<u8>>, u16, &str)> = vec![
        (
            "malformed JSON",
            json(r#"{"handler": "echo""#),
            400,
            "malformed JSON",
        ),
        ("not an object", json(r#"["echo"]"#), 400, "JSON object"),
        (
            "wrong type: string",
            json(r#"{"handler": 5}"#),
            400,
            "invalid",
        ),
        (
            "wrong type: int32",
            json(r#"{"handler": "echo", "priority": "high"}"#),
            400,
            "invalid",
        ),
        (
            "wrong type: map",
            json(r#"{"handler": "echo", "labels": ["a"]}"#),
            400,
            "map",
        ),
        (
            "wrong type: message",
            json(r#"{"handler": "echo", "payload": "x"}"#),
            400,
            "invalid",
        ),
        (
            "bad base64",
            json(r#"{"handler": "echo", "payload": {"data": "%%"}}"#),
            400,
            "base64",
        ),
        (
            "bad enum",
            json(r#"{"handler": "echo", "balancer": "BEST"}"#),
            400,
            "BEST",
        ),
        (
            "bad duration",
            json(r#"{"handler": "echo", "delay": "5 minutes"}"#),
            400,
            "invalid",
        ),
        (
            "bad timestamp",
            json(r#"{"handler": "echo", "runAt": "tomorrow"}"#),
            400,
            "invalid",
        ),
        (
            "unknown field",
            json(r#"{"handler": "echo", "colour": "red"}"#),
            400,
            "colour",
        ),
        (
            "unknown nested",
            json(r#"{"handler": "echo", "payload": {"size": 1}}"#),
            400,
            "size",
        ),
        (
            "oversized",
            Some(vec![b' '; 4_096]),
            413,
            "larger than the limit of 2048 bytes",
        ),
    ];
    for (what, body, status, text) in cases {
        let reply = rest
            .raw(
                Method::POST,
                "/api/tasks",
                &[("content-type", "application/json")],
                body,
            )
            .await;
        let code = if status == 413 { 8 } else { 3 };
        // Names the case in the output of a failing run.
        eprintln!("case: {what}");
        assert_error(&reply, status, code, text);
    }
    let batch = rest
        .call(
            Method::POST,
            "/api/tasks:batch",
            Some(json!({"tasks": [{"handler": "echo", "x": 1}]})),
        )
        .await;
    assert_error(&batch, 400, 3, "x");

    // An oversized body without Content-Length is cut off while it streams.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..8).map(|_| Ok(vec![b' '; 1_024])).collect();
    let reply = rest
        .client
        .post(format!("{}/api/tasks", rest.base))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(reply.headers().get("content-length").is_some());

    assert_eq!(rest.count_tasks().await, 0, "nothing was written");
    stop_node(node).await;
}
