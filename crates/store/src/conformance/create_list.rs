//! Conformance scenarios: creating tasks (idempotency included) and listing them.

use std::collections::BTreeSet;
use std::sync::Arc;

use taskmesh_core::{NewTask, TaskRecord, TaskState};

use super::{StoreFixture, T0, all_filter, create, new_task, without_attempts};
use crate::{Error, Store, TaskFilter};

/// A repeated `client_request_id` returns the stored task for the same
/// fingerprint and is refused for another; one row either way.
pub async fn idempotent_create(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let with_key = || NewTask {
        client_request_id: Some("req-1".into()),
        ..new_task("idem")
    };
    let first = store
        .create_task(with_key(), "fp-a", T0)
        .await
        .expect("first create");
    assert!(!first.existing);

    let again = store
        .create_task(with_key(), "fp-a", T0 + 5)
        .await
        .expect("repeat");
    assert!(again.existing, "same key and fingerprint must be existing");
    assert_eq!(again.task.id, first.task.id);
    assert_eq!(without_attempts(again.task), first.task);

    let err = store
        .create_task(with_key(), "fp-b", T0 + 10)
        .await
        .expect_err("other fingerprint must be refused");
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("req-1") && text.contains(&first.task.id),
        "{text}"
    );

    let page = store.list_tasks(&all_filter(100)).await.expect("list");
    assert_eq!(page.tasks.len(), 1, "exactly one row for one key");

    // Without a key, two creates are two tasks.
    create(store.as_ref(), new_task("idem"), T0).await;
    create(store.as_ref(), new_task("idem"), T0).await;
    let page = store.list_tasks(&all_filter(100)).await.expect("list");
    assert_eq!(page.tasks.len(), 3);
}

/// Many concurrent creates with one key make one task; all but one see it
/// as existing.
pub async fn concurrent_idempotent_creates(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let mut handles = Vec::new();
    for _ in 0..10 {
        let store = Arc::clone(&store);
        handles.push(tokio::spawn(async move {
            let task = NewTask {
                client_request_id: Some("req-race".into()),
                ..new_task("race")
            };
            store.create_task(task, "fp", T0).await
        }));
    }
    let mut ids = BTreeSet::new();
    let mut fresh = 0;
    for handle in handles {
        let created = handle.await.expect("join").expect("create");
        fresh += usize::from(!created.existing);
        ids.insert(created.task.id);
    }
    assert_eq!(fresh, 1, "exactly one create writes");
    assert_eq!(ids.len(), 1, "every caller sees the same task");
    let page = store.list_tasks(&all_filter(100)).await.expect("list");
    assert_eq!(page.tasks.len(), 1);
}

/// Listing is newest first, filters by state and handler, and pages with
/// no duplicates, no gaps and no dangling cursor on the last page.
pub async fn list_filters_and_paging(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let mut all = Vec::new();
    for i in 0..25 {
        let handler = if i % 2 == 0 { "h-a" } else { "h-b" };
        let run_at = if i % 3 == 0 { T0 + 60_000 } else { T0 };
        let task = NewTask {
            run_at,
            ..new_task(handler)
        };
        all.push(create(store.as_ref(), task, T0).await);
    }
    let mut newest_first: Vec<String> = all.iter().map(|t| t.id.clone()).collect();
    newest_first.sort_by(|a, b| b.cmp(a));

    for limit in [1u32, 5, 7, 25, 1000] {
        let pages = page_all(store.as_ref(), TaskFilter::default(), limit).await;
        let ids: Vec<String> = pages.iter().flatten().map(|t| t.id.clone()).collect();
        assert_eq!(
            ids, newest_first,
            "limit {limit}: every task once, newest first"
        );
        let expected_pages = 25usize.div_ceil(limit as usize);
        assert_eq!(pages.len(), expected_pages, "limit {limit}: page count");
        assert!(pages.iter().flatten().all(|t| t.attempts.is_empty()));
    }

    let check = |filter: TaskFilter, keep: &dyn Fn(&TaskRecord) -> bool| {
        let mut ids: Vec<String> = all
            .iter()
            .filter(|t| keep(t))
            .map(|t| t.id.clone())
            .collect();
        ids.sort_by(|a, b| b.cmp(a));
        (filter, ids)
    };
    let cases = [
        check(
            TaskFilter {
                state: Some(TaskState::Pending),
                ..TaskFilter::default()
            },
            &|t| t.state == TaskState::Pending,
        ),
        check(
            TaskFilter {
                handler: Some("h-b".into()),
                ..TaskFilter::default()
            },
            &|t| t.handler == "h-b",
        ),
        check(
            TaskFilter {
                state: Some(TaskState::Ready),
                handler: Some("h-a".into()),
                ..TaskFilter::default()
            },
            &|t| t.state == TaskState::Ready && t.handler == "h-a",
        ),
        check(
            TaskFilter {
                state: Some(TaskState::Succeeded),
                ..TaskFilter::default()
            },
            &|_| false,
        ),
    ];
    for (filter, expected) in cases {
        let ids: Vec<String> = page_all(store.as_ref(), filter.clone(), 3)
            .await
            .into_iter()
            .flatten()
            .map(|t| t.id)
            .collect();
        assert_eq!(ids, expected, "{filter:?}");
    }

    // Limits are clamped to 1..=1000.
    let page = store.list_tasks(&all_filter(0)).await.expect("list");
    assert_eq!(page.tasks.len(), 1);
    let page = store.list_tasks(&all_filter(u32::MAX)).await.expect("list");
    assert_eq!(page.tasks.len(), 25);
    assert_eq!(page.next_before_id, None);
}

