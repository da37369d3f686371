//! Sharding broadcast end to end, on a real node over gRPC and REST with
//! the real worker SDK: a broadcast over 3 workers runs shards 0, 1 and 2
//! exactly once each, one on each worker, each handler seeing its index;
//! a broadcast with no worker for its handler waits (PENDING) and is
//! spread over the one worker that joins later; a shard failing for good
//! fails the broadcast and cancels the shards still running; cancelling a
//! broadcast cancels its shards; a broadcast workflow step is refused.
//! (A worker process killed mid-shard: `crates/cli/tests/worker_kill.rs`.)

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use taskmesh::v1 as pb;
use taskmesh_testkit::http::Rest;
use taskmesh_testkit::*;
use taskmesh_worker::{HandlerError, Output, TaskContext, Worker, WorkerOptions, handler_fn};

const LIMIT: Duration = Duration::from_secs(30);

type TaskApi = taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>;

/// Worker `id` serving `shard` (answers "index/total@id"), `late` (the
/// same) and `hold` (runs until cancelled; shard 0 of a `hold` broadcast
/// with the payload `{"fail":true}` fails at once for good instead).
fn shard_worker(grpc: std::net::SocketAddr, id: &'static str, handlers: &[&str]) -> TestWorker {
    let mut opts = WorkerOptions::new(vec![format!("http://{grpc}")]);
    opts.worker_id = id.into();
    opts.name = id.into();
    opts.concurrency = 8;
    opts.reconnect_initial = Duration::from_millis(50);
    let answer = move |ctx: TaskContext| async move {
        let (index, total) = ctx
            .shard
            .ok_or_else(|| HandlerError::fatal("not a shard"))?;
        Ok::<_, HandlerError>(Output::new(
            format!("{index}/{total}@{id}").into_bytes(),
            "text/plain",
        ))
    };
    let hold = handler_fn(|ctx: TaskContext| async move {
        let fail = ctx.payload.as_slice() == br#"{"fail":true}"#;
        if fail && ctx.shard.is_some_and(|(i, _)| i == 0) {
            return Err::<Output, _>(HandlerError::fatal("shard 0 broke"));
        }
        ctx.cancelled().await;
        Err::<Output, _>(HandlerError::fatal("cancelled"))
    });
    let mut w = Worker::new(opts);
    for h in handlers {
        w = match *h {
            "hold" => w.handler("hold", hold.clone()),
            name => w.handler(name, handler_fn(answer)),
        };
    }
    TestWorker::spawn(w)
}

