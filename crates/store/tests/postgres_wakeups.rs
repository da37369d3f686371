//! Wake-ups and time across replicas on Postgres: what one store commits
//! reaches the other's subscribers by LISTEN/NOTIFY (also after the LISTEN
//! connection is lost), notifications can be turned off, and the store
//! clock follows the database's clock from a skewed host.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{T0, change_of, replica, schedule, schema, sqlx_conn, task, wait_for};
use taskmesh_core::id::new_execution_id;
use taskmesh_core::{Clock, Event, FakeClock, TaskState};
use taskmesh_store::{Claim, PostgresOptions, PostgresStore, ScheduleChange, Store, StoreClock};
use tokio::sync::broadcast::error::RecvError;

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
