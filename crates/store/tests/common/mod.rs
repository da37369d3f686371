//! What the backend-specific tests of the cluster stores share: waiting for
//! a change, a resync, and a store's own subscribers.
#![allow(dead_code)]

use std::time::Duration;

use taskmesh_core::id::new_execution_id;
use taskmesh_store::conformance::{T0, new_task};
use taskmesh_store::{Claim, Store, TaskChange};
use tokio::sync::broadcast::{self, error::RecvError};

pub use taskmesh_store::conformance::cluster::change_of;

/// Waits until `rx` is told to resync: `Lagged`, or a resync marker.
pub async fn resynced(rx: &mut broadcast::Receiver<TaskChange>) {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match rx.recv().await {
                Err(RecvError::Lagged(_)) => return,
                Ok(c) if c.is_resync() => return,
                Ok(_) => {}
                Err(RecvError::Closed) => panic!("closed"),
            }
        }
    })
    .await
    .expect("subscribers told to resync within 20 s");
}

/// A store with its transport off still tells its own subscribers of a
/// create and a claim.
pub async fn publishes_locally(store: &dyn Store) {
    let mut rx = store.subscribe();
    let t = store
        .create_task(new_task("quiet"), "fp", T0)
        .await
        .expect("create")
        .task;
    assert_eq!(change_of(&mut rx, &t.id).await.version, 1);
    let claimed = store
        .claim_ready("default", "quiet", 1, T0, &mut |_| {
            Some(Claim {
                execution_id: new_execution_id(),
                worker_id: "w".into(),
                ack_deadline: T0 + 1_000,
            })
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(change_of(&mut rx, &t.id).await.version, 2);
}
