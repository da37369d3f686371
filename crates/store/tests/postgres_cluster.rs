//! Postgres as a cluster's store: several stores (two pools, as two
//! replicas would have) on one schema. Claims never overlap, changes one
//! replica commits reach the other's subscribers by LISTEN/NOTIFY (also
//! after the notification connection is lost), the store clock follows the
//! database, and bad options or an absent server are clear errors.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use taskmesh_core::id::new_execution_id;
use taskmesh_core::{Clock, Event, FakeClock, NewTask, RetryPolicy, TaskState};
use taskmesh_store::postgres::scratch::ScratchSchema;
use taskmesh_store::{
    Claim, Error, PostgresOptions, PostgresStore, ScheduleChange, Store, StoreClock, TaskChange,
};
use tokio::sync::broadcast::{self, error::RecvError};

const T0: i64 = 1_700_000_000_000;

fn task(handler: &str) -> NewTask {
    NewTask {
        id: taskmesh_core::id::new_task_id(),
        handler: handler.into(),
        payload: b"{}".to_vec(),
        content_type: "application/json".into(),
        priority: 0,
        labels: Default::default(),
        routing_key: String::new(),
        client_request_id: None,
        callback_url: String::new(),
        retry: RetryPolicy::default(),
        timeout_ms: 60_000,
        run_at: T0,
        traceparent: String::new(),
        balancer: None,
        schedule_id: None,
    }
}

async fn schema() -> ScratchSchema {
    ScratchSchema::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn replica(schema: &ScratchSchema) -> Arc<PostgresStore> {
    Arc::new(
        PostgresStore::connect(schema.options())
            .await
            .unwrap_or_else(|err| panic!("connect: {err}")),
    )
}

/// Polls `check` until it returns `Some`, failing the test after `limit`.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        // Polling interval of a condition with a deadline, not a synchronisation sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next change naming `id`, skipping others (and resync markers).
async fn change_of(rx: &mut broadcast::Receiver<TaskChange>, id: &str) -> TaskChange {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await {
                Ok(c) if c.task_id == id => return c,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("change channel closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no change of task {id} within 10 s"))
}

/// Four claimers on two replicas drain 600 tasks; no task is claimed
/// twice and every one is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_claiming_at_once_never_double_claim() {
    let schema = schema().await;
    let (a, b) = (replica(&schema).await, replica(&schema).await);
    let mut all = BTreeSet::new();
    for i in 0..600 {
        let store = if i % 2 == 0 { &a } else { &b };
        let t = NewTask {
            priority: i % 3,
            ..task("race")
        };
        all.insert(
            store
                .create_task(t, "fp", T0)
                .await
                .expect("create")
                .task
                .id,
        );
    }
    let claimer = |store: Arc<PostgresStore>, worker: &'static str| {
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for round in 0..10_000 {
                let got = store
                    .claim_ready("race", 16, T0 + round, &mut |_| {
                        Some(Claim {
                            execution_id: new_execution_id(),
                            worker_id: worker.into(),
                            ack_deadline: T0 + 60_000,
                        })
                    })
                    .await
                    .expect("claim");
                if got.is_empty() && store.ready_counts().await.expect("counts").is_empty() {
                    return ids;
                }
                ids.extend(got.into_iter().map(|t| t.id));
            }
            panic!("not drained");
        })
    };
    let handles = [
        claimer(Arc::clone(&a), "a-1"),
        claimer(Arc::clone(&a), "a-2"),
        claimer(Arc::clone(&b), "b-1"),
        claimer(Arc::clone(&b), "b-2"),
    ];
    let mut claimed = Vec::new();
    for h in handles {
        claimed.extend(h.await.expect("join"));
    }
    let unique: BTreeSet<_> = claimed.iter().cloned().collect();
    assert_eq!(unique.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(unique, all, "every task claimed");
    let in_flight = b.in_flight(None).await.expect("in_flight");
    assert_eq!(in_flight.len(), 600);
    assert!(in_flight.iter().all(|t| t.version == 2 && t.attempt == 1));
}

