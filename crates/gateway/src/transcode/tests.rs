//! Transcoding against the real contract: where each field comes from, and
//! how bad input is refused before anything is sent.

use http::Method;
use prost::Message;
use taskmesh::v1 as pb;

use super::{request, response};
use crate::rules::{Lookup, Route, Routes};

fn routes() -> Routes {
    Routes::load(&crate::descriptor_pool().unwrap()).unwrap()
}

fn build<M: Message + Default>(
    method: Method,
    path: &str,
    query: Option<&str>,
    body: &str,
) -> Result<M, String> {
    let routes = routes();
    let (route, vars) = match routes.lookup(&method, path) {
        Lookup::Found(route, vars) => (route.clone(), vars),
        other => panic!("{method} {path}: {other:?}"),
    };
    let bytes = request(&route, &vars, query, body.as_bytes()).map_err(|e| {
        assert_eq!(e.status, 400, "{e:?}");
        e.message
    })?;
    Ok(M::decode(bytes).unwrap())
}

#[test]
fn body_star_takes_the_whole_message_in_proto3_json() {
    let req: pb::SubmitTaskRequest = build(
        Method::POST,
        "/api/tasks",
        None,
        r#"{"handler":"echo","payload":{"data":"aGk=","contentType":"text/plain"},
            "priority":"7","labels":{"zone":"eu"},"client_request_id":"k1",
            "delay":"1.5s","balancer":"BALANCER_STRATEGY_ROUND_ROBIN",
            "retryPolicy":{"maxAttempts":4,"multiplier":1.5}}"#,
    )
    .unwrap();
    assert_eq!(req.handler, "echo");
    assert_eq!(req.payload.unwrap().data, b"hi");
    assert_eq!(req.priority, 7, "numbers as strings are accepted");
    assert_eq!(req.labels["zone"], "eu");
    assert_eq!(req.client_request_id, "k1", "proto names are accepted too");
    assert_eq!(
        req.delay.unwrap(),
        prost_types::Duration {
            seconds: 1,
            nanos: 500_000_000
        }
    );
    assert_eq!(req.balancer, pb::BalancerStrategy::RoundRobin as i32);
    assert_eq!(req.retry_policy.unwrap().max_attempts, 4);
}

#[test]
fn path_variables_override_the_body_and_empty_bodies_are_empty_messages() {
    let id = "0190b5c8-0000-7000-8000-000000000001";
    let req: pb::CancelTaskRequest = build(
        Method::POST,
        &format!("/api/tasks/{id}/cancel"),
        None,
        r#"{"task_id":"other","reason":"stop"}"#,
    )
    .unwrap();
    assert_eq!((req.task_id.as_str(), req.reason.as_str()), (id, "stop"));
    let req: pb::AckTaskRequest =
        build(Method::POST, &format!("/api/tasks/{id}/ack"), None, "").unwrap();
    assert_eq!(req.task_id, id);
    let req: pb::GetTaskRequest = build(Method::GET, "/api/tasks/a%2Fb", None, "").unwrap();
    assert_eq!(req.task_id, "a/b", "a path variable is percent-decoded");
}

#[test]
fn query_parameters_fill_the_remaining_fields() {
    let req: pb::ListTasksRequest = build(
        Method::GET,
        "/api/tasks",
        Some("state=TASK_STATE_READY&handler=echo&pageSize=5&page_token=x%20y"),
        "",
    )
    .unwrap();
    assert_eq!(req.state, pb::TaskState::Ready as i32);
    assert_eq!((req.handler.as_str(), req.page_size), ("echo", 5));
    assert_eq!(req.page_token, "x y");
    let req: pb::ListTasksRequest = build(Method::GET, "/api/tasks", Some("state=5"), "").unwrap();
    assert_eq!(req.state, 5, "an enum by number");
    let req: pb::UpdateScheduleRequest = build(
        Method::PUT,
        "/api/schedules/s1",
        None,
        r#"{"name":"nightly","kind":"SCHEDULE_KIND_CRON","paused":true}"#,
    )
    .unwrap();
    let schedule = req.schedule.unwrap();
    assert_eq!(req.schedule_id, "s1");
    assert_eq!((schedule.name.as_str(), schedule.paused), ("nightly", true));
}

#[test]
fn bad_input_is_refused_with_the_reason() {
    let cases: [(Method, &str, Option<&str>, &str, &str); 14] = [
        (Method::POST, "/api/tasks", None, "{", "malformed JSON"),
        (
            Method::POST,
            "/api/tasks",
            None,
            "[1]",
            "must be a JSON object",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"nope":1}"#,
            "unrecognized field name 'nope'",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"priority":"high"}"#,
            "invalid",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"priority":1.5}"#,
            "invalid",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"handler":7}"#,
            "invalid",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"balancer":"FASTEST"}"#,
            "FASTEST",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"delay":"soon"}"#,
            "invalid",
        ),
        (
            Method::POST,
            "/api/tasks",
            None,
            r#"{"payload":{"data":"!!"}}"#,
            "base64",
        ),
        (
            Method::POST,
            "/api/tasks",
            Some("handler=x"),
            "{}",
            "query parameter handler",
        ),
        (Method::GET, "/api/tasks", Some("bogus=1"), "", "bogus"),
        (
            Method::GET,
            "/api/tasks",
            Some("pageSize=1&pageSize=2"),
            "",
            "more than once",
        ),
        (
            Method::GET,
            "/api/tasks",
            Some("pageSize=-1"),
            "",
            "invalid",
        ),
        (
            Method::GET,
            "/api/tasks",
            None,
            "{}",
            "takes no request body",
        ),
    ];
    for (method, path, query, body, want) in cases {
        let err = build::<pb::SubmitTaskRequest>(method.clone(), path, query, body)
            .expect_err(&format!("{method} {path} {query:?} {body}"));
        assert!(
            err.contains(want),
            "{body}: {err:?} should mention {want:?}"
        );
    }
    let err = build::<pb::GetTaskRequest>(Method::GET, "/api/tasks/abc", Some("task_id=x"), "")
        .unwrap_err();
    assert!(err.contains("set by the path"), "{err}");
}

#[test]
fn responses_are_canonical_proto3_json() {
    let routes = routes();
    let route: &Route = match routes.lookup(&Method::GET, "/api/tasks/x") {
        Lookup::Found(route, _) => route,
        other => panic!("{other:?}"),
    };
    let reply = pb::GetTaskResponse {
        task: Some(pb::Task {
            task_id: "t".into(),
            state: pb::TaskState::Succeeded as i32,
            version: 3,
            timeout: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
            ..Default::default()
        }),
    };
    let (json, _) = response(route, &reply.encode_to_vec()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"task": {
            "taskId": "t", "state": "TASK_STATE_SUCCEEDED", "version": "3", "timeout": "2s"
        }})
    );
    let err = response(route, b"\xff\xff").unwrap_err();
    assert_eq!(err.status, 500);
}