/// A list by state finds the tasks in that state and no other, in each
/// state of a task's life, in flight (DISPATCHING, RUNNING: their lists
/// read another index than the rest's) or not, within a namespace and
/// across them, by handler too, paged.
pub async fn lists_by_state_follow_each_task_through_its_life(fixture: &dyn StoreFixture) {
    use taskmesh_core::Event;

    use super::{ack, step, succeed};
    use crate::Claim;

    let store = fixture.open().await;
    let store = store.as_ref();
    let mut tasks = Vec::new();
    for namespace in ["default", "other"] {
        for j in 0..12 {
            let handler = if j % 3 == 0 { "h-b" } else { "h-a" };
            let task = NewTask {
                namespace: namespace.into(),
                ..new_task(handler)
            };
            tasks.push(create(store, task, T0).await);
        }
    }
    // Of each namespace's handler h-a (8 tasks): 6 claimed, 4 of them
    // ACKed, 2 of those ended; one of the 2 READY left is cancelled.
    for namespace in ["default", "other"] {
        let claimed = store
            .claim_ready(namespace, "h-a", 6, T0 + 10, &mut |_| {
                Some(Claim {
                    execution_id: taskmesh_core::id::new_execution_id(),
                    worker_id: "w-1".into(),
                    ack_deadline: T0 + 60_000,
                })
            })
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 6);
        for (k, task) in claimed.iter().take(4).enumerate() {
            let exec = task.execution_id.clone().expect("claimed");
            let running = step(store, task, ack(&exec), T0 + 11).await;
            if k < 2 {
                step(store, &running, succeed(&exec, b""), T0 + 12).await;
            }
        }
    }
    let mut current = Vec::new();
    for task in &tasks {
        current.push(super::get(store, &task.id).await);
    }
    for namespace in ["default", "other"] {
        let ready = current
            .iter()
            .find(|t| t.namespace == namespace && t.handler == "h-a" && t.state == TaskState::Ready)
            .expect("a READY task left")
            .clone();
        let cancel = Event::Cancel {
            reason: "not wanted".into(),
        };
        let cancelled = step(store, &ready, cancel, T0 + 13).await;
        let slot = current
            .iter_mut()
            .find(|t| t.id == cancelled.id)
            .expect("listed");
        *slot = cancelled;
    }
    let states = [
        TaskState::Ready,
        TaskState::Dispatching,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Cancelled,
        TaskState::Failed,
    ];
    let mut checked = 0;
    for state in states {
        for namespace in [None, Some("default"), Some("other")] {
            for handler in [None, Some("h-a"), Some("h-b")] {
                let mut expected: Vec<String> = current
                    .iter()
                    .filter(|t| {
                        t.state == state
                            && namespace.is_none_or(|n| t.namespace == n)
                            && handler.is_none_or(|h| t.handler == h)
                    })
                    .map(|t| t.id.clone())
                    .collect();
                expected.sort_by(|a, b| b.cmp(a));
                let filter = TaskFilter {
                    state: Some(state),
                    namespace: namespace.map(Into::into),
                    handler: handler.map(Into::into),
                    ..TaskFilter::default()
                };
                let listed: Vec<String> = page_all(store, filter, 3)
                    .await
                    .into_iter()
                    .flatten()
                    .map(|t| t.id)
                    .collect();
                assert_eq!(
                    listed, expected,
                    "{state:?} in {namespace:?} of {handler:?}"
                );
                checked += expected.len();
            }
        }
    }
    // Each task counted four times (across namespaces and in its own, with
    // and without its handler).
    assert_eq!(checked, 4 * tasks.len());
}