/// Two replicas cancel the same 300 tasks at once, in batches: each task is
/// cancelled exactly once, the loser of each race is told it is already
/// CANCELLED (its batch re-read the moved rows), and no row is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_batches_on_the_same_tasks_write_each_once() {
    let schema = schema().await;
    let (a, b) = (replica(&schema).await, replica(&schema).await);
    let mut ids = Vec::new();
    for _ in 0..300 {
        ids.push(
            a.create_task(task("r"), "fp", T0)
                .await
                .expect("create")
                .task
                .id,
        );
    }
    let canceller = |store: Arc<PostgresStore>, ids: Vec<String>| {
        tokio::spawn(async move {
            let mut results = Vec::new();
            for chunk in ids.chunks(50) {
                let events: Vec<(String, Event)> = chunk
                    .iter()
                    .map(|id| {
                        (
                            id.clone(),
                            Event::Cancel {
                                reason: "race".into(),
                            },
                        )
                    })
                    .collect();
                let got = store
                    .transition_many(&events, T0 + 1, None)
                    .await
                    .expect("batch");
                results.extend(chunk.iter().cloned().zip(got));
            }
            results
        })
    };
    let mut reversed = ids.clone();
    reversed.reverse();
    let (ra, rb) = (
        canceller(Arc::clone(&a), ids.clone()),
        canceller(Arc::clone(&b), reversed),
    );
    let mut wins = std::collections::BTreeMap::<String, usize>::new();
    let mut all = ra.await.expect("join");
    all.extend(rb.await.expect("join"));
    for (id, result) in all {
        match result {
            Ok(t) => {
                assert_eq!((t.state, t.version), (TaskState::Cancelled, 2));
                *wins.entry(id).or_default() += 1;
            }
            Err(Error::Transition(taskmesh_core::TransitionError::IllegalState {
                state: TaskState::Cancelled,
                ..
            })) => {
                wins.entry(id).or_default();
            }
            Err(other) => panic!("task {id}: {other:?}"),
        }
    }
    assert_eq!(wins.len(), 300);
    assert!(wins.values().all(|n| *n == 1), "each task cancelled once");
    for id in &ids {
        let t = a.get_task(id).await.expect("get").expect("exists");
        assert_eq!((t.state, t.version), (TaskState::Cancelled, 2));
    }
}

/// The delivery loops of two replicas share the due callbacks: each entry
/// is handed out once while its lease runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_claim_one_callback_twice() {
    let schema = schema().await;
    let (a, b) = (replica(&schema).await, replica(&schema).await);
    let mut ended = Vec::new();
    for _ in 0..120 {
        let t = NewTask {
            callback_url: "http://127.0.0.1:9/cb".into(),
            ..task("cb")
        };
        let t = a.create_task(t, "fp", T0).await.expect("create").task;
        ended.push((
            t.id,
            Event::Cancel {
                reason: "done".into(),
            },
        ));
    }
    for r in a
        .transition_many(&ended, T0 + 1, None)
        .await
        .expect("cancel")
    {
        assert!(r.expect("cancelled").callback.is_some());
    }
    let claimer = |store: Arc<PostgresStore>| {
        tokio::spawn(async move {
            let mut ids = Vec::new();
            loop {
                let jobs = store
                    .claim_callbacks(T0 + 10, 7, 60_000)
                    .await
                    .expect("claim");
                if jobs.is_empty() {
                    return ids;
                }
                for job in jobs {
                    assert_eq!(job.task.id.len(), 36);
                    assert_eq!(job.delivery.next_attempt_at, Some(T0 + 60_010));
                    ids.push(job.delivery.delivery_id);
                }
            }
        })
    };
    let (ca, cb) = (claimer(Arc::clone(&a)), claimer(Arc::clone(&b)));
    let mut ids = ca.await.expect("join");
    ids.extend(cb.await.expect("join"));
    let unique: BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a callback was handed out twice");
    assert_eq!(ids.len(), 120);
    assert_eq!(b.next_callback_at().await.expect("next"), Some(T0 + 60_010));
}

