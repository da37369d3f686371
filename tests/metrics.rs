//! `GET /metrics` after a small run: every family is there, and the figures
//! agree with what the run did.
//!
//! Metrics are process-wide (one recorder per process), so this file holds
//! exactly one test: no other node in this process adds to the counts.

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_testkit::metrics::{http_get, sample};
use taskmesh_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_small_run_agree_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = node_options(dir.path());
    opts.dispatcher.gauge_interval = Duration::from_millis(50);
    let node = start_node(opts).await;
    let mut api = api(node.grpc_addr).await;

    let mut wopts = taskmesh_worker::WorkerOptions::new(vec![format!("http://{}", node.grpc_addr)]);
    wopts.worker_id = "metrics-worker".into();
    wopts.concurrency = 8;
    let worker = taskmesh_worker::Worker::new(wopts)
        .handler("echo", taskmesh_worker::builtin::Echo)
        .handler("fail", taskmesh_worker::builtin::Fail);
    let worker = TestWorker::spawn(worker);
    assert!(worker.handle.wait_connected(Duration::from_secs(10)).await);

    // 20 echo tasks in one batch; one task failing twice with 2 attempts
    // (one retry, then FAILED); 3 tasks nobody serves (the queue).
    let echo = pb::SubmitTaskRequest {
        handler: "echo".into(),
        payload: Some(pb::Payload {
            data: b"{}".to_vec(),
            content_type: "application/json".into(),
        }),
        ..Default::default()
    };
    let resp = api
        .submit_tasks(pb::SubmitTasksRequest {
            tasks: vec![echo.clone(); 20],
        })
        .await
        .expect("submit_tasks")
        .into_inner();
    let mut ids: Vec<String> = resp
        .results
        .iter()
        .map(|r| r.accepted.as_ref().expect("accepted").task_id.clone())
        .collect();
    let fail = api
        .submit_task(pb::SubmitTaskRequest {
            handler: "fail".into(),
            payload: Some(pb::Payload {
                data: br#"{"times": 5}"#.to_vec(),
                content_type: "application/json".into(),
            }),
            retry_policy: Some(pb::RetryPolicy {
                max_attempts: 2,
                initial_backoff: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 10_000_000,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("submit fail")
        .into_inner();
    ids.push(fail.task_id);
    for _ in 0..3 {
        submit(&mut api, "nobody", b"{}").await;
    }

    for id in &ids {
        wait_for("a task to end", Duration::from_secs(20), || {
            let (mut api, id) = (api.clone(), id.clone());
            async move {
                let t = get(&mut api, &id).await;
                matches!(state(&t), pb::TaskState::Succeeded | pb::TaskState::Failed).then_some(())
            }
        })
        .await;
    }

    // The gauges refresh on their own (every 50 ms here), so a scrape right
    // after the last task ended may still show it in flight: wait until they
    // show this state — nothing in flight included; a slot that is never
    // freed times this out.
    let text = wait_for(
        "the gauges to show 3 queued, 1 worker, nothing in flight",
        Duration::from_secs(10),
        || async {
            let (status, text) = http_get(node.http_addr, "/metrics")
                .await
                .expect("the node answers /metrics");
            assert_eq!(status, 200, "{text}");
            (sample(&text, "taskmesh_queue_depth", &[("handler", "nobody")]) == Some(3.0)
                && sample(&text, "taskmesh_workers_connected", &[]) == Some(1.0)
                && sample(
                    &text,
                    "taskmesh_worker_active_tasks",
                    &[("namespace", "default")],
                ) == Some(0.0))
            .then_some(text)
        },
    )
    .await;

    let v = |name: &str, labels: &[(&str, &str)]| {
        sample(&text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
    };
    let echo_l = [("handler", "echo")];
    let fail_l = [("handler", "fail")];
    assert_eq!(v("taskmesh_tasks_submitted_total", &echo_l), 20.0);
    assert_eq!(v("taskmesh_tasks_submitted_total", &fail_l), 1.0);
    assert_eq!(
        v("taskmesh_tasks_submitted_total", &[("handler", "nobody")]),
        3.0
    );
    assert_eq!(v("taskmesh_tasks_dispatched_total", &echo_l), 20.0);
    assert_eq!(
        v("taskmesh_tasks_dispatched_total", &fail_l),
        2.0,
        "two attempts"
    );
    assert_eq!(v("taskmesh_tasks_completed_total", &echo_l), 20.0);
    assert_eq!(v("taskmesh_tasks_retried_total", &fail_l), 1.0);
    assert_eq!(v("taskmesh_tasks_failed_total", &fail_l), 1.0);
    assert!(sample(&text, "taskmesh_tasks_failed_total", &echo_l).is_none());
    assert_eq!(v("taskmesh_dispatch_latency_seconds_count", &echo_l), 20.0);
    assert_eq!(
        v("taskmesh_task_end_to_end_latency_seconds_count", &echo_l),
        20.0
    );
    assert_eq!(
        v("taskmesh_task_end_to_end_latency_seconds_count", &fail_l),
        1.0
    );
    assert!(v("taskmesh_dispatch_latency_seconds_sum", &echo_l) >= 0.0);
    assert_eq!(
        v("taskmesh_worker_active_tasks", &[("namespace", "default")]),
        0.0,
        "nothing in flight at the end"
    );
    assert_eq!(v("taskmesh_leader", &[]), 1.0, "the only node leads");
    for op in [
        "create_tasks",
        "claim_ready",
        "transition_many",
        "ready_counts",
    ] {
        let n = v(
            "taskmesh_store_call_duration_seconds_count",
            &[("op", op), ("outcome", "ok")],
        );
        assert!(n >= 1.0, "{op}: {n}");
    }
    assert!(
        v(
            "taskmesh_coord_call_duration_seconds_count",
            &[("backend", "local"), ("op", "acquire_or_renew")]
        ) >= 1.0
    );
    assert!(
        text.contains(
            "taskmesh_dispatch_latency_seconds_bucket{namespace=\"default\",handler=\"echo\",le=\"0.005\"}"
        ),
        "histograms come with fixed buckets"
    );

    worker.stop().await;
    stop_node(node).await;
}
