//! The TaskApi's promises at the front door: idempotent submit, clear errors
//! for bad input with nothing written, cancel and watch.

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_testkit::*;
use tonic::Code;

async fn count_tasks(
    api: &mut taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
) -> usize {
    api.list_tasks(pb::ListTasksRequest {
        page_size: 1_000,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .tasks
    .len()
}

fn request(payload: &str, key: &str) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        handler: "echo".into(),
        payload: Some(pb::Payload {
            data: payload.as_bytes().to_vec(),
            content_type: "application/json".into(),
        }),
        client_request_id: key.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_same_client_request_id_yields_one_task() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;

    let first = api
        .submit_task(request("{\"a\":1}", "order-42"))
        .await
        .unwrap()
        .into_inner();
    let again = api
        .submit_task(request("{\"a\":1}", "order-42"))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.existing);
    assert!(again.existing);
    assert_eq!(first.task_id, again.task_id);

    let err = api
        .submit_task(request("{\"a\":2}", "order-42"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains("order-42"), "{}", err.message());
    assert_eq!(count_tasks(&mut api).await, 1);
    stop_node(node).await;
}

#[tokio::test]
async fn malformed_requests_get_clear_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_payload_bytes = 1_024;
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;

    let cases: Vec<(&str, pb::SubmitTaskRequest, &str)> = vec![
        (
            "empty handler",
            pb::SubmitTaskRequest::default(),
            "handler: value length must be at least 1 characters",
        ),
        (
            "invalid handler",
            pb::SubmitTaskRequest {
                handler: "send email".into(),
                ..Default::default()
            },
            "handler: does not match regex pattern",
        ),
        (
            "oversized payload",
            pb::SubmitTaskRequest {
                handler: "echo".into(),
                payload: Some(pb::Payload {
                    data: vec![b'x'; 2_000],
                    content_type: String::new(),
                }),
                ..Default::default()
            },
            "the limit is 1024 bytes",
        ),
        (
            "run_at and delay",
            pb::SubmitTaskRequest {
                handler: "echo".into(),
                run_at: Some(prost_types::Timestamp {
                    seconds: 1,
                    nanos: 0,
                }),
                delay: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..Default::default()
            },
            "only one of run_at, delay can be set",
        ),
        (
            "negative delay",
            pb::SubmitTaskRequest {
                handler: "echo".into(),
                delay: Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                }),
                ..Default::default()
            },
            "delay",
        ),
        (
            "bad callback url",
            pb::SubmitTaskRequest {
                handler: "echo".into(),
                callback_url: "ftp://x".into(),
                ..Default::default()
            },
            "callback_url",
        ),
        (
            "absurd retry policy",
            pb::SubmitTaskRequest {
                handler: "echo".into(),
                retry_policy: Some(pb::RetryPolicy {
                    max_attempts: 1_000_000,
                    ..Default::default()
                }),
                ..Default::default()
            },
            "max_attempts",
        ),
    ];
    for (name, req, needle) in cases {
        let err = api.submit_task(req).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "{name}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{name}: {:?} lacks {needle:?}",
            err.message()
        );
    }

    for bad in ["", "42", "not-a-uuid", "'; DROP TABLE tasks; --"] {
        let err = api
            .get_task(pb::GetTaskRequest {
                task_id: bad.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "get {bad:?}");
        let err = api
            .cancel_task(pb::CancelTaskRequest {
                task_id: bad.into(),
                reason: String::new(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "cancel {bad:?}");
    }
    let unknown = "0190b5c8-0000-7000-8000-000000000000";
    let err = api
        .get_task(pb::GetTaskRequest {
            task_id: unknown.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains(unknown));
    let err = api
        .ack_task(pb::AckTaskRequest {
            task_id: unknown.into(),
            execution_id: "e".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    // Without the assignment's secret an ACK learns nothing, not even
    // whether the task exists.
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = api
        .list_tasks(pb::ListTasksRequest {
            state: 99,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    assert_eq!(count_tasks(&mut api).await, 0, "nothing was written");
    stop_node(node).await;
}

#[tokio::test]
async fn a_waiting_task_is_cancelled_and_watchers_see_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;

    // No worker serves "nobody": the task waits READY until cancelled.
    let id = submit(&mut api, "nobody", b"{}").await;
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            task_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap().task.unwrap();
    assert_eq!(state(&first), pb::TaskState::Ready);

    let cancelled = api
        .cancel_task(pb::CancelTaskRequest {
            task_id: id.clone(),
            reason: "changed my mind".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert_eq!(state(&cancelled), pb::TaskState::Cancelled);
    assert_eq!(cancelled.error_message, "changed my mind");

    let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("a change within 10 s")
        .unwrap()
        .unwrap()
        .task
        .unwrap();
    assert_eq!(state(&next), pb::TaskState::Cancelled);
    let end = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("stream ends");
    assert!(
        matches!(end, Ok(None)),
        "the watch ends after a terminal state: {end:?}"
    );

    // Cancelling again is harmless and reports the end state.
    let again = api
        .cancel_task(pb::CancelTaskRequest {
            task_id: id.clone(),
            reason: String::new(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert_eq!(state(&again), pb::TaskState::Cancelled);
    stop_node(node).await;
}

#[tokio::test]
async fn a_delayed_task_waits_pending_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_worker(&[node.grpc_addr], "w", 2, ledger.clone());
    assert!(w.handle.wait_connected(Duration::from_secs(10)).await);

    let resp = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "echo".into(),
            delay: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let t = resp.task.unwrap();
    assert_eq!(state(&t), pb::TaskState::Pending);
    let run_at = t.run_at.unwrap();
    let done = wait_task_state(
        &api,
        &resp.task_id,
        pb::TaskState::Succeeded,
        Duration::from_secs(20),
    )
    .await;
    let started = done.attempts[0].start_time.unwrap();
    let early = (started.seconds, started.nanos) < (run_at.seconds, run_at.nanos);
    assert!(
        !early,
        "dispatched before its run_at: {started:?} < {run_at:?}"
    );
    w.stop().await;
    stop_node(node).await;
}

#[tokio::test]
async fn a_batch_submit_answers_each_entry_and_writes_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_payload_bytes = 16;
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let first = api
        .submit_task(request("{\"a\":1}", "batch-key"))
        .await
        .unwrap()
        .into_inner();
    // An entry that breaks a contract rule refuses the whole batch, naming
    // the entry, and writes nothing.
    let err = api
        .submit_tasks(pb::SubmitTasksRequest {
            tasks: vec![
                request("{\"z\":1}", ""),
                pb::SubmitTaskRequest {
                    handler: "".into(),
                    ..request("{}", "")
                },
            ],
        })
        .await
        .expect_err("a contract rule is broken");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("tasks[1].handler: "),
        "{}",
        err.message()
    );
    assert_eq!(count_tasks(&mut api).await, 1, "nothing written");
    // An entry over the server's own limit (its configuration, not the
    // contract) is refused alone.
    let bad = request(&"x".repeat(17), "");
    let resp = api
        .submit_tasks(pb::SubmitTasksRequest {
            tasks: vec![
                request("{\"b\":1}", ""),          // new
                bad,                               // invalid: refused alone
                request("{\"a\":1}", "batch-key"), // the stored task
                request("{\"a\":2}", "batch-key"), // same key, other request
                request("{\"c\":1}", "new-key"),   // new
                request("{\"c\":1}", "new-key"),   // = the entry before
            ],
        })
        .await
        .expect("the batch as a whole is accepted")
        .into_inner();
    let r = &resp.results;
    assert_eq!(r.len(), 6, "one result per entry, in order");
    let accepted = |i: usize| {
        r[i].accepted
            .clone()
            .unwrap_or_else(|| panic!("{i}: {:?}", r[i]))
    };
    assert!(!accepted(0).existing);
    assert_eq!(r[1].error_code, Code::InvalidArgument as i32, "{:?}", r[1]);
    assert!(
        r[1].error_message.contains("the limit is 16 bytes"),
        "{}",
        r[1].error_message
    );
    assert!(accepted(2).existing && accepted(2).task_id == first.task_id);
    assert_eq!(r[3].error_code, Code::AlreadyExists as i32, "{:?}", r[3]);
    assert!(!accepted(4).existing);
    assert!(accepted(5).existing && accepted(5).task_id == accepted(4).task_id);
    assert_eq!(count_tasks(&mut api).await, 3, "the stored one and two new");

    let err = api
        .submit_tasks(pb::SubmitTasksRequest { tasks: vec![] })
        .await
        .expect_err("an empty batch is refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    stop_node(node).await;
}

#[tokio::test]
async fn bytes_that_are_not_the_request_message_are_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut grpc = tonic::client::Grpc::new(channel(node.grpc_addr).await);
    // A field 1 of wire type 7 (none such), then a length running past the end.
    for garbage in [&[0x0f_u8, 0x01][..], &[0x0a, 0x7f, 0x01][..]] {
        grpc.ready().await.unwrap();
        let err = grpc
            .unary(
                tonic::Request::new(bytes::Bytes::copy_from_slice(garbage)),
                ::http::uri::PathAndQuery::from_static("/taskmesh.v1.TaskApi/SubmitTask"),
                taskmesh_gateway::BytesCodec,
            )
            .await
            .expect_err("garbage is refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("not valid protobuf"), "{err:?}");
    }
    let mut api = api(node.grpc_addr).await;
    assert_eq!(count_tasks(&mut api).await, 0, "nothing was written");
    stop_node(node).await;
}

/// Regression: a page of large tasks used to be loaded and encoded whole
/// and then refused (OUT_OF_RANGE) for passing the message limit. Now a
/// page of the full view ends early with a token, and walking the pages
/// yields every task exactly once, with its payload.
#[tokio::test]
async fn list_pages_end_before_the_message_limit_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_message_bytes = 256 * 1024;
    opts.dispatcher.max_payload_bytes = 64 * 1024;
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let payload = format!("\"{}\"", "x".repeat(60 * 1024));
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(submit(&mut api, "nobody", payload.as_bytes()).await);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 12, "the pages end");
        let page = api
            .list_tasks(pb::ListTasksRequest {
                page_size: 1_000,
                page_token: token.clone(),
                view: pb::TaskView::Full as i32,
                ..Default::default()
            })
            .await
            .expect("a page within the message limit")
            .into_inner();
        assert!(!page.tasks.is_empty(), "a page holds at least one task");
        assert!(
            page.tasks.iter().all(|t| t
                .payload
                .as_ref()
                .is_some_and(|p| p.data == payload.as_bytes())),
            "the full view carries the payloads"
        );
        seen.extend(page.tasks.iter().map(|t| t.task_id.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert!(pages > 1, "12 × 60 KiB does not fit one 256 KiB answer");
    let mut want = ids.clone();
    want.sort();
    let mut got = seen.clone();
    got.sort();
    assert_eq!(got, want, "every task exactly once over {pages} pages");
    stop_node(node).await;
}

/// Regression: a batch whose echoed tasks passed the message limit was
/// committed and then failed to encode its answer (OUT_OF_RANGE), so a
/// caller retrying without client_request_id made duplicates. Now the
/// answer carries ids only and always arrives.
#[tokio::test]
async fn a_committed_batch_always_gets_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.max_message_bytes = 512 * 1024;
    opts.dispatcher.max_payload_bytes = 64 * 1024;
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    let payload = format!("\"{}\"", "x".repeat(50));
    let tasks: Vec<pb::SubmitTaskRequest> = (0..3_000)
        .map(|_| pb::SubmitTaskRequest {
            handler: "nobody".into(),
            payload: Some(pb::Payload {
                data: payload.as_bytes().to_vec(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        })
        .collect();
    let answer = api
        .submit_tasks(pb::SubmitTasksRequest { tasks })
        .await
        .expect("the answer of a committed batch arrives")
        .into_inner();
    assert_eq!(answer.results.len(), 3_000);
    let ids: std::collections::HashSet<String> = answer
        .results
        .iter()
        .map(|r| {
            let accepted = r.accepted.as_ref().expect("accepted");
            assert!(accepted.task.is_none(), "ids only past the limit");
            accepted.task_id.clone()
        })
        .collect();
    assert_eq!(ids.len(), 3_000, "3,000 distinct tasks");
    for id in ids.iter().take(3) {
        assert_eq!(
            get(&mut api, id).await.task_id,
            *id,
            "each id names a stored task"
        );
    }
    // A small batch still echoes its tasks.
    let small = api
        .submit_tasks(pb::SubmitTasksRequest {
            tasks: vec![pb::SubmitTaskRequest {
                handler: "nobody".into(),
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(small.results[0].accepted.as_ref().unwrap().task.is_some());
    stop_node(node).await;
}
