//! Chaos, end to end, with real processes: 3 `taskmesh serve` replicas and 4
//! `taskmesh worker` processes on a private database and a private Redis,
//! once on Postgres and once on MariaDB (one scenario, two tests).
//! 10,000 tasks are submitted (SubmitTasks batches spread over the replicas,
//! a refused batch retried elsewhere with the same client request ids),
//! and 100 diamond workflows (a → b, c → d) and 5 sharding broadcasts (2 s
//! shards, one per worker) beside them, while the leader
//! is killed (SIGKILL) twice and a worker every few seconds, each
//! replaced. A schedule fires every second throughout.
//!
//! Then the record is checked against the workers' ledgers (one line per
//! handler execution, written before it runs) and the store:
//! - every accepted task reached a terminal state (SUCCEEDED: the handler
//!   never fails), and the store holds each exactly once;
//! - no task SUCCEEDED twice: one SUCCEEDED attempt per task, and that
//!   attempt's execution is in a ledger exactly once;
//! - every handler execution is one attempt (execution id, task, attempt
//!   number and worker agree with the store), and every execution beyond
//!   the first of a task is a later attempt (attempt > 1) whose earlier
//!   executions are explained: their attempt ended WORKER_LOST or
//!   ACK_TIMEOUT and either its worker was killed (the kill at or before
//!   the attempt's end) or the replica holding its stream was (a leader
//!   kill between the attempt's start and its end, and the attempt taken
//!   back because its worker re-registered on another replica, vanished
//!   from the cluster-wide registry or its ACK was never written);
//! - after each leader kill a new leader committed a schedule fire within
//!   lease TTL + 2 s, and every fire time has one task;
//! - every workflow SUCCEEDED, each of its steps SUCCEEDED exactly once (the
//!   steps are among the tasks above), and no step started before its
//!   parents had ended;
//! - every broadcast SUCCEEDED with shards 0..N-1 (N the workers in the
//!   registry when the leader spread it), each shard SUCCEEDED exactly
//!   once (the shards are among the tasks above: a shard whose worker was
//!   killed ran again, explained as above).
//!
//! Clocks: kill instants are taken on this host's clock; fire times
//! (`schedule_fires.handled_at`) are the leader's `now`, the database's
//! clock as followed by `StoreClock` — the database runs on this host, so
//! both are the same clock.
//!
//! Run with `cargo test -p taskmesh-cli --test chaos -- --nocapture` to see
//! the figures of each backend.

use std::collections::HashMap;
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_store::DatabaseKind;
use taskmesh_testkit::cluster::{
    Cluster, LEASE_TTL, Load, Replica, lazy_client, leader_index, submit_broadcasts, submit_load,
    submit_workflows,
};
use taskmesh_testkit::db::Arg;
use taskmesh_testkit::metrics::metric;
use taskmesh_testkit::process::{LedgerLine, read_ledger};
use taskmesh_testkit::record::prove;
use taskmesh_testkit::schedule::{create_schedule, every_second_retrying, pause_schedule};
use taskmesh_testkit::{Child, now_ms, wait_for};
use tokio::time::Instant;

const TASKS: usize = 10_000;
const BATCH: usize = 100;
const REPLICAS: usize = 3;
const WORKERS: usize = 4;
const WORKER_SLOTS: u32 = 16;
/// Each task sleeps this long, so kills hit running handlers.
const TASK_MS: u64 = 40;
/// One batch per this interval: 10,000 tasks over about 20 s.
const SUBMIT_EVERY: Duration = Duration::from_millis(200);
const WORKER_KILL_EVERY: Duration = Duration::from_secs(3);
const LEADER_KILLS: usize = 2;
const FIRST_LEADER_KILL: Duration = Duration::from_secs(4);
const LEADER_KILL_GAP: Duration = Duration::from_secs(8);
/// Diamond workflows submitted beside the tasks, one per this interval.
const WORKFLOWS: usize = 100;
const WORKFLOW_EVERY: Duration = Duration::from_millis(150);
/// Sharding broadcasts submitted beside them, one per this interval; each
/// shard sleeps BROADCAST_MS, so worker kills hit shards.
const BROADCASTS: usize = 5;
const BROADCAST_EVERY: Duration = Duration::from_secs(3);
const BROADCAST_MS: u64 = 2_000;
/// How far two replicas' readings of the database clock may differ.
const CLOCK_SLACK_MS: i64 = 100;

/// How the store records an attempt taken back because the stream holding
/// it was on a replica that died (`crates/dispatcher/src/lost.rs`,
/// `crates/scheduler/src/orphans.rs`, `crates/scheduler/src/round.rs`: an
/// ACK the dead replica never wrote).
const CROSS_REPLICA_RELEASES: [&str; 3] = [
    taskmesh_dispatcher::RELEASE_RECONNECTED,
    "its worker is gone from the cluster",
    "no ACK within the ACK timeout",
];

