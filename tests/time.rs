//! Time end to end over real gRPC with the real clock: a schedule firing
//! every second, the misfire policy across a SIGKILL of `serve`, execution
//! timeouts reaching the handler, and cancels reaching a running handler.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use taskmesh::v1 as pb;
use taskmesh_worker::{HandlerError, Output, TaskContext, Worker, WorkerOptions, handler_fn};
use tokio_util::sync::CancellationToken;

fn every_second(handler: &str, misfire: pb::MisfirePolicy) -> pb::CreateScheduleRequest {
    pb::CreateScheduleRequest {
        schedule: Some(pb::Schedule {
            kind: pb::ScheduleKind::Cron as i32,
            cron_expression: "* * * * * *".into(),
            time_zone: "Europe/London".into(),
            misfire_policy: misfire as i32,
            template: Some(pb::TaskTemplate {
                handler: handler.into(),
                payload: Some(pb::Payload {
                    data: b"{}".to_vec(),
                    content_type: "application/json".into(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
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
async fn a_schedule_every_second_for_ten_seconds_yields_ten_tasks_each_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_worker(&[node.grpc_addr], "w", 4, ledger.clone());
    assert!(w.handle.wait_connected(Duration::from_secs(10)).await);

    let created = api
        .create_schedule(every_second("echo", pb::MisfirePolicy::Skip))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    // The subject of the test is elapsed time: let ten seconds pass.
    tokio::time::sleep(Duration::from_secs(10)).await;
    api.pause_schedule(pb::PauseScheduleRequest {
        schedule_id: created.schedule_id.clone(),
    })
    .await
    .unwrap();

    let tasks = tasks_of(&mut api, &created.schedule_id).await;
    assert!(
        (9..=11).contains(&tasks.len()),
        "10 ± 1 tasks, got {}",
        tasks.len()
    );
    let keys: std::collections::HashSet<_> =
        tasks.iter().map(|t| t.client_request_id.clone()).collect();
    assert_eq!(keys.len(), tasks.len(), "no fire time produced two tasks");
    for t in &tasks {
        let t = wait_for("the fired task to succeed", Duration::from_secs(20), || {
            let mut api = api.clone();
            let id = t.task_id.clone();
            async move {
                let t = get(&mut api, &id).await;
                (state(&t) == pb::TaskState::Succeeded).then_some(t)
            }
        })
        .await;
        assert_eq!(ledger.count(&t.task_id), 1, "task {} ran once", t.task_id);
        let fire_ms =
            t.run_at.unwrap().seconds * 1_000 + i64::from(t.run_at.unwrap().nanos) / 1_000_000;
        let started = t.attempts[0].start_time.unwrap();
        let start_ms = started.seconds * 1_000 + i64::from(started.nanos) / 1_000_000;
        assert!(start_ms >= fire_ms, "dispatched before its fire time");
    }
    let got = api
        .get_schedule(pb::GetScheduleRequest {
            schedule_id: created.schedule_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.schedule.unwrap().fire_count as usize, tasks.len());
    w.shutdown.cancel();
    let _ = w.join.await;
    node.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_serve_applies_the_misfire_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], grpc).into();
    let flags = ["--misfire-threshold", "1500ms"];
    let mut server = spawn_server(dir.path(), grpc, http, &flags).await;
    let mut api = api(addr).await;
    let skip = api
        .create_schedule(every_second("nobody", pb::MisfirePolicy::Skip))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    let once = api
        .create_schedule(every_second("nobody", pb::MisfirePolicy::FireOnceNow))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    wait_for("two fires before the kill", Duration::from_secs(10), || {
        let mut api = api.clone();
        let id = skip.schedule_id.clone();
        async move {
            let s = api
                .get_schedule(pb::GetScheduleRequest { schedule_id: id })
                .await
                .ok()?
                .into_inner();
            (s.schedule?.fire_count >= 2).then_some(())
        }
    })
    .await;

    server.kill();
    let down_at = std::time::Instant::now();
    // Downtime is the subject here: long enough for several missed fires
    // beyond the 1.5 s misfire threshold.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _server = spawn_server(dir.path(), grpc, http, &flags).await;
    let api = common::api(addr).await;

    let fires_of = |id: String| {
        let mut api = api.clone();
        async move {
            api.get_schedule(pb::GetScheduleRequest { schedule_id: id })
                .await
                .unwrap()
                .into_inner()
                .recent_fires
        }
    };
    // SKIP: the missed times are recorded as skipped, no task for them.
    let skipped = wait_for(
        "misfires recorded for the SKIP schedule",
        Duration::from_secs(10),
        || {
            let f = fires_of(skip.schedule_id.clone());
            async move {
                let fires = f.await;
                let n = fires
                    .iter()
                    .filter(|f| f.outcome == pb::FireOutcome::SkippedMisfire as i32)
                    .count();
                (n >= 2).then_some(fires)
            }
        },
    )
    .await;
    for f in skipped
        .iter()
        .filter(|f| f.outcome == pb::FireOutcome::SkippedMisfire as i32)
    {
        assert!(f.task_id.is_empty(), "a skipped fire created no task");
    }
    // FIRE_ONCE_NOW: one task stands for all the missed times.
    let fires = wait_for(
        "the FIRE_ONCE_NOW schedule to catch up",
        Duration::from_secs(10),
        || {
            let f = fires_of(once.schedule_id.clone());
            async move {
                let fires = f.await;
                fires
                    .iter()
                    .any(|f| f.outcome == pb::FireOutcome::SkippedMisfire as i32)
                    .then_some(fires)
            }
        },
    )
    .await;
    let restart_ms = {
        let elapsed = down_at.elapsed().as_millis() as i64;
        chrono_now_ms() - elapsed
    };
    let created_after_restart: Vec<_> = fires
        .iter()
        .filter(|f| f.outcome == pb::FireOutcome::Created as i32)
        .filter(|f| {
            let h = f.handled_time.unwrap();
            h.seconds * 1_000 + i64::from(h.nanos / 1_000_000) > restart_ms
        })
        .collect();
    assert!(
        !created_after_restart.is_empty(),
        "fire-once-now created a task on restart"
    );
    let missed = fires
        .iter()
        .filter(|f| f.outcome == pb::FireOutcome::SkippedMisfire as i32)
        .count();
    assert!(
        missed >= 2,
        "the missed times were folded into one fire: {missed} skipped"
    );
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
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
    let handle = worker.handle();
    let stop = CancellationToken::new();
    let join = tokio::spawn(worker.run(stop.clone()));
    assert!(handle.wait_connected(Duration::from_secs(10)).await);

    // Cancel while running: the handler's token fires.
    let id = submit(&mut api, "block", b"{}").await;
    wait_for("the task to run", Duration::from_secs(10), || {
        let mut api = api.clone();
        let id = id.clone();
        async move { (state(&get(&mut api, &id).await) == pb::TaskState::Running).then_some(()) }
    })
    .await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: id.clone(),
        reason: "stop".into(),
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
    let t = wait_for(
        "the task to time out for good",
        Duration::from_secs(20),
        || {
            let mut api = api.clone();
            let id = resp.task_id.clone();
            async move {
                let t = get(&mut api, &id).await;
                (state(&t) == pb::TaskState::TimedOut).then_some(t)
            }
        },
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
    stop.cancel();
    let _ = join.await;
    node.stop(Duration::from_secs(5)).await;
}