/// What one replica commits reaches the other's subscribers, once; a
/// replica does not hear its own changes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_the_other_replica_once() {
    let schema = schema().await;
    let (a, b) = (replica(&schema).await, replica(&schema).await);
    assert_eq!(a.channel(), b.channel());
    let mut on_a = a.subscribe();
    let mut on_b = b.subscribe();
    let mut schedules_on_b = b.subscribe_schedules();

    let t1 = a
        .create_task(task("n"), "fp", T0)
        .await
        .expect("create")
        .task;
    let c = change_of(&mut on_b, &t1.id).await;
    assert_eq!((c.state, c.version), (TaskState::Ready, 1));
    // Visible on the other replica by the time it is announced there.
    assert_eq!(
        b.get_task(&t1.id).await.expect("get").map(|t| t.version),
        Some(1)
    );

    let events = [(
        t1.id.clone(),
        Event::Dispatch {
            execution_id: "exec-1".into(),
            worker_id: "w-1".into(),
            ack_deadline: T0 + 5_000,
        },
    )];
    a.transition_many(&events, T0 + 1, None)
        .await
        .expect("transition")[0]
        .as_ref()
        .expect("dispatched");
    let c = change_of(&mut on_b, &t1.id).await;
    assert_eq!(
        (c.state, c.version, c.next_at),
        (TaskState::Dispatching, 2, Some(T0 + 5_000))
    );

    // A's own changes come once (published locally); B's come by NOTIFY,
    // after A's own notifications would have, since they commit later.
    let t2 = b
        .create_task(task("n"), "fp", T0)
        .await
        .expect("create")
        .task;
    let mut seen = Vec::new();
    loop {
        let c = tokio::time::timeout(Duration::from_secs(10), on_a.recv())
            .await
            .expect("a change within 10 s")
            .expect("open");
        seen.push((c.task_id.clone(), c.version));
        if c.task_id == t2.id {
            break;
        }
    }
    assert_eq!(
        seen,
        [(t1.id.clone(), 1), (t1.id.clone(), 2), (t2.id.clone(), 1)],
        "each change once, in commit order"
    );

    let s = schedule("sched-n");
    a.create_schedule(&s).await.expect("create schedule");
    let c = tokio::time::timeout(Duration::from_secs(10), schedules_on_b.recv())
        .await
        .expect("a schedule change within 10 s")
        .expect("open");
    assert_eq!(
        c,
        ScheduleChange {
            schedule_id: "sched-n".into(),
            next_fire_at: Some(T0)
        }
    );
}

/// A lost LISTEN connection is re-established, subscribers are told to
/// resync, and notifications flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_notification_connection_resyncs_and_recovers() {
    let schema = schema().await;
    let (a, b) = (replica(&schema).await, replica(&schema).await);
    let mut on_b = b.subscribe();
    let old = b.listener_backend_pid().expect("listening");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(i32::try_from(old).expect("pid"))
        .fetch_one(&mut sqlx_conn(&schema).await)
        .await
        .expect("terminate");
    assert!(killed);

    let resync = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match on_b.recv().await {
                Err(RecvError::Lagged(_)) => return "lagged",
                Ok(c) if c.is_resync() => return "marker",
                Ok(_) => {}
                Err(RecvError::Closed) => panic!("closed"),
            }
        }
    })
    .await
    .expect("subscribers told to resync within 20 s");
    assert!(["lagged", "marker"].contains(&resync));
    let new = wait_for("a new LISTEN connection", Duration::from_secs(20), || {
        let b = Arc::clone(&b);
        async move { b.listener_backend_pid().filter(|pid| *pid != old) }
    })
    .await;
    assert_ne!(new, old);

    let mut on_b = b.subscribe();
    let t = a
        .create_task(task("n"), "fp", T0)
        .await
        .expect("create")
        .task;
    assert_eq!(change_of(&mut on_b, &t.id).await.version, 1);
}

