//! Conformance scenarios: what operators' views read and do. Listings by
//! label, creation time and idempotency key; the figures of GetStats; a
//! rerun of an ended task, whose next end queues a new callback.

use std::collections::BTreeMap;

use taskmesh_core::{CallbackOutcome, Event, NewTask, TaskState};

use super::{StoreFixture, T0, ack, all_filter, create, dispatch, get, new_task, step, succeed};
use crate::{Store, TaskFilter};

const MIN: i64 = 60_000;

/// The start of the minute of `ms`, as the store buckets it.
fn minute(ms: i64) -> i64 {
    ms - ms % MIN
}

fn labelled(handler: &str, pairs: &[(&str, &str)], key: Option<&str>) -> NewTask {
    NewTask {
        labels: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        client_request_id: key.map(str::to_string),
        ..new_task(handler)
    }
}

async fn ids(store: &dyn Store, filter: TaskFilter) -> Vec<String> {
    let page = store.list_tasks(&filter).await.expect("list");
    page.tasks.into_iter().map(|t| t.id).collect()
}

/// A label filter (key alone, or key and value), a creation-time range and
/// an idempotency key narrow a listing exactly; a label filter pages on
/// with a cursor.
pub async fn list_by_label_time_and_key(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let a = create(store, labelled("h", &[("team", "a")], Some("key-a")), T0).await;
    let b = create(store, labelled("h", &[("team", "b")], None), T0 + MIN).await;
    let c = create(store, labelled("h", &[("zone", "x")], None), T0 + 2 * MIN).await;
    let d = create(store, labelled("h", &[("team", "a")], None), T0 + 3 * MIN).await;

    let team = |value: Option<&str>, limit| TaskFilter {
        label: Some(("team".into(), value.map(str::to_string))),
        ..all_filter(limit)
    };
    assert_eq!(
        ids(store, team(Some("a"), 10)).await,
        [d.id.as_str(), a.id.as_str()]
    );
    assert_eq!(
        ids(store, team(None, 10)).await,
        [d.id.as_str(), b.id.as_str(), a.id.as_str()]
    );
    assert!(ids(store, team(Some("c"), 10)).await.is_empty());
    // Paged one at a time, the label filter goes on from its cursor.
    let first = store.list_tasks(&team(Some("a"), 1)).await.expect("list");
    assert_eq!(first.tasks[0].id, d.id);
    let next = TaskFilter {
        before_id: first.next_before_id.clone(),
        ..team(Some("a"), 1)
    };
    let second = store.list_tasks(&next).await.expect("list");
    assert_eq!(second.tasks[0].id, a.id);
    assert_eq!(second.next_before_id, None, "nothing after the last");

    let range = TaskFilter {
        created_after: Some(T0 + MIN),
        created_before: Some(T0 + 3 * MIN),
        ..all_filter(10)
    };
    assert_eq!(
        ids(store, range).await,
        [c.id.as_str(), b.id.as_str()],
        "[after, before)"
    );

    let by_key = |ns: Option<&str>, key: &str| TaskFilter {
        namespace: ns.map(str::to_string),
        client_request_id: Some(key.into()),
        ..all_filter(10)
    };
    assert_eq!(ids(store, by_key(None, "key-a")).await, [a.id.as_str()]);
    assert_eq!(
        ids(store, by_key(Some("default"), "key-a")).await,
        [a.id.as_str()]
    );
    assert!(ids(store, by_key(Some("other"), "key-a")).await.is_empty());
    assert!(ids(store, by_key(None, "key-none")).await.is_empty());
    // The other filters still apply to the key's task.
    let keyed_wrong_state = TaskFilter {
        state: Some(TaskState::Succeeded),
        ..by_key(None, "key-a")
    };
    assert!(ids(store, keyed_wrong_state).await.is_empty());
}

