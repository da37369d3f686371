//! Conformance scenarios: batches of events, change notifications, and durability across a reopen.

use std::time::Duration;

use taskmesh_core::id::new_task_id;
use taskmesh_core::{Event, NewTask, TaskState, TransitionError};

use super::{
    StoreFixture, T0, ack, create, dispatch, get, new_task, step, succeed, without_attempts,
};
use crate::{ChangeInterest, Error};

/// One batch of events: each succeeds or fails on its own, in order, and
/// later events see earlier ones.
pub async fn transition_many_mixed(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let a = create(store, new_task("batch"), T0).await;
    let b = create(store, new_task("batch"), T0).await;
    let missing = new_task_id();
    let events = vec![
        (a.id.clone(), dispatch("exec-a", "w-1", T0 + 5_000)),
        (b.id.clone(), ack("exec-x")),
        (missing.clone(), Event::Due),
        (a.id.clone(), ack("exec-a")),
        (
            b.id.clone(),
            Event::Cancel {
                reason: "stop".into(),
            },
        ),
    ];
    let results = store
        .transition_many(&events, T0 + 1, None)
        .await
        .expect("transition_many");
    assert_eq!(results.len(), 5);
    let state = |i: usize| match &results[i] {
        Ok(t) => t.state,
        Err(e) => panic!("event {i} must succeed: {e:?}"),
    };
    assert_eq!(state(0), TaskState::Dispatching);
    assert!(
        matches!(
            results[1],
            Err(Error::Transition(TransitionError::IllegalState { .. }))
        ),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(&results[2], Err(Error::NotFound(id)) if *id == missing),
        "{:?}",
        results[2]
    );
    assert_eq!(state(3), TaskState::Running);
    assert_eq!(state(4), TaskState::Cancelled);

    let a_now = get(store, &a.id).await;
    assert_eq!((a_now.state, a_now.version), (TaskState::Running, 3));
    assert_eq!(a_now.attempts.len(), 1);
    let b_now = get(store, &b.id).await;
    assert_eq!((b_now.state, b_now.version), (TaskState::Cancelled, 2));
    assert!(store.get_task(&missing).await.expect("get").is_none());

    let empty = store
        .transition_many(&[], T0 + 2, None)
        .await
        .expect("empty batch");
    assert!(empty.is_empty());
}

/// An event the state machine accepts but the database refuses (its
/// attempts row reuses an execution id) fails alone and leaves nothing
/// behind; the rest of the batch is written.
pub async fn transition_many_isolates_a_refused_write(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let a = create(store, new_task("batch"), T0).await;
    let b = create(store, new_task("batch"), T0).await;
    let c = create(store, new_task("batch"), T0).await;
    step(store, &c, dispatch("exec-taken", "w-1", T0 + 5_000), T0 + 1).await;

    let events = vec![
        (b.id.clone(), dispatch("exec-b", "w-1", T0 + 5_000)),
        (a.id.clone(), dispatch("exec-taken", "w-2", T0 + 5_000)),
        (b.id.clone(), ack("exec-b")),
    ];
    let results = store
        .transition_many(&events, T0 + 2, None)
        .await
        .expect("transition_many");
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(results[1].is_err(), "a reused execution id must be refused");
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert_eq!(
        get(store, &a.id).await,
        a,
        "the refused event wrote nothing"
    );
    let b_now = get(store, &b.id).await;
    assert_eq!((b_now.state, b_now.version), (TaskState::Running, 3));
    assert_eq!(b_now.attempts.len(), 1);
    assert_eq!(get(store, &c.id).await.attempts.len(), 1);
}

/// A subscriber sees creates and transitions after they commit, and nothing
/// for a refused event.
pub async fn subscribe_sees_changes(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let mut rx = store.subscribe();
    let t = create(store, new_task("watch"), T0).await;
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a change within 10 s")
            .expect("channel open")
    };
    let change = next().await;
    assert_eq!(
        (change.task_id.as_str(), change.state, change.version),
        (t.id.as_str(), TaskState::Ready, 1)
    );
    // Visible to readers by the time it is announced.
    assert_eq!(get(store, &t.id).await.version, 1);

    store
        .transition(&t.id, &ack("nope"), T0 + 1)
        .await
        .expect_err("illegal");
    let t2 = step(store, &t, dispatch("exec-1", "w-1", T0 + 5_000), T0 + 2).await;
    let change = next().await;
    assert_eq!(
        (change.task_id.as_str(), change.state, change.version),
        (t2.id.as_str(), TaskState::Dispatching, 2),
        "the refused event published nothing"
    );
}

