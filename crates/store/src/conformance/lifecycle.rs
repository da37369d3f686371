//! Conformance scenarios: one task through the state machine: every field stored, attempts recorded, refused events write nothing.

use std::collections::BTreeMap;

use taskmesh_core::id::new_task_id;
use taskmesh_core::{AttemptOutcome, Event, NewTask, RetryPolicy, TaskState, TransitionError};

use super::{
    StoreFixture, T0, ack, create, dispatch, get, new_task, step, succeed, without_attempts,
};
use crate::Error;

/// Every field survives a write and a read, through a whole life that sets
/// all six state times, output, labels, retry policy and bytes.
pub async fn create_get_round_trip(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let task = NewTask {
        payload: vec![0, 1, 2, 254, 255],
        content_type: "application/octet-stream".into(),
        priority: -3,
        labels: BTreeMap::from([
            ("region".into(), "eu-west".into()),
            ("gpu".into(), "a \"quoted\" value".into()),
        ]),
        routing_key: "customer-42".into(),
        client_request_id: Some("req-round-trip".into()),
        callback_url: "https://example.invalid/cb".into(),
        retry: RetryPolicy {
            max_attempts: 4,
            initial_backoff_ms: 250,
            multiplier: 1.5,
            max_backoff_ms: 9_000,
        },
        timeout_ms: 12_345,
        run_at: T0 + 1_000,
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        balancer: Some(taskmesh_core::Strategy::ConsistentHash),
        schedule_id: Some("sched-1".into()),
        concurrency: Some(taskmesh_core::Concurrency {
            key: "customer:42".into(),
            limit: 7,
        }),
        ..new_task("round-trip")
    };
    let expected = task.clone().into_record(T0);
    let created = store.create_task(task, "fp-1", T0).await.expect("create");
    assert!(!created.existing);
    assert_eq!(created.task, expected);
    assert_eq!(created.task.state, TaskState::Pending);
    assert_eq!(get(store, &expected.id).await, expected);

    // PENDING -> READY -> DISPATCHING -> RETRYING -> READY -> DISPATCHING
    // -> RUNNING -> SUCCEEDED, each step checked against core::apply.
    let t = step(store, &expected, Event::Due, T0 + 1_000).await;
    let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 6_000), T0 + 1_100).await;
    let fail = Event::Fail {
        execution_id: "exec-1".into(),
        message: "boom".into(),
        retryable: true,
        jitter: 0.5,
    };
    let t = step(store, &t, fail, T0 + 1_200).await;
    assert_eq!(t.state, TaskState::Retrying);
    let t = step(store, &t, Event::Due, T0 + 5_000).await;
    let t = step(
        store,
        &t,
        dispatch("exec-2", "w-2", T0 + 10_000),
        T0 + 5_100,
    )
    .await;
    let t = step(store, &t, ack("exec-2"), T0 + 5_200).await;
    let done = step(store, &t, succeed("exec-2", &[9, 0, 9]), T0 + 5_300).await;

    let stored = get(store, &expected.id).await;
    assert_eq!(without_attempts(stored.clone()), done);
    let times = &stored.times;
    for (name, at) in [
        ("pending", times.pending),
        ("ready", times.ready),
        ("dispatching", times.dispatching),
        ("running", times.running),
        ("retrying", times.retrying),
        ("end", times.end),
    ] {
        assert!(at.is_some(), "state time {name} must round-trip");
    }
    assert_eq!(stored.output.as_deref(), Some(&[9u8, 0, 9][..]));
    assert_eq!(stored.version, 8);
    assert_eq!(stored.attempts.len(), 2);
    assert_eq!(stored.attempts[0].outcome, Some(AttemptOutcome::Failed));
    assert_eq!(stored.attempts[0].message, "boom");
    assert_eq!(stored.attempts[1].outcome, Some(AttemptOutcome::Succeeded));
}

/// READY -> DISPATCHING -> RUNNING -> SUCCEEDED with the attempt recorded.
pub async fn full_life_records_attempts(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let t = create(store, new_task("life"), T0).await;
    assert_eq!((t.state, t.version), (TaskState::Ready, 1));

    let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 5_000), T0 + 10).await;
    assert_eq!(t.state, TaskState::Dispatching);
    assert_eq!(t.next_at, Some(T0 + 5_000));
    let open = get(store, &t.id).await.attempts;
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].number, 1);
    assert_eq!(open[0].execution_id, "exec-1");
    assert_eq!(open[0].worker_id, "w-1");
    assert_eq!(open[0].started_at, T0 + 10);
    assert_eq!((open[0].ended_at, open[0].outcome), (None, None));

    let t = step(store, &t, ack("exec-1"), T0 + 20).await;
    assert_eq!(t.state, TaskState::Running);
    assert_eq!(t.next_at, Some(T0 + 20 + 60_000));
    let t = step(store, &t, succeed("exec-1", b"ok"), T0 + 30).await;
    assert_eq!((t.state, t.version), (TaskState::Succeeded, 4));

    let stored = get(store, &t.id).await;
    assert_eq!(stored.next_at, None);
    assert_eq!(stored.execution_id, None);
    assert_eq!(stored.output.as_deref(), Some(&b"ok"[..]));
    assert_eq!(stored.attempts.len(), 1);
    let a = &stored.attempts[0];
    assert_eq!(a.ended_at, Some(T0 + 30));
    assert_eq!(a.outcome, Some(AttemptOutcome::Succeeded));
    assert_eq!(a.message, "");
}

/// An event naming an old attempt is refused and writes nothing.
pub async fn stale_execution_refused(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let t = create(store, new_task("stale"), T0).await;
    let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 5_000), T0 + 1).await;
    let before = get(store, &t.id).await;

    for event in [ack("exec-old"), succeed("exec-old", b"x")] {
        let err = store
            .transition(&t.id, &event, T0 + 2)
            .await
            .expect_err("stale execution id must be refused");
        assert!(
            matches!(
                err,
                Error::Transition(TransitionError::StaleExecution { .. })
            ),
            "{err:?}"
        );
    }
    let after = get(store, &t.id).await;
    assert_eq!(after, before, "a refused event changes nothing");
    assert_eq!(after.version, 2);
}

/// Events for an unknown task are `NotFound`.
pub async fn missing_task_not_found(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let id = new_task_id();
    assert!(store.get_task(&id).await.expect("get").is_none());
    let err = store
        .transition(&id, &Event::Due, T0)
        .await
        .expect_err("no such task");
    assert!(
        matches!(&err, Error::NotFound(missing) if *missing == id),
        "{err:?}"
    );
    store.ping().await.expect("ping");
}

/// A terminal task refuses every event and keeps its version.
pub async fn terminal_stays_terminal(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let t = create(store, new_task("terminal"), T0).await;
    let cancel = Event::Cancel {
        reason: "no longer needed".into(),
    };
    let t = step(store, &t, cancel.clone(), T0 + 1).await;
    assert_eq!(t.state, TaskState::Cancelled);
    let before = get(store, &t.id).await;
    for event in [
        cancel,
        Event::Due,
        dispatch("exec-1", "w-1", T0 + 9),
        ack("exec-1"),
    ] {
        let err = store
            .transition(&t.id, &event, T0 + 2)
            .await
            .expect_err("terminal task must refuse");
        assert!(
            matches!(
                err,
                Error::Transition(TransitionError::IllegalState {
                    state: TaskState::Cancelled,
                    ..
                })
            ),
            "{err:?}"
        );
    }
    assert_eq!(get(store, &t.id).await, before);
}
