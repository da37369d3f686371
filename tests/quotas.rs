//! Quotas and rates per namespace on a real node, each against small limits
//! so the test stays short: the request rate (RESOURCE_EXHAUSTED with
//! `retry-after-ms`, REST 429 with `Retry-After`, another namespace
//! unaffected, room again after the wait), the READY backlog (SubmitTask
//! refused; in a SubmitTasks batch only the full namespace's entries),
//! schedules and their shortest interval, open watches, workers per
//! namespace and handlers per registration (the 40,000-handler worker).

use std::time::Duration;

use reqwest::Method;
use taskmesh::v1::{
    self as pb, connect_request::Message as In, dispatcher_client::DispatcherClient,
};
use taskmesh_dispatcher::quota::QuotaOptions;
use taskmesh_testkit::http::Rest;
use taskmesh_testkit::schedule::every_second;
use taskmesh_testkit::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

fn quotas() -> QuotaOptions {
    QuotaOptions {
        rate_per_sec: 0,
        ..QuotaOptions::default()
    }
}

async fn node_with(q: QuotaOptions) -> (tempfile::TempDir, taskmesh_cli::node::RunningNode) {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.quotas = q;
    let node = start_node(opts).await;
    (dir, node)
}

fn task_in(namespace: &str) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        handler: "nobody".into(),
        namespace: namespace.into(),
        ..Default::default()
    }
}

