//! Conformance scenarios: the callback outbox. An entry is queued in the
//! same transaction as the terminal transition of a task with a callback
//! URL (and never otherwise), claims lease entries so one try runs at a
//! time, outcomes are recorded once, and everything survives a reopen.

use taskmesh_core::id::new_task_id;
use taskmesh_core::{CallbackOutcome, CallbackState, Event, NewTask, TaskState};

use super::{StoreFixture, T0, ack, all_filter, create, dispatch, get, new_task, step, succeed};
use crate::{Error, Store};

fn with_callback(handler: &str) -> NewTask {
    NewTask {
        callback_url: format!("http://127.0.0.1:9/{handler}"),
        ..new_task(handler)
    }
}

fn cancel() -> Event {
    Event::Cancel {
        reason: "stop".into(),
    }
}

/// Ends a fresh callback task at `at` by cancelling it; returns its delivery id.
async fn ended(store: &dyn Store, handler: &str, at: i64) -> (String, String) {
    let t = create(store, with_callback(handler), T0).await;
    let t = step(store, &t, cancel(), at).await;
    let entry = t.callback.expect("queued");
    (t.id, entry.delivery_id)
}

/// Only the terminal transition of a task with a callback URL queues an
/// entry; a refused event in a batch queues nothing; reads show the entry.
pub async fn callback_queued_with_terminal_transition(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();

    let t = create(store, with_callback("cb"), T0).await;
    assert_eq!(t.callback, None);
    let t = step(store, &t, dispatch("exec-1", "w-1", T0 + 5_000), T0 + 1).await;
    let t = step(store, &t, ack("exec-1"), T0 + 2).await;
    assert_eq!(t.callback, None, "no entry before the task ends");
    let done = step(store, &t, succeed("exec-1", b"ok"), T0 + 3).await;
    assert_eq!(done.state, TaskState::Succeeded);
    let entry = done.callback.clone().expect("queued with the end");
    let stored = get(store, &done.id).await;
    assert_eq!(stored.callback.as_ref(), Some(&entry));
    assert_eq!(stored.attempts.len(), 1);
    let listed = store.list_tasks(&all_filter(10)).await.expect("list");
    assert_eq!(listed.tasks[0].callback.as_ref(), Some(&entry));

    // No URL, no entry.
    let plain = create(store, new_task("cb"), T0).await;
    let plain = step(store, &plain, cancel(), T0 + 4).await;
    assert_eq!(plain.callback, None);
    assert_eq!(get(store, &plain.id).await.callback, None);

    // In a batch, the refused event queues nothing and the cancel does.
    let a = create(store, with_callback("cb"), T0).await;
    let b = create(store, with_callback("cb"), T0).await;
    let results = store
        .transition_many(
            &[
                (a.id.clone(), ack("exec-none")),
                (b.id.clone(), cancel()),
                (new_task_id(), cancel()),
            ],
            T0 + 5,
            None,
        )
        .await
        .expect("batch");
    assert!(results[0].is_err() && results[2].is_err());
    let b_done = results[1].as_ref().expect("cancel applies");
    assert_eq!(
        b_done.callback.as_ref().map(|c| c.state),
        Some(CallbackState::Pending)
    );
    assert_eq!(get(store, &a.id).await.callback, None);
    assert_eq!(
        get(store, &b.id).await.callback.as_ref(),
        b_done.callback.as_ref()
    );
    // A terminal task refuses events, so it can never queue a second entry.
    store
        .transition(&b.id, &cancel(), T0 + 6)
        .await
        .expect_err("terminal");
    let due = store
        .claim_callbacks(T0 + 1_000, 100, 60_000)
        .await
        .expect("claim");
    assert_eq!(due.len(), 2, "one entry per ended task: {due:?}");
}