/// [`Store::subscribe_to`](crate::Store::subscribe_to): each interest is
/// sent the changes it wants and no other, in commit order; `All` is sent
/// every one.
pub async fn subscribe_to_sends_what_the_interest_wants(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let mut all = store.subscribe_to(ChangeInterest::All);
    let mut dispatch_rx = store.subscribe_to(ChangeInterest::Dispatch);
    let mut callbacks = store.subscribe_to(ChangeInterest::Callbacks);

    // READY, DISPATCHING, RUNNING, SUCCEEDED (no callback).
    let t = create(store, new_task("interest"), T0).await;
    let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 5_000), T0 + 1).await;
    let t = step(store, &t, ack("exec-1"), T0 + 2).await;
    step(store, &t, succeed("exec-1", b"ok"), T0 + 3).await;
    // READY, then CANCELLED with a callback queued.
    let c = create(
        store,
        NewTask {
            callback_url: "http://127.0.0.1:9/interest".into(),
            ..new_task("interest")
        },
        T0,
    )
    .await;
    let cancel = Event::Cancel {
        reason: "stop".into(),
    };
    step(store, &c, cancel, T0 + 4).await;

    // The store publishes before its call returns: what is not queued now
    // was never sent.
    let drain = |rx: &mut tokio::sync::broadcast::Receiver<crate::TaskChange>| {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|c| (c.task_id, c.state))
            .collect::<Vec<_>>()
    };
    let (tid, cid) = (t.id.clone(), c.id.clone());
    assert_eq!(
        drain(&mut all),
        vec![
            (tid.clone(), TaskState::Ready),
            (tid.clone(), TaskState::Dispatching),
            (tid.clone(), TaskState::Running),
            (tid.clone(), TaskState::Succeeded),
            (cid.clone(), TaskState::Ready),
            (cid.clone(), TaskState::Cancelled),
        ]
    );
    assert_eq!(
        drain(&mut dispatch_rx),
        vec![
            (tid, TaskState::Ready),
            (cid.clone(), TaskState::Ready),
            (cid.clone(), TaskState::Cancelled),
        ],
        "the dispatcher's interest: READY and CANCELLED only"
    );
    assert_eq!(
        drain(&mut callbacks),
        vec![(cid, TaskState::Cancelled)],
        "the callback deliverer's interest: the change that queued a callback only"
    );
}

/// Everything written is there after the store is reopened.
pub async fn survives_reopen(fixture: &dyn StoreFixture) {
    let (kept, done) = {
        let store = fixture.open().await;
        let store = store.as_ref();
        let kept = create(
            store,
            NewTask {
                client_request_id: Some("req-kept".into()),
                ..new_task("reopen")
            },
            T0,
        )
        .await;
        let t = create(store, new_task("reopen"), T0).await;
        let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 5_000), T0 + 1).await;
        step(store, &t, ack("exec-1"), T0 + 2).await;
        let done = get(store, &t.id).await;
        (get(store, &kept.id).await, done)
    };

    let store = fixture.open().await;
    let store = store.as_ref();
    assert_eq!(get(store, &kept.id).await, kept);
    assert_eq!(get(store, &done.id).await, done);
    assert_eq!(done.attempts.len(), 1);
    let in_flight = store.in_flight(Some("w-1")).await.expect("in_flight");
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].id, done.id);

    // The idempotency key and the state machine carry on.
    let again = NewTask {
        client_request_id: Some("req-kept".into()),
        ..new_task("reopen")
    };
    let again = store
        .create_task(again, "fp", T0 + 3)
        .await
        .expect("create");
    assert!(again.existing);
    assert_eq!(again.task.id, kept.id);
    let finished = step(
        store,
        &without_attempts(done),
        succeed("exec-1", b"!"),
        T0 + 4,
    )
    .await;
    assert_eq!(finished.state, TaskState::Succeeded);
}
