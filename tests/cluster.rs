//! Two in-process replicas coordinated through the machine's Redis (each
//! test its own key prefix, deleted afterwards) on one database of the
//! machine's Postgres or MariaDB (each test a scratch database of its own):
//! one leader at a time, a schedule's fires not duplicated, every replica's
//! workers visible from any replica, a task submitted on one replica run by
//! a worker connected to the other. Each scenario runs on both backends.

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_store::DatabaseKind;
use taskmesh_testkit::node::replica_options;
use taskmesh_testkit::schedule::{create_schedule, every_second, pause_schedule};
use taskmesh_testkit::services::{ScratchDb, SharedRedis};
use taskmesh_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_leader_and_one_worker_registry_on_postgres() {
    two_replicas_share_one_leader_and_one_worker_registry(DatabaseKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_leader_and_one_worker_registry_on_mariadb() {
    two_replicas_share_one_leader_and_one_worker_registry(DatabaseKind::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_leaves_the_running_attempts_of_the_others_alone_on_postgres() {
    a_replica_joining_leaves_the_running_attempts_of_the_others_alone(DatabaseKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_leaves_the_running_attempts_of_the_others_alone_on_mariadb() {
    a_replica_joining_leaves_the_running_attempts_of_the_others_alone(DatabaseKind::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_key_caps_its_tasks_across_two_replicas_on_postgres() {
    a_concurrency_key_caps_its_tasks_across_two_replicas(DatabaseKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_key_caps_its_tasks_across_two_replicas_on_mariadb() {
    a_concurrency_key_caps_its_tasks_across_two_replicas(DatabaseKind::Mysql).await;
}

/// When each execution of a handler started and ended, by the worker's
/// clock (one host: every replica and worker share it).
#[derive(Clone, Default)]
struct Runs(std::sync::Arc<std::sync::Mutex<Vec<(String, i64, i64)>>>);

impl Runs {
    /// The most executions of `tasks` under way at once: ends before
    /// starts at one instant (a task of the key started after another's
    /// end was written, which came after its handler returned).
    fn peak(&self, tasks: &std::collections::HashSet<String>) -> usize {
        let mut edges: Vec<(i64, i32)> = Vec::new();
        for (id, start, end) in self.0.lock().unwrap().iter() {
            if tasks.contains(id) {
                edges.push((*start, 1));
                edges.push((*end, -1));
            }
        }
        edges.sort();
        let (mut now, mut peak) = (0i32, 0i32);
        for (_, d) in edges {
            now += d;
            peak = peak.max(now);
        }
        peak as usize
    }
}

/// A worker whose `hold` handler sleeps 100 ms and records when it ran.
fn holding_worker(addr: std::net::SocketAddr, id: &str, runs: Runs) -> TestWorker {
    use taskmesh_worker::{HandlerError, Output, TaskContext, Worker, WorkerOptions, handler_fn};
    let mut opts = WorkerOptions::new(vec![format!("http://{addr}")]);
    opts.worker_id = id.into();
    opts.name = id.into();
    opts.concurrency = 8;
    let hold = handler_fn(move |ctx: TaskContext| {
        let runs = runs.clone();
        async move {
            let start = now_ms();
            tokio::time::sleep(Duration::from_millis(100)).await;
            runs.0
                .lock()
                .unwrap()
                .push((ctx.task_id.clone(), start, now_ms()));
            Ok::<_, HandlerError>(Output::new(Vec::new(), "text/plain"))
        }
    });
    TestWorker::spawn(Worker::new(opts).handler("hold", hold))
}

/// 50 tasks of key `customer:42` (limit 2) and 10 of `customer:7` (limit
/// 2), submitted on both replicas (one of them over REST), then run by a
/// worker on each replica with 8 slots: never more than 2 of a key at once (from
/// the workers' start and end times of every execution, not by sampling),
/// both keys reach their limit, every task succeeds once. A key without a
/// limit is refused over gRPC and REST with nothing written.
async fn a_concurrency_key_caps_its_tasks_across_two_replicas(kind: DatabaseKind) {
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let database = ScratchDb::create(kind).await;
    let redis = SharedRedis::new();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(start_node(replica_options(dir.path(), &redis, database.url())).await);
    }
    let mut apis = [
        api(replicas[0].grpc_addr).await,
        api(replicas[1].grpc_addr).await,
    ];
    let keyed = |key: &str| pb::SubmitTaskRequest {
        handler: "hold".into(),
        concurrency_key: key.into(),
        concurrency_limit: 2,
        ..Default::default()
    };

    let refused = apis[0]
        .submit_task(pb::SubmitTaskRequest {
            concurrency_limit: 0,
            ..keyed("customer:42")
        })
        .await
        .expect_err("a key without a limit");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("concurrency_limit"),
        "{refused:?}"
    );
    let rest = taskmesh_testkit::http::Rest::new(replicas[1].http_addr);
    let bad = rest
        .call(
            reqwest::Method::POST,
            "/api/tasks",
            Some(serde_json::json!({"handler": "hold", "concurrencyLimit": 3})),
        )
        .await;
    taskmesh_testkit::http::assert_error(&bad, 400, 3, "concurrency_key");
    let listed = apis[0]
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert!(listed.is_empty(), "nothing written: {listed:?}");

    let mut big = HashSet::new();
    let mut small = HashSet::new();
    for i in 0..60 {
        let (key, set) = if i % 6 == 5 {
            ("customer:7", &mut small)
        } else {
            ("customer:42", &mut big)
        };
        let id = if i == 0 {
            let reply = rest
                .call(
                    reqwest::Method::POST,
                    "/api/tasks",
                    Some(serde_json::json!({
                        "handler": "hold",
                        "concurrencyKey": key,
                        "concurrencyLimit": 2,
                    })),
                )
                .await;
            assert_eq!(
                reply.status,
                reqwest::StatusCode::ACCEPTED,
                "{:?}",
                reply.json
            );
            assert_eq!(reply.json["task"]["concurrencyKey"], key);
            assert_eq!(reply.json["task"]["concurrencyLimit"], 2);
            reply.json["taskId"].as_str().unwrap().to_string()
        } else {
            apis[i % 2]
                .submit_task(keyed(key))
                .await
                .unwrap()
                .into_inner()
                .task_id
        };
        set.insert(id);
    }
    // The workers come once every task is queued, so both keys wait from
    // the start.
    let runs = Runs::default();
    let workers = [
        holding_worker(replicas[0].grpc_addr, "hold-a", runs.clone()),
        holding_worker(replicas[1].grpc_addr, "hold-b", runs.clone()),
    ];
    for w in &workers {
        assert!(w.handle.wait_connected(Duration::from_secs(10)).await);
    }
    let all: Vec<String> = big.iter().chain(&small).cloned().collect();
    for id in &all {
        let t = wait_task_state(
            &apis[0],
            id,
            pb::TaskState::Succeeded,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(t.attempts.len(), 1, "{t:?}");
    }
    assert_eq!(runs.0.lock().unwrap().len(), 60, "each task ran once");
    assert_eq!(
        runs.peak(&big),
        2,
        "customer:42 ran at most, and at times, 2 at once"
    );
    assert_eq!(
        runs.peak(&small),
        2,
        "customer:7 ran at most, and at times, 2 at once"
    );
    for w in workers {
        w.stop().await;
    }
    for r in replicas {
        stop_node(r).await;
    }
}

async fn two_replicas_share_one_leader_and_one_worker_registry(kind: DatabaseKind) {
    let dir = tempfile::tempdir().unwrap();
    let database = ScratchDb::create(kind).await;
    let redis = SharedRedis::new();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(start_node(replica_options(dir.path(), &redis, database.url())).await);
    }
    let mut a = api(replicas[0].grpc_addr).await;
    let b = api(replicas[1].grpc_addr).await;

    // A worker on replica B; a task submitted on replica A reaches it.
    let ledger = Ledger::default();
    let w = counting_worker(&[replicas[1].grpc_addr], "on-b", 4, ledger.clone());
    assert!(w.handle.wait_connected(Duration::from_secs(10)).await);
    let listed = a
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .workers;
    assert_eq!(
        listed.len(),
        1,
        "replica A sees replica B's worker: {listed:?}"
    );
    assert_eq!(listed[0].worker_id, "on-b");

    let id = submit(&mut a, "echo", b"{}").await;
    wait_task_state(&b, &id, pb::TaskState::Succeeded, Duration::from_secs(20)).await;
    assert_eq!(ledger.count(&id), 1);

    // A schedule every second: with two schedulers, each fire still makes one task.
    let s = create_schedule(&mut a, every_second("echo")).await;
    let fires = wait_for("five fires", Duration::from_secs(20), || {
        let mut a = a.clone();
        let id = s.clone();
        async move {
            let r = a
                .get_schedule(pb::GetScheduleRequest {
                    schedule_id: id,
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            (r.recent_fires.len() >= 5).then_some(r.recent_fires)
        }
    })
    .await;
    let times: std::collections::HashSet<_> =
        fires.iter().map(|f| f.fire_time.unwrap().seconds).collect();
    assert_eq!(times.len(), fires.len(), "no fire time handled twice");
    pause_schedule(&mut a, &s).await;

    // The fencing token only ever rose: both replicas led with tokens the store accepted.
    assert!(replicas[0].store.fence_token().await.unwrap() > 0);
    w.stop().await;
    for r in replicas {
        stop_node(r).await;
    }
}

/// Regression: a replica joining a running cluster used to take back every
/// attempt in flight anywhere ("server restarted during the attempt"), so
/// the other replicas' workers ran those tasks a second time. Only a single
/// node may assume that nothing in flight survived its start.
async fn a_replica_joining_leaves_the_running_attempts_of_the_others_alone(kind: DatabaseKind) {
    let dir = tempfile::tempdir().unwrap();
    let database = ScratchDb::create(kind).await;
    let redis = SharedRedis::new();
    let options = || replica_options(dir.path(), &redis, database.url());
    let a = start_node(options()).await;
    let mut api_a = api(a.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_worker(&[a.grpc_addr], "on-a", 2, ledger.clone());
    assert!(w.handle.wait_connected(Duration::from_secs(10)).await);
    let id = submit(&mut api_a, "sleep", br#"{"ms":2000}"#).await;
    wait_task_state(&api_a, &id, pb::TaskState::Running, Duration::from_secs(20)).await;

    let b = start_node(options()).await;
    let t = wait_for("the task to succeed", Duration::from_secs(20), || {
        let mut api_a = api_a.clone();
        let id = id.clone();
        async move {
            let t = get(&mut api_a, &id).await;
            matches!(
                state(&t),
                pb::TaskState::Succeeded | pb::TaskState::Failed | pb::TaskState::TimedOut
            )
            .then_some(t)
        }
    })
    .await;
    assert_eq!(state(&t), pb::TaskState::Succeeded, "{t:?}");
    assert_eq!(
        t.attempts.len(),
        1,
        "B's start took nothing back from A's worker: {:?}",
        t.attempts
    );
    w.stop().await;
    for r in [a, b] {
        stop_node(r).await;
    }
}
