//! The scheduler on a fake clock (no real waiting): misfire policies after
//! an hour of downtime, overlap policies, fixed delay, timeouts with retry,
//! stale reports, retries held by an open circuit breaker, and the orphan
//! sweep's registry grace after a lost lease term. Each test
//! drives `Scheduler::round` against a real SQLite store.

use std::sync::Arc;

use taskmesh_coord::{Coordinator, LocalCoordinator, WorkerEntry};
use taskmesh_core::breaker::{BreakerOptions, Breakers};
use taskmesh_core::schedule::{
    FireOutcome, MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord, TaskTemplate,
};
use taskmesh_core::{
    Event, FakeClock, NewTask, RetryPolicy, TaskRecord, TaskState, TransitionError, UnixMillis, id,
};
use taskmesh_scheduler::{Reaped, Scheduler, SchedulerOptions};
use taskmesh_store::{SqliteStore, Store, TaskFilter};
use tokio::sync::mpsc;

/// 2026-01-01T00:00:00Z.
const T0: UnixMillis = 1_767_225_600_000;
const SEC: i64 = 1_000;
const MIN: i64 = 60 * SEC;

fn worker_entry(worker_id: &str) -> WorkerEntry {
    WorkerEntry {
        push: false,
        session_id: format!("session-{worker_id}"),
        worker_id: worker_id.into(),
        namespace: "default".into(),
        owner: "open".into(),
        name: worker_id.into(),
        node_id: "n1".into(),
        handlers: vec!["echo".into(), "slow".into()],
        capacity: 8,
        labels: Default::default(),
        weight: 1,
        load: Default::default(),
        last_seen: T0,
        draining: false,
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    clock: FakeClock,
    scheduler: Scheduler,
    reaped: mpsc::Receiver<Reaped>,
    breakers: Breakers,
    coord: Arc<LocalCoordinator>,
    /// The scheduler's retention switch and tally.
    retention: Arc<taskmesh_scheduler::retention::RetentionControl>,
}

async fn fixture() -> Fixture {
    fixture_with(SchedulerOptions::default()).await
}

async fn fixture_with(opts: SchedulerOptions) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in(dir.path()).await.unwrap());
    let clock = FakeClock::new(T0);
    let coord = Arc::new(LocalCoordinator::with_clock("n1", Arc::new(clock.clone())));
    // The worker "w" that runs these tests' attempts is registered, as a
    // connected worker would be (the leader's orphan sweep checks).
    coord.put_worker(worker_entry("w")).await.unwrap();
    let (tx, reaped) = mpsc::channel(64);
    let retention = opts.retention_control.clone();
    let breakers = Breakers::new(BreakerOptions {
        window: 10,
        min_samples: 3,
        failure_threshold: 0.5,
        cool_down_ms: 30 * SEC,
        trial_wait_ms: SEC,
    });
    let scheduler = Scheduler::build(
        opts,
        store.clone(),
        coord.clone(),
        Arc::new(clock.clone()),
        breakers.clone(),
        tx,
    );
    Fixture {
        _dir: dir,
        store,
        clock,
        scheduler,
        reaped,
        breakers,
        coord,
        retention,
    }
}

impl Fixture {
    async fn round_at(&self, at: UnixMillis) {
        self.clock.set(at);
        self.scheduler.round().await.expect("round");
    }

    async fn schedule(
        &self,
        kind: ScheduleKind,
        cron: &str,
        misfire: MisfirePolicy,
        overlap: OverlapPolicy,
    ) -> ScheduleRecord {
        let mut s = ScheduleRecord {
            id: id::new_task_id(),
            namespace: taskmesh_core::validate::DEFAULT_NAMESPACE.into(),
            name: "test".into(),
            kind,
            cron_expression: cron.into(),
            interval_ms: 10 * SEC,
            time_zone: String::new(),
            template: TaskTemplate {
                handler: "echo".into(),
                payload: b"{}".to_vec(),
                content_type: "application/json".into(),
                priority: 0,
                labels: Default::default(),
                routing_key: String::new(),
                retry: RetryPolicy::default(),
                timeout_ms: 60 * SEC,
                callback_url: String::new(),
                balancer: None,
                concurrency: None,
                broadcast: false,
            },
            workflow: None,
            misfire,
            max_catch_up: 3,
            overlap,
            paused: false,
            next_fire_at: None,
            last_fire_at: None,
            last_task_id: None,
            fire_count: 0,
            skipped_count: 0,
            created_at: self.clock.now(),
            updated_at: self.clock.now(),
            version: 1,
        };
        s.next_fire_at = s.first_fire_after(self.clock.now()).unwrap();
        self.store.create_schedule(&s).await.unwrap();
        s
    }

