//! A restart of `taskmesh serve` (SIGKILL, then start again on the same data
//! directory) keeps every task; attempts that were running are taken back
//! and finish after the restart.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use taskmesh::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_keeps_every_task_and_finishes_the_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let addr: SocketAddr = ([127, 0, 0, 1], grpc).into();
    let mut server = spawn_server(dir.path(), grpc, http, &[]).await;
    let mut api = api(addr).await;

    let ledger = Ledger::default();
    let worker = counting_worker(&[addr], "w", 4, ledger.clone());
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

    let mut running = Vec::new();
    for _ in 0..2 {
        running.push(submit(&mut api, "sleep", br#"{"ms":1500}"#).await);
    }
    let mut delayed = Vec::new();
    for _ in 0..10 {
        let r = api
            .submit_task(pb::SubmitTaskRequest {
                handler: "echo".into(),
                delay: Some(prost_types::Duration {
                    seconds: 2,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        delayed.push(r.task_id);
    }
    wait_for("the sleep tasks to run", Duration::from_secs(20), || {
        let mut api = api.clone();
        let ids = running.clone();
        async move {
            for id in &ids {
                if state(&get(&mut api, id).await) != pb::TaskState::Running {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;

    server.kill();
    let _server = spawn_server(dir.path(), grpc, http, &[]).await;
    let mut api = common::api(addr).await;

    for id in running.iter().chain(&delayed) {
        let t = wait_for(
            "every task to succeed after the restart",
            Duration::from_secs(60),
            || {
                let mut api = api.clone();
                let id = id.clone();
                async move {
                    let t = get(&mut api, &id).await;
                    (state(&t) == pb::TaskState::Succeeded).then_some(t)
                }
            },
        )
        .await;
        if running.contains(id) {
            assert_eq!(
                t.attempts[0].outcome,
                pb::AttemptOutcome::WorkerLost as i32,
                "the interrupted attempt is recorded: {t:?}"
            );
            assert!(t.attempts.len() >= 2);
        }
    }
    let listed = api
        .list_tasks(pb::ListTasksRequest {
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks
        .len();
    assert_eq!(listed, 12, "no task lost or duplicated across the restart");
    for id in &delayed {
        assert_eq!(ledger.count(id), 1, "delayed task {id} ran once");
    }
    worker.shutdown.cancel();
    let _ = worker.join.await;
}

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
    wait_for("the delayed task to run", Duration::from_secs(20), || {
        let mut api = api.clone();
        let id = id.clone();
        async move { (state(&get(&mut api, &id).await) == pb::TaskState::Succeeded).then_some(()) }
    })
    .await;
    assert!(node.store.fence_token().await.unwrap() > 7);
    w.shutdown.cancel();
    let _ = w.join.await;
    node.stop(Duration::from_secs(5)).await;
}
