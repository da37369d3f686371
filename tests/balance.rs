//! Balancing end to end over real gRPC on loopback: the strategy configured
//! per handler and overridden per task, label filters, and BUSY failover
//! that neither spins nor loses the task while nobody has room.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use taskmesh::v1 as pb;
use taskmesh_core::Strategy;

const QUIET: Duration = Duration::from_millis(300);

fn request(handler: &str, routing_key: &str, labels: &[(&str, &str)]) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        handler: handler.into(),
        payload: Some(pb::Payload {
            data: b"{}".to_vec(),
            content_type: "application/json".into(),
        }),
        routing_key: routing_key.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

async fn submit_req(
    api: &mut taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
    req: pb::SubmitTaskRequest,
) -> String {
    api.submit_task(req)
        .await
        .expect("submit")
        .into_inner()
        .task_id
}

async fn wait_state(
    api: &taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
    id: &str,
    want: pb::TaskState,
) -> pb::Task {
    wait_for(
        &format!("task {id} to be {want:?}"),
        Duration::from_secs(10),
        || {
            let mut api = api.clone();
            let id = id.to_string();
            async move {
                let t = get(&mut api, &id).await;
                (state(&t) == want).then_some(t)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_strategy_from_config_and_per_task_override_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher
        .balancer
        .per_handler
        .insert("h".into(), Strategy::ConsistentHash);
    let node = start_node(opts).await;
    let mut a = RawWorker::connect(node.grpc_addr, "wa", &["h"], 50).await;
    let mut b = RawWorker::connect(node.grpc_addr, "wb", &["h"], 50).await;
    let mut api = api(node.grpc_addr).await;

    // CONSISTENT_HASH (the handler's configured strategy): one key, one worker.
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(submit_req(&mut api, request("h", "customer-7", &[])).await);
    }
    for id in &ids {
        wait_state(&api, id, pb::TaskState::Dispatching).await;
    }
    let (ga, gb) = (a.drain_assigns(QUIET).await, b.drain_assigns(QUIET).await);
    assert!(
        (ga.len(), gb.len()) == (8, 0) || (ga.len(), gb.len()) == (0, 8),
        "one routing key went to one worker: {} vs {}",
        ga.len(),
        gb.len()
    );

    // The same key with a per-task ROUND_ROBIN override alternates.
    let mut ids = Vec::new();
    for _ in 0..8 {
        let mut req = request("h", "customer-7", &[]);
        req.balancer = pb::BalancerStrategy::RoundRobin as i32;
        ids.push(submit_req(&mut api, req).await);
    }
    for id in &ids {
        let t = wait_state(&api, id, pb::TaskState::Dispatching).await;
        assert_eq!(t.balancer, pb::BalancerStrategy::RoundRobin as i32);
    }
    let (ga, gb) = (a.drain_assigns(QUIET).await, b.drain_assigns(QUIET).await);
    assert_eq!((ga.len(), gb.len()), (4, 4), "round robin shares evenly");
    node.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_go_only_to_workers_carrying_their_labels() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut gpu =
        RawWorker::connect_with(node.grpc_addr, "gpu", &["h"], 50, &[("gpu", "a100")], 1).await;
    let mut plain = RawWorker::connect(node.grpc_addr, "plain", &["h"], 50).await;
    let mut api = api(node.grpc_addr).await;

    // Least-active would prefer `plain` once `gpu` is loaded: labels win.
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(submit_req(&mut api, request("h", "", &[("gpu", "a100")])).await);
    }
    for id in &ids {
        let t = wait_state(&api, id, pb::TaskState::Dispatching).await;
        assert_eq!(t.worker_id, "gpu");
    }
    assert_eq!(gpu.drain_assigns(QUIET).await.len(), 5);
    assert!(plain.drain_assigns(QUIET).await.is_empty());

    // A label nobody carries: the task waits READY until such a worker joins.
    let id = submit_req(&mut api, request("h", "", &[("zone", "mars")])).await;
    assert!(gpu.next_assign(QUIET).await.is_none());
    assert!(plain.next_assign(QUIET).await.is_none());
    assert_eq!(state(&get(&mut api, &id).await), pb::TaskState::Ready);
    let mut mars =
        RawWorker::connect_with(node.grpc_addr, "mars", &["h"], 1, &[("zone", "mars")], 1).await;
    let a = mars
        .next_assign(Duration::from_secs(10))
        .await
        .expect("assigned");
    assert_eq!(a.task_id, id);
    node.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_fails_over_then_waits_without_spinning_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(node_options(dir.path())).await;
    let mut a = RawWorker::connect(node.grpc_addr, "wa", &["h"], 1).await;
    let mut b = RawWorker::connect(node.grpc_addr, "wb", &["h"], 1).await;
    let mut api = api(node.grpc_addr).await;
    let id = submit_req(&mut api, request("h", "", &[])).await;

    // Whoever gets it first says BUSY; the other is offered it next.
    let (first, a_first) = tokio::select! {
        Some(x) = a.next_assign(Duration::from_secs(10)) => (x, true),
        Some(x) = b.next_assign(Duration::from_secs(10)) => (x, false),
    };
    assert_eq!(first.task_id, id);
    let (rejecter, second) = if a_first { (&a, &mut b) } else { (&b, &mut a) };
    rejecter.reject_busy(&first).await;
    let again = second
        .next_assign(Duration::from_secs(10))
        .await
        .expect("failed over to the next candidate");
    assert_eq!(again.task_id, id);
    assert_ne!(again.execution_id, first.execution_id);
    second.reject_busy(&again).await;

    // Every candidate refused: the task waits READY, nothing is claimed
    // and nothing pushed while no stream has room.
    let t = wait_state(&api, &id, pb::TaskState::Ready).await;
    assert_eq!(t.attempts.len(), 2);
    let claims_before = node.dispatch_stats.snapshot().1;
    assert!(a.next_assign(Duration::from_millis(1_200)).await.is_none());
    assert!(b.next_assign(QUIET).await.is_none());
    let claims_after = node.dispatch_stats.snapshot().1;
    assert_eq!(
        claims_after, claims_before,
        "no claim transaction while every stream is busy"
    );
    let t = get(&mut api, &id).await;
    assert_eq!(state(&t), pb::TaskState::Ready);
    assert_eq!(t.attempts.len(), 2, "no further pushes");

    // A heartbeat showing room brings one stream back: the task runs there.
    a.heartbeat(0).await;
    let last = a
        .next_assign(Duration::from_secs(10))
        .await
        .expect("pushed once room shows");
    assert_eq!(last.task_id, id);
    a.ack(&last).await;
    a.succeed(&last).await;
    let t = wait_state(&api, &id, pb::TaskState::Succeeded).await;
    let outcomes: HashMap<String, usize> = t.attempts.iter().fold(HashMap::new(), |mut m, at| {
        *m.entry(at.worker_id.clone()).or_default() += 1;
        m
    });
    assert_eq!(t.attempts.len(), 3, "{outcomes:?}");
    assert_eq!(outcomes.len(), 2, "both workers were tried: {outcomes:?}");
    node.stop(Duration::from_secs(5)).await;
}
