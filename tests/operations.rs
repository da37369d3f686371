//! The operators' calls through the front doors (what the web console
//! uses, open to any client): the console's own files, RetryTask,
//! CancelTasks by filter, GetStats, PreviewSchedule and DrainWorker, on a
//! real node with real workers over gRPC and REST.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use taskmesh::v1 as pb;
use taskmesh::v1::connect_request::Message as In;
use taskmesh::v1::connect_response::Message as Out;
use taskmesh_testkit::http::{Rest, assert_error, state_of};
use taskmesh_testkit::raw::{self, RawWorker};
use taskmesh_testkit::*;

const LIMIT: Duration = Duration::from_secs(20);

fn id_of(reply: &taskmesh_testkit::http::Reply) -> String {
    reply.json["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task id in {:?}", reply.json))
        .to_string()
}

async fn fail(raw: &RawWorker, a: &pb::TaskAssignment) {
    raw.send(In::Complete(pb::TaskComplete {
        task_id: a.task_id.clone(),
        execution_id: a.execution_id.clone(),
        result: Some(pb::task_complete::Result::Failure(pb::TaskFailure {
            message: "boom".into(),
            retryable: false,
        })),
    }))
    .await;
}

#[tokio::test]
async fn the_console_is_served_from_the_binary_with_its_policy() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);

    let no_follow = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let bare = no_follow
        .get(format!("{}/ui", rest.base))
        .send()
        .await
        .expect("GET /ui");
    assert_eq!(bare.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(bare.headers()["location"], "/ui/");
    let page = rest.raw(Method::GET, "/ui/", &[], None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    let script = rest.raw(Method::GET, "/ui/app.js", &[], None).await;
    assert_eq!(script.status, StatusCode::OK);
    assert_eq!(
        script.headers["content-type"],
        "text/javascript; charset=utf-8"
    );
    for missing in [
        "/ui/nothing.js",
        "/ui/../Cargo.toml",
        "/ui/%2e%2e/Cargo.toml",
    ] {
        let reply = rest.raw(Method::GET, missing, &[], None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{missing}");
    }
    stop_node(node).await;
}

#[tokio::test]
async fn retry_runs_an_ended_task_again_once_and_never_a_success() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let mut raw = RawWorker::connect(node.grpc_addr, "w-retry", &["flaky"], 1).await;

    let submitted = rest
        .call(
            Method::POST,
            "/api/tasks",
            Some(json!({"handler": "flaky", "retryPolicy": {"maxAttempts": 1}})),
        )
        .await;
    let id = id_of(&submitted);
    let first = raw.next_assign(LIMIT).await.expect("first assignment");
    fail(&raw, &first).await;
    rest.wait_state(&id, "TASK_STATE_FAILED", LIMIT).await;

    let path = format!("/api/tasks/{id}/retry");
    let reply = rest.call(Method::POST, &path, Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert_eq!(reply.json["retried"], true);
    assert_eq!(state_of(&reply.json["task"]), "TASK_STATE_READY");
    let second = raw.next_assign(LIMIT).await.expect("second assignment");
    assert_eq!(second.task_id, id);
    assert_ne!(second.execution_id, first.execution_id);
    // While it runs, a repeat changes nothing.
    let repeat = rest.call(Method::POST, &path, Some(json!({}))).await;
    assert_eq!(repeat.status, StatusCode::OK, "{:?}", repeat.json);
    assert_eq!(repeat.json["retried"], Value::Null, "false is left out");
    assert_eq!(repeat.json["task"]["version"], {
        let now = rest.task(&id).await;
        now["version"].clone()
    });
    raw.succeed(&second).await;
    let done = rest.wait_state(&id, "TASK_STATE_SUCCEEDED", LIMIT).await;
    let attempts = done["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{done:?}");
    assert_eq!(attempts[1]["number"], 2);

    // A success is never rerun; bad or unknown ids are refused.
    let again = rest.call(Method::POST, &path, Some(json!({}))).await;
    assert_error(&again, 400, 9, "SUCCEEDED");
    let unknown = format!("/api/tasks/{}/retry", taskmesh_core::id::new_task_id());
    assert_error(
        &rest.call(Method::POST, &unknown, Some(json!({}))).await,
        404,
        5,
        "not found",
    );
    assert_error(
        &rest
            .call(Method::POST, "/api/tasks/nope/retry", Some(json!({})))
            .await,
        400,
        3,
        "task_id",
    );
    raw.close().await;
    stop_node(node).await;
}

#[tokio::test]
async fn cancel_by_filter_counts_first_and_cancels_only_live_matches() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let submit =
        |team: &str| json!({"handler": "later", "delay": "3600s", "labels": {"team": team}});
    let mut team_a = Vec::new();
    for _ in 0..5 {
        team_a.push(id_of(
            &rest
                .call(Method::POST, "/api/tasks", Some(submit("a")))
                .await,
        ));
    }
    let b = id_of(
        &rest
            .call(Method::POST, "/api/tasks", Some(submit("b")))
            .await,
    );

    let dry = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"label": "team=a", "dryRun": true})),
        )
        .await;
    assert_eq!(dry.status, StatusCode::OK, "{:?}", dry.json);
    assert_eq!(dry.json["matched"], 5);
    assert_eq!(dry.json["cancelled"], Value::Null);
    for id in &team_a {
        assert_eq!(state_of(&rest.task(id).await), "TASK_STATE_PENDING");
    }

    let some = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"label": "team=a", "limit": 3, "reason": "cleanup"})),
        )
        .await;
    assert_eq!(
        (some.json["matched"].clone(), some.json["cancelled"].clone()),
        (json!(3), json!(3))
    );
    // The newest three went; the two oldest wait.
    for (i, id) in team_a.iter().enumerate() {
        let task = rest.task(id).await;
        let want = if i < 2 {
            "TASK_STATE_PENDING"
        } else {
            "TASK_STATE_CANCELLED"
        };
        assert_eq!(state_of(&task), want, "task {i}");
        if i >= 2 {
            assert_eq!(task["errorMessage"], "cleanup");
        }
    }
    let rest_of = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"label": "team"})),
        )
        .await;
    assert_eq!(rest_of.json["matched"], 3, "{:?}", rest_of.json);
    assert_eq!(state_of(&rest.task(&b).await), "TASK_STATE_CANCELLED");

    // Ended states and malformed filters are refused, changing nothing.
    let ended = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"state": "TASK_STATE_SUCCEEDED"})),
        )
        .await;
    assert_eq!(ended.status, StatusCode::BAD_REQUEST, "{:?}", ended.json);
    let bad_label = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"label": "x\u{1}"})),
        )
        .await;
    assert_eq!(
        bad_label.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        bad_label.json
    );
    let too_many = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"limit": 10001})),
        )
        .await;
    assert_eq!(
        too_many.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        too_many.json
    );

    // A running match (by handler: labels would need a worker carrying
    // them) is cancelled too, and its worker is told.
    let mut raw = RawWorker::connect(node.grpc_addr, "w-cancel", &["busy"], 1).await;
    let running = id_of(
        &rest
            .call(Method::POST, "/api/tasks", Some(json!({"handler": "busy"})))
            .await,
    );
    let a = raw.next_assign(LIMIT).await.expect("an assignment");
    raw.ack(&a).await;
    rest.wait_state(&running, "TASK_STATE_RUNNING", LIMIT).await;
    let reply = rest
        .call(
            Method::POST,
            "/api/tasks:cancel",
            Some(json!({"handler": "busy"})),
        )
        .await;
    assert_eq!(reply.json["cancelled"], 1, "{:?}", reply.json);
    // The next messages until the cancel, within the deadline (receipts may
    // come first).
    let deadline = tokio::time::Instant::now() + LIMIT;
    let told = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match raw.next(left).await {
            Some(Out::Cancel(c)) => break c,
            Some(_) => continue,
            None => panic!("the worker was not told to cancel within {LIMIT:?}"),
        }
    };
    assert_eq!(
        (told.task_id.as_str(), told.execution_id.as_str()),
        (running.as_str(), a.execution_id.as_str())
    );
    raw.close().await;

    // The list filters the console uses find the same tasks.
    let listed = rest
        .call(
            Method::GET,
            "/api/tasks?label=team%3Da&state=TASK_STATE_CANCELLED",
            None,
        )
        .await;
    assert_eq!(listed.json["tasks"].as_array().map(Vec::len), Some(5));
    stop_node(node).await;
}