    async fn tasks(&self) -> Vec<TaskRecord> {
        let mut t = self
            .store
            .list_tasks(&TaskFilter {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .tasks;
        t.reverse();
        t
    }

    async fn task(&self, id: &str) -> TaskRecord {
        self.store.get_task(id).await.unwrap().unwrap()
    }

    async fn step(&self, id: &str, event: Event) -> Result<TaskRecord, taskmesh_store::Error> {
        self.store.transition(id, &event, self.clock.now()).await
    }

    /// Dispatches and ACKs a READY task; returns its execution id.
    async fn start(&self, id: &str) -> String {
        let exec = id::new_execution_id();
        self.step(
            id,
            Event::Dispatch {
                execution_id: exec.clone(),
                worker_id: "w".into(),
                ack_deadline: self.clock.now() + 10 * SEC,
            },
        )
        .await
        .unwrap();
        self.step(
            id,
            Event::Ack {
                execution_id: exec.clone(),
                at: None,
            },
        )
        .await
        .unwrap();
        exec
    }
}

trait Now {
    fn now(&self) -> UnixMillis;
}
impl Now for FakeClock {
    fn now(&self) -> UnixMillis {
        taskmesh_core::Clock::now_millis(self)
    }
}

fn outcomes_of(fires: &[taskmesh_core::schedule::FireRecord]) -> Vec<FireOutcome> {
    let mut f: Vec<_> = fires.to_vec();
    f.sort_by_key(|f| f.fire_at);
    f.iter().map(|f| f.outcome).collect()
}

/// Every 5 minutes from T0; the scheduler is down for an hour, then one
/// round at T0 + 1 h + 2 s (the 60-minute fire is only 2 s late: on time).
async fn after_an_hour(policy: MisfirePolicy) -> (Fixture, ScheduleRecord) {
    let f = fixture().await;
    let s = f
        .schedule(
            ScheduleKind::Cron,
            "*/5 * * * *",
            policy,
            OverlapPolicy::Allow,
        )
        .await;
    f.round_at(T0 + 60 * MIN + 2 * SEC).await;
    (f, s)
}

#[tokio::test]
async fn misfire_fire_once_now_creates_one_task_for_the_missed_hour() {
    let (f, s) = after_an_hour(MisfirePolicy::FireOnceNow).await;
    let tasks = f.tasks().await;
    assert_eq!(tasks.len(), 1);
    let fires = f.store.recent_fires(&s.id, 100).await.unwrap();
    let outcomes = outcomes_of(&fires);
    assert_eq!(outcomes.len(), 12);
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == FireOutcome::SkippedMisfire)
            .count(),
        11
    );
    let stored = f.store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!((stored.fire_count, stored.skipped_count), (1, 11));
    assert_eq!(stored.next_fire_at, Some(T0 + 65 * MIN));
    assert_eq!(tasks[0].client_request_id, Some(s.fire_key(T0 + 60 * MIN)));
}

#[tokio::test]
async fn misfire_skip_drops_the_missed_hour() {
    let (f, s) = after_an_hour(MisfirePolicy::Skip).await;
    // Only the on-time 60-minute fire created a task.
    let tasks = f.tasks().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].client_request_id, Some(s.fire_key(T0 + 60 * MIN)));
    let stored = f.store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!((stored.fire_count, stored.skipped_count), (1, 11));
}

#[tokio::test]
async fn misfire_catch_up_fires_the_latest_missed_times_up_to_the_bound() {
    let (f, s) = after_an_hour(MisfirePolicy::CatchUp).await;
    let keys: Vec<_> = f
        .tasks()
        .await
        .into_iter()
        .map(|t| t.client_request_id.unwrap())
        .collect();
    let expected: Vec<_> = [50, 55, 60]
        .iter()
        .map(|m| s.fire_key(T0 + m * MIN))
        .collect();
    let mut keys_sorted = keys.clone();
    keys_sorted.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(keys_sorted, expected_sorted, "max_catch_up = 3");
    // Caught-up tasks never run before their own fire time or before now.
    for t in f.tasks().await {
        assert!(t.run_at >= T0 + 60 * MIN + 2 * SEC);
    }
}