/// A process killed by the test, and when (host clock, ms).
#[derive(Debug, Clone)]
struct Kill {
    who: String,
    at: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tasks_survive_killed_leaders_and_workers_on_postgres() {
    chaos(DatabaseKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tasks_survive_killed_leaders_and_workers_on_mariadb() {
    chaos(DatabaseKind::Mysql).await;
}

/// The scenario and its proof, on a private database of `kind`.
async fn chaos(kind: DatabaseKind) {
    let cluster = Cluster::start(env!("CARGO_BIN_EXE_taskmesh").as_ref(), kind).await;
    let mut replicas: Vec<Replica> = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(cluster.replica(None, &[]).await);
    }
    let urls: Vec<String> = replicas.iter().map(Replica::url).collect();
    let db = cluster.db().await;
    leader_index(&replicas).await;

    let mut api0 = lazy_client(&urls[0]);
    let schedule = create_schedule(&mut api0, every_second_retrying("echo")).await;

    // Workers: each tries the replicas in its own order, so they spread.
    let mut started = 0usize;
    let mut workers: Vec<(String, Child)> = Vec::new();
    for slot in 0..WORKERS {
        started += 1;
        workers.push(start_worker(&cluster, &urls, slot, started).await);
    }

    let submitter = tokio::spawn(submit_load(
        urls.clone(),
        Load {
            batches: TASKS / BATCH,
            batch: BATCH,
            every: SUBMIT_EVERY,
            task_ms: TASK_MS,
            prefix: "chaos".into(),
        },
    ));
    let workflow_submitter = tokio::spawn(submit_workflows(
        urls.clone(),
        WORKFLOWS,
        WORKFLOW_EVERY,
        TASK_MS,
        "chaos-wf".into(),
    ));
    let broadcast_submitter = tokio::spawn(submit_broadcasts(
        urls.clone(),
        BROADCASTS,
        BROADCAST_EVERY,
        BROADCAST_MS,
        "chaos-bc".into(),
    ));
    let begin = Instant::now();
    let mut next_worker_kill = begin + Duration::from_secs(2);
    let mut next_leader_kill = begin + FIRST_LEADER_KILL;
    let mut worker_kills: Vec<Kill> = Vec::new();
    let mut leader_kills: Vec<Kill> = Vec::new();
    let mut takeovers: Vec<(i64, u64, u64)> = Vec::new();
    let mut pacing = tokio::time::interval(Duration::from_millis(100));
    while !(submitter.is_finished() && leader_kills.len() == LEADER_KILLS) {
        // The scenario's own timetable (kills every few seconds), not a
        // synchronisation: every outcome is awaited with a deadline below.
        pacing.tick().await;
        let now = Instant::now();
        if now >= next_worker_kill {
            let slot = worker_kills.len() % WORKERS;
            let (id, mut child) = workers.remove(slot);
            child.kill();
            worker_kills.push(Kill {
                who: id,
                at: now_ms(),
            });
            started += 1;
            workers.insert(slot, start_worker(&cluster, &urls, slot, started).await);
            next_worker_kill = now + WORKER_KILL_EVERY;
        }
        if leader_kills.len() < LEADER_KILLS && now >= next_leader_kill {
            let i = leader_index(&replicas).await;
            let old_token = cluster.leader_token().expect("a lease in Redis");
            let ports = (replicas[i].grpc, replicas[i].http);
            replicas[i].child.kill();
            let at = now_ms();
            leader_kills.push(Kill {
                who: format!("replica :{}", ports.0),
                at,
            });
            // A fire handled after the kill (plus a margin that only makes
            // the figure larger) cannot be the dead leader's.
            let first_fire: i64 = wait_for(
                "a new leader to fire the schedule",
                LEASE_TTL + Duration::from_secs(20),
                || {
                    let db = db.clone();
                    async move {
                        db.int(
                            "SELECT MIN(handled_at) FROM schedule_fires WHERE handled_at > $1",
                            &[Arg::Int(at + 100)],
                        )
                        .await
                        .ok()
                        .flatten()
                    }
                },
            )
            .await;
            let new_token = cluster.leader_token().unwrap_or(0);
            takeovers.push((first_fire - at, old_token, new_token));
            replicas[i] = cluster.replica(Some(ports), &[]).await;
            next_leader_kill = Instant::now() + LEADER_KILL_GAP;
        }
    }
    let chaos_secs = begin.elapsed().as_secs_f64();
    let mut accepted = submitter.await.expect("the submitter");
    let (workflows, steps) = workflow_submitter.await.expect("the workflow submitter");
    let broadcasts = broadcast_submitter.await.expect("the broadcast submitter");
    let tasks_accepted = accepted.len();
    accepted.extend(steps);
    api0 = lazy_client(&urls[0]);
    pause_schedule(&mut api0, &schedule).await;

    wait_for(
        "every task to reach a terminal state",
        Duration::from_secs(180),
        || {
            let db = db.clone();
            async move { (db.open_tasks().await.ok()? == 0).then_some(()) }
        },
    )
    .await;
    let settled_secs = begin.elapsed().as_secs_f64();
    for (_, w) in &mut workers {
        w.kill();
    }
    let fenced: f64 = {
        let mut sum = 0.0;
        for r in &replicas {
            sum += metric(r.http, "taskmesh_fenced_writes_total")
                .await
                .unwrap_or(0.0);
        }
        sum
    };

    // ---- the proof ----
    assert_eq!(tasks_accepted, TASKS, "every task was accepted");
    assert_eq!(workflows.len(), WORKFLOWS, "every workflow was accepted");
    let workflow_order = check_workflows(&urls, &workflows).await;
    assert_eq!(broadcasts.len(), BROADCASTS, "every broadcast was accepted");
    let shard_counts = check_broadcasts(&db, &broadcasts).await;
    let mut shard_ids = std::collections::HashSet::new();
    for b in &broadcasts {
        accepted.push(b.clone());
        let shards = db.children(b).await.expect("read the shards");
        shard_ids.extend(shards.into_iter().map(|s| s.0));
    }
    accepted.extend(shard_ids.iter().cloned());
    let shards_run_again = {
        let mut n: HashMap<String, usize> = HashMap::new();
        for a in db.attempts().await.expect("read the attempts") {
            if shard_ids.contains(&a.0) {
                *n.entry(a.0).or_default() += 1;
            }
        }
        n.values().filter(|&&k| k > 1).count()
    };
    let ledger = read_ledgers(&cluster, started);
    let killed_worker_at: HashMap<&str, i64> = worker_kills
        .iter()
        .map(|k| (k.who.as_str(), k.at))
        .collect();
    let proof = prove(&db, &accepted, &ledger, Some(&schedule), |l, a| {
        let ended = a.5.unwrap_or(i64::MAX);
        let lost = matches!(a.6.as_deref(), Some("WORKER_LOST" | "ACK_TIMEOUT"));
        let worker_killed = killed_worker_at
            .get(l.worker_id.as_str())
            .is_some_and(|at| *at <= ended);
        // Taken back from a stream on a dead replica: when the worker
        // re-registered elsewhere, by the leader's orphan sweep, or by the
        // ACK reaper.
        let replica_killed = leader_kills.iter().any(|k| a.4 <= k.at && k.at <= ended)
            && CROSS_REPLICA_RELEASES.contains(&a.7.as_str());
        match (lost, worker_killed, replica_killed) {
            (true, true, _) => Some("a killed worker".into()),
            (true, false, true) => Some("a killed replica".into()),
            _ => None,
        }
    })
    .await;
    let explained = |k: &str| proof.explained.get(k).copied().unwrap_or(0);

    let limit = (LEASE_TTL + Duration::from_secs(2)).as_millis() as i64;
    println!("chaos figures ({kind:?}):");
    println!(
        "  tasks accepted {}, SUCCEEDED {}, schedule fires {} -> {} tasks",
        proof.accepted, proof.succeeded, proof.fires, proof.fire_tasks
    );
    println!(
        "  handler executions {}: {} extra, on {} tasks; earlier executions explained by a killed worker {}, by a killed replica {}, unexplained 0",
        proof.executions,
        proof.extra,
        proof.tasks_run_again,
        explained("a killed worker"),
        explained("a killed replica")
    );
    println!("  attempts {}, tasks SUCCEEDED twice 0", proof.attempts);
    println!(
        "  broadcasts {BROADCASTS}: all SUCCEEDED, shards per broadcast {shard_counts:?}, each index SUCCEEDED once; {shards_run_again} shards ran again after a lost attempt"
    );
    println!(
        "  workflows {WORKFLOWS}: all SUCCEEDED, {} steps each SUCCEEDED once; {workflow_order}",
        4 * WORKFLOWS
    );
    for (reason, n) in &proof.why {
        println!("    earlier execution ended {reason}: {n}");
    }
    println!(
        "  kills: {} workers ({:?}), {} leaders; fenced leader writes seen on live replicas {fenced}",
        worker_kills.len(),
        worker_kills
            .iter()
            .map(|k| k.who.as_str())
            .collect::<Vec<_>>(),
        leader_kills.len()
    );
    for (n, (ms, old, new)) in takeovers.iter().enumerate() {
        println!(
            "  leader kill {}: token {old} -> {new}, new leader fired {ms} ms after the kill (limit {limit} ms)",
            n + 1
        );
    }
    println!("  chaos phase {chaos_secs:.1} s, all terminal at {settled_secs:.1} s");
    for (n, (ms, _, _)) in takeovers.iter().enumerate() {
        assert!(
            *ms <= limit,
            "leader kill {}: the new leader fired {ms} ms after it, more than lease TTL + 2 s",
            n + 1
        );
    }
    assert!(
        worker_kills.len() >= WORKERS,
        "workers were killed every few seconds"
    );
}

/// Worker `w{n}` in `slot`, trying the replicas starting from `slot`'s.
async fn start_worker(
    cluster: &Cluster,
    urls: &[String],
    slot: usize,
    n: usize,
) -> (String, Child) {
    let id = format!("w{n}");
    let mut order: Vec<String> = urls.to_vec();
    order.rotate_left(slot % urls.len());
    let child = cluster
        .worker(&id, &order)
        .concurrency(WORKER_SLOTS)
        .ledger(&cluster.path(&format!("ledger-{id}")))
        .spawn()
        .await;
    (id, child)
}

/// Every line of the ledgers of workers `w1..=w{started}` (each must exist:
/// every worker opened its ledger before the test went on).
fn read_ledgers(cluster: &Cluster, started: usize) -> Vec<LedgerLine> {
    (1..=started)
        .flat_map(|n| read_ledger(&cluster.path(&format!("ledger-w{n}"))))
        .collect()
}

/// Every broadcast SUCCEEDED with shards 0..total, each SUCCEEDED (each
/// with one SUCCEEDED attempt: `prove`); the shard count of each.
async fn check_broadcasts(db: &taskmesh_testkit::db::Db, ids: &[String]) -> Vec<usize> {
    let states: HashMap<String, String> = db
        .tasks()
        .await
        .expect("read the tasks")
        .into_iter()
        .map(|(id, state, _, _)| (id, state))
        .collect();
    let mut counts = Vec::new();
    for id in ids {
        assert_eq!(
            states.get(id).map(String::as_str),
            Some("SUCCEEDED"),
            "broadcast {id}"
        );
        let mut shards = db.children(id).await.expect("read the shards");
        shards.sort_by_key(|s| s.2);
        let n = shards.len();
        assert!(n >= 1, "broadcast {id} was spread");
        for (i, (sid, state, index, total)) in shards.iter().enumerate() {
            assert_eq!(
                (*index, *total),
                (i as i64, n as i64),
                "shard {sid} of {id}"
            );
            assert_eq!(state, "SUCCEEDED", "shard {sid} of {id}");
        }
        counts.push(n);
    }
    counts
}

/// Every workflow SUCCEEDED with its four steps SUCCEEDED, and each step
/// started (its first attempt) only after every parent had ended; a
/// summary of the release gaps.
async fn check_workflows(urls: &[String], workflows: &[String]) -> String {
    let mut api = lazy_client(&urls[0]);
    let mut gaps = Vec::new();
    for id in workflows {
        let w = api
            .get_workflow(pb::GetWorkflowRequest {
                workflow_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("get_workflow")
            .into_inner()
            .workflow
            .expect("a workflow");
        assert_eq!(
            w.state,
            pb::WorkflowState::Succeeded as i32,
            "workflow {id}: {w:#?}"
        );
        let mut ended: HashMap<String, i64> = HashMap::new();
        let mut started: HashMap<String, i64> = HashMap::new();
        for s in &w.steps {
            assert_eq!(
                s.state,
                pb::TaskState::Succeeded as i32,
                "{id} step {}",
                s.name
            );
            let task = api
                .get_task(pb::GetTaskRequest {
                    task_id: s.task_id.clone(),
                    ..Default::default()
                })
                .await
                .expect("get_task")
                .into_inner()
                .task
                .expect("a task");
            let ms = |t: &Option<prost_types::Timestamp>| {
                t.as_ref()
                    .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
                    .unwrap_or(i64::MAX)
            };
            let first = task.attempts.iter().map(|a| ms(&a.start_time)).min();
            started.insert(s.name.clone(), first.expect("a step that SUCCEEDED ran"));
            ended.insert(s.name.clone(), ms(&s.ended_at));
        }
        for s in &w.steps {
            for p in &s.depends_on {
                let (start, end) = (started[&s.name], ended[p]);
                // Two replicas' instants: each follows the database's clock
                // (StoreClock) within a few ms, hence the slack.
                assert!(
                    start + CLOCK_SLACK_MS >= end,
                    "workflow {id}: step {} started at {start}, before its parent {p} ended at {end}",
                    s.name
                );
                gaps.push(start - end);
            }
        }
    }
    gaps.sort_unstable();
    let at = |q: f64| gaps[((gaps.len() - 1) as f64 * q) as usize];
    format!(
        "parent end -> child's first attempt p50 {} ms, p99 {} ms, max {} ms",
        at(0.5),
        at(0.99),
        gaps[gaps.len() - 1]
    )
}