#[tokio::test]
async fn stats_count_from_the_store_over_grpc_and_rest() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let ledger = Ledger::default();
    let worker = counting_worker(&[node.grpc_addr], "w-stats", 4, ledger.clone());
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(id_of(
            &rest
                .call(Method::POST, "/api/tasks", Some(json!({"handler": "echo"})))
                .await,
        ));
    }
    for id in &ids {
        rest.wait_state(id, "TASK_STATE_SUCCEEDED", LIMIT).await;
    }
    rest.call(
        Method::POST,
        "/api/tasks",
        Some(json!({"handler": "nobody-serves-it"})),
    )
    .await;

    let stats = rest
        .call(Method::GET, "/api/stats?windowMinutes=5", None)
        .await;
    assert_eq!(stats.status, StatusCode::OK, "{:?}", stats.json);
    let count_of = |state: &str| {
        stats.json["byState"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["state"] == state)
            .map(|c| c["count"].as_str().unwrap_or("0").parse::<u64>().unwrap())
    };
    assert_eq!(count_of("TASK_STATE_SUCCEEDED"), Some(6));
    assert_eq!(count_of("TASK_STATE_READY"), Some(1));
    assert_eq!(
        count_of("TASK_STATE_FAILED"),
        Some(0),
        "every state is listed"
    );
    let minutes = stats.json["perMinute"].as_array().unwrap();
    assert_eq!(minutes.len(), 5);
    let completed: u64 = minutes
        .iter()
        .map(|m| {
            m["completed"]
                .as_str()
                .unwrap_or("0")
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    // Six ended in the window (a minute boundary may split them).
    assert_eq!(completed, 6, "{minutes:?}");
    let queue = &stats.json["queues"][0];
    assert_eq!(queue["handler"], "nobody-serves-it");
    assert_eq!(queue["ready"], "1");
    assert!(queue["oldestReadyTime"].is_string());
    assert!(
        !stats.json["leader"]["nodeId"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "a lone node leads: {:?}",
        stats.json["leader"]
    );

    // The same figures over gRPC.
    let mut api = api(node.grpc_addr).await;
    let grpc = api
        .get_stats(pb::GetStatsRequest {
            window_minutes: 5,
            ..Default::default()
        })
        .await
        .expect("GetStats")
        .into_inner();
    let succeeded = grpc
        .by_state
        .iter()
        .find(|c| c.state == pb::TaskState::Succeeded as i32)
        .map(|c| c.count);
    assert_eq!(succeeded, Some(6));
    let window = rest
        .call(Method::GET, "/api/stats?windowMinutes=1441", None)
        .await;
    assert_eq!(window.status, StatusCode::BAD_REQUEST, "{:?}", window.json);
    worker.stop().await;
    assert_eq!(ledger.all().values().sum::<u32>(), 6, "each ran once");
    stop_node(node).await;
}

#[tokio::test]
async fn preview_lists_the_next_fires_and_names_dst_changes() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    // Sundays of March at 02:30 in Berlin: the last is the spring change.
    let sundays = json!({"schedule": {
        "kind": "SCHEDULE_KIND_CRON", "cronExpression": "0 30 2 * 3 0",
        "timeZone": "Europe/Berlin", "template": {"handler": "echo"}}, "count": 5});
    let reply = rest
        .call(Method::POST, "/api/schedules:preview", Some(sundays))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    let times = reply.json["fireTimes"].as_array().expect("fireTimes");
    assert_eq!(times.len(), 5);
    let warnings = reply.json["warnings"].as_array().expect("a DST warning");
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap_or("")
            .contains("go forward from 02:00 to 03:00")),
        "{warnings:?}"
    );
    let every_minute = json!({"schedule": {
        "kind": "SCHEDULE_KIND_FIXED_RATE", "interval": "60s",
        "template": {"handler": "echo"}}});
    let reply = rest
        .call(Method::POST, "/api/schedules:preview", Some(every_minute))
        .await;
    let times: Vec<&str> = reply.json["fireTimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(times.len(), 5, "five by default: {times:?}");
    // Invalid definitions are refused, and nothing is ever created.
    let bad_zone = json!({"schedule": {"kind": "SCHEDULE_KIND_CRON",
        "cronExpression": "0 * * * *", "timeZone": "Mars/Olympus",
        "template": {"handler": "echo"}}});
    let reply = rest
        .call(Method::POST, "/api/schedules:preview", Some(bad_zone))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{:?}", reply.json);
    let listed = rest.call(Method::GET, "/api/schedules", None).await;
    assert_eq!(listed.json["schedules"], Value::Null, "{:?}", listed.json);
    stop_node(node).await;
}