/// A child's parent is stored with it (one at a time and in a batch) and
/// listing by parent finds exactly its children, newest first, paged and
/// with the other filters.
pub async fn children_are_listed_by_parent(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let parent = create(store.as_ref(), new_task("p"), T0).await;
    let other = create(store.as_ref(), new_task("p"), T0).await;
    let child = |parent: &TaskRecord, handler: &str, later: bool| NewTask {
        parent_task_id: Some(parent.id.clone()),
        run_at: if later { T0 + 60_000 } else { T0 },
        ..new_task(handler)
    };
    let mut mine = Vec::new();
    for i in 0..4 {
        let handler = if i % 2 == 0 { "c-a" } else { "c-b" };
        mine.push(create(store.as_ref(), child(&parent, handler, i == 3), T0).await);
        create(store.as_ref(), new_task("c-a"), T0).await;
    }
    create(store.as_ref(), child(&other, "c-a", false), T0).await;
    let batch = (0..3)
        .map(|i| (child(&parent, "c-b", i == 0), format!("fp-{i}")))
        .collect();
    for created in store.create_tasks(batch, T0).await.expect("create_tasks") {
        mine.push(created.expect("a child in a batch").task);
    }
    let by_parent = |parent: &str| TaskFilter {
        parent_task_id: Some(parent.to_string()),
        ..TaskFilter::default()
    };
    let mut newest_first: Vec<String> = mine.iter().map(|t| t.id.clone()).collect();
    newest_first.sort_by(|a, b| b.cmp(a));
    for limit in [1u32, 3, 1000] {
        let got = page_all(store.as_ref(), by_parent(&parent.id), limit).await;
        let ids: Vec<String> = got.iter().flatten().map(|t| t.id.clone()).collect();
        assert_eq!(
            ids, newest_first,
            "limit {limit}: every child once, newest first"
        );
        assert!(
            got.iter()
                .flatten()
                .all(|t| t.parent_task_id.as_deref() == Some(parent.id.as_str()))
        );
    }
    let expect = |keep: &dyn Fn(&TaskRecord) -> bool| -> Vec<String> {
        let mut ids: Vec<String> = mine
            .iter()
            .filter(|t| keep(t))
            .map(|t| t.id.clone())
            .collect();
        ids.sort_by(|a, b| b.cmp(a));
        ids
    };
    let cases = [
        (
            TaskFilter {
                handler: Some("c-b".into()),
                ..by_parent(&parent.id)
            },
            expect(&|t| t.handler == "c-b"),
        ),
        (
            TaskFilter {
                state: Some(TaskState::Pending),
                ..by_parent(&parent.id)
            },
            expect(&|t| t.state == TaskState::Pending),
        ),
        (
            TaskFilter {
                namespace: Some("elsewhere".into()),
                ..by_parent(&parent.id)
            },
            Vec::new(),
        ),
        (by_parent(&mine[0].id), Vec::new()),
    ];
    for (filter, want) in cases {
        let ids: Vec<String> = page_all(store.as_ref(), filter.clone(), 2)
            .await
            .into_iter()
            .flatten()
            .map(|t| t.id)
            .collect();
        assert_eq!(ids, want, "{filter:?}");
    }
    assert_eq!(
        page_all(store.as_ref(), by_parent(&other.id), 10)
            .await
            .concat()
            .len(),
        1
    );
    let got = store
        .get_task(&mine[0].id)
        .await
        .expect("get")
        .expect("the child");
    assert_eq!(got.parent_task_id.as_deref(), Some(parent.id.as_str()));
    let plain = store
        .get_task(&parent.id)
        .await
        .expect("get")
        .expect("the parent");
    assert_eq!(plain.parent_task_id, None);
}

/// Every page of `filter` at `limit`, following `next_before_id`.
async fn page_all(store: &dyn Store, mut filter: TaskFilter, limit: u32) -> Vec<Vec<TaskRecord>> {
    filter.limit = limit;
    filter.before_id = None;
    let mut pages = Vec::new();
    loop {
        let page = store.list_tasks(&filter).await.expect("list_tasks");
        assert!(
            page.tasks.len() <= limit as usize,
            "page larger than its limit"
        );
        match page.next_before_id {
            Some(next) => {
                assert_eq!(
                    page.tasks.len(),
                    limit as usize,
                    "only the last page is short"
                );
                assert_eq!(Some(&next), page.tasks.last().map(|t| &t.id));
                pages.push(page.tasks);
                filter.before_id = Some(next);
            }
            None => {
                if !page.tasks.is_empty() {
                    pages.push(page.tasks);
                }
                break;
            }
        }
        assert!(pages.len() <= 10_000, "paging does not end");
    }
    pages
}