#[tokio::test]
async fn overlap_allow_creates_while_the_previous_run_goes_on() {
    let f = fixture().await;
    let s = f
        .schedule(
            ScheduleKind::Cron,
            "* * * * * *",
            MisfirePolicy::Skip,
            OverlapPolicy::Allow,
        )
        .await;
    f.round_at(T0 + SEC).await;
    f.round_at(T0 + 2 * SEC).await;
    let tasks = f.tasks().await;
    assert_eq!(tasks.len(), 2);
    assert!(tasks.iter().all(|t| t.state == TaskState::Ready));
    assert_eq!(
        f.store
            .get_schedule(&s.id)
            .await
            .unwrap()
            .unwrap()
            .last_task_id,
        Some(tasks[1].id.clone())
    );
}

#[tokio::test]
async fn overlap_skip_records_the_skipped_fire() {
    let f = fixture().await;
    let s = f
        .schedule(
            ScheduleKind::Cron,
            "* * * * * *",
            MisfirePolicy::Skip,
            OverlapPolicy::Skip,
        )
        .await;
    f.round_at(T0 + SEC).await;
    f.round_at(T0 + 2 * SEC).await;
    assert_eq!(f.tasks().await.len(), 1);
    let fires = f.store.recent_fires(&s.id, 10).await.unwrap();
    assert_eq!(
        outcomes_of(&fires),
        [FireOutcome::Created, FireOutcome::SkippedOverlap]
    );
    // Once the run ends, the next fire creates again.
    let first = f.tasks().await.remove(0);
    let exec = f.start(&first.id).await;
    f.step(
        &first.id,
        Event::Succeed {
            execution_id: exec,
            output: vec![],
            content_type: String::new(),
        },
    )
    .await
    .unwrap();
    f.round_at(T0 + 3 * SEC).await;
    assert_eq!(f.tasks().await.len(), 2);
}

#[tokio::test]
async fn overlap_cancel_previous_cancels_the_running_run() {
    let mut f = fixture().await;
    let s = f
        .schedule(
            ScheduleKind::Cron,
            "* * * * * *",
            MisfirePolicy::Skip,
            OverlapPolicy::CancelPrevious,
        )
        .await;
    f.round_at(T0 + SEC).await;
    let first = f.tasks().await.remove(0);
    let exec = f.start(&first.id).await;
    f.round_at(T0 + 2 * SEC).await;
    assert_eq!(f.task(&first.id).await.state, TaskState::Cancelled);
    let tasks = f.tasks().await;
    assert_eq!(tasks.len(), 2);
    assert_eq!(tasks[1].state, TaskState::Ready);
    // The dispatcher is told, so the worker's handler gets the cancel.
    assert_eq!(
        f.reaped.try_recv().unwrap(),
        Reaped::Cancelled {
            task_id: first.id.clone(),
            execution_id: exec
        }
    );
    let fires = f.store.recent_fires(&s.id, 10).await.unwrap();
    assert_eq!(
        outcomes_of(&fires),
        [FireOutcome::Created, FireOutcome::CreatedCancelledPrevious]
    );
}

#[tokio::test]
async fn fixed_delay_waits_for_the_run_to_end() {
    let f = fixture().await;
    let s = f
        .schedule(
            ScheduleKind::FixedDelay,
            "",
            MisfirePolicy::FireOnceNow,
            OverlapPolicy::Allow,
        )
        .await;
    assert_eq!(s.next_fire_at, Some(T0 + 10 * SEC));
    f.round_at(T0 + 10 * SEC).await;
    let task = f.tasks().await.remove(0);
    assert_eq!(
        f.store
            .get_schedule(&s.id)
            .await
            .unwrap()
            .unwrap()
            .next_fire_at,
        None
    );
    // Still running at T0 + 25 s: nothing new.
    let exec = f.start(&task.id).await;
    f.round_at(T0 + 25 * SEC).await;
    assert_eq!(f.tasks().await.len(), 1);
    f.clock.set(T0 + 27 * SEC);
    f.step(
        &task.id,
        Event::Succeed {
            execution_id: exec,
            output: vec![],
            content_type: String::new(),
        },
    )
    .await
    .unwrap();
    f.round_at(T0 + 27 * SEC).await;
    assert_eq!(
        f.store
            .get_schedule(&s.id)
            .await
            .unwrap()
            .unwrap()
            .next_fire_at,
        Some(T0 + 37 * SEC),
        "one interval after the run ended"
    );
    f.round_at(T0 + 37 * SEC).await;
    assert_eq!(f.tasks().await.len(), 2);
}

