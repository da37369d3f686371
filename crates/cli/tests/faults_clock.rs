//! Skewed clocks: three `taskmesh serve` replicas on a private Postgres and
//! Redis, one with its clock 60 s ahead and one 30 s behind (libfaketime,
//! `apt-get install faketime`, preloaded into the replica only), one on
//! the host's clock; two `taskmesh worker` processes on the host's clock
//! stamp the start of every execution. The fast replica leads first; it is
//! killed, and then the normal one if it took over, so the slow one leads
//! too. Delayed tasks are submitted to every replica and a schedule fires
//! every second throughout.
//!
//! What must hold (judged on the host's clock, which is the database's: the
//! database runs on this host): no delayed task starts before its submit
//! was sent plus its delay, no fire's task starts before its fire time;
//! never two leaders; fires late by no more than the normal bound outside
//! the takeovers; and the ledger proof (nothing lost or run twice beyond
//! the kills).
//!
//! `cargo test -p taskmesh-cli --test faults_clock -- --include-ignored
//! --nocapture` (run by `make faults`).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_store::DatabaseKind;
use taskmesh_testkit::cluster::{Cluster, LEASE_TTL, Replica, lazy_client, retry_policy};
use taskmesh_testkit::db::Arg;
use taskmesh_testkit::metrics::leads_at;
use taskmesh_testkit::process::{read_ledger, read_start_stamps};
use taskmesh_testkit::record::prove;
use taskmesh_testkit::schedule::{create_schedule, every_second_retrying, pause_schedule};
use taskmesh_testkit::{Child, now_ms, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The load: this many rounds, one every 250 ms, of one delayed task per
/// replica.
const ROUNDS: usize = 100;
/// Lateness allowed outside a takeover (a fire's task starts within this
/// of its fire time; a delayed task within this of its due time).
const LATE_BOUND_MS: i64 = 1_000;

/// A replica and the skew its clock runs at (seconds).
struct Skewed {
    replica: Replica,
    skew: i64,
}

async fn start_replica(cluster: &Cluster, skew: i64) -> Skewed {
    let faketime = format!("{skew:+}s");
    let envs: Vec<(&str, &str)> = if skew == 0 {
        Vec::new()
    } else {
        vec![
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", faketime.as_str()),
            // Timers and intervals keep the real pace; only the wall clock
            // is off.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ]
    };
    let replica = cluster.replica(None, &envs).await;
    Skewed { replica, skew }
}

/// The replica's wall clock minus this host's, in seconds, read from the
/// `Date` header of its HTTP answers.
async fn clock_offset(replica: &Replica) -> i64 {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = client
        .get(format!("http://{}/metrics", replica.http_addr()))
        .send()
        .await
        .expect("the replica answers");
    let date = resp.headers()["date"].to_str().unwrap().to_string();
    let theirs = httpdate_secs(&date);
    theirs - now_ms() / 1_000
}

/// Seconds since the epoch of an HTTP date (`Tue, 01 Dec 2026 09:00:00 GMT`).
fn httpdate_secs(s: &str) -> i64 {
    let t = chrono::DateTime::parse_from_rfc2822(s).expect("an HTTP date");
    t.timestamp()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "make faults"]
async fn skewed_replica_clocks_neither_fire_early_nor_lead_twice() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: this test skews replicas' clocks with libfaketime \
         (apt-get install faketime; `make faults` installs it)"
    );
    let cluster = Cluster::start(BIN.as_ref(), DatabaseKind::Postgres).await;
    // The fast replica first: it takes the lease.
    let mut replicas = vec![start_replica(&cluster, 60).await];
    wait_for("the fast replica to lead", Duration::from_secs(20), || {
        let addr = replicas[0].replica.http_addr();
        async move { leads_at(addr).await.then_some(()) }
    })
    .await;
    replicas.push(start_replica(&cluster, -30).await);
    replicas.push(start_replica(&cluster, 0).await);
    for r in &replicas {
        let off = clock_offset(&r.replica).await;
        assert!(
            (off - r.skew).abs() <= 2,
            "the replica's clock is {off:+} s off (wanted {:+} s): the skew is real",
            r.skew
        );
    }
    let urls: Vec<String> = replicas.iter().map(|r| r.replica.url()).collect();
    let db = cluster.db().await;
    let mut api = lazy_client(&urls[2]);
    let schedule = create_schedule(&mut api, every_second_retrying("echo")).await;
    let mut workers: Vec<Child> = Vec::new();
    for i in 0..2 {
        let id = format!("w{i}");
        let mut order = urls.clone();
        order.rotate_left(i);
        workers.push(
            cluster
                .worker(&id, &order)
                .concurrency(16)
                .ledger(&cluster.path(&format!("ledger-{id}")))
                .start_stamps(&cluster.path(&format!("stamps-{id}")))
                .spawn()
                .await,
        );
    }

    // Delayed tasks through every replica; leaders killed on the way.
    let mut due: HashMap<String, i64> = HashMap::new();
    let mut kills: Vec<i64> = Vec::new();
    let mut leaders_seen: Vec<i64> = Vec::new();
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    for round in 0..ROUNDS {
        // The load's own timetable.
        pace.tick().await;
        for (i, r) in replicas.iter().enumerate() {
            if !alive_url(&r.replica) {
                continue;
            }
            let delay_ms = 500 + (round as i64 * 137 + i as i64 * 311) % 2_500;
            let sent = now_ms();
            let reply = lazy_client(&urls[i])
                .submit_task(pb::SubmitTaskRequest {
                    handler: "echo".into(),
                    delay: Some(prost_types::Duration {
                        seconds: delay_ms / 1_000,
                        nanos: ((delay_ms % 1_000) * 1_000_000) as i32,
                    }),
                    retry_policy: Some(retry_policy()),
                    ..Default::default()
                })
                .await;
            if let Ok(r) = reply {
                due.insert(r.into_inner().task_id, sent + delay_ms);
            }
        }
        // Never two leaders among the live replicas.
        let mut leading = Vec::new();
        for r in &replicas {
            if alive_url(&r.replica) && leads_at(r.replica.http_addr()).await {
                leading.push(r.skew);
            }
        }
        assert!(leading.len() <= 1, "two leaders at once: skews {leading:?}");
        if let [skew] = leading[..]
            && leaders_seen.last() != Some(&skew)
        {
            leaders_seen.push(skew);
        }
        // Kill the leader once at 8 s (the fast one) and once at 16 s if
        // the slow one has not led yet.
        if (round == 32 || (round == 64 && !leaders_seen.contains(&-30)))
            && let [skew] = leading[..]
            && skew != -30
        {
            let r = replicas.iter_mut().find(|r| r.skew == skew).unwrap();
            r.replica.child.kill();
            kills.push(now_ms());
        }
    }
    assert!(
        leaders_seen.contains(&60) && leaders_seen.contains(&-30),
        "both skewed replicas led: {leaders_seen:?}"
    );
    let mut api = lazy_client(&urls[1]);
    pause_schedule(&mut api, &schedule).await;
    wait_for("every task to end", Duration::from_secs(120), || {
        let db = db.clone();
        async move { (db.open_tasks().await.ok()? == 0).then_some(()) }
    })
    .await;
    for w in &mut workers {
        w.assert_alive();
    }

    // Starts as the workers saw them (host clock).
    let mut started: HashMap<String, i64> = HashMap::new();
    for i in 0..2 {
        for (id, us) in read_start_stamps(&cluster.path(&format!("stamps-w{i}"))) {
            let ms = us / 1_000;
            started
                .entry(id)
                .and_modify(|t| *t = (*t).min(ms))
                .or_insert(ms);
        }
    }
    // A takeover: from a second before a kill (a fire due then may have
    // died with its leader) to the lease TTL and 2 s after it.
    let in_takeover = |t: i64| {
        kills
            .iter()
            .any(|k| t >= k - 1_000 && t <= k + (LEASE_TTL.as_millis() as i64) + 2_000)
    };
    // Each task against the instant it was due: started early is a
    // failure, late is a lateness figure (outside takeovers).
    let mut early = Vec::new();
    let mut judge = |what: &str, due: &[(String, i64)]| {
        let mut late = Vec::new();
        for (id, due_at) in due {
            let s = *started
                .get(id)
                .unwrap_or_else(|| panic!("{what} {id} started"));
            if s < *due_at {
                early.push(format!("{what} {id} started {} ms early", due_at - s));
            } else if !in_takeover(*due_at) {
                late.push(s - due_at);
            }
        }
        late
    };
    let due: Vec<(String, i64)> = due.into_iter().collect();
    let fires: Vec<(String, i64)> = fire_tasks(&db, &schedule).await;
    let mut late_delayed = judge("delayed task", &due);
    let mut late_fires = judge("fire task", &fires);
    assert!(early.is_empty(), "tasks started early: {early:#?}");
    late_delayed.sort_unstable();
    late_fires.sort_unstable();
    let p = |v: &[i64], q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];

    let ledger: Vec<_> = (0..2)
        .flat_map(|i| read_ledger(&cluster.path(&format!("ledger-w{i}"))))
        .collect();
    let accepted: Vec<String> = due.iter().map(|(id, _)| id.clone()).collect();
    let proof = prove(&db, &accepted, &ledger, Some(&schedule), |_, a| {
        let ended = a.5.unwrap_or(i64::MAX);
        kills
            .iter()
            .any(|k| a.4 <= *k && *k <= ended)
            .then(|| "a killed leader".to_string())
    })
    .await;
    println!(
        "fault clock-skew (+60 s, -30 s, 0): {}; leaders in turn {leaders_seen:?} (skew s), \
         never two; started early 0 of {} delayed and {} fire tasks; lateness outside takeovers: \
         delayed p50 {} p99 {} max {} ms, fires p50 {} p99 {} max {} ms",
        proof.summary(),
        due.len(),
        fires.len(),
        p(&late_delayed, 0.5),
        p(&late_delayed, 0.99),
        late_delayed.last().unwrap(),
        p(&late_fires, 0.5),
        p(&late_fires, 0.99),
        late_fires.last().unwrap()
    );
    assert!(
        p(&late_delayed, 0.99) <= LATE_BOUND_MS && p(&late_fires, 0.99) <= LATE_BOUND_MS,
        "lateness p99 within {LATE_BOUND_MS} ms outside takeovers"
    );
}

/// Whether the test has not killed the replica.
fn alive_url(r: &Replica) -> bool {
    !r.child.is_killed()
}

/// (task id, fire time in ms) of every fire of `schedule` that created one.
async fn fire_tasks(db: &taskmesh_testkit::db::Db, schedule: &str) -> Vec<(String, i64)> {
    let n = db
        .int(
            "SELECT COUNT(*) FROM schedule_fires WHERE schedule_id = $1 AND task_id IS NOT NULL",
            &[Arg::Text(schedule)],
        )
        .await
        .unwrap()
        .unwrap_or(0);
    let mut out = Vec::with_capacity(n as usize);
    for (id, _, sched, _) in db.tasks().await.unwrap() {
        if sched.as_deref() != Some(schedule) {
            continue;
        }
        let fire_at = db
            .int(
                "SELECT fire_at FROM schedule_fires WHERE task_id = $1",
                &[Arg::Text(&id)],
            )
            .await
            .unwrap()
            .expect("the fire of a fire's task");
        out.push((id, fire_at));
    }
    assert_eq!(out.len() as i64, n, "every created fire's task is found");
    out
}
