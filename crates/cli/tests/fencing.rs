//! A leader stopped (SIGSTOP) past its lease, in the middle of a scheduler
//! round, is replaced; when it resumes (SIGCONT) its write reaches the store
//! with the old fencing token and is refused. Real processes: two
//! `taskmesh serve` replicas on a private Postgres and a private Redis.
//!
//! A SIGSTOP at a random instant almost never lands between a lease check
//! and a commit, so replica A runs with the test-only fault hook
//! `TASKMESH_FAULT_HOLD_ROUND`: while the hook's file exists, a round about
//! to commit schedule fires waits there (after its lease check, holding its
//! token). The test stops A there, removes the file, lets B take over and
//! fire, then resumes A: A really sends its commit, and the store refuses it.

use std::time::Duration;

use taskmesh_store::DatabaseKind;
use taskmesh_testkit::cluster::{Cluster, LEASE_TTL};
use taskmesh_testkit::db::Arg;
use taskmesh_testkit::metrics::{leads, metric};
use taskmesh_testkit::schedule::{create_schedule, every_second, fires};
use taskmesh_testkit::{api, now_ms, wait_for};

const FENCED: &str = "taskmesh_fenced_writes_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_leader_writes_with_its_old_token_and_is_refused() {
    let cluster = Cluster::start(
        env!("CARGO_BIN_EXE_taskmesh").as_ref(),
        DatabaseKind::Postgres,
    )
    .await;
    let hold = cluster.path("hold-round");
    let hold_env = hold.to_str().unwrap().to_string();
    let a = cluster
        .replica(None, &[("TASKMESH_FAULT_HOLD_ROUND", &hold_env)])
        .await;
    wait_for("replica A to lead", Duration::from_secs(20), || async {
        leads(a.http).await.then_some(())
    })
    .await;
    let b = cluster.replica(None, &[]).await;
    let db = cluster.db().await;

    let mut api_b = api(([127, 0, 0, 1], b.grpc).into()).await;
    let schedule = create_schedule(&mut api_b, every_second("echo")).await;
    wait_for("A to fire twice", Duration::from_secs(20), || async {
        (fires(&db, &schedule).await >= 2).then_some(())
    })
    .await;
    assert_eq!(metric(a.http, FENCED).await, Some(0.0));

    // Hold A's next round before its commit, then freeze the process there.
    std::fs::write(&hold, b"").unwrap();
    let marker = taskmesh_scheduler::fault::held_marker(&hold);
    let token_a: u64 = wait_for(
        "A's round to be held before its commit",
        Duration::from_secs(20),
        || async { std::fs::read_to_string(&marker).ok()?.trim().parse().ok() },
    )
    .await;
    a.child.signal(libc::SIGSTOP);
    let stopped_at = now_ms();
    std::fs::remove_file(&hold).unwrap();

    // A's lease lapses; B takes it with a newer token and fires.
    let (token_b, first_fire_b) = wait_for(
        "B to take over and fire with a newer token",
        LEASE_TTL + Duration::from_secs(15),
        || async {
            let token = db.fence().await;
            let fired = db
                .int(
                    "SELECT MIN(handled_at) FROM schedule_fires WHERE schedule_id = $1 AND handled_at > $2",
                    &[Arg::Text(&schedule), Arg::Int(stopped_at)],
                )
                .await
                .unwrap();
            (token > token_a).then_some(())?;
            Some((token, fired?))
        },
    )
    .await;
    assert!(leads(b.http).await, "B holds the lease");
    assert!(
        cluster.leader_token().is_some_and(|t| t == token_b),
        "the lease in Redis carries B's token {token_b}"
    );
    let fires_before_resume = fires(&db, &schedule).await;

    // Resume A: its held round commits with token_a and must be refused.
    a.child.signal(libc::SIGCONT);
    let refused = wait_for(
        "A's commit to be refused by the fencing token",
        Duration::from_secs(20),
        || async { metric(a.http, FENCED).await.filter(|n| *n >= 1.0) },
    )
    .await;
    wait_for(
        "A to stop claiming the lead",
        Duration::from_secs(10),
        || async { (!leads(a.http).await).then_some(()) },
    )
    .await;
    let log = std::fs::read_to_string(cluster.path(&format!("serve-{}.log", a.grpc))).unwrap();
    assert!(
        log.contains("leader write refused by the fencing token"),
        "A logs the refusal:\n{log}"
    );

    // The store kept B's token and exactly one task per fire time: A's
    // planned fire changed nothing (B fired that time itself).
    assert!(db.fence().await >= token_b);
    wait_for("B to fire again", Duration::from_secs(10), || async {
        (fires(&db, &schedule).await > fires_before_resume).then_some(())
    })
    .await;
    let (fire_rows, distinct_times, with_task) = db
        .ints3(
            "SELECT COUNT(*), COUNT(DISTINCT fire_at), COUNT(task_id) FROM schedule_fires WHERE schedule_id = $1",
            &[Arg::Text(&schedule)],
        )
        .await
        .unwrap();
    let (tasks, distinct_keys, _) = db
        .ints3(
            "SELECT COUNT(*), COUNT(DISTINCT client_request_id), COUNT(*) FROM tasks WHERE schedule_id = $1",
            &[Arg::Text(&schedule)],
        )
        .await
        .unwrap();
    assert_eq!(fire_rows, distinct_times, "one record per fire time");
    assert_eq!(tasks, with_task, "one task per created fire");
    assert_eq!(tasks, distinct_keys, "no fire time has two tasks");
    println!(
        "fencing: A held with token {token_a}, stopped at {stopped_at}; B took over with token \
         {token_b}, first fire handled {} ms after the stop (lease TTL {} ms); A resumed and \
         {refused} write(s) were refused by the fence; {fire_rows} fires, {tasks} tasks, no duplicate",
        first_fire_b - stopped_at,
        LEASE_TTL.as_millis()
    );
}
