//! Conformance scenario: the store's clock, followed by a [`StoreClock`]
//! from a host whose clock is off, is what due-ness is judged by.

use std::sync::Arc;

use taskmesh_core::{Clock, FakeClock, NewTask};

use super::{StoreFixture, create, new_task};
use crate::StoreClock;
use crate::clock::DEFAULT_RESYNC;

/// A host clock an hour ahead would call a task due ten minutes early; the
/// [`StoreClock`] built on it reads the store's clock and does not.
pub async fn store_clock_corrects_a_skewed_host(fixture: &dyn StoreFixture) {
    let store = fixture.open().await;
    let first = store.db_now().await.expect("db_now");
    let second = store.db_now().await.expect("db_now");
    assert!(
        second >= first,
        "the store's clock went back: {first} -> {second}"
    );

    let hour = 3_600_000;
    let host = FakeClock::new(first + hour);
    let clock = StoreClock::start(Arc::clone(&store), Arc::new(host.clone()), DEFAULT_RESYNC)
        .await
        .expect("start the store clock");
    let reading = clock.now_millis();
    let db = store.db_now().await.expect("db_now");
    assert!(
        (db - reading).abs() < 2_000,
        "store clock reads {reading}, the store says {db}"
    );
    assert!((clock.offset_millis() + hour).abs() < 2_000);

    let task = NewTask {
        run_at: db + 600_000,
        ..new_task("clock")
    };
    let task = create(store.as_ref(), task, db).await;
    let due = |now| {
        let store = Arc::clone(&store);
        async move {
            store
                .due_tasks(now, 10)
                .await
                .expect("due_tasks")
                .into_iter()
                .map(|t| t.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        due(host.now_millis()).await,
        std::slice::from_ref(&task.id),
        "the skewed host fires early"
    );
    assert!(
        due(clock.now_millis()).await.is_empty(),
        "the store clock does not"
    );
    // Ten minutes on (plus the slack of the readings above), it is due.
    assert_eq!(due(clock.now_millis() + 602_000).await, [task.id]);
}
