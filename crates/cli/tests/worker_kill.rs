//! `taskmesh worker` processes (the binary built from this code) killed
//! with SIGKILL mid-task, as a stream worker and in push mode: their tasks
//! are taken back and finish on another worker.

use std::time::Duration;

use taskmesh::v1::{self as pb, task_api_client::TaskApiClient};
use taskmesh_testkit::process::WorkerProcess;
use taskmesh_testkit::*;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");
const LIMIT: Duration = Duration::from_secs(30);

/// A node whose push workers are probed (and lost) quickly.
async fn fast_node(dir: &std::path::Path) -> taskmesh_cli::node::RunningNode {
    let mut opts = node_options(dir);
    opts.dispatcher.heartbeat_interval = Duration::from_millis(300);
    start_node(opts).await
}

async fn workers(api: &mut TaskApiClient<Channel>) -> Vec<pb::WorkerInfo> {
    api.list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("list workers")
        .into_inner()
        .workers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_a_killed_worker_process_finish_on_another_worker() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;

    // Worker A is a real process: SIGKILL takes its stream down mid-task.
    let mut a = WorkerProcess::new(
        BIN.as_ref(),
        "worker-a",
        &[format!("http://{}", node.grpc_addr)],
        dir.path(),
    )
    .handlers("sleep")
    .concurrency(4)
    .spawn()
    .await;
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(submit(&mut api, "sleep", br#"{"ms":4000}"#).await);
        }
        v
    };
    wait_for(
        "4 tasks running on worker-a",
        Duration::from_secs(30),
        || {
            let mut api = api.clone();
            let ids = ids.clone();
            async move {
                for id in &ids {
                    let t = get(&mut api, id).await;
                    if state(&t) != pb::TaskState::Running || t.worker_id != "worker-a" {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    a.kill();

    let ledger = Ledger::default();
    let b = counting_worker(&[node.grpc_addr], "worker-b", 4, ledger);
    for id in &ids {
        let t = wait_task_state(&api, id, pb::TaskState::Succeeded, Duration::from_secs(30)).await;
        let first = &t.attempts[0];
        assert_eq!(first.worker_id, "worker-a");
        assert_eq!(
            first.outcome,
            pb::AttemptOutcome::WorkerLost as i32,
            "{t:?}"
        );
        let last = t.attempts.last().unwrap();
        assert_eq!(last.worker_id, "worker-b");
        assert_eq!(last.outcome, pb::AttemptOutcome::Succeeded as i32);
    }
    b.stop().await;
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_a_killed_push_worker_process_finish_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let node = fast_node(dir.path()).await;
    let mut api = api(node.grpc_addr).await;

    let ledger_file = dir.path().join("push-a.ledger");
    let mut a = WorkerProcess::new(
        BIN.as_ref(),
        "push-a",
        &[format!("http://{}", node.grpc_addr)],
        dir.path(),
    )
    .push("127.0.0.1:0")
    .handlers("sleep")
    .concurrency(4)
    .ledger(&ledger_file)
    .spawn()
    .await;
    wait_for("push-a to register", LIMIT, || {
        let mut api = api.clone();
        async move {
            let w = workers(&mut api).await;
            w.iter().any(|w| w.worker_id == "push-a").then_some(())
        }
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(submit(&mut api, "sleep", br#"{"ms":4000}"#).await);
    }
    wait_for("4 tasks running on push-a", LIMIT, || {
        let mut api = api.clone();
        let ids = ids.clone();
        async move {
            for id in &ids {
                let t = get(&mut api, id).await;
                if state(&t) != pb::TaskState::Running || t.worker_id != "push-a" {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    a.kill();
    let ran = std::fs::read_to_string(&ledger_file).unwrap();
    for id in &ids {
        assert!(ran.contains(id.as_str()), "push-a started {id}: {ran}");
    }

    let ledger = Ledger::default();
    let b = counting_worker(&[node.grpc_addr], "worker-b", 4, ledger);
    for id in &ids {
        let t = wait_task_state(&api, id, pb::TaskState::Succeeded, LIMIT).await;
        let first = &t.attempts[0];
        assert_eq!(first.worker_id, "push-a");
        assert_eq!(
            first.outcome,
            pb::AttemptOutcome::WorkerLost as i32,
            "{t:?}"
        );
        let last = t.attempts.last().unwrap();
        assert_eq!(last.worker_id, "worker-b");
        assert_eq!(last.outcome, pb::AttemptOutcome::Succeeded as i32);
    }
    // The lost push worker is gone from the list; the stream worker stays.
    let listed = workers(&mut api).await;
    let ids_listed: Vec<&str> = listed.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids_listed, ["worker-b"]);
    b.stop().await;
    stop_node(node).await;
}
