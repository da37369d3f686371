//! The leader fence: a write carrying an older fencing token than the
//! newest the store has seen changes nothing and is refused, whatever it
//! is (a batch of task events or a schedule's fires).

use taskmesh_core::{Event, TaskState};

use super::schedules::{fire_commit, schedule};
use super::{StoreFixture, T0, create, dispatch, get, new_task};
use crate::{Error, Store};

/// A deposed leader's writes are refused and leave no trace; the current
/// leader's are written; writes that are not a leader's are not fenced.
pub async fn fenced_writes_from_an_old_leader_are_refused(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    assert_eq!(store.fence_token().await.unwrap(), 0);
    let pending = || taskmesh_core::NewTask {
        run_at: T0 + 10,
        ..new_task("fence")
    };
    let a = create(store, pending(), T0).await;
    let b = create(store, pending(), T0).await;

    let due = |id: &str| vec![(id.to_string(), Event::Due)];
    let r = store
        .transition_many(&due(&a.id), T0 + 10, Some(5))
        .await
        .unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].as_ref().expect("written").state, TaskState::Ready);
    assert_eq!(get(store, &a.id).await.state, TaskState::Ready);
    assert_eq!(store.fence_token().await.unwrap(), 5);

    // The old leader (token 4) wakes up and tries to act: a batch of two
    // events, and a real fire of a due schedule.
    let (a_before, b_before) = (get(store, &a.id).await, get(store, &b.id).await);
    let batch = vec![
        (a.id.clone(), dispatch("exec-old", "w-old", T0 + 5_000)),
        (
            b.id.clone(),
            Event::Cancel {
                reason: "old leader".into(),
            },
        ),
    ];
    let err = store
        .transition_many(&batch, T0 + 11, Some(4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err:?}");
    assert_eq!(get(store, &a.id).await, a_before, "nothing written");
    assert_eq!(get(store, &b.id).await, b_before, "nothing written");
    assert_eq!(store.fence_token().await.unwrap(), 5);

    let sched = schedule("sched-fence", Some(T0));
    store
        .create_schedule(&sched)
        .await
        .expect("create schedule");
    let fire_task = taskmesh_core::id::new_task_id();
    let commit = || fire_commit(&sched, T0, &fire_task);
    let err = store
        .commit_fires_many(vec![commit()], T0 + 11, Some(4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err:?}");
    assert!(store.recent_fires(&sched.id, 10).await.unwrap().is_empty());
    assert!(store.get_task(&fire_task).await.unwrap().is_none());
    assert_eq!(
        store.get_schedule(&sched.id).await.unwrap(),
        Some(sched.clone())
    );

    // The current leader goes on; a newer one takes over and fires.
    let r = store
        .transition_many(&due(&b.id), T0 + 12, Some(5))
        .await
        .unwrap();
    assert_eq!(r[0].as_ref().expect("written").state, TaskState::Ready);
    let done = store
        .commit_fires_many(vec![commit()], T0 + 12, Some(6))
        .await
        .unwrap();
    let committed = done[0].as_ref().expect("fire").as_ref().expect("written");
    assert_eq!(committed.tasks[0].id, fire_task);
    assert_eq!(store.recent_fires(&sched.id, 10).await.unwrap().len(), 1);
    assert_eq!(
        store
            .get_schedule(&sched.id)
            .await
            .unwrap()
            .map(|s| s.version),
        Some(sched.version + 1)
    );
    assert_eq!(store.fence_token().await.unwrap(), 6);

    // Writes that are not leader writes (a dispatcher's claim, a worker's
    // report) are not fenced.
    let r = store
        .transition_many(
            &[(a.id.clone(), dispatch("exec-a", "w-1", T0 + 20_000))],
            T0 + 13,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().expect("written").state,
        TaskState::Dispatching
    );
    assert_eq!(store.fence_token().await.unwrap(), 6);
}
