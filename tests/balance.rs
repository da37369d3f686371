//! Balancing end to end over real gRPC on loopback: the strategy configured
//! per handler and overridden per task, label filters, and BUSY failover
//! that neither spins nor loses the task while nobody has room.

use std::collections::HashMap;
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_core::Strategy;
use taskmesh_testkit::raw;
use taskmesh_testkit::*;

const LIMIT: Duration = Duration::from_secs(10);

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

/// Waits until every task of `ids` is DISPATCHING; which worker each was
/// claimed for (worker id → task ids), as GetTask tells.
async fn placed_on(
    api: &taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
    ids: &[String],
) -> HashMap<String, Vec<String>> {
    let mut placed: HashMap<String, Vec<String>> = HashMap::new();
    for id in ids {
        let t = wait_task_state(api, id, pb::TaskState::Dispatching, LIMIT).await;
        placed.entry(t.worker_id).or_default().push(id.clone());
    }
    placed
}

/// Each worker received exactly the tasks it was claimed for: that many
/// assignments read off its stream, then nothing more before a fence.
async fn received_as_placed(workers: &mut [&mut RawWorker], placed: &HashMap<String, Vec<String>>) {
    for w in workers.iter_mut() {
        let mut want = placed.get(&w.worker_id).cloned().unwrap_or_default();
        let mut got: Vec<String> = w
            .assigns(want.len())
            .await
            .into_iter()
            .map(|a| a.task_id)
            .collect();
        got.extend(w.fence().await.into_iter().map(|a| a.task_id));
        want.sort();
        got.sort();
        assert_eq!(got, want, "the assignments {} received", w.worker_id);
    }
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
    let placed = placed_on(&api, &ids).await;
    assert_eq!(
        placed.len(),
        1,
        "one routing key went to one worker: {placed:?}"
    );
    received_as_placed(&mut [&mut a, &mut b], &placed).await;

    // The same key with a per-task ROUND_ROBIN override alternates.
    let mut ids = Vec::new();
    for _ in 0..8 {
        let mut req = request("h", "customer-7", &[]);
        req.balancer = pb::BalancerStrategy::RoundRobin as i32;
        ids.push(submit_req(&mut api, req).await);
    }
    for id in &ids {
        let t = wait_task_state(&api, id, pb::TaskState::Dispatching, LIMIT).await;
        assert_eq!(t.balancer, pb::BalancerStrategy::RoundRobin as i32);
    }
    let placed = placed_on(&api, &ids).await;
    let shares: Vec<usize> = ["wa", "wb"]
        .iter()
        .map(|w| placed.get(*w).map_or(0, Vec::len))
        .collect();
    assert_eq!(shares, [4, 4], "round robin shares evenly: {placed:?}");
    received_as_placed(&mut [&mut a, &mut b], &placed).await;
    a.close().await;
    b.close().await;
    stop_node(node).await;
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
    let placed = placed_on(&api, &ids).await;
    assert_eq!(placed.keys().collect::<Vec<_>>(), ["gpu"], "{placed:?}");
    received_as_placed(&mut [&mut gpu, &mut plain], &placed).await;

    // A label nobody carries: the task waits READY until such a worker
    // joins. Three dispatch rounds after its submit, nothing was pushed.
    let id = submit_req(&mut api, request("h", "", &[("zone", "mars")])).await;
    raw::rounds(&node.dispatch_stats, 3).await;
    assert!(gpu.fence().await.is_empty(), "pushed to gpu");
    assert!(plain.fence().await.is_empty(), "pushed to plain");
    assert_eq!(state(&get(&mut api, &id).await), pb::TaskState::Ready);
    let mut mars =
        RawWorker::connect_with(node.grpc_addr, "mars", &["h"], 1, &[("zone", "mars")], 1).await;
    let a = mars
        .next_assign(Duration::from_secs(10))
        .await
        .expect("assigned");
    assert_eq!(a.task_id, id);
    gpu.close().await;
    plain.close().await;
    mars.close().await;
    stop_node(node).await;
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
    let t = wait_task_state(&api, &id, pb::TaskState::Ready, LIMIT).await;
    assert_eq!(t.attempts.len(), 2);
    let claims_before = node.dispatch_stats.snapshot().1;
    raw::rounds(&node.dispatch_stats, 3).await;
    assert!(a.fence().await.is_empty(), "pushed to wa while busy");
    assert!(b.fence().await.is_empty(), "pushed to wb while busy");
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
    let t = wait_task_state(&api, &id, pb::TaskState::Succeeded, LIMIT).await;
    let outcomes: HashMap<String, usize> = t.attempts.iter().fold(HashMap::new(), |mut m, at| {
        *m.entry(at.worker_id.clone()).or_default() += 1;
        m
    });
    assert_eq!(t.attempts.len(), 3, "{outcomes:?}");
    assert_eq!(outcomes.len(), 2, "both workers were tried: {outcomes:?}");
    a.close().await;
    b.close().await;
    stop_node(node).await;
}
