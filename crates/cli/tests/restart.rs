//! Restarts of `taskmesh serve` as a real process (the binary built from
//! this code): SIGKILL, then start again on the same data directory. Every
//! task is kept and the attempts that were running are taken back and
//! finish after the restart; the schedules' misfire policies apply to the
//! fire times missed while it was down.

use std::net::SocketAddr;
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_testkit::process::spawn_server;
use taskmesh_testkit::schedule::every_second;
use taskmesh_testkit::*;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");

/// A schedule every second of `handler` with `misfire` (Europe/London).
fn every_second_with(handler: &str, misfire: pb::MisfirePolicy) -> pb::CreateScheduleRequest {
    pb::CreateScheduleRequest {
        schedule: Some(pb::Schedule {
            time_zone: "Europe/London".into(),
            misfire_policy: misfire as i32,
            ..every_second(handler)
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_keeps_every_task_and_finishes_the_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let addr: SocketAddr = ([127, 0, 0, 1], grpc).into();
    let mut server = spawn_server(BIN.as_ref(), dir.path(), (grpc, http), &[], &[]).await;
    let mut api = api(addr).await;

    let ledger = Ledger::default();
    let worker = counting_worker(&[addr], "w", 4, ledger.clone());
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

    let mut running = Vec::new();
    for _ in 0..2 {
        running.push(submit(&mut api, "sleep", br#"{"ms":1500}"#).await);
    }
    let mut delayed = Vec::new();
    for _ in 0..10 {
        let r = api
            .submit_task(pb::SubmitTaskRequest {
                handler: "echo".into(),
                delay: Some(prost_types::Duration {
                    seconds: 2,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        delayed.push(r.task_id);
    }
    for id in &running {
        wait_task_state(&api, id, pb::TaskState::Running, Duration::from_secs(20)).await;
    }

    server.kill();
    let _server = spawn_server(BIN.as_ref(), dir.path(), (grpc, http), &[], &[]).await;
    let mut api = taskmesh_testkit::api(addr).await;

    for id in running.iter().chain(&delayed) {
        let t = wait_task_state(&api, id, pb::TaskState::Succeeded, Duration::from_secs(60)).await;
        if running.contains(id) {
            assert_eq!(
                t.attempts[0].outcome,
                pb::AttemptOutcome::WorkerLost as i32,
                "the interrupted attempt is recorded: {t:?}"
            );
            assert!(t.attempts.len() >= 2);
        }
    }
    let listed = api
        .list_tasks(pb::ListTasksRequest {
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks
        .len();
    assert_eq!(listed, 12, "no task lost or duplicated across the restart");
    for id in &delayed {
        assert_eq!(ledger.count(id), 1, "delayed task {id} ran once");
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_serve_applies_the_misfire_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], grpc).into();
    let flags = ["--misfire-threshold", "1500ms"];
    let mut server = spawn_server(BIN.as_ref(), dir.path(), (grpc, http), &flags, &[]).await;
    let mut api = api(addr).await;
    let skip = api
        .create_schedule(every_second_with("nobody", pb::MisfirePolicy::Skip))
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    let once = api
        .create_schedule(every_second_with("nobody", pb::MisfirePolicy::FireOnceNow))
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
                .get_schedule(pb::GetScheduleRequest {
                    schedule_id: id,
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            (s.schedule?.fire_count >= 2).then_some(())
        }
    })
    .await;

    server.kill();
    let down_at = std::time::Instant::now();
    // Not a synchronisation: the downtime is this test's input, long enough
    // for several missed fires beyond the 1.5 s misfire threshold (nothing
    // runs meanwhile that could be waited for).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _server = spawn_server(BIN.as_ref(), dir.path(), (grpc, http), &flags, &[]).await;
    let api = taskmesh_testkit::api(addr).await;

    let fires_of = |id: String| {
        let mut api = api.clone();
        async move {
            api.get_schedule(pb::GetScheduleRequest {
                schedule_id: id,
                ..Default::default()
            })
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
        now_ms() - elapsed
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
