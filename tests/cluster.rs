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
