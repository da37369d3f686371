//! A node started again on the data of an earlier life leads with a token
//! above the fence that life left in the store. (Restarts of `taskmesh
//! serve` as a killed process run the binary: `crates/cli/tests/restart.rs`.)

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_leads_with_a_token_above_the_stored_fence() {
    let dir = tempfile::tempdir().unwrap();
    {
        // An earlier life of this node led with token 7 (its lease lapsed
        // and was retaken a few times).
        let store = taskmesh_store::SqliteStore::open_in(dir.path())
            .await
            .unwrap();
        use taskmesh_store::Store;
        store.transition_many(&[], 0, Some(7)).await.unwrap();
        assert_eq!(store.fence_token().await.unwrap(), 7);
        store.close().await;
    }
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_worker(&[node.grpc_addr], "w", 2, ledger.clone());
    let id = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "echo".into(),
            delay: Some(prost_types::Duration {
                seconds: 0,
                nanos: 200_000_000,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task_id;
    // The scheduler's writes are fenced: with a stale token this task would
    // stay PENDING for ever.
    wait_task_state(&api, &id, pb::TaskState::Succeeded, Duration::from_secs(20)).await;
    assert!(node.store.fence_token().await.unwrap() > 7);
    w.stop().await;
    stop_node(node).await;
}