fn assert_exhausted(err: &tonic::Status, needle: &str) {
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains(needle), "{needle:?} not in {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_rate_is_per_namespace_and_says_when_to_retry() {
    let (_dir, node) = node_with(QuotaOptions {
        rate_per_sec: 5,
        burst: 5,
        ..quotas()
    })
    .await;
    let mut api = api(node.grpc_addr).await;
    let rest = Rest::new(node.http_addr);
    for _ in 0..5 {
        api.submit_task(task_in("a"))
            .await
            .expect("within the burst");
    }
    let err = api
        .submit_task(task_in("a"))
        .await
        .expect_err("over the rate");
    assert_exhausted(&err, "request rate of 5/s");
    let wait = retry_after_ms(&err).expect("retry-after-ms metadata");
    assert!((1..=1_000).contains(&wait), "{wait} ms");
    let reply = rest.call(Method::GET, "/api/tasks?namespace=a", None).await;
    assert_eq!(reply.status.as_u16(), 429, "{:?}", reply.json);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(reply.json["code"], 8);
    // Another namespace has a bucket of its own.
    api.submit_task(task_in("b"))
        .await
        .expect("namespace b is not limited by a");
    // There is room again once the bucket has refilled (5/s); a refused
    // try takes nothing from it.
    wait_for("room in a's bucket", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move { api.submit_task(task_in("a")).await.ok() }
    })
    .await;
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ready_backlog_is_bounded_per_namespace() {
    // No refresh from the store during the test (the node counts once,
    // before it serves): a count read while a submit commits may count it
    // twice (high by that, never low), which a limit of 3 would feel.
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.quotas = QuotaOptions {
        max_ready_tasks: 3,
        ..quotas()
    };
    opts.dispatcher.gauge_interval = Duration::from_secs(3_600);
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;
    for _ in 0..3 {
        api.submit_task(task_in("a"))
            .await
            .expect("within the backlog");
    }
    let err = api
        .submit_task(task_in("a"))
        .await
        .expect_err("backlog full");
    assert_exhausted(&err, "3 tasks waiting for a worker, its limit is 3");
    // A batch: a's entries are refused, b's accepted.
    let results = api
        .submit_tasks(pb::SubmitTasksRequest {
            tasks: vec![task_in("a"), task_in("b"), task_in("a"), task_in("b")],
        })
        .await
        .expect("the batch is answered")
        .into_inner()
        .results;
    let outcome: Vec<(bool, i32)> = results
        .iter()
        .map(|r| (r.accepted.is_some(), r.error_code))
        .collect();
    assert_eq!(outcome, [(false, 8), (true, 0), (false, 8), (true, 0)]);
    let listed = api
        .list_tasks(pb::ListTasksRequest {
            namespace: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.tasks.len(), 3, "nothing more was written for a");
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_bounded_in_number_and_frequency() {
    let (_dir, node) = node_with(QuotaOptions {
        max_schedules: 2,
        min_schedule_interval: Duration::from_secs(5),
        ..quotas()
    })
    .await;
    let mut api = api(node.grpc_addr).await;
    let create = |schedule: pb::Schedule| pb::CreateScheduleRequest {
        schedule: Some(schedule),
        ..Default::default()
    };
    // Every second is more often than every 5 s: refused, as cron and as a rate.
    let err = api
        .create_schedule(create(every_second("echo")))
        .await
        .expect_err("too often");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("shortest interval allowed is 5000 ms"),
        "{err:?}"
    );
    let every = |ms: i64| pb::Schedule {
        kind: pb::ScheduleKind::FixedRate as i32,
        interval: Some(prost_types::Duration {
            seconds: ms / 1_000,
            nanos: 0,
        }),
        template: Some(pb::TaskTemplate {
            handler: "echo".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(api.create_schedule(create(every(2_000))).await.is_err());
    api.create_schedule(create(every(5_000)))
        .await
        .expect("every 5 s");
    api.create_schedule(create(every(60_000)))
        .await
        .expect("every minute");
    let err = api
        .create_schedule(create(every(60_000)))
        .await
        .expect_err("a third");
    assert_exhausted(&err, "has 2 schedules, its limit is 2");
    stop_node(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_watches_are_bounded_and_come_back() {
    let (_dir, node) = node_with(QuotaOptions {
        max_watches: 2,
        ..quotas()
    })
    .await;
    let mut api = api(node.grpc_addr).await;
    let id = submit(&mut api, "nobody", b"{}").await;
    let watch = |api: &mut taskmesh::v1::task_api_client::TaskApiClient<_>| {
        let mut api = api.clone();
        let id = id.clone();
        async move {
            api.watch_task(pb::WatchTaskRequest {
                task_id: id,
                ..Default::default()
            })
            .await
        }
    };
    let first = watch(&mut api).await.expect("one");
    let second = watch(&mut api).await.expect("two");
    let err = watch(&mut api).await.expect_err("three");
    assert_exhausted(&err, "2 open watches");
    drop(first);
    let third = wait_for(
        "the closed watch's place comes back",
        Duration::from_secs(10),
        || {
            let mut api = api.clone();
            async move { watch(&mut api).await.ok() }
        },
    )
    .await;
    // Open streams would hold the server's graceful stop.
    drop((second, third));
    stop_node(node).await;
}

/// Opens a worker stream with `reg`; the server's first answer or refusal.
async fn register(
    addr: std::net::SocketAddr,
    reg: pb::WorkerRegistration,
) -> (
    mpsc::Sender<pb::ConnectRequest>,
    Result<tonic::Streaming<pb::ConnectResponse>, tonic::Status>,
) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::ConnectRequest {
        message: Some(In::Register(reg)),
    })
    .await
    .unwrap();
    let mut d = DispatcherClient::new(channel(addr).await);
    let answer = d
        .connect(ReceiverStream::new(rx))
        .await
        .map(|r| r.into_inner());
    (tx, answer)
}

fn worker(id: &str, handlers: usize) -> pb::WorkerRegistration {
    pb::WorkerRegistration {
        worker_id: id.into(),
        name: id.into(),
        handlers: (0..handlers).map(|i| format!("h{i}")).collect(),
        capacity: 1,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_their_handlers_are_bounded() {
    let (_dir, node) = node_with(QuotaOptions {
        max_workers: 1,
        ..quotas()
    })
    .await;
    // The 40,000-handler registration: refused with what the limit is.
    let (_tx, answer) = register(node.grpc_addr, worker("wide", 40_000)).await;
    let err = answer.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("at most 256 are allowed"), "{err:?}");

    let (_tx1, first) = register(node.grpc_addr, worker("w1", 256)).await;
    let mut first = first.expect("the first worker, at the handler limit");
    first
        .message()
        .await
        .expect("registered")
        .expect("a message");
    let (_tx2, second) = register(node.grpc_addr, worker("w2", 1)).await;
    let err = second.expect_err("the second is over the limit");
    assert_exhausted(&err, "has 1 workers on this server, its limit is 1");
    // Nothing of the refused ones shows.
    let rest = Rest::new(node.http_addr);
    let workers = rest.call(Method::GET, "/api/workers", None).await;
    let ids: Vec<&str> = workers.json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["workerId"].as_str())
        .collect();
    assert_eq!(ids, ["w1"]);
    drop((_tx1, first));
    stop_node(node).await;
}