#[tokio::test]
async fn a_drained_worker_gets_nothing_new_and_shows_draining() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let rest = Rest::new(node.http_addr);
    let mut first = RawWorker::connect(node.grpc_addr, "w-drained", &["job"], 2).await;
    let reply = rest
        .call(
            Method::POST,
            "/api/workers/w-drained/drain",
            Some(json!({})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json);
    assert_eq!(reply.json["streams"], 1);
    let workers = rest.call(Method::GET, "/api/workers", None).await;
    let me = &workers.json["workers"][0];
    assert_eq!(me["workerId"], "w-drained");
    assert_eq!(me["draining"], true);
    assert_eq!(me["mode"], "WORKER_MODE_STREAM");

    let id = id_of(
        &rest
            .call(Method::POST, "/api/tasks", Some(json!({"handler": "job"})))
            .await,
    );
    raw::rounds(&node.dispatch_stats, 3).await;
    assert_eq!(state_of(&rest.task(&id).await), "TASK_STATE_READY");
    let mut second = RawWorker::connect(node.grpc_addr, "w-fresh", &["job"], 1).await;
    let a = second
        .next_assign(LIMIT)
        .await
        .expect("the fresh worker gets it");
    assert_eq!(a.task_id, id);
    second.succeed(&a).await;
    rest.wait_state(&id, "TASK_STATE_SUCCEEDED", LIMIT).await;
    assert!(
        first.next_assign(Duration::from_millis(1)).await.is_none(),
        "the drained worker was pushed nothing"
    );
    let unknown = rest
        .call(Method::POST, "/api/workers/nobody/drain", Some(json!({})))
        .await;
    assert_error(&unknown, 404, 5, "not connected");
    first.close().await;
    second.close().await;
    stop_node(node).await;
}