async fn submit(f: &Fixture, timeout_ms: i64) -> TaskRecord {
    let task = NewTask {
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 2 * SEC,
            multiplier: 2.0,
            max_backoff_ms: 60 * SEC,
        },
        timeout_ms,
        ..NewTask::new("slow", f.clock.now())
    };
    f.store
        .create_task(task, "fp", f.clock.now())
        .await
        .unwrap()
        .task
}

#[tokio::test]
async fn timeout_cancels_then_retries_then_succeeds_and_stale_reports_are_refused() {
    let mut f = fixture().await;
    let t = submit(&f, 5 * SEC).await;
    let first = f.start(&t.id).await;
    f.round_at(T0 + 5 * SEC - 1).await;
    assert_eq!(
        f.task(&t.id).await.state,
        TaskState::Running,
        "not a millisecond early"
    );
    f.round_at(T0 + 5 * SEC).await;
    let after = f.task(&t.id).await;
    assert_eq!(after.state, TaskState::Retrying);
    assert_eq!(
        after.attempts[0].outcome,
        Some(taskmesh_core::AttemptOutcome::TimedOut)
    );
    assert_eq!(
        f.reaped.try_recv().unwrap(),
        Reaped::TimedOut {
            task_id: t.id.clone(),
            execution_id: first.clone()
        },
        "the worker is told to cancel"
    );
    // The late result of the timed-out attempt is refused.
    let late = f
        .step(
            &t.id,
            Event::Succeed {
                execution_id: first,
                output: vec![],
                content_type: String::new(),
            },
        )
        .await;
    assert!(
        matches!(
            late,
            Err(taskmesh_store::Error::Transition(
                TransitionError::IllegalState { .. }
            ))
        ),
        "{late:?}"
    );
    // Backoff (full jitter, at most 2 s), then READY again and a success.
    let retry_at = after.next_at.unwrap();
    assert!(retry_at <= T0 + 7 * SEC);
    f.round_at(retry_at).await;
    assert_eq!(f.task(&t.id).await.state, TaskState::Ready);
    let second = f.start(&t.id).await;
    f.step(
        &t.id,
        Event::Succeed {
            execution_id: second,
            output: b"ok".to_vec(),
            content_type: String::new(),
        },
    )
    .await
    .unwrap();
    let done = f.task(&t.id).await;
    assert_eq!(
        (done.state, done.run_count, done.attempts.len()),
        (TaskState::Succeeded, 2, 2)
    );
}

#[tokio::test]
async fn an_open_breaker_holds_retries_and_a_trial_success_releases_them() {
    let f = fixture().await;
    for _ in 0..3 {
        f.breakers.record("default", "slow", false, T0);
    }
    // Two tasks failed once and wait to retry.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let t = submit(&f, 60 * SEC).await;
        let exec = f.start(&t.id).await;
        f.step(
            &t.id,
            Event::Fail {
                execution_id: exec,
                message: "boom".into(),
                retryable: true,
                jitter: 0.0,
            },
        )
        .await
        .unwrap();
        ids.push(t.id);
    }
    f.round_at(T0 + SEC).await;
    for id in &ids {
        let t = f.task(id).await;
        assert_eq!(t.state, TaskState::Retrying, "held, not failed");
        assert_eq!(t.next_at, Some(T0 + 30 * SEC), "until the cool-down ends");
    }
    // Cool-down over: one trial goes, the other waits.
    f.round_at(T0 + 30 * SEC).await;
    let states: Vec<_> = [f.task(&ids[0]).await.state, f.task(&ids[1]).await.state].into();
    assert_eq!(
        states.iter().filter(|s| **s == TaskState::Ready).count(),
        1,
        "{states:?}"
    );
    f.breakers.record("default", "slow", true, T0 + 31 * SEC);
    f.round_at(T0 + 32 * SEC).await;
    for id in &ids {
        assert_eq!(f.task(id).await.state, TaskState::Ready);
    }
}