/// GetStats' figures: counts by state and handler, READY queues with the
/// earliest READY time, ends per minute by state, and re-runs (attempts
/// after the first) per minute from live and recently ended tasks alike.
pub async fn stats_count_states_queues_and_minutes(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let r1 = create(store, new_task("q"), T0).await;
    let _r2 = create(store, new_task("q"), T0 + 10).await;
    // Succeeds on its second push (the first given back), ending in minute 2.
    let t = create(store, new_task("w"), T0).await;
    let t = step(store, &t, dispatch("e1", "w-1", T0 + 5_000), T0 + 1).await;
    let t = step(
        store,
        &t,
        Event::Release {
            execution_id: "e1".into(),
            reason: taskmesh_core::ReleaseReason::Rejected,
            message: "busy".into(),
        },
        T0 + 2,
    )
    .await;
    let t = step(store, &t, dispatch("e2", "w-1", T0 + 2 * MIN), T0 + MIN + 1).await;
    let t = step(store, &t, ack("e2"), T0 + MIN + 2).await;
    step(store, &t, succeed("e2", b"ok"), T0 + 2 * MIN + 5).await;
    // Cancelled in minute 0: ended, neither completed nor failed.
    let c = create(store, new_task("w"), T0).await;
    step(store, &c, Event::Cancel { reason: "x".into() }, T0 + 3).await;
    // Another namespace is never counted.
    create(
        store,
        NewTask {
            namespace: "other".into(),
            ..new_task("q")
        },
        T0,
    )
    .await;

    let stats = store.task_stats("default", T0).await.expect("stats");
    assert_eq!(
        stats.by_state_handler,
        [
            (TaskState::Ready, "q".to_string(), 2),
            (TaskState::Succeeded, "w".to_string(), 1),
            (TaskState::Cancelled, "w".to_string(), 1),
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
    assert_eq!(stats.queues, [("q".to_string(), 2, r1.times.ready)]);
    assert_eq!(
        stats.ended_per_minute,
        [(minute(T0 + 2 * MIN + 5), TaskState::Succeeded, 1)]
    );
    assert_eq!(stats.reruns_per_minute, [(minute(T0 + MIN + 1), 1)]);
    // A window that starts later leaves earlier minutes out.
    let later = store
        .task_stats("default", T0 + 3 * MIN)
        .await
        .expect("stats");
    assert!(later.ended_per_minute.is_empty() && later.reruns_per_minute.is_empty());
    assert_eq!(
        later.by_state_handler, stats.by_state_handler,
        "counts are not windowed"
    );
}

/// A rerun puts a failed task back to READY with its attempts kept and a
/// fresh round; its delivered callback makes way, and its next end queues
/// a new one with a new delivery id. A task that succeeded never reruns.
pub async fn rerun_opens_an_ended_task_once_more(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let t = create(
        store,
        NewTask {
            callback_url: "http://127.0.0.1:9/cb".into(),
            ..new_task("r")
        },
        T0,
    )
    .await;
    let t = step(store, &t, dispatch("e1", "w-1", T0 + 5_000), T0 + 1).await;
    let t = step(
        store,
        &t,
        Event::Fail {
            execution_id: "e1".into(),
            message: "boom".into(),
            retryable: false,
            jitter: 0.0,
        },
        T0 + 2,
    )
    .await;
    assert_eq!(t.state, TaskState::Failed);
    let first = t.callback.clone().expect("queued").delivery_id;
    store
        .finish_callback(&first, &CallbackOutcome::Delivered, T0 + 3)
        .await
        .expect("delivered");

    let again = step(store, &t, Event::Rerun, T0 + 4).await;
    assert_eq!((again.state, again.run_count), (TaskState::Ready, 0));
    let read = get(store, &again.id).await;
    assert_eq!(read.callback, None, "the delivered callback made way");
    assert_eq!(read.attempts.len(), 1, "earlier attempts are kept");
    assert_eq!(read.times.end, None);

    let t = step(store, &read, dispatch("e2", "w-1", T0 + 9_000), T0 + 5).await;
    let done = step(store, &t, succeed("e2", b"ok"), T0 + 6).await;
    let second = done.callback.clone().expect("queued again").delivery_id;
    assert_ne!(second, first, "a new delivery for the new end");
    let read = get(store, &done.id).await;
    assert_eq!(read.attempts.len(), 2);
    assert_eq!(read.attempts[1].number, 2, "attempt numbers go on");
    let refused = store.transition(&done.id, &Event::Rerun, T0 + 7).await;
    assert!(
        matches!(refused, Err(crate::Error::Transition(_))),
        "{refused:?}"
    );
    assert_eq!(get(store, &done.id).await.state, TaskState::Succeeded);
}