/// The store clock follows the database from a host clock that is off,
/// and keeps following it when the host clock jumps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_clock_follows_the_database_clock() {
    let schema = schema().await;
    let store: Arc<dyn Store> = replica(&schema).await;
    let db = store.db_now().await.expect("db_now");
    let host = FakeClock::new(db - 90_000);
    let clock = StoreClock::start(
        Arc::clone(&store),
        Arc::new(host.clone()),
        Duration::from_millis(50),
    )
    .await
    .expect("start");
    let close = |clock: &StoreClock, db: i64| (clock.now_millis() - db).abs() < 2_000;
    assert!(close(&clock, store.db_now().await.expect("db_now")));
    assert!(clock.uncertainty_millis() < 1_000);

    // The host clock jumps a day ahead; the resampling task notices.
    host.advance(86_400_000);
    wait_for(
        "the store clock to catch the jump",
        Duration::from_secs(10),
        || {
            let (clock, store) = (clock.clone(), Arc::clone(&store));
            async move {
                let db = store.db_now().await.expect("db_now");
                close(&clock, db).then_some(())
            }
        },
    )
    .await;
}

/// Bad options and an absent server are clear errors, not hangs or panics.
#[tokio::test]
async fn bad_options_and_absent_servers_are_clear_errors() {
    let schema = schema().await;
    for bad in ["Upper", "has-dash", "pg_catalog", "", &"x".repeat(49)] {
        let err = PostgresStore::connect(schema.options().with_schema(bad))
            .await
            .expect_err("bad schema");
        assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err:?}");
    }
    let err = PostgresStore::connect(PostgresOptions::new("not a url"))
        .await
        .expect_err("bad url");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let mut nowhere = PostgresOptions::new("postgres://postgres@127.0.0.1:1/test");
    nowhere.acquire_timeout = Duration::from_secs(2);
    let err = PostgresStore::connect(nowhere)
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(err.code(), taskmesh_core::ErrorCode::Unavailable);
}

/// With notifications off a store still serves its own subscribers.
#[tokio::test]
async fn notifications_off_still_publishes_locally() {
    let schema = schema().await;
    let opts = PostgresOptions {
        notify: false,
        ..schema.options()
    };
    let store = PostgresStore::connect(opts).await.expect("connect");
    assert_eq!(store.channel(), None);
    assert_eq!(store.listener_backend_pid(), None);
    let mut rx = store.subscribe();
    let t = store
        .create_task(task("quiet"), "fp", T0)
        .await
        .expect("create")
        .task;
    assert_eq!(change_of(&mut rx, &t.id).await.version, 1);
    let claimed = store
        .claim_ready("quiet", 1, T0, &mut |_| {
            Some(Claim {
                execution_id: new_execution_id(),
                worker_id: "w".into(),
                ack_deadline: T0 + 1_000,
            })
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(change_of(&mut rx, &t.id).await.version, 2);
}

async fn sqlx_conn(schema: &ScratchSchema) -> sqlx::PgConnection {
    use sqlx::Connection;
    sqlx::PgConnection::connect(schema.url())
        .await
        .expect("admin connection")
}

fn schedule(id: &str) -> taskmesh_core::schedule::ScheduleRecord {
    use taskmesh_core::schedule::{
        MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord, TaskTemplate,
    };
    ScheduleRecord {
        id: id.into(),
        name: id.into(),
        kind: ScheduleKind::FixedRate,
        cron_expression: String::new(),
        interval_ms: 1_000,
        time_zone: String::new(),
        template: TaskTemplate {
            handler: "echo".into(),
            payload: Vec::new(),
            content_type: "application/json".into(),
            priority: 0,
            labels: Default::default(),
            routing_key: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: 1_000,
            callback_url: String::new(),
            balancer: None,
        },
        misfire: MisfirePolicy::CatchUp,
        max_catch_up: 1,
        overlap: OverlapPolicy::Skip,
        paused: false,
        next_fire_at: Some(T0),
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: T0,
        updated_at: T0,
        version: 1,
    }
}
