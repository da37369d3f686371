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

/// A broadcast over 3 `taskmesh worker` processes: shards 0, 1 and 2 run
/// one on each; the worker running shard 1 is killed (SIGKILL) mid-shard,
/// and that shard runs again with the same index on a worker that had
/// finished its own. In the end every index SUCCEEDED exactly once (one
/// succeeded attempt each), the lost attempt is WORKER_LOST, and the
/// broadcast SUCCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_shard_of_a_killed_worker_runs_again_with_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut api = api(node.grpc_addr).await;
    let server = [format!("http://{}", node.grpc_addr)];
    let mut procs = Vec::new();
    for id in ["bw-0", "bw-1", "bw-2"] {
        let p = WorkerProcess::new(BIN.as_ref(), id, &server, dir.path())
            .handlers("sleep")
            .concurrency(2)
            .spawn()
            .await;
        procs.push((id, p));
    }
    wait_for("3 workers connected", LIMIT, || {
        let mut api = api.clone();
        async move { (workers(&mut api).await.len() == 3).then_some(()) }
    })
    .await;

    let parent = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "sleep".into(),
            payload: Some(pb::Payload {
                data: br#"{"ms":3000}"#.to_vec(),
                content_type: "application/json".into(),
            }),
            broadcast: true,
            ..Default::default()
        })
        .await
        .expect("submit a broadcast")
        .into_inner()
        .task_id;
    let running = wait_for("3 shards running on 3 workers", LIMIT, || {
        let mut api = api.clone();
        let parent = parent.clone();
        async move {
            let s = shards(&mut api, &parent).await;
            let on: std::collections::BTreeSet<&str> =
                s.iter().map(|t| t.worker_id.as_str()).collect();
            (s.len() == 3 && s.iter().all(|t| state(t) == pb::TaskState::Running) && on.len() == 3)
                .then_some(s)
        }
    })
    .await;
    assert_eq!(
        running
            .iter()
            .map(|t| (t.shard_index, t.shard_total))
            .collect::<Vec<_>>(),
        vec![(0, 3), (1, 3), (2, 3)]
    );
    assert_eq!(state(&get(&mut api, &parent).await), pb::TaskState::Running);
    let victim = running[1].worker_id.clone();
    let (_, p) = procs.iter_mut().find(|(id, _)| *id == victim).unwrap();
    p.kill();

    let done = wait_task_state(&api, &parent, pb::TaskState::Succeeded, LIMIT).await;
    assert!(done.broadcast);
    let ended = shards(&mut api, &parent).await;
    assert_eq!(ended.len(), 3, "no shard was added: {ended:#?}");
    for (i, s) in ended.iter().enumerate() {
        assert_eq!((s.shard_index, s.shard_total), (i as u32, 3));
        assert_eq!(state(s), pb::TaskState::Succeeded, "{s:#?}");
        let t = get(&mut api, &s.task_id).await;
        let won: Vec<&pb::Attempt> = t
            .attempts
            .iter()
            .filter(|a| a.outcome == pb::AttemptOutcome::Succeeded as i32)
            .collect();
        assert_eq!(won.len(), 1, "shard {i} succeeded exactly once: {t:#?}");
        if i == 1 {
            let first = &t.attempts[0];
            assert_eq!(first.worker_id, victim);
            assert_eq!(
                first.outcome,
                pb::AttemptOutcome::WorkerLost as i32,
                "{t:#?}"
            );
            assert_ne!(won[0].worker_id, victim, "run again on a live worker");
        } else {
            assert_eq!(t.attempts.len(), 1, "shard {i} ran once: {t:#?}");
        }
    }
    for (_, mut p) in procs {
        if !p.is_killed() {
            p.kill();
        }
    }
    stop_node(node).await;
}
