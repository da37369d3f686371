//! One conformance suite for both trigger engines. What every engine must do:
//! - never fire anything before its instant (checked on every item);
//! - fire within its granularity (poll: one interval; wheel: about a
//!   millisecond), with slack for a shared, noisy machine: these bounds
//!   catch an engine that misses items, not one that is slow (lateness is
//!   measured by `taskmesh bench --scenario cron`);
//! - see items created after it started, and stop firing deleted schedules
//!   (checked with a marker due after the next fire time: no quiet period).
//!
//! It runs on the real clock: tokio's paused clock advances whenever the
//! runtime idles, which it does while SQLite I/O runs on its own thread, so
//! fake time would race ahead of the store. The round logic itself is
//! covered on a fake clock in `time.rs`.

use std::sync::Arc;
use std::time::Duration;

use taskmesh_coord::LocalCoordinator;
use taskmesh_core::breaker::Breakers;
use taskmesh_core::schedule::{
    MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord, TaskTemplate,
};
use taskmesh_core::{Clock, NewTask, RetryPolicy, SystemClock, TaskState, UnixMillis, id};
use taskmesh_scheduler::{EngineKind, Scheduler, SchedulerOptions};
use taskmesh_store::{SqliteStore, Store, TaskFilter};
use taskmesh_testkit::wait_for;
use tokio_util::sync::CancellationToken;

const POLL: Duration = Duration::from_millis(100);
/// Slack for a shared 2-core machine running other tests at the same time.
const SLACK_MS: i64 = 250;

struct Run {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    clock: SystemClock,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<()>,
}

async fn start(kind: EngineKind) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in(dir.path()).await.unwrap());
    let clock = SystemClock;
    let coord = Arc::new(LocalCoordinator::with_clock("n1", Arc::new(clock)));
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let opts = SchedulerOptions {
        engine: kind,
        poll_interval: POLL,
        wheel_horizon: Duration::from_secs(60),
        ..Default::default()
    };
    let scheduler = Scheduler::build(
        opts,
        store.clone(),
        coord,
        Arc::new(clock),
        Breakers::default(),
        tx,
    );
    let shutdown = CancellationToken::new();
    let join = tokio::spawn(scheduler.run(shutdown.clone()));
    Run {
        _dir: dir,
        store,
        clock,
        shutdown,
        join,
    }
}

fn delayed(run_at: UnixMillis) -> NewTask {
    NewTask::new("echo", run_at)
}

fn every_second(clock: &SystemClock) -> ScheduleRecord {
    let now = clock.now_millis();
    let mut s = ScheduleRecord {
        id: id::new_task_id(),
        name: String::new(),
        kind: ScheduleKind::Cron,
        cron_expression: "* * * * * *".into(),
        interval_ms: 0,
        time_zone: "Asia/Kolkata".into(),
        template: TaskTemplate {
            handler: "echo".into(),
            payload: vec![],
            content_type: String::new(),
            priority: 0,
            labels: Default::default(),
            routing_key: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: 60_000,
            callback_url: String::new(),
            balancer: None,
            concurrency: None,
            broadcast: false,
        },
        workflow: None,
        misfire: MisfirePolicy::Skip,
        max_catch_up: 0,
        overlap: OverlapPolicy::Allow,
        paused: false,
        next_fire_at: None,
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: now,
        updated_at: now,
        version: 1,
        namespace: taskmesh_core::validate::DEFAULT_NAMESPACE.into(),
    };
    s.next_fire_at = s.first_fire_after(now).unwrap();
    s
}

