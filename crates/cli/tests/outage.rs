//! Outages of the services a cluster node stands on, end to end with real
//! processes: one `taskmesh serve` (lease TTL 3 s, renew 1 s) on a private
//! Postgres and a private Redis, one `taskmesh worker` writing a ledger
//! line per handler execution, a schedule firing every second.
//!
//! - Redis killed: the leader steps down within the lease TTL and fires
//!   nothing while Redis is gone; `/readyz` and gRPC health say why;
//!   ListWorkers (it reads the cluster-wide registry) fails UNAVAILABLE
//!   ("coordination unavailable", a log reference, no address); SubmitTask and GetTask (store only) keep working. Redis
//!   restarted empty on the same port: the node takes the lease back by
//!   itself, the schedule fires again, the worker's entry is back, and
//!   every task ran exactly once — also the ones in flight across the
//!   restart, which the leader's orphan sweep must not take for vanished.
//! - Postgres stopped (`pg_ctl stop -m immediate`): SubmitTask and GetTask
//!   fail UNAVAILABLE with "store unavailable" (no INTERNAL, no hang), REST
//!   answers 503, health NOT_SERVING; results reported meanwhile wait for
//!   the store. Started again on the same port and data directory: submits
//!   succeed without restarting taskmesh, and every task accepted before
//!   and after ran exactly once; a submit refused during the outage created
//!   nothing.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use taskmesh_store::DatabaseKind;
use taskmesh_testkit::cluster::{Cluster, LEASE_TTL, PREFIX, Replica};
use taskmesh_testkit::db::{Arg, Db};
use taskmesh_testkit::http::Rest;
use taskmesh_testkit::metrics::{leads, renew_failures};
use taskmesh_testkit::process::read_ledger;
use taskmesh_testkit::schedule::{create_schedule, every_second, fires, pause_schedule};
use taskmesh_testkit::{Child, now_ms, wait_for};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The server's request timeout (`DispatcherOptions::request_timeout`): no
/// call may take longer, outage or not.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each sleep task runs: long enough to be in flight across a
/// service coming back.
const LONG_MS: u64 = 10_000;
const SHORT_MS: u64 = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_deposes_the_leader_and_everything_resumes_by_itself() {
    let mut env = Env::start().await;
    let mut api = client(&env.node.url());
    let schedule = create_schedule(&mut api, every_second("echo")).await;
    env.fires_at_least(&schedule, 2).await;
    let mut tasks: Vec<String> = Vec::new();
    for _ in 0..10 {
        tasks.push(submit(&mut api, "echo", b"{}", "").await.expect("submit"));
    }

    // ---- Redis goes away ----
    let redis_port = env.cluster.redis.port;
    let killed = Instant::now();
    env.cluster.redis.kill();
    let killed_ms = now_ms();
    wait_for("the leader to step down", LEASE_TTL * 2, || async {
        (!leads(env.node.http).await).then_some(())
    })
    .await;
    let step_down = killed.elapsed();
    let fires_down = fires(&env.db, &schedule).await;
    // A margin measured by the node itself: three more rounds that could
    // not renew, each a chance to fire (one second apart).
    let failed = renew_failures(env.node.http).await;
    wait_for(
        "three more failed lease renewals",
        Duration::from_secs(20),
        || async { (renew_failures(env.node.http).await >= failed + 3.0).then_some(()) },
    )
    .await;
    assert_eq!(
        fires(&env.db, &schedule).await,
        fires_down,
        "no schedule fire was committed while Redis was down"
    );
    assert!(
        !leads(env.node.http).await,
        "the node does not lead without Redis"
    );

    // The worker's heartbeats cannot refresh its entry in Redis now. Long
    // tasks start after one such heartbeat, and Redis returns (empty) just
    // after the next: the leader's first round then sees a registry without
    // the worker, for up to a heartbeat interval, while the tasks have been
    // running for seconds. Its orphan sweep must not take them back.
    let log = env.cluster.path(&format!("serve-{}.log", env.node.grpc));
    let refresh_failures = || {
        std::fs::read_to_string(&log)
            .expect("the server's log")
            .matches("cannot refresh the worker's cluster-wide entry")
            .count()
    };
    let first_miss = wait_for(
        "a heartbeat that cannot refresh the worker's entry",
        Duration::from_secs(20),
        || async { Some(refresh_failures()).filter(|n| *n > 0) },
    )
    .await;
    let long_payload = format!(r#"{{"ms":{LONG_MS}}}"#);
    let mut long = Vec::new();
    for _ in 0..3 {
        long.push(
            submit(&mut api, "sleep", long_payload.as_bytes(), "")
                .await
                .expect("SubmitTask only writes the store: accepted during a Redis outage"),
        );
    }

    // What still works: the store-only calls. What cannot: the registry.
    let during_started = Instant::now();
    let mut during = Vec::new();
    for _ in 0..5 {
        during.push(
            submit(&mut api, "echo", b"{}", "")
                .await
                .expect("SubmitTask only writes the store: accepted during a Redis outage"),
        );
    }
    let got = api
        .get_task(pb::GetTaskRequest {
            task_id: tasks[0].clone(),
            ..Default::default()
        })
        .await
        .expect("GetTask only reads the store");
    assert!(got.into_inner().task.is_some());
    let err = bounded(
        "ListWorkers",
        api.list_workers(pb::ListWorkersRequest::default()),
    )
    .await
    .expect_err("ListWorkers reads the cluster-wide registry in Redis");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    // The class and a reference to the log line (which names Redis and
    // its address), never where the infrastructure is.
    assert!(
        err.message().starts_with("coordination unavailable") && err.message().contains("(ref "),
        "the message says what is down: {err:?}"
    );
    assert!(
        !err.message().contains(&redis_port.to_string()),
        "no address of the infrastructure: {err:?}"
    );
    let rest = Rest::new(([127, 0, 0, 1], env.node.http).into());
    let workers = rest.call(Method::GET, "/api/workers", None).await;
    assert_eq!(workers.status.as_u16(), 503, "{:?}", workers.json);
    assert_eq!(workers.json["code"], 14, "{:?}", workers.json);
    let ready = rest.call(Method::GET, "/readyz", None).await;
    assert_eq!(ready.status.as_u16(), 503, "{:?}", ready.json);
    let reason = ready.json["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.starts_with("coordination: ") && reason.contains(&format!("{redis_port}")),
        "readyz names coordination and the server: {reason:?}"
    );
    assert_eq!(ready.json["checks"]["store"], "ok", "{:?}", ready.json);
    wait_health(env.node.grpc, ServingStatus::NotServing).await;
    // The long tasks started while Redis was down: dispatching needs no Redis.
    wait_for(
        "the long tasks to run during the outage",
        Duration::from_secs(20),
        || async { (count_in(&env.db, &long, "RUNNING").await == 3).then_some(()) },
    )
    .await;
    let ran_during = count_in(&env.db, &during, "SUCCEEDED").await;
    let outage_calls = during_started.elapsed();
    wait_for(
        "the next heartbeat that cannot refresh the worker's entry",
        Duration::from_secs(20),
        || async { (refresh_failures() > first_miss).then_some(()) },
    )
    .await;

    // ---- Redis comes back, empty ----
    // Taken before the restart: the node may lead and fire again before
    // `restart` has seen the server answer.
    let restarted = Instant::now();
    let restarted_ms = now_ms();
    env.cluster.redis.restart();
    wait_for(
        "the node to lead again",
        Duration::from_secs(20),
        || async { leads(env.node.http).await.then_some(()) },
    )
    .await;
    let lead_again = restarted.elapsed();
    wait_for(
        "a schedule fire after Redis returned",
        Duration::from_secs(20),
        || async { (last_fire_handled(&env.db, &schedule).await > restarted_ms).then_some(()) },
    )
    .await;
    let fire_again = restarted.elapsed();
    // ListWorkers answers again; this replica's own streams it lists from
    // memory, so the entry in the (restarted) Redis is read there.
    let sessions: Vec<String> = api
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("ListWorkers answers again")
        .into_inner()
        .workers
        .into_iter()
        .filter(|w| w.worker_id == "w1")
        .map(|w| w.session_id)
        .collect();
    assert_eq!(sessions.len(), 1, "one stream of w1: {sessions:?}");
    wait_for(
        "the worker's entry back in Redis",
        Duration::from_secs(30),
        || async {
            env.cluster
                .redis
                .get(&format!("{PREFIX}worker:{}", sessions[0]))
        },
    )
    .await;
    let worker_again = restarted.elapsed();
    wait_health(env.node.grpc, ServingStatus::Serving).await;
    for _ in 0..5 {
        tasks.push(submit(&mut api, "echo", b"{}", "").await.expect("submit"));
    }
    tasks.extend(during.iter().chain(&long).cloned());
    pause_schedule(&mut api, &schedule).await;

    let proof = env.everything_ran_once(&tasks).await;
    assert_eq!(
        fires_between(
            &env.db,
            &schedule,
            killed_ms + LEASE_TTL.as_millis() as i64,
            restarted_ms
        )
        .await,
        0,
        "no fire handled between the lease's expiry and Redis's return"
    );
    println!("redis outage figures:");
    println!(
        "  leader stepped down {} ms after the kill (lease TTL {} ms); fires {fires_down} at step-down, none while down",
        step_down.as_millis(),
        LEASE_TTL.as_millis()
    );
    println!(
        "  during the outage: 8 submits accepted (3 long tasks running across the restart), GetTask served, ListWorkers UNAVAILABLE: {:?}; readyz 503: {reason:?}; {ran_during}/5 echo tasks submitted then already SUCCEEDED ({} ms of calls)",
        err.message(),
        outage_calls.as_millis()
    );
    println!(
        "  after restart: leading again in {} ms, first fire in {} ms, worker entry back in Redis in {} ms",
        lead_again.as_millis(),
        fire_again.as_millis(),
        worker_again.as_millis()
    );
    proof.print();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_answers_unavailable_and_loses_no_task() {
    let env = Env::start().await;
    let mut api = client(&env.node.url());
    let schedule = create_schedule(&mut api, every_second("echo")).await;
    env.fires_at_least(&schedule, 1).await;
    let mut tasks: Vec<String> = Vec::new();
    for _ in 0..10 {
        tasks.push(submit(&mut api, "echo", b"{}", "").await.expect("submit"));
    }
    wait_for(
        "the first tasks to succeed",
        Duration::from_secs(30),
        || {
            let (db, tasks) = (env.db.clone(), tasks.clone());
            async move { (count_in(&db, &tasks, "SUCCEEDED").await == tasks.len()).then_some(()) }
        },
    )
    .await;
    // Tasks that will report their results while the database is gone.
    let short_payload = format!(r#"{{"ms":{SHORT_MS}}}"#);
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(
            submit(&mut api, "sleep", short_payload.as_bytes(), "")
                .await
                .expect("submit"),
        );
    }
    wait_for("the sleep tasks to run", Duration::from_secs(20), || {
        let (db, running) = (env.db.clone(), running.clone());
        async move { (count_in(&db, &running, "RUNNING").await == 3).then_some(()) }
    })
    .await;
    let log = env.cluster.path(&format!("serve-{}.log", env.node.grpc));
    let write_failures = || {
        std::fs::read_to_string(&log)
            .expect("the server's log")
            .matches("batched write failed")
            .count()
    };
    let failures_before = write_failures();

    // ---- Postgres goes away ----
    let stopped = Instant::now();
    env.cluster.pg().stop();
    let started = Instant::now();
    let refused = bounded(
        "SubmitTask",
        submit(&mut api, "echo", b"{}", "refused-during-outage"),
    )
    .await
    .expect_err("no store, no submit");
    let submit_took = started.elapsed();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().starts_with("store unavailable"),
        "a clear message: {refused:?}"
    );
    let started = Instant::now();
    let get = bounded(
        "GetTask",
        api.get_task(pb::GetTaskRequest {
            task_id: tasks[0].clone(),
            ..Default::default()
        }),
    )
    .await
    .expect_err("no store, no read");
    let get_took = started.elapsed();
    assert_eq!(get.code(), tonic::Code::Unavailable, "{get:?}");
    assert!(
        get.message().starts_with("store unavailable"),
        "a clear message: {get:?}"
    );
    // The class and a reference to the log line, never the driver's words
    // (which name hosts, ports and SQL).
    for err in [&refused, &get] {
        let m = err.message();
        assert!(m.contains("(ref "), "a reference to the log: {m}");
        assert!(
            !m.contains("127.0.0.1") && !m.contains("pool") && !m.contains("connect"),
            "no infrastructure detail: {m}"
        );
    }
    let rest = Rest::new(([127, 0, 0, 1], env.node.http).into());
    let posted = rest
        .call(
            Method::POST,
            "/api/tasks",
            Some(json!({"handler": "echo", "clientRequestId": "refused-during-outage-rest"})),
        )
        .await;
    taskmesh_testkit::http::assert_error(&posted, 503, 14, "store unavailable");
    wait_health(env.node.grpc, ServingStatus::NotServing).await;
    let ready = rest.call(Method::GET, "/readyz", None).await;
    assert_eq!(ready.status.as_u16(), 503, "{:?}", ready.json);
    let reason = ready.json["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The store's pool keeps trying to connect for its acquire timeout
    // (5 s), longer than the readiness check waits (2 s).
    assert!(
        reason.starts_with("store: ") && ready.json["checks"]["coordination"] == "ok",
        "readyz names the store: {:?}",
        ready.json
    );
    // At least one sleep task's result met the outage (nothing else writes
    // through the batch writer now): it must wait for the store, not vanish.
    wait_for(
        "a result reported during the outage",
        Duration::from_secs(20),
        || async { (write_failures() > failures_before).then_some(()) },
    )
    .await;
    let outage = stopped.elapsed();

    // ---- Postgres comes back, same port and data ----
    let back = Instant::now();
    env.cluster.pg().start_again();
    let back_ms = now_ms();
    let first = wait_for("a submit to succeed again", Duration::from_secs(30), || {
        let mut api = api.clone();
        async move { submit(&mut api, "echo", b"{}", "").await.ok() }
    })
    .await;
    let submit_again = back.elapsed();
    tasks.push(first);
    wait_health(env.node.grpc, ServingStatus::Serving).await;
    wait_for(
        "a schedule fire after Postgres returned",
        Duration::from_secs(20),
        || async { (last_fire_handled(&env.db, &schedule).await > back_ms).then_some(()) },
    )
    .await;
    let fire_again = back.elapsed();
    for _ in 0..10 {
        tasks.push(submit(&mut api, "echo", b"{}", "").await.expect("submit"));
    }
    tasks.extend(running.iter().cloned());
    pause_schedule(&mut api, &schedule).await;
    let proof = env.everything_ran_once(&tasks).await;
    let refused_created = env
        .db
        .int(
            "SELECT COUNT(*) FROM tasks WHERE client_request_id LIKE 'refused-during-outage%'",
            &[],
        )
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(refused_created, 0, "a refused submit created nothing");
    println!("postgres outage figures:");
    println!(
        "  during the outage ({} ms): SubmitTask UNAVAILABLE in {} ms: {:?}; GetTask UNAVAILABLE in {} ms; REST 503; readyz {reason:?}",
        outage.as_millis(),
        submit_took.as_millis(),
        refused.message(),
        get_took.as_millis()
    );
    println!(
        "  after the restart: submits succeed again in {} ms, first fire in {} ms",
        submit_again.as_millis(),
        fire_again.as_millis()
    );
    proof.print();
}

/// One node and one worker on a private Postgres and Redis, and the record.
struct Env {
    cluster: Cluster,
    node: Replica,
    _worker: Child,
    db: Db,
}

impl Env {
    async fn start() -> Self {
        let cluster = Cluster::start(
            env!("CARGO_BIN_EXE_taskmesh").as_ref(),
            DatabaseKind::Postgres,
        )
        .await;
        let node = cluster.replica(None, &[]).await;
        wait_for("the node to lead", Duration::from_secs(20), || async {
            leads(node.http).await.then_some(())
        })
        .await;
        let worker = cluster
            .worker("w1", &[node.url()])
            .concurrency(8)
            .ledger(&cluster.path("ledger-w1"))
            .spawn()
            .await;
        let mut api = client(&node.url());
        wait_for("the worker to register", Duration::from_secs(20), || {
            let mut api = api.clone();
            async move {
                let w = api
                    .list_workers(pb::ListWorkersRequest::default())
                    .await
                    .ok()?
                    .into_inner()
                    .workers;
                (!w.is_empty()).then_some(())
            }
        })
        .await;
        api.list_tasks(pb::ListTasksRequest::default())
            .await
            .expect("the node answers");
        let db = cluster.db().await;
        Self {
            cluster,
            node,
            _worker: worker,
            db,
        }
    }

    async fn fires_at_least(&self, schedule: &str, n: i64) {
        wait_for("the schedule to fire", Duration::from_secs(20), || async {
            (fires(&self.db, schedule).await >= n).then_some(())
        })
        .await;
    }

    /// Waits until every task in the store is terminal, then checks each
    /// of `accepted` is there, and every task SUCCEEDED in one attempt
    /// whose execution is in the ledger exactly once.
    async fn everything_ran_once(&self, accepted: &[String]) -> Proof {
        let db = &self.db;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let open: Result<Vec<(String, String)>, _> = sqlx::query_as(
                "SELECT id, state FROM tasks WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED')",
            )
            .fetch_all(db.pg())
            .await;
            if open.as_ref().is_ok_and(Vec::is_empty) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "every task should be terminal within 60 s; open: {open:?}"
            );
            // Polling interval of a condition with a deadline.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rows = db.tasks().await.unwrap();
        let state: HashMap<&str, &str> = rows
            .iter()
            .map(|(id, s, _, _)| (id.as_str(), s.as_str()))
            .collect();
        for id in accepted {
            assert_eq!(
                state.get(id.as_str()).copied(),
                Some("SUCCEEDED"),
                "accepted task {id}"
            );
        }
        let not_ok: Vec<_> = rows.iter().filter(|r| r.1 != "SUCCEEDED").collect();
        assert!(not_ok.is_empty(), "every task SUCCEEDED: {not_ok:?}");
        let attempts = db.attempts().await.unwrap();
        let extra: Vec<_> = attempts
            .iter()
            .filter(|a| a.6.as_deref() != Some("SUCCEEDED"))
            .collect();
        assert!(
            extra.is_empty(),
            "every task ran in one attempt; these ended otherwise: {extra:?}"
        );
        let ledger = read_ledger(&self.cluster.path("ledger-w1"));
        let mut runs: HashMap<&str, Vec<&str>> = HashMap::new();
        for line in &ledger {
            runs.entry(&line.task_id)
                .or_default()
                .push(&line.execution_id);
        }
        for (task, _, execution, ..) in &attempts {
            assert_eq!(
                runs.get(task.as_str()).map(Vec::as_slice),
                Some(&[execution.as_str()][..]),
                "task {task} ran once, as its SUCCEEDED attempt {execution}"
            );
        }
        assert_eq!(runs.len(), rows.len(), "the ledger holds no other task");
        Proof {
            tasks: rows.len(),
            submitted: accepted.len(),
            fired: rows.iter().filter(|r| r.2.is_some()).count(),
            executions: ledger.len(),
        }
    }
}

struct Proof {
    tasks: usize,
    submitted: usize,
    fired: usize,
    executions: usize,
}

impl Proof {
    fn print(&self) {
        println!(
            "  tasks {} ({} submitted, {} schedule fires): all SUCCEEDED in one attempt; handler executions {}",
            self.tasks, self.submitted, self.fired, self.executions
        );
    }
}

/// A lazily connecting client whose calls never wait past the server's
/// request timeout by much.
fn client(url: &str) -> TaskApiClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy();
    TaskApiClient::new(ch)
}