#[tokio::test]
async fn the_leader_takes_back_attempts_of_a_worker_gone_from_the_registry() {
    let f = fixture().await;
    let t = submit(&f, 600 * SEC).await;
    // Pushed to "ghost", a worker no replica holds a stream of.
    let exec = id::new_execution_id();
    f.step(
        &t.id,
        Event::Dispatch {
            execution_id: exec.clone(),
            worker_id: "ghost".into(),
            ack_deadline: T0 + 600 * SEC,
        },
    )
    .await
    .unwrap();
    f.step(
        &t.id,
        Event::Ack {
            execution_id: exec,
            at: None,
        },
    )
    .await
    .unwrap();
    // A moment after the push it is left alone (the registry may lag).
    f.round_at(T0 + SEC).await;
    assert_eq!(f.task(&t.id).await.state, TaskState::Running);
    // Later, long before its execution deadline, it is taken back.
    f.round_at(T0 + 10 * SEC).await;
    let back = f.task(&t.id).await;
    assert_eq!(back.state, TaskState::Ready);
    assert_eq!(
        back.attempts[0].outcome,
        Some(taskmesh_core::AttemptOutcome::WorkerLost)
    );
}

/// Redis restarted empty between two renewals: the leader's lease key and
/// the worker registry are gone, yet no call failed. The node leads again
/// in a new term; its orphan sweep must not take the registry's emptiness
/// for dead workers until live ones had `registry_grace` to heartbeat back —
/// and must still take back the attempts of a worker that never returns.
#[tokio::test]
async fn a_new_term_of_a_former_leader_waits_the_registry_grace_before_sweeping() {
    let f = fixture().await;
    let t = submit(&f, 10 * MIN).await;
    let exec = f.start(&t.id).await;
    f.round_at(T0 + 5 * SEC).await;
    assert_eq!(f.task(&t.id).await.state, TaskState::Running);

    // What a Redis restart loses: the lease key and the registry entry.
    f.coord.remove_worker("session-w").await.unwrap();
    f.coord.resign().await.unwrap();

    // Rounds every 3 s (renewing the new term) through the grace (15 s from
    // the new term at T0+11s): a sweep is due every 5 s, none may run.
    for at in [11, 14, 17, 20, 23] {
        f.round_at(T0 + at * SEC).await;
        assert_eq!(
            f.task(&t.id).await.state,
            TaskState::Running,
            "at T0+{at}s, inside the registry grace, the attempt of a worker missing \
             from a registry that may be refilling was taken back"
        );
    }
    // Past the grace the worker still has not come back: it is gone.
    f.round_at(T0 + 26 * SEC).await;
    f.round_at(T0 + 29 * SEC).await;
    let task = f.task(&t.id).await;
    assert_ne!(
        task.state,
        TaskState::Running,
        "a worker gone for good is swept after the grace"
    );
    let attempt = task
        .attempts
        .iter()
        .find(|a| a.execution_id == exec)
        .expect("the first attempt");
    assert!(
        format!("{:?}", attempt).contains("WorkerLost"),
        "the attempt ended WORKER_LOST: {attempt:?}"
    );
}

/// Retention on the leader's rounds: an ended task goes once it is older
/// than its state's horizon, not before; a live task never; a state without
/// a horizon keeps its tasks.
#[tokio::test]
async fn retention_removes_ended_tasks_past_their_horizon_and_nothing_else() {
    let f = fixture_with(SchedulerOptions {
        retention: taskmesh_scheduler::retention::Retention {
            cancelled: Some(std::time::Duration::from_secs(600)),
            succeeded: None,
            ..taskmesh_scheduler::retention::Retention::keep_all()
        },
        ..SchedulerOptions::default()
    })
    .await;
    let cancel = Event::Cancel {
        reason: "stop".into(),
    };
    let create = |at: UnixMillis| {
        let store = f.store.clone();
        async move {
            store
                .create_task(NewTask::new("echo", at), "fp", at)
                .await
                .unwrap()
                .task
        }
    };
    let early = create(T0).await;
    f.store.transition(&early.id, &cancel, T0).await.unwrap();
    let later = create(T0).await;
    f.store
        .transition(&later.id, &cancel, T0 + 5 * MIN)
        .await
        .unwrap();
    let live = create(T0 + 20 * MIN).await;
    let exists = |id: String| {
        let store = f.store.clone();
        async move { store.get_task(&id).await.unwrap().is_some() }
    };

    f.round_at(T0 + 9 * MIN).await;
    assert!(
        exists(early.id.clone()).await,
        "9 min after it ended: inside the 10 min horizon"
    );
    f.round_at(T0 + 11 * MIN).await;
    assert!(
        !exists(early.id.clone()).await,
        "11 min after it ended: removed"
    );
    assert!(exists(later.id.clone()).await, "6 min after it ended: kept");
    f.round_at(T0 + 16 * MIN).await;
    assert!(
        !exists(later.id.clone()).await,
        "11 min after it ended: removed"
    );
    f.round_at(T0 + 400 * 24 * 60 * MIN).await;
    let t = f
        .store
        .get_task(&live.id)
        .await
        .unwrap()
        .expect("the live task");
    assert!(
        !t.state.is_terminal(),
        "a task that has not ended is never removed"
    );
}

