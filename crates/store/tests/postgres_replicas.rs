//! Postgres as the store of several replicas (two stores, two pools, one
//! schema): claims never overlap, racing batches write each change once,
//! callbacks are handed out once, and bad options or an absent server are
//! clear errors.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{T0, replica, schema, task};
use taskmesh_core::id::new_execution_id;
use taskmesh_core::{Event, NewTask, TaskState};
use taskmesh_store::{Claim, Error, PostgresOptions, PostgresStore, Store};

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