/// Claims take due entries earliest first and lease them; a lapsed lease
/// hands the entry out again; outcomes count tries and are recorded once.
pub async fn callback_claims_lease_and_outcomes(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    assert_eq!(store.next_callback_at().await.expect("next"), None);
    let (first_task, first) = ended(store, "cb-a", T0 + 10).await;
    let (_, second) = ended(store, "cb-b", T0 + 20).await;
    assert_eq!(store.next_callback_at().await.expect("next"), Some(T0 + 10));

    assert!(
        store
            .claim_callbacks(T0 + 5, 10, 1_000)
            .await
            .expect("claim")
            .is_empty()
    );
    let jobs = store
        .claim_callbacks(T0 + 30, 1, 1_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job.delivery.delivery_id, first);
    assert_eq!(job.delivery.next_attempt_at, Some(T0 + 1_030), "leased");
    assert_eq!(job.task.id, first_task);
    assert_eq!(job.task.state, TaskState::Cancelled);
    assert_eq!(job.task.callback_url, job.delivery.url);

    let jobs = store
        .claim_callbacks(T0 + 30, 10, 1_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1, "the leased entry is not handed out twice");
    assert_eq!(jobs[0].delivery.delivery_id, second);
    assert!(
        store
            .claim_callbacks(T0 + 30, 10, 1_000)
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(
        store.next_callback_at().await.expect("next"),
        Some(T0 + 1_030)
    );

    // A failed try is counted and waits for its retry time.
    let retry = CallbackOutcome::Retry {
        error: "HTTP 500".into(),
        next_attempt_at: T0 + 5_000,
    };
    assert!(
        store
            .finish_callback(&first, &retry, T0 + 40)
            .await
            .expect("finish")
    );
    let entry = get(store, &first_task).await.callback.expect("entry");
    assert_eq!(
        (
            entry.state,
            entry.attempts,
            entry.last_error.as_str(),
            entry.next_attempt_at
        ),
        (CallbackState::Pending, 1, "HTTP 500", Some(T0 + 5_000))
    );
    // The second one's deliverer died: its lease lapses and it comes back.
    let jobs = store
        .claim_callbacks(T0 + 1_030, 10, 10_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].delivery.delivery_id, second);
    assert_eq!(jobs[0].delivery.attempts, 0);
    // Postponed (no room for it now): due later, no try counted.
    store
        .postpone_callbacks(&[second.as_str()], T0 + 2_000)
        .await
        .expect("postpone");
    assert!(
        store
            .claim_callbacks(T0 + 1_999, 10, 10_000)
            .await
            .expect("claim")
            .is_empty(),
        "not due before the postponed time"
    );
    let jobs = store
        .claim_callbacks(T0 + 2_000, 10, 10_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (
            jobs[0].delivery.delivery_id.as_str(),
            jobs[0].delivery.attempts
        ),
        (second.as_str(), 0)
    );

    let jobs = store
        .claim_callbacks(T0 + 5_000, 10, 1_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].delivery.attempts, 1);
    let delivered = CallbackOutcome::Delivered;
    assert!(
        store
            .finish_callback(&first, &delivered, T0 + 5_001)
            .await
            .expect("finish")
    );
    let entry = get(store, &first_task).await.callback.expect("entry");
    assert_eq!(
        (
            entry.state,
            entry.attempts,
            entry.delivered_at,
            entry.next_attempt_at
        ),
        (CallbackState::Delivered, 2, Some(T0 + 5_001), None)
    );
    assert!(entry.last_error.is_empty());
    assert!(
        !store
            .finish_callback(&first, &retry, T0 + 5_002)
            .await
            .expect("finish"),
        "a delivered entry is never reopened"
    );
    assert_eq!(get(store, &first_task).await.callback, Some(entry));

    let failed = CallbackOutcome::Failed {
        error: "connection refused".into(),
    };
    assert!(
        store
            .finish_callback(&second, &failed, T0 + 5_003)
            .await
            .expect("finish")
    );
    assert!(
        store
            .claim_callbacks(T0 + 99_999, 10, 1_000)
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(store.next_callback_at().await.expect("next"), None);

    let err = store
        .finish_callback("no-such-delivery", &delivered, T0)
        .await
        .expect_err("unknown delivery");
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

/// A queued entry and a recorded outcome are there after a reopen.
pub async fn callbacks_survive_reopen(fixture: &dyn StoreFixture) {
    let (pending_task, done_task) = {
        let store = fixture.open().await;
        let store = store.as_ref();
        let (pending_task, _) = ended(store, "reopen-a", T0 + 1).await;
        let (done_task, done) = ended(store, "reopen-b", T0 + 2).await;
        store
            .finish_callback(&done, &CallbackOutcome::Delivered, T0 + 3)
            .await
            .expect("finish");
        (
            get(store, &pending_task).await,
            get(store, &done_task).await,
        )
    };
    let store = fixture.open().await;
    let store = store.as_ref();
    assert_eq!(get(store, &pending_task.id).await, pending_task);
    assert_eq!(get(store, &done_task.id).await, done_task);
    let jobs = store
        .claim_callbacks(T0 + 10, 10, 1_000)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].task.id, pending_task.id);
}
