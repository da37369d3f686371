//! Conformance scenario: [`Store::create_tasks`], many creates in one call.

use std::collections::HashSet;

use taskmesh_core::{NewTask, TaskState};
use tokio::sync::broadcast::error::TryRecvError;

use super::{StoreFixture, T0, all_filter, create, new_task};
use crate::Error;

/// A batch answers each entry as a lone create would: new tasks created
/// (READY or PENDING by their run_at), a stored idempotency key found or
/// refused by fingerprint, a key repeated inside the batch resolved against
/// its first use, and an entry whose id is taken refused — without stopping
/// the others. Only new tasks are published.
pub async fn create_tasks_batch(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    assert!(
        store
            .create_tasks(Vec::new(), T0)
            .await
            .expect("empty")
            .is_empty(),
        "an empty batch writes nothing"
    );
    let stored = store
        .create_task(
            NewTask {
                client_request_id: Some("before".into()),
                ..new_task("batch")
            },
            "fp-stored",
            T0,
        )
        .await
        .expect("create before the batch")
        .task;
    let taken = create(store.as_ref(), new_task("batch"), T0).await;
    let mut feed = store.subscribe();

    let keyed = |key: &str| NewTask {
        client_request_id: Some(key.into()),
        ..new_task("batch")
    };
    let later = NewTask {
        run_at: T0 + 60_000,
        ..new_task("batch")
    };
    let duplicate_id = NewTask {
        id: taken.id.clone(),
        ..new_task("batch")
    };
    let entries = vec![
        (new_task("batch"), "fp".to_string()), // 0: new, READY
        (later, "fp".into()),                  // 1: new, PENDING
        (keyed("before"), "fp-stored".into()), // 2: the stored one
        (keyed("before"), "fp-other".into()),  // 3: refused
        (keyed("in-batch"), "fp-1".into()),    // 4: new
        (keyed("in-batch"), "fp-1".into()),    // 5: = 4, existing
        (keyed("in-batch"), "fp-2".into()),    // 6: refused
        (duplicate_id, "fp".into()),           // 7: id taken, refused
        (new_task("batch"), "fp".into()),      // 8: new, after a failure
    ];
    let results = store.create_tasks(entries, T0).await.expect("create_tasks");
    assert_eq!(results.len(), 9, "one answer per entry");
    let ok = |i: usize| match &results[i] {
        Ok(c) => c.clone(),
        Err(e) => panic!("entry {i} must be accepted, got {e:?}"),
    };
    let refused = |i: usize| match &results[i] {
        Err(Error::AlreadyExists(_)) => {}
        other => panic!("entry {i} must be AlreadyExists, got {other:?}"),
    };
    assert!(!ok(0).existing && ok(0).task.state == TaskState::Ready);
    assert!(!ok(1).existing && ok(1).task.state == TaskState::Pending);
    assert!(ok(2).existing && ok(2).task.id == stored.id);
    refused(3);
    assert!(!ok(4).existing);
    assert!(ok(5).existing && ok(5).task.id == ok(4).task.id);
    refused(6);
    refused(7);
    assert!(!ok(8).existing);

    let new_ids: HashSet<String> = [0, 1, 4, 8].iter().map(|&i| ok(i).task.id).collect();
    assert_eq!(new_ids.len(), 4, "four distinct new tasks");
    for id in &new_ids {
        let got = store.get_task(id).await.expect("get").expect("stored");
        assert_eq!(got.handler, "batch");
    }
    let page = store.list_tasks(&all_filter(100)).await.expect("list");
    assert_eq!(page.tasks.len(), 2 + 4, "two before, four new");
    let taken_now = store.get_task(&taken.id).await.expect("get").expect("kept");
    assert_eq!(
        taken_now.version, taken.version,
        "the taken id's task is untouched"
    );

    let mut published = HashSet::new();
    loop {
        match feed.try_recv() {
            Ok(c) => {
                published.insert(c.task_id);
            }
            Err(TryRecvError::Empty) => break,
            Err(e) => panic!("feed: {e:?}"),
        }
    }
    assert_eq!(published, new_ids, "exactly the new tasks are published");
}

/// A batch with many entries (more than one statement's worth) is written
/// whole, in one call.
pub async fn create_tasks_many(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let entries: Vec<(NewTask, String)> = (0..700)
        .map(|_| (new_task("many"), "fp".to_string()))
        .collect();
    let ids: Vec<String> = entries.iter().map(|(t, _)| t.id.clone()).collect();
    let results = store.create_tasks(entries, T0).await.expect("create_tasks");
    let got: Vec<String> = results
        .into_iter()
        .map(|r| r.expect("accepted").task.id)
        .collect();
    assert_eq!(got, ids, "answers in input order");
    let counts = store.ready_counts().await.expect("ready_counts");
    assert_eq!(
        counts,
        vec![("default".to_string(), "many".to_string(), 700)]
    );
}