/// Creates `task` and ends it at T0: FAILED (dispatched to "w", ACKed,
/// failed for good) or CANCELLED; its id.
async fn end_at_t0(store: &Arc<dyn Store>, task: NewTask, fail: bool) -> String {
    let t = store.create_task(task, "fp", T0).await.unwrap().task;
    let exec = format!("exec-{}", t.id);
    let events = if fail {
        vec![
            Event::Dispatch {
                execution_id: exec.clone(),
                worker_id: "w".into(),
                ack_deadline: T0 + MIN,
            },
            Event::Ack {
                execution_id: exec.clone(),
                at: None,
            },
            Event::Fail {
                execution_id: exec,
                message: "planned".into(),
                retryable: false,
                jitter: 0.0,
            },
        ]
    } else {
        vec![Event::Cancel {
            reason: "stop".into(),
        }]
    };
    for event in &events {
        store.transition(&t.id, event, T0).await.unwrap();
    }
    let t = store.get_task(&t.id).await.unwrap().unwrap();
    assert!(t.state.is_terminal(), "{:?}", t.state);
    t.id
}

/// While one state drains a backlog a batch a pass, a state found with
/// nothing more to remove is not read again until `IDLE_PAUSE` later (its
/// newly eligible task waits that long), and the paused control stops
/// passes altogether and counts what went.
#[tokio::test]
async fn retention_rests_a_state_it_found_empty_while_another_drains() {
    use taskmesh_scheduler::retention::{IDLE_PAUSE, Retention};
    let ten_min = std::time::Duration::from_secs(600);
    let f = fixture_with(SchedulerOptions {
        retention: Retention {
            cancelled: Some(ten_min),
            failed: Some(ten_min),
            batch: 2,
            ..Retention::keep_all()
        },
        ..SchedulerOptions::default()
    })
    .await;
    let ended = |fail: bool| end_at_t0(&f.store, NewTask::new("echo", T0), fail);
    let exists = |id: String| {
        let store = f.store.clone();
        async move { store.get_task(&id).await.unwrap().is_some() }
    };
    let mut cancelled = Vec::new();
    for _ in 0..6 {
        cancelled.push(ended(false).await);
    }
    let first_failed = ended(true).await;
    let start = T0 + 11 * MIN;
    f.round_at(start).await;
    assert!(!exists(first_failed).await, "FAILED: past its horizon");
    let left = |ids: Vec<String>| async move {
        let mut n = 0;
        for id in ids {
            n += usize::from(exists(id).await);
        }
        n
    };
    assert_eq!(left(cancelled.clone()).await, 4, "a batch of 2 went");
    // A FAILED task past its horizon now, while CANCELLED still drains.
    let late_failed = ended(true).await;
    f.round_at(start + SEC).await;
    assert_eq!(left(cancelled.clone()).await, 2, "the next batch went");
    assert!(
        exists(late_failed.clone()).await,
        "FAILED was found empty a second ago: not read again yet"
    );
    // Paused: nothing goes, whatever is due.
    let control = f.retention.clone();
    let before = control.removed();
    control.set_paused(true);
    f.round_at(start + 2 * SEC).await;
    assert_eq!(left(cancelled.clone()).await, 2, "paused: no pass");
    assert_eq!(control.removed(), before);
    control.set_paused(false);
    let rested = start + IDLE_PAUSE.as_millis() as i64 + 2 * SEC;
    f.round_at(rested).await;
    assert!(
        !exists(late_failed).await,
        "FAILED read again once it had rested"
    );
    assert_eq!(left(cancelled).await, 0, "the last batch went");
    assert_eq!(control.removed(), before + 3, "two CANCELLED, one FAILED");
}

