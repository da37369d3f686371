//! Conformance scenario: retention's removal. Exactly the tasks of the
//! named terminal state that ended before the horizon go, the oldest first
//! and no more than asked, with their attempts; a task whose callback is
//! still to be delivered stays until it is delivered; nothing that is not
//! terminal ever goes.

use taskmesh_core::{CallbackOutcome, Event, NewTask, TaskState};

use super::{StoreFixture, T0, ack, all_filter, create, dispatch, get, new_task, step, succeed};
use crate::{Error, Store};

async fn succeeded(store: &dyn Store, at: i64) -> String {
    let t = create(store, new_task("keep"), T0).await;
    let exec = format!("exec-{at}");
    let t = step(store, &t, dispatch(&exec, "w-1", at + 5_000), at - 2).await;
    let t = step(store, &t, ack(&exec), at - 1).await;
    step(store, &t, succeed(&exec, b"ok"), at).await.id
}

async fn cancelled(store: &dyn Store, task: NewTask, at: i64) -> String {
    let t = create(store, task, T0).await;
    let cancel = Event::Cancel {
        reason: "stop".into(),
    };
    step(store, &t, cancel, at).await.id
}

async fn remove(store: &dyn Store, state: TaskState, before: i64, limit: usize) -> u64 {
    store
        .remove_ended(state, before, 0, limit)
        .await
        .expect("remove_ended")
}

/// See the module documentation.
pub async fn retention_removes_only_ended_tasks_past_their_horizon(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store = store.as_ref();
    let old_a = succeeded(store, T0 + 10).await;
    let old_b = succeeded(store, T0 + 40).await;
    let recent = succeeded(store, T0 + 1_000).await;
    let old_cancelled = cancelled(store, new_task("keep"), T0 + 20).await;
    let with_callback = NewTask {
        callback_url: "http://127.0.0.1:9/cb".into(),
        ..new_task("keep")
    };
    let awaiting_callback = cancelled(store, with_callback, T0 + 30).await;
    let live = create(store, new_task("keep"), T0).await.id;
    let horizon = T0 + 500;

    // The oldest first, no more than asked.
    let n = remove(store, TaskState::Succeeded, horizon, 1).await;
    assert_eq!(n, 1);
    assert!(
        store.get_task(&old_a).await.unwrap().is_none(),
        "the oldest went first"
    );
    assert!(store.get_task(&old_b).await.unwrap().is_some());
    let n = remove(store, TaskState::Succeeded, horizon, 100).await;
    assert_eq!(n, 1, "only the other old SUCCEEDED task");
    assert!(store.get_task(&old_b).await.unwrap().is_none());
    assert_eq!(
        get(store, &recent).await.attempts.len(),
        1,
        "inside the horizon: kept whole"
    );

    // Per state; a pending callback keeps its task.
    let n = remove(store, TaskState::Cancelled, horizon, 100).await;
    assert_eq!(n, 1, "the cancelled task without a callback to deliver");
    assert!(store.get_task(&old_cancelled).await.unwrap().is_none());
    let entry = get(store, &awaiting_callback)
        .await
        .callback
        .expect("a pending callback");
    assert!(
        store
            .finish_callback(&entry.delivery_id, &CallbackOutcome::Delivered, T0 + 600)
            .await
            .expect("deliver")
    );
    let n = remove(store, TaskState::Cancelled, horizon, 100).await;
    assert_eq!(n, 1, "delivered, it goes with its callback");
    assert!(store.get_task(&awaiting_callback).await.unwrap().is_none());
    let n = remove(store, TaskState::Failed, horizon, 100).await;
    assert_eq!(n, 0, "no FAILED task");

    // Never a live task; a non-terminal state is refused, changing nothing.
    let err = store
        .remove_ended(TaskState::Ready, i64::MAX, 0, 100)
        .await
        .expect_err("READY is not terminal");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let left: Vec<String> = store
        .list_tasks(&all_filter(100))
        .await
        .expect("list")
        .tasks
        .into_iter()
        .map(|t| t.id)
        .collect();
    let mut left = left;
    left.sort();
    let mut want = vec![recent.clone(), live.clone()];
    want.sort();
    assert_eq!(left, want, "exactly the recent and the live task are left");
    // Once everything is past the horizon, all ended tasks can go; the
    // live one stays.
    for state in [
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::TimedOut,
        TaskState::Cancelled,
    ] {
        remove(store, state, i64::MAX, 100).await;
    }
    assert!(store.get_task(&recent).await.unwrap().is_none());
    assert_eq!(get(store, &live).await.state, TaskState::Ready);
}

