//! Two replicas coordinated through the machine's Redis (each test its own
//! key prefix): one leader at a time, a schedule's fires not duplicated,
//! every replica's workers visible from any replica, a task submitted on
//! one replica run by a worker connected to the other.

mod common;

use std::time::Duration;

use common::*;
use taskmesh::v1 as pb;

fn redis_url() -> String {
    std::env::var("TASKMESH_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_leader_and_one_worker_registry() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("taskmesh-test-{}:", uuid::Uuid::new_v4().simple());
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let mut opts = node_options(dir.path());
        let mut r = taskmesh_coord::RedisOptions::new(redis_url(), "replica");
        r.key_prefix = prefix.clone();
        r.lease_ttl = Duration::from_secs(3);
        r.renew_interval = Duration::from_secs(1);
        opts.redis = Some(r);
        replicas.push(
            taskmesh_cli::node::start(opts).await.expect(
                "a replica starts (is Redis up on 127.0.0.1:6379? `make services` starts it)",
            ),
        );
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
    wait_for("the task submitted on A to run on B's worker", Duration::from_secs(20), || {
        let mut b = b.clone();
        let id = id.clone();
        async move { (state(&get(&mut b, &id).await) == pb::TaskState::Succeeded).then_some(()) }
    })
    .await;
    assert_eq!(ledger.count(&id), 1);

    // A schedule every second: with two schedulers, each fire still makes one task.
    let s = a
        .create_schedule(pb::CreateScheduleRequest {
            schedule: Some(pb::Schedule {
                kind: pb::ScheduleKind::Cron as i32,
                cron_expression: "* * * * * *".into(),
                template: Some(pb::TaskTemplate {
                    handler: "echo".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    let fires = wait_for("five fires", Duration::from_secs(20), || {
        let mut a = a.clone();
        let id = s.schedule_id.clone();
        async move {
            let r = a
                .get_schedule(pb::GetScheduleRequest { schedule_id: id })
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
    a.pause_schedule(pb::PauseScheduleRequest {
        schedule_id: s.schedule_id.clone(),
    })
    .await
    .unwrap();

    // The fencing token only ever rose: both replicas led with tokens the store accepted.
    assert!(replicas[0].store.fence_token().await.unwrap() > 0);
    w.shutdown.cancel();
    let _ = w.join.await;
    for r in replicas {
        r.stop(Duration::from_secs(5)).await;
    }
}

/// Regression: a replica joining a running cluster used to take back every
/// attempt in flight anywhere ("server restarted during the attempt"), so
/// the other replicas' workers ran those tasks a second time. Only a single
/// node may assume that nothing in flight survived its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_leaves_the_running_attempts_of_the_others_alone() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("taskmesh-test-{}:", uuid::Uuid::new_v4().simple());
    let options = || {
        let mut opts = node_options(dir.path());
        let mut r = taskmesh_coord::RedisOptions::new(redis_url(), "replica");
        r.key_prefix = prefix.clone();
        r.lease_ttl = Duration::from_secs(3);
        r.renew_interval = Duration::from_secs(1);
        opts.redis = Some(r);
        opts
    };
    let a = taskmesh_cli::node::start(options())
        .await
        .expect("a replica starts (is Redis up on 127.0.0.1:6379? `make services` starts it)");
    let mut api_a = api(a.grpc_addr).await;
    let ledger = Ledger::default();
    let w = counting_worker(&[a.grpc_addr], "on-a", 2, ledger.clone());
    assert!(w.handle.wait_connected(Duration::from_secs(10)).await);
    let id = submit(&mut api_a, "sleep", br#"{"ms":2000}"#).await;
    wait_for("the task to run on A's worker", Duration::from_secs(20), || {
        let mut api_a = api_a.clone();
        let id = id.clone();
        async move { (state(&get(&mut api_a, &id).await) == pb::TaskState::Running).then_some(()) }
    })
    .await;

    let b = taskmesh_cli::node::start(options())
        .await
        .expect("replica B starts");
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
    w.shutdown.cancel();
    let _ = w.join.await;
    for r in [a, b] {
        r.stop(Duration::from_secs(5)).await;
    }
}