/// Horizons set for a namespace and for a handler (through the store, as
/// `Admin.SetRetention` does) decide over the server's on the leader's
/// rounds, also for a state the server keeps forever.
#[tokio::test]
async fn retention_follows_namespace_and_handler_horizons_on_the_fake_clock() {
    use taskmesh_core::retention::Horizons;
    let f = fixture_with(SchedulerOptions {
        retention: taskmesh_scheduler::retention::Retention {
            cancelled: Some(std::time::Duration::from_secs(600)),
            ..taskmesh_scheduler::retention::Retention::keep_all()
        },
        ..SchedulerOptions::default()
    })
    .await;
    let horizons = |state: TaskState, ms: i64| {
        let mut h = Horizons::default();
        h.set(state, Some(ms));
        h
    };
    // The namespace keeps CANCELLED tasks 30 min; its handler "brief" 2 min;
    // the server keeps FAILED forever, but "brief" only 1 min.
    f.store
        .set_retention("long", "", &horizons(TaskState::Cancelled, 30 * MIN))
        .await
        .unwrap();
    let mut brief = horizons(TaskState::Cancelled, 2 * MIN);
    brief.set(TaskState::Failed, Some(MIN));
    f.store
        .set_retention("long", "brief", &brief)
        .await
        .unwrap();
    let ended = |namespace: &'static str, handler: &'static str, fail: bool| {
        let task = NewTask {
            namespace: namespace.into(),
            ..NewTask::new(handler, T0)
        };
        end_at_t0(&f.store, task, fail)
    };
    let plain = ended("default", "echo", false).await;
    let long = ended("long", "echo", false).await;
    let quick = ended("long", "brief", false).await;
    let quick_failed = ended("long", "brief", true).await;
    let other_failed = ended("long", "echo", true).await;
    let exists = |id: &String| {
        let store = f.store.clone();
        let id = id.clone();
        async move { store.get_task(&id).await.unwrap().is_some() }
    };

    f.round_at(T0 + 3 * MIN).await;
    assert!(!exists(&quick).await, "the handler's 2 min passed");
    assert!(
        !exists(&quick_failed).await,
        "FAILED: the handler's 1 min passed"
    );
    assert!(exists(&plain).await && exists(&long).await);
    f.round_at(T0 + 11 * MIN).await;
    assert!(!exists(&plain).await, "the server's 10 min passed");
    assert!(exists(&long).await, "the namespace keeps it 30 min");
    f.round_at(T0 + 31 * MIN).await;
    assert!(!exists(&long).await, "the namespace's 30 min passed");
    f.round_at(T0 + 400 * 24 * 60 * MIN).await;
    assert!(
        exists(&other_failed).await,
        "FAILED without a horizon anywhere: kept"
    );
}

/// Fire history beyond a schedule's newest `fire_history` records is
/// trimmed by the leader's retention pass, the newest kept.
#[tokio::test]
async fn retention_trims_fire_history_to_the_newest_records() {
    let f = fixture_with(SchedulerOptions {
        retention: taskmesh_scheduler::retention::Retention {
            fire_history: 5,
            ..taskmesh_scheduler::retention::Retention::keep_all()
        },
        ..SchedulerOptions::default()
    })
    .await;
    let s = f
        .schedule(
            ScheduleKind::Cron,
            "*/5 * * * *",
            MisfirePolicy::FireOnceNow,
            OverlapPolicy::Allow,
        )
        .await;
    // An hour down: 12 fire records (1 created, 11 skipped) in one round,
    // whose retention pass trims them to the newest 5.
    f.round_at(T0 + 60 * MIN + 2 * SEC).await;
    let stored = f.store.get_schedule(&s.id).await.unwrap().unwrap();
    assert_eq!(stored.fire_count + stored.skipped_count, 12);
    let mut kept: Vec<UnixMillis> = f
        .store
        .recent_fires(&s.id, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.fire_at)
        .collect();
    kept.sort_unstable();
    let newest: Vec<UnixMillis> = (8..=12).map(|k| T0 + k * 5 * MIN).collect();
    assert_eq!(kept, newest, "the newest five fire records are kept");
}