/// Fire history is trimmed to a schedule's newest records, the oldest first
/// and no more than asked per call; another schedule's fires stay; a
/// schedule with no more than `keep` records loses nothing.
pub async fn fire_history_is_trimmed_to_the_newest(fixture: &dyn StoreFixture) {
    use super::schedules::{fire_commit, schedule};
    let store = fixture.open().await;
    let store = store.as_ref();
    for id in ["busy", "quiet"] {
        store
            .create_schedule(&schedule(id, Some(T0)))
            .await
            .expect("create schedule");
    }
    let fire = |id: &'static str, n: i64| async move {
        let s = store.get_schedule(id).await.unwrap().expect("schedule");
        let commit = fire_commit(&s, T0 + n * 1_000, &taskmesh_core::id::new_task_id());
        store
            .commit_fires(commit, T0 + n * 1_000)
            .await
            .expect("commit")
            .expect("committed");
    };
    for n in 0..10 {
        fire("busy", n).await;
    }
    for n in 0..3 {
        fire("quiet", n).await;
    }
    let times = |id: &'static str| async move {
        let mut t: Vec<i64> = store
            .recent_fires(id, 100)
            .await
            .expect("fires")
            .into_iter()
            .map(|f| f.fire_at)
            .collect();
        t.sort_unstable();
        t
    };

    assert_eq!(store.trim_fires("busy", 4, 2).await.expect("trim"), 2);
    assert_eq!(times("busy").await[0], T0 + 2_000, "the two oldest went");
    assert_eq!(store.trim_fires("busy", 4, 100).await.expect("trim"), 4);
    let kept: Vec<i64> = (6..10).map(|n| T0 + n * 1_000).collect();
    assert_eq!(times("busy").await, kept, "the newest four are kept");
    assert_eq!(store.trim_fires("busy", 4, 100).await.expect("trim"), 0);
    assert_eq!(store.trim_fires("quiet", 4, 100).await.expect("trim"), 0);
    assert_eq!(times("quiet").await.len(), 3, "within the cap: untouched");
    assert_eq!(store.trim_fires("missing", 4, 100).await.expect("trim"), 0);
}

async fn succeeded_in(store: &dyn Store, namespace: &str, handler: &str, at: i64) -> String {
    let task = NewTask {
        namespace: namespace.into(),
        ..new_task(handler)
    };
    let t = create(store, task, T0).await;
    let exec = format!("exec-{namespace}-{handler}");
    let t = step(store, &t, dispatch(&exec, "w-1", at + 5_000), at - 2).await;
    let t = step(store, &t, ack(&exec), at - 1).await;
    step(store, &t, succeed(&exec, b"ok"), at).await.id
}

/// Horizons set for a namespace, and for one handler within it, decide
/// over the server's: each task goes by its handler's, else its
/// namespace's, else the default; the rules read back as set, and setting
/// none removes them. The oldest kept task of a namespace and state is
/// the first created.
pub async fn retention_follows_namespace_and_handler_horizons(fixture: &dyn StoreFixture) {
    use taskmesh_core::retention::Horizons;
    let store = fixture.open().await;
    let store = store.as_ref();
    let mut long = Horizons::default();
    long.set(TaskState::Succeeded, Some(10_000));
    long.set(TaskState::Failed, Some(20_000));
    store
        .set_retention("long", "", &long)
        .await
        .expect("set the namespace's");
    let mut quick = Horizons::default();
    quick.set(TaskState::Succeeded, Some(100));
    store
        .set_retention("long", "quick", &quick)
        .await
        .expect("set a handler's");

    let plain = succeeded_in(store, "default", "keep", T0 + 10).await;
    let kept = succeeded_in(store, "long", "keep", T0 + 10).await;
    let fast = succeeded_in(store, "long", "quick", T0 + 10).await;
    assert_eq!(
        store
            .oldest_ended("long", TaskState::Succeeded)
            .await
            .expect("oldest"),
        Some((kept.clone(), Some(T0 + 10))),
        "the first created of the namespace's SUCCEEDED tasks"
    );
    assert_eq!(
        store
            .oldest_ended("long", TaskState::Failed)
            .await
            .expect("oldest"),
        None
    );

    // At T0 + 1,000 with a default of 500 ms: the default task (ended
    // 990 ms ago) and the quick handler's (horizon 100 ms) go; the long
    // namespace's other task (horizon 10 s) stays.
    let n = store
        .remove_ended(TaskState::Succeeded, T0 + 1_000, 500, 100)
        .await
        .expect("remove");
    assert_eq!(n, 2);
    assert!(store.get_task(&plain).await.unwrap().is_none());
    assert!(store.get_task(&fast).await.unwrap().is_none());
    assert!(store.get_task(&kept).await.unwrap().is_some());
    let n = store
        .remove_ended(TaskState::Succeeded, T0 + 10_009, 500, 100)
        .await
        .expect("remove");
    assert_eq!(n, 0, "inside the namespace's horizon by 1 ms");
    let n = store
        .remove_ended(TaskState::Succeeded, T0 + 10_011, 500, 100)
        .await
        .expect("remove");
    assert_eq!(n, 1, "past it");

    let rules = store.retention_rules(Some("long")).await.expect("rules");
    let seen: Vec<(&str, TaskState, i64)> = rules
        .iter()
        .map(|r| (r.handler.as_str(), r.state, r.horizon_ms))
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.contains(&("", TaskState::Succeeded, 10_000)));
    assert!(seen.contains(&("", TaskState::Failed, 20_000)));
    assert!(seen.contains(&("quick", TaskState::Succeeded, 100)));
    assert!(
        store
            .retention_rules(Some("default"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.retention_rules(None).await.unwrap().len(), 3);
    // Replacing: a set replaces the level's rules; none set removes them.
    store
        .set_retention("long", "", &quick)
        .await
        .expect("replace");
    store
        .set_retention("long", "quick", &Horizons::default())
        .await
        .expect("clear");
    let rules = store.retention_rules(None).await.expect("rules");
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        (
            rules[0].handler.as_str(),
            rules[0].state,
            rules[0].horizon_ms
        ),
        ("", TaskState::Succeeded, 100)
    );
}