async fn conformance(kind: EngineKind, granularity_ms: i64) {
    let run = start(kind).await;
    let store = run.store.clone();
    let now = run.clock.now_millis();

    // Delayed tasks, some due before others, one created after start-up.
    let mut tasks = Vec::new();
    for offset in [100, 300, 600, 1_500] {
        let t = store
            .create_task(delayed(now + offset), "fp", now)
            .await
            .unwrap()
            .task;
        tasks.push(t);
    }
    let schedule = every_second(&run.clock);
    store.create_schedule(&schedule).await.unwrap();

    wait_for(
        "the first three delayed tasks to be READY",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            let ids: Vec<_> = tasks[..3].iter().map(|t| t.id.clone()).collect();
            async move {
                for id in ids {
                    if store.get_task(&id).await.unwrap().unwrap().state != TaskState::Ready {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    let late_comer = {
        let at = run.clock.now_millis() + 300;
        store
            .create_task(delayed(at), "fp", run.clock.now_millis())
            .await
            .unwrap()
            .task
    };
    tasks.push(late_comer.clone());
    wait_for(
        "the task created after start-up to be READY",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            let id = late_comer.id.clone();
            async move {
                (store.get_task(&id).await.unwrap().unwrap().state == TaskState::Ready)
                    .then_some(())
            }
        },
    )
    .await;
    wait_for("the last task to be READY", Duration::from_secs(10), || {
        let store = store.clone();
        let id = tasks[3].id.clone();
        async move {
            (store.get_task(&id).await.unwrap().unwrap().state == TaskState::Ready).then_some(())
        }
    })
    .await;
    for t in &tasks {
        let t = store.get_task(&t.id).await.unwrap().unwrap();
        let ready = t.times.ready.unwrap();
        let lateness = ready - t.run_at;
        assert!(
            lateness >= 0,
            "{}: task READY {} ms early",
            kind.as_str(),
            -lateness
        );
        assert!(
            lateness <= granularity_ms,
            "{}: task READY {lateness} ms late (granularity {granularity_ms} ms)",
            kind.as_str()
        );
    }

    // The schedule fires every second, never early, and stops once deleted.
    wait_for(
        "three fires of the schedule",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            let id = schedule.id.clone();
            async move { (store.recent_fires(&id, 10).await.unwrap().len() >= 3).then_some(()) }
        },
    )
    .await;
    let fires = store.recent_fires(&schedule.id, 1_000).await.unwrap();
    for f in &fires {
        let lateness = f.handled_at - f.fire_at;
        assert!(
            lateness >= 0,
            "{}: fire handled {} ms early",
            kind.as_str(),
            -lateness
        );
        assert!(
            lateness <= granularity_ms,
            "{}: fire {lateness} ms late",
            kind.as_str()
        );
        assert_eq!(f.fire_at % 1_000, 0, "fires on whole seconds");
    }
    assert!(store.delete_schedule(&schedule.id).await.unwrap());
    let fired = |store: Arc<dyn Store>| {
        let id = schedule.id.clone();
        async move {
            store
                .list_tasks(&TaskFilter {
                    limit: 1_000,
                    ..Default::default()
                })
                .await
                .unwrap()
                .tasks
                .iter()
                .filter(|t| t.schedule_id.as_deref() == Some(id.as_str()))
                .count()
        }
    };
    let before = fired(store.clone()).await;
    // Negative check without a quiet period: a marker task due after the
    // next whole second (the schedule's next fire time) plus the engine's
    // granularity. Both engines handle items in time order, so once the
    // marker is READY that fire time has been handled too.
    let now = run.clock.now_millis();
    let next_second = (now / 1_000 + 1) * 1_000;
    let marker = store
        .create_task(delayed(next_second + granularity_ms), "fp", now)
        .await
        .unwrap()
        .task;
    wait_for(
        "the marker after the next fire time to be READY",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            let id = marker.id.clone();
            async move {
                (store.get_task(&id).await.unwrap().unwrap().state == TaskState::Ready)
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        fired(store.clone()).await,
        before,
        "a deleted schedule does not fire"
    );

    run.shutdown.cancel();
    run.join.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_polling_engine_conforms() {
    conformance(EngineKind::Poll, POLL.as_millis() as i64 + SLACK_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timing_wheel_conforms() {
    conformance(EngineKind::Wheel, SLACK_MS).await;
}