/// A node with connected workers of `shard_worker(id, handlers)` each.
async fn node_with(
    dir: &std::path::Path,
    workers: &[(&'static str, &[&str])],
) -> (taskmesh_cli::node::RunningNode, Vec<TestWorker>) {
    let node = start_node(node_options(dir)).await;
    let mut started = Vec::new();
    for (id, handlers) in workers {
        let w = shard_worker(node.grpc_addr, id, handlers);
        assert!(w.handle.wait_connected(LIMIT).await, "worker {id} connects");
        started.push(w);
    }
    (node, started)
}

/// The tasks `schedule` fired (of `handler`) that are in state `want`.
async fn fired_in(
    api: &mut TaskApi,
    schedule: &str,
    handler: &str,
    want: pb::TaskState,
) -> Vec<pb::Task> {
    let tasks = api
        .list_tasks(pb::ListTasksRequest {
            handler: handler.into(),
            state: want as i32,
            page_size: 100,
            ..Default::default()
        })
        .await
        .expect("ListTasks")
        .into_inner()
        .tasks;
    tasks
        .into_iter()
        .filter(|t| t.schedule_id == schedule)
        .collect()
}

/// Stops `workers`, then `node`.
async fn stop_all(node: taskmesh_cli::node::RunningNode, workers: Vec<TestWorker>) {
    for w in workers {
        w.stop().await;
    }
    stop_node(node).await;
}

async fn submit_broadcast(api: &mut TaskApi, handler: &str) -> String {
    submit_broadcast_of(api, handler, b"{}").await
}

async fn submit_broadcast_of(api: &mut TaskApi, handler: &str, payload: &[u8]) -> String {
    let reply = api
        .submit_task(pb::SubmitTaskRequest {
            handler: handler.into(),
            payload: Some(pb::Payload {
                data: payload.to_vec(),
                content_type: "application/json".into(),
            }),
            broadcast: true,
            ..Default::default()
        })
        .await
        .expect("submit a broadcast")
        .into_inner();
    let t = reply.task.unwrap();
    assert!(t.broadcast);
    assert_eq!(
        state(&t),
        pb::TaskState::Pending,
        "spread by the leader, never READY"
    );
    reply.task_id
}

/// Waits until `parent` has `n` shards, every one in state `want`.
async fn shards_in(api: &TaskApi, parent: &str, n: usize, want: pb::TaskState) {
    wait_for(&format!("{n} shards {want:?}"), LIMIT, || {
        let mut api = api.clone();
        let parent = parent.to_string();
        async move {
            let s = shards(&mut api, &parent).await;
            (s.len() == n && s.iter().all(|t| state(t) == want)).then_some(())
        }
    })
    .await;
}

/// The outputs of `parent`'s shards, each checked SUCCEEDED with one attempt.
async fn outputs(api: &mut TaskApi, parent: &str) -> Vec<String> {
    let mut out = Vec::new();
    for s in shards(api, parent).await {
        assert_eq!(state(&s), pb::TaskState::Succeeded, "{s:#?}");
        let t = get(api, &s.task_id).await;
        assert_eq!(t.attempts.len(), 1, "each shard ran once: {t:#?}");
        out.push(String::from_utf8(t.output.unwrap().data).unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_runs_once_on_each_worker_over_grpc_and_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (node, workers) = node_with(
        dir.path(),
        &[
            ("w-a", &["shard"]),
            ("w-b", &["shard"]),
            ("w-c", &["shard"]),
        ],
    )
    .await;
    let mut api = api(node.grpc_addr).await;

    let parent = submit_broadcast(&mut api, "shard").await;
    let done = wait_task_state(&api, &parent, pb::TaskState::Succeeded, LIMIT).await;
    let out = outputs(&mut api, &parent).await;
    let on: BTreeSet<&str> = out.iter().filter_map(|o| o.split('@').nth(1)).collect();
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(
        out.iter().map(|o| &o[..3]).collect::<Vec<_>>(),
        ["0/3", "1/3", "2/3"],
        "each index once, as the handler saw it"
    );
    assert_eq!(on.len(), 3, "one shard on each worker: {out:?}");
    let summary = String::from_utf8(done.output.unwrap().data).unwrap();
    assert!(summary.contains("\"shards\":3"), "{summary}");
    let w = shards(&mut api, &parent).await[0].workflow_id.clone();
    let workflow = api
        .get_workflow(pb::GetWorkflowRequest {
            workflow_id: w,
            ..Default::default()
        })
        .await
        .expect("GetWorkflow")
        .into_inner()
        .workflow
        .unwrap();
    assert_eq!(workflow.parent_task_id, parent);
    assert_eq!(workflow.state, pb::WorkflowState::Succeeded as i32);

    // Over REST, the same.
    let rest = Rest::new(node.http_addr);
    let reply = rest
        .call(
            Method::POST,
            "/api/tasks",
            Some(json!({"handler": "shard", "broadcast": true})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{:?}", reply.json);
    assert_eq!(reply.json["task"]["broadcast"], json!(true));
    let id = reply.json["taskId"].as_str().unwrap().to_string();
    wait_task_state(&api, &id, pb::TaskState::Succeeded, LIMIT).await;
    let listed = rest
        .call(Method::GET, &format!("/api/tasks?parentTaskId={id}"), None)
        .await;
    let mut idx: Vec<u64> = listed.json["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["shardIndex"].as_u64().unwrap_or(0))
        .collect();
    idx.sort_unstable();
    assert_eq!(idx, [0, 1, 2], "{:?}", listed.json);

    // No worker serves `late`: the broadcast waits, and is spread over the
    // one worker that joins.
    let late = submit_broadcast(&mut api, "late").await;
    assert!(shards(&mut api, &late).await.is_empty());
    let joiner = shard_worker(node.grpc_addr, "w-late", &["late"]);
    wait_task_state(&api, &late, pb::TaskState::Succeeded, LIMIT).await;
    assert_eq!(outputs(&mut api, &late).await, ["0/1@w-late"]);

    // A workflow step cannot be a broadcast; nothing is written.
    let refused = api
        .submit_workflow(pb::SubmitWorkflowRequest {
            steps: vec![pb::WorkflowStepSpec {
                after_parents_end: false,
                name: "a".into(),
                template: Some(pb::TaskTemplate {
                    handler: "shard".into(),
                    broadcast: true,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect_err("a broadcast step");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("broadcast"),
        "{}",
        refused.message()
    );
    let all = api
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .workflows;
    assert_eq!(all.len(), 3, "the three broadcasts' workflows only");

    joiner.stop().await;
    stop_all(node, workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shard_fails_the_broadcast_and_a_cancel_stops_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (node, workers) = node_with(
        dir.path(),
        &[("h-a", &["hold", "shard"]), ("h-b", &["hold", "shard"])],
    )
    .await;
    let mut api = api(node.grpc_addr).await;

    // Shard 0 fails for good: the broadcast FAILED, shard 1 cancelled.
    let parent = submit_broadcast_of(&mut api, "hold", br#"{"fail":true}"#).await;
    let failed = wait_task_state(&api, &parent, pb::TaskState::Failed, LIMIT).await;
    assert!(
        failed.error_message.contains("shard 0 broke"),
        "{}",
        failed.error_message
    );
    let s = shards(&mut api, &parent).await;
    assert_eq!(
        s.iter().map(state).collect::<Vec<_>>(),
        [pb::TaskState::Failed, pb::TaskState::Cancelled]
    );

    // Cancelling a running broadcast cancels its shards (each told to stop).
    let held = submit_broadcast(&mut api, "hold").await;
    shards_in(&api, &held, 2, pb::TaskState::Running).await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: held.clone(),
        reason: "enough".into(),
        ..Default::default()
    })
    .await
    .expect("cancel the broadcast");
    let cancelled = wait_task_state(&api, &held, pb::TaskState::Cancelled, LIMIT).await;
    assert!(cancelled.broadcast);
    shards_in(&api, &held, 2, pb::TaskState::Cancelled).await;
    stop_all(node, workers).await;
}

/// A schedule whose template is a broadcast: every fire runs on both
/// workers, and the schedule shows the template's `broadcast`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_broadcast_runs_on_every_worker_at_each_fire() {
    let dir = tempfile::tempdir().unwrap();
    let (node, workers) = node_with(dir.path(), &[("s-a", &["shard"]), ("s-b", &["shard"])]).await;
    let mut api = api(node.grpc_addr).await;
    let mut def = taskmesh_testkit::schedule::every_second("shard");
    def.template.as_mut().unwrap().broadcast = true;
    let schedule = taskmesh_testkit::schedule::create_schedule(&mut api, def).await;
    let shown = api
        .get_schedule(pb::GetScheduleRequest {
            schedule_id: schedule.clone(),
            ..Default::default()
        })
        .await
        .expect("GetSchedule")
        .into_inner()
        .schedule
        .unwrap();
    assert!(shown.template.unwrap().broadcast);

    let fired = wait_for("two fires of the schedule ended", LIMIT, || {
        let mut api = api.clone();
        let schedule = schedule.clone();
        async move {
            let fired = fired_in(&mut api, &schedule, "shard", pb::TaskState::Succeeded).await;
            (fired.len() >= 2).then_some(fired)
        }
    })
    .await;
    taskmesh_testkit::schedule::pause_schedule(&mut api, &schedule).await;
    for t in &fired {
        assert!(t.broadcast, "{t:#?}");
        let out = outputs(&mut api, &t.task_id).await;
        let on: BTreeSet<&str> = out.iter().filter_map(|o| o.split('@').nth(1)).collect();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(on.len(), 2, "each fire ran on both workers: {out:?}");
    }
    stop_all(node, workers).await;
}

/// The bulk CancelTasks matching a broadcast and its shards cancels the
/// broadcast and sweeps its shards (never in one batch with it); a
/// broadcast whose payload is over 64 KiB is refused; a schedule with
/// overlap CANCEL_PREVIOUS cancels the previous broadcast's shards too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_and_overlap_cancels_reach_the_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (node, workers) = node_with(dir.path(), &[("c-a", &["hold"]), ("c-b", &["hold"])]).await;
    let mut api = api(node.grpc_addr).await;

    let held = submit_broadcast(&mut api, "hold").await;
    shards_in(&api, &held, 2, pb::TaskState::Running).await;
    let answer = api
        .cancel_tasks(pb::CancelTasksRequest {
            handler: "hold".into(),
            ..Default::default()
        })
        .await
        .expect("CancelTasks")
        .into_inner();
    assert_eq!((answer.matched, answer.cancelled), (3, 3), "{answer:?}");
    assert_eq!(state(&get(&mut api, &held).await), pb::TaskState::Cancelled);
    shards_in(&api, &held, 2, pb::TaskState::Cancelled).await;

    let big = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "hold".into(),
            payload: Some(pb::Payload {
                data: vec![b'x'; 70_000],
                content_type: "application/octet-stream".into(),
            }),
            broadcast: true,
            ..Default::default()
        })
        .await
        .expect_err("a broadcast of 70,000 bytes");
    assert_eq!(big.code(), tonic::Code::InvalidArgument);
    assert!(big.message().contains("each shard"), "{}", big.message());

    let mut def = taskmesh_testkit::schedule::every_second("hold");
    def.template.as_mut().unwrap().broadcast = true;
    def.overlap_policy = pb::OverlapPolicy::CancelPrevious as i32;
    let schedule = taskmesh_testkit::schedule::create_schedule(&mut api, def).await;
    let first = wait_for("a second fire cancelled the first", LIMIT, || {
        let mut api = api.clone();
        let schedule = schedule.clone();
        async move {
            let fired = fired_in(&mut api, &schedule, "hold", pb::TaskState::Cancelled).await;
            fired.into_iter().find(|t| t.broadcast)
        }
    })
    .await;
    taskmesh_testkit::schedule::pause_schedule(&mut api, &schedule).await;
    wait_for("the cancelled fire's shards cancelled", LIMIT, || {
        let mut api = api.clone();
        let id = first.task_id.clone();
        async move {
            let s = shards(&mut api, &id).await;
            (!s.is_empty() && s.iter().all(|t| state(t) == pb::TaskState::Cancelled)).then_some(())
        }
    })
    .await;
    // The last fire still holds its workers: cancel it so they can drain.
    api.cancel_tasks(pb::CancelTasksRequest {
        handler: "hold".into(),
        ..Default::default()
    })
    .await
    .expect("CancelTasks");
    stop_all(node, workers).await;
}
