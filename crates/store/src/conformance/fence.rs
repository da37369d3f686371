//! The leader fence: a write carrying an older fencing token than the
//! newest the store has seen changes nothing and is refused, whatever it
//! is (task events or schedule fires).

use taskmesh_core::{Event, TaskState};

use super::{StoreFixture, T0, create, get, new_task};
use crate::{Error, Store};

/// A deposed leader's writes are refused and leave no trace.
pub async fn fenced_writes_from_an_old_leader_are_refused(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let store: &dyn Store = store.as_ref();
    assert_eq!(store.fence_token().await.unwrap(), 0);
    let a = create(
        store,
        taskmesh_core::NewTask {
            run_at: T0 + 10,
            ..new_task("fence")
        },
        T0,
    )
    .await;
    let b = create(
        store,
        taskmesh_core::NewTask {
            run_at: T0 + 10,
            ..new_task("fence")
        },
        T0,
    )
    .await;

    let due = |id: &str| vec![(id.to_string(), Event::Due)];
    let r = store
        .transition_many(&due(&a.id), T0 + 10, Some(5))
        .await
        .unwrap();
    assert!(r[0].is_ok());
    assert_eq!(store.fence_token().await.unwrap(), 5);

    // The old leader (token 4) wakes up and tries to act.
    let err = store
        .transition_many(&due(&b.id), T0 + 11, Some(4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err:?}");
    assert_eq!(
        get(store, &b.id).await.state,
        TaskState::Pending,
        "nothing written"
    );
    assert_eq!(store.fence_token().await.unwrap(), 5);
    let err = store
        .commit_fires_many(Vec::new(), T0 + 11, Some(4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err:?}");

    // The current leader goes on; a newer one takes over.
    assert!(
        store
            .transition_many(&due(&b.id), T0 + 12, Some(5))
            .await
            .unwrap()[0]
            .is_ok()
    );
    assert!(
        store
            .commit_fires_many(Vec::new(), T0 + 12, Some(6))
            .await
            .is_ok()
    );
    assert_eq!(store.fence_token().await.unwrap(), 6);
    // Writes that are not leader writes (worker reports) are not fenced.
    assert!(store.transition_many(&[], T0 + 13, None).await.is_ok());
}
