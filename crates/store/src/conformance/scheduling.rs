//! Conformance scenarios: the queries the scheduler and dispatcher poll: due tasks, in-flight tasks, READY counts.

use std::collections::BTreeSet;

use taskmesh_core::id::new_execution_id;
use taskmesh_core::{Event, NewTask, TaskRecord, TaskState};

use super::{StoreFixture, T0, ack, create, new_task, step, succeed};
use crate::Claim;

/// A delayed task is due only once its run_at has passed; due tasks come
/// earliest first and respect the limit.
pub async fn due_tasks_after_run_at(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    assert_eq!(store.next_due_at().await.expect("next_due_at"), None);
    let late = create(
        store,
        NewTask {
            run_at: T0 + 20_000,
            ..new_task("due")
        },
        T0,
    )
    .await;
    let early = create(
        store,
        NewTask {
            run_at: T0 + 10_000,
            ..new_task("due")
        },
        T0,
    )
    .await;
    create(store, new_task("due"), T0).await; // READY: never due

    assert_eq!(store.next_due_at().await.expect("next"), Some(T0 + 10_000));
    assert!(
        store
            .due_tasks(T0 + 9_999, 10)
            .await
            .expect("due")
            .is_empty()
    );
    let due: Vec<String> = store
        .due_tasks(T0 + 10_000, 10)
        .await
        .expect("due")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(due, std::slice::from_ref(&early.id));
    let due: Vec<String> = store
        .due_tasks(T0 + 30_000, 10)
        .await
        .expect("due")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(due, [early.id.clone(), late.id.clone()], "earliest first");
    let one = store.due_tasks(T0 + 30_000, 1).await.expect("due");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].id, early.id);

    let promoted = step(store, &early, Event::Due, T0 + 10_001).await;
    assert_eq!((promoted.state, promoted.next_at), (TaskState::Ready, None));
    assert_eq!(store.next_due_at().await.expect("next"), Some(T0 + 20_000));
    let due = store.due_tasks(T0 + 30_000, 10).await.expect("due");
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].id, late.id);
}

/// In-flight tasks, all or of one worker.
pub async fn in_flight_by_worker(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    for _ in 0..3 {
        create(store, new_task("flight"), T0).await;
    }
    create(store, new_task("flight"), T0).await; // stays READY
    let mut workers = ["w-1", "w-2", "w-1"].into_iter();
    let claimed = store
        .claim_ready("default", "flight", 3, T0 + 1, &mut |_| {
            workers.next().map(|w| Claim {
                execution_id: new_execution_id(),
                worker_id: w.into(),
                ack_deadline: T0 + 5_000,
            })
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    let running = step(
        store,
        &claimed[0],
        ack(claimed[0].execution_id.as_deref().expect("exec id")),
        T0 + 2,
    )
    .await;

    let ids = |tasks: Vec<TaskRecord>| tasks.into_iter().map(|t| t.id).collect::<BTreeSet<_>>();
    let all = ids(store.in_flight(None).await.expect("in_flight"));
    assert_eq!(all, ids(claimed.clone()));
    let w1 = ids(store.in_flight(Some("w-1")).await.expect("in_flight"));
    assert_eq!(
        w1,
        BTreeSet::from([claimed[0].id.clone(), claimed[2].id.clone()])
    );
    let w2 = ids(store.in_flight(Some("w-2")).await.expect("in_flight"));
    assert_eq!(w2, BTreeSet::from([claimed[1].id.clone()]));
    assert!(
        store
            .in_flight(Some("w-3"))
            .await
            .expect("in_flight")
            .is_empty()
    );

    step(
        store,
        &running,
        succeed(running.execution_id.as_deref().expect("exec id"), b""),
        T0 + 3,
    )
    .await;
    let w1 = ids(store.in_flight(Some("w-1")).await.expect("in_flight"));
    assert_eq!(w1, BTreeSet::from([claimed[2].id.clone()]));
}

/// READY counts per handler; other states do not count.
pub async fn ready_counts_by_handler(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    assert!(store.ready_counts().await.expect("counts").is_empty());
    for handler in ["h-a", "h-a", "h-b", "h-a"] {
        create(store, new_task(handler), T0).await;
    }
    let pending = NewTask {
        run_at: T0 + 1_000,
        ..new_task("h-c")
    };
    create(store, pending, T0).await;
    let cancelled = create(store, new_task("h-b"), T0).await;
    let cancel = Event::Cancel {
        reason: String::new(),
    };
    step(store, &cancelled, cancel, T0 + 1).await;

    let mut counts = store.ready_counts().await.expect("counts");
    counts.sort();
    assert_eq!(
        counts,
        [
            ("default".to_string(), "h-a".to_string(), 3),
            ("default".to_string(), "h-b".to_string(), 1)
        ]
    );
}
