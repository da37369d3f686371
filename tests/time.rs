//! Time end to end over real gRPC with the real clock: a schedule firing
//! every second, execution timeouts reaching the handler, and cancels
//! reaching a running handler. (The misfire policy across a SIGKILL of
//! `serve` runs the binary: `crates/cli/tests/restart.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use taskmesh_testkit::schedule::every_second;
use taskmesh_testkit::*;
use taskmesh_worker::{HandlerError, Output, TaskContext, Worker, WorkerOptions, handler_fn};
use tonic::transport::Channel;

/// A schedule every second (Europe/London) of `handler` with `misfire`.
fn every_second_with(handler: &str, misfire: pb::MisfirePolicy) -> pb::CreateScheduleRequest {
    let base = every_second(handler);
    pb::CreateScheduleRequest {
        schedule: Some(pb::Schedule {
            time_zone: "Europe/London".into(),
            misfire_policy: misfire as i32,
            template: Some(pb::TaskTemplate {
                payload: Some(pb::Payload {
                    data: b"{}".to_vec(),
                    content_type: "application/json".into(),
                }),
                ..base.template.clone().unwrap()
            }),
            ..base
        }),
        ..Default::default()
    }
}

async fn tasks_of(
    api: &mut taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
    schedule_id: &str,
) -> Vec<pb::Task> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = api
            .list_tasks(pb::ListTasksRequest {
                page_size: 1_000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        out.extend(
            page.tasks
                .into_iter()
                .filter(|t| t.schedule_id == schedule_id),
        );
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_every_second_yields_one_task_per_second_each_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_worker(&[node.grpc_addr], "w", 4, ledger.clone());
    assert!(w.handle.wait_connected(Duration::from_secs(10)).await);

    let created = api
        .create_schedule(every_second_with("echo", pb::MisfirePolicy::Skip))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    // Ten fires, counted by the schedule itself; then no more.
    let schedule = |api: &TaskApiClient<Channel>| {
        let (mut api, id) = (api.clone(), created.schedule_id.clone());
        async move {
            api.get_schedule(pb::GetScheduleRequest {
                schedule_id: id,
                ..Default::default()
            })
            .await
            .expect("get the schedule")
            .into_inner()
        }
    };
    wait_for("ten fires", Duration::from_secs(30), || async {
        (schedule(&api).await.schedule?.fire_count >= 10).then_some(())
    })
    .await;
    api.pause_schedule(pb::PauseScheduleRequest {
        schedule_id: created.schedule_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();

    let got = schedule(&api).await;
    let fire_count = got.schedule.as_ref().unwrap().fire_count as usize;
    let tasks = tasks_of(&mut api, &created.schedule_id).await;
    assert!(fire_count >= 10, "{fire_count} fires");
    assert_eq!(tasks.len(), fire_count, "one task per fire");
    // The fire times are distinct, consecutive whole seconds: none skipped,
    // none doubled.
    let mut fired: Vec<i64> = got
        .recent_fires
        .iter()
        .map(|f| {
            assert_eq!(f.outcome, pb::FireOutcome::Created as i32, "{f:?}");
            let t = f.fire_time.unwrap();
            assert_eq!(t.nanos, 0, "a whole second: {f:?}");
            t.seconds
        })
        .collect();
    fired.sort_unstable();
    assert_eq!(fired.len(), fire_count, "every fire is recorded: {fired:?}");
    for pair in fired.windows(2) {
        assert_eq!(pair[1] - pair[0], 1, "consecutive seconds: {fired:?}");
    }
    let keys: std::collections::HashSet<_> =
        tasks.iter().map(|t| t.client_request_id.clone()).collect();
    assert_eq!(keys.len(), tasks.len(), "no fire time produced two tasks");
    let mut at_fire = 0;
    for t in &tasks {
        let t = wait_task_state(
            &api,
            &t.task_id,
            pb::TaskState::Succeeded,
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(ledger.count(&t.task_id), 1, "task {} ran once", t.task_id);
        let fire_ms =
            t.run_at.unwrap().seconds * 1_000 + i64::from(t.run_at.unwrap().nanos) / 1_000_000;
        let started = t.attempts[0].start_time.unwrap();
        let start_ms = started.seconds * 1_000 + i64::from(started.nanos) / 1_000_000;
        assert!(start_ms >= fire_ms, "dispatched before its fire time");
        // Claimed for the worker in the fire's own commit: the attempt
        // starts at the instant the fire was handled (a claim after the
        // commit stamps a later one).
        let fire = got
            .recent_fires
            .iter()
            .find(|f| f.task_id == t.task_id)
            .expect("the task's fire");
        if fire.handled_time == Some(started) {
            at_fire += 1;
        }
    }
    // The first fire or two may find the handler not yet known to have
    // nothing READY (its task then waits for the dispatcher's claim).
    assert!(
        at_fire + 2 >= tasks.len(),
        "{at_fire} of {} tasks dispatched in their fire's commit",
        tasks.len()
    );
    let got = api
        .get_schedule(pb::GetScheduleRequest {
            schedule_id: created.schedule_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.schedule.unwrap().fire_count as usize,
        tasks.len(),
        "no fire after the pause"
    );
    w.stop().await;
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_the_running_handler_and_a_timeout_retries_then_ends() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;

    let saw_cancel = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU32::new(0));
    let mut opts = WorkerOptions::new(vec![format!("http://{}", node.grpc_addr)]);
    opts.worker_id = "w".into();
    let flag = saw_cancel.clone();
    let counter = runs.clone();
    let worker = Worker::new(opts).handler(
        "block",
        handler_fn(move |ctx: TaskContext| {
            let flag = flag.clone();
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                ctx.cancelled().await;
                flag.store(true, Ordering::SeqCst);
                Err::<Output, _>(HandlerError::retryable("cancelled"))
            }
        }),
    );
    let worker = TestWorker::spawn(worker);
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

    // Cancel while running: the handler's token fires.
    let id = submit(&mut api, "block", b"{}").await;
    wait_task_state(&api, &id, pb::TaskState::Running, Duration::from_secs(10)).await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: id.clone(),
        reason: "stop".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let flag = saw_cancel.clone();
    wait_for(
        "the handler to see the cancel",
        Duration::from_secs(10),
        || {
            let flag = flag.clone();
            async move { flag.load(Ordering::SeqCst).then_some(()) }
        },
    )
    .await;
    assert_eq!(state(&get(&mut api, &id).await), pb::TaskState::Cancelled);

    // Timeout: each attempt is cancelled at its deadline, retried, then the task ends TIMED_OUT.
    runs.store(0, Ordering::SeqCst);
    let resp = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "block".into(),
            timeout: Some(prost_types::Duration {
                seconds: 0,
                nanos: 300_000_000,
            }),
            retry_policy: Some(pb::RetryPolicy {
                max_attempts: 2,
                initial_backoff: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 100_000_000,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let t = wait_task_state(
        &api,
        &resp.task_id,
        pb::TaskState::TimedOut,
        Duration::from_secs(20),
    )
    .await;
    let outcomes: Vec<i32> = t.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        vec![pb::AttemptOutcome::TimedOut as i32; 2],
        "{t:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "two runs, each cancelled at its deadline"
    );
    worker.stop().await;
    stop_node(node).await;
}