/// Runs a call that must answer within the server's request timeout.
async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    tokio::time::timeout(REQUEST_TIMEOUT + Duration::from_secs(5), call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung past the request timeout"))
}

async fn submit(
    api: &mut TaskApiClient<Channel>,
    handler: &str,
    payload: &[u8],
    client_request_id: &str,
) -> Result<String, tonic::Status> {
    api.submit_task(pb::SubmitTaskRequest {
        handler: handler.into(),
        payload: Some(pb::Payload {
            data: payload.to_vec(),
            content_type: "application/json".into(),
        }),
        client_request_id: client_request_id.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().task_id)
}

async fn wait_health(grpc: u16, want: ServingStatus) {
    let addr = format!("http://127.0.0.1:{grpc}");
    wait_for(
        &format!("gRPC health {want:?}"),
        Duration::from_secs(20),
        || {
            let addr = addr.clone();
            async move {
                let ch = tonic::transport::Endpoint::from_shared(addr)
                    .ok()?
                    .connect()
                    .await
                    .ok()?;
                let status = HealthClient::new(ch)
                    .check(HealthCheckRequest {
                        service: "taskmesh.v1.TaskApi".into(),
                    })
                    .await
                    .ok()?
                    .into_inner()
                    .status;
                (status == want as i32).then_some(())
            }
        },
    )
    .await;
}

async fn fires_between(db: &Db, schedule: &str, from: i64, to: i64) -> i64 {
    db.int(
        "SELECT COUNT(*) FROM schedule_fires WHERE schedule_id = $1 AND handled_at > $2 AND handled_at < $3",
        &[Arg::Text(schedule), Arg::Int(from), Arg::Int(to)],
    )
    .await
    .unwrap()
    .unwrap_or(0)
}

/// When the newest fire was handled (0 before the first); a database that
/// does not answer reads as 0.
async fn last_fire_handled(db: &Db, schedule: &str) -> i64 {
    db.int(
        "SELECT MAX(handled_at) FROM schedule_fires WHERE schedule_id = $1",
        &[Arg::Text(schedule)],
    )
    .await
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// How many of `ids` are in `state`; a database that does not answer
/// counts none.
async fn count_in(db: &Db, ids: &[String], state: &str) -> usize {
    sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM tasks WHERE id = ANY($1) AND state = $2")
        .bind(ids)
        .bind(state)
        .fetch_one(db.pg())
        .await
        .map_or(0, |n| n as usize)
}
