//! Conformance scenarios of a store shared by several processes: two
//! stores opened on one fixture act as two replicas. Claims never overlap,
//! racing batches write each change once, callbacks are handed out once,
//! what one replica commits reaches the other's subscribers, and the store
//! clock follows the database's. Run by
//! [`cluster_conformance_suite!`](crate::cluster_conformance_suite) for the
//! backends meant for a cluster (Postgres, MySQL).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use taskmesh_core::id::new_execution_id;
use taskmesh_core::{Clock, Event, FakeClock, NewTask, TaskState, TransitionError};
use tokio::sync::broadcast::{self, error::RecvError};

use super::{StoreFixture, T0, create, new_task};
use crate::{Claim, Error, ScheduleChange, Store, StoreClock, TaskChange};

/// The next change naming `id`, skipping others (and resync markers).
pub async fn change_of(rx: &mut broadcast::Receiver<TaskChange>, id: &str) -> TaskChange {
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

fn claim_for(worker: &str) -> Claim {
    Claim {
        execution_id: new_execution_id(),
        worker_id: worker.into(),
        ack_deadline: T0 + 60_000,
    }
}

/// Four claimers on two replicas drain 600 tasks; no task is claimed twice
/// and every one is claimed.
pub async fn two_replicas_claiming_at_once_never_double_claim(fixture: &dyn StoreFixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let mut all = BTreeSet::new();
    for i in 0..600 {
        let store = if i % 2 == 0 { &a } else { &b };
        let t = NewTask {
            priority: i % 3,
            ..new_task("race")
        };
        all.insert(create(store.as_ref(), t, T0).await.id);
    }
    let claimer = |store: Arc<dyn Store>, worker: &'static str| {
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for round in 0..10_000 {
                let got = store
                    .claim_ready("default", "race", 16, T0 + round, &mut |_| {
                        Some(claim_for(worker))
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
        claimed.extend(h.await.expect("a claimer panicked"));
    }
    let unique: BTreeSet<_> = claimed.iter().cloned().collect();
    assert_eq!(unique.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(unique, all, "every task claimed");
    let in_flight = b.in_flight(None).await.expect("in_flight");
    assert_eq!(in_flight.len(), 600);
    assert!(in_flight.iter().all(|t| t.version == 2 && t.attempt == 1));
}

/// Two replicas cancel the same 300 tasks at once, in batches, in opposite
/// orders: each task is cancelled exactly once, the loser of each race is
/// told it is already CANCELLED, and no row is written twice.
pub async fn racing_batches_on_the_same_tasks_write_each_once(fixture: &dyn StoreFixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let mut ids = Vec::new();
    for _ in 0..300 {
        ids.push(create(a.as_ref(), new_task("r"), T0).await.id);
    }
    let canceller = |store: Arc<dyn Store>, ids: Vec<String>| {
        tokio::spawn(async move {
            let mut results = Vec::new();
            for chunk in ids.chunks(50) {
                let events: Vec<(String, Event)> = chunk
                    .iter()
                    .map(|id| {
                        let cancel = Event::Cancel {
                            reason: "race".into(),
                        };
                        (id.clone(), cancel)
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
    let mut wins = BTreeMap::<String, usize>::new();
    let mut all = ra.await.expect("a canceller panicked");
    all.extend(rb.await.expect("a canceller panicked"));
    for (id, result) in all {
        match result {
            Ok(t) => {
                assert_eq!((t.state, t.version), (TaskState::Cancelled, 2));
                *wins.entry(id).or_default() += 1;
            }
            Err(Error::Transition(TransitionError::IllegalState {
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
pub async fn two_replicas_never_claim_one_callback_twice(fixture: &dyn StoreFixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let mut ended = Vec::new();
    for _ in 0..120 {
        let t = NewTask {
            callback_url: "http://127.0.0.1:9/cb".into(),
            ..new_task("cb")
        };
        let t = create(a.as_ref(), t, T0).await;
        let cancel = Event::Cancel {
            reason: "done".into(),
        };
        ended.push((t.id, cancel));
    }
    for r in a
        .transition_many(&ended, T0 + 1, None)
        .await
        .expect("cancel")
    {
        assert!(r.expect("cancelled").callback.is_some());
    }
    let claimer = |store: Arc<dyn Store>| {
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
    let mut ids = ca.await.expect("a claimer panicked");
    ids.extend(cb.await.expect("a claimer panicked"));
    let unique: BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a callback was handed out twice");
    assert_eq!(ids.len(), 120);
    assert_eq!(b.next_callback_at().await.expect("next"), Some(T0 + 60_010));
}

/// What one replica commits reaches the other's subscribers, once and in
/// commit order; a replica does not hear its own changes twice. Schedule
/// changes travel too.
pub async fn changes_reach_the_other_replica_once(fixture: &dyn StoreFixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let mut on_a = a.subscribe();
    let mut on_b = b.subscribe();
    let mut schedules_on_b = b.subscribe_schedules();

    let t1 = create(a.as_ref(), new_task("n"), T0).await;
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

    // A's own changes come once (published locally); B's come through the
    // transport, after A's, since they commit later.
    let t2 = create(b.as_ref(), new_task("n"), T0).await;
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

    let s = super::schedules::schedule("sched-n", Some(T0));
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

/// The store clock follows the database from a host clock that is off,
/// and follows it again after the host clock jumps.
pub async fn store_clock_follows_the_database_clock(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let db = store.db_now().await.expect("db_now");
    let host = FakeClock::new(db - 90_000);
    let clock = StoreClock::start(
        Arc::clone(&store),
        Arc::new(host.clone()),
        Duration::from_secs(3_600),
    )
    .await
    .expect("start");
    let close = |clock: &StoreClock, db: i64| (clock.now_millis() - db).abs() < 2_000;
    assert!(close(&clock, store.db_now().await.expect("db_now")));
    assert!(clock.uncertainty_millis() < 1_000);

    // The host clock jumps a day ahead; the next resample corrects it.
    host.advance(86_400_000);
    assert!(!close(&clock, store.db_now().await.expect("db_now")));
    clock.resync().await.expect("resync");
    assert!(close(&clock, store.db_now().await.expect("db_now")));
}
