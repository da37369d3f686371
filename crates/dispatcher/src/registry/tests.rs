//! The registry's filters, failover marks and per-handler strategy state.

use std::collections::{BTreeMap, HashSet};

use taskmesh_core::{NewTask, Strategy, TaskRecord};
use tokio::sync::mpsc;

use super::*;

type Rx = mpsc::Receiver<StreamItem>;

fn stream(
    reg: &Registry,
    id: &str,
    handlers: &[&str],
    capacity: u32,
    labels: &[(&str, &str)],
) -> Rx {
    let (tx, rx) = mpsc::channel(8);
    reg.insert(Registration {
        push: false,
        session_id: id.into(),
        namespace: taskmesh_core::validate::DEFAULT_NAMESPACE.into(),
        owner: String::new(),
        worker_id: format!("worker-{id}"),
        name: id.into(),
        handlers: handlers
            .iter()
            .map(|h| h.to_string())
            .collect::<HashSet<_>>(),
        capacity,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        weight: 1,
        tx,
        now: 0,
    });
    rx
}

fn task(handler: &str, labels: &[(&str, &str)], balancer: Option<Strategy>) -> TaskRecord {
    NewTask {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        timeout_ms: 1_000,
        balancer,
        ..NewTask::new(handler, 0)
    }
    .into_record(0)
}

fn pick(reg: &Registry, t: &TaskRecord, exec: &str) -> Option<String> {
    reg.reserve(t, exec).map(|r| r.session_id)
}

#[test]
fn filters_handler_slots_labels_and_draining() {
    let reg = Registry::default();
    let _a = stream(&reg, "a", &["echo"], 1, &[("zone", "eu")]);
    let _b = stream(&reg, "b", &["sleep"], 5, &[("zone", "eu")]);
    let _c = stream(&reg, "c", &["echo"], 5, &[]);
    let eu = task("echo", &[("zone", "eu")], None);
    assert_eq!(pick(&reg, &eu, "e1").as_deref(), Some("a"));
    // a is full now; c lacks the label; b does not serve echo.
    assert_eq!(pick(&reg, &eu, "e2"), None);
    assert_eq!(
        pick(&reg, &task("echo", &[], None), "e3").as_deref(),
        Some("c")
    );
    reg.set_draining("c");
    assert_eq!(pick(&reg, &task("echo", &[], None), "e4"), None);
    assert_eq!(pick(&reg, &task("nobody", &[], None), "e5"), None);
    reg.finish("e1");
    assert_eq!(pick(&reg, &eu, "e6").as_deref(), Some("a"));
}

#[test]
fn busy_stays_busy_until_a_slot_frees_or_a_heartbeat_shows_room() {
    let reg = Registry::default();
    let _a = stream(&reg, "a", &["echo"], 2, &[]);
    let t = task("echo", &[], None);
    assert_eq!(pick(&reg, &t, "e1").as_deref(), Some("a"));
    assert_eq!(pick(&reg, &t, "e2").as_deref(), Some("a"));
    // e2 is rejected BUSY: its slot is free, but the stream is not offered.
    reg.finish_with("e2", After::Busy);
    assert_eq!(pick(&reg, &t, "e3"), None);
    assert!(reg.free_slots_by_handler().is_empty());
    // A heartbeat at capacity keeps it busy; one with room frees it.
    let hb = |active| Heartbeat {
        active,
        cpu_idle_percent: f64::NAN,
        avg_cost_ms: -1.0,
    };
    reg.heartbeat("a", hb(2));
    assert_eq!(pick(&reg, &t, "e3"), None);
    reg.heartbeat("a", hb(1));
    assert_eq!(pick(&reg, &t, "e3").as_deref(), Some("a"));
    reg.finish_with("e3", After::Busy);
    // A finished task frees it too.
    reg.finish("e1");
    assert_eq!(pick(&reg, &t, "e4").as_deref(), Some("a"));
    let info = &reg.snapshot("n", None)[0];
    assert_eq!(info.cpu_idle_percent, 100.0, "NaN ignored");
    assert_eq!(info.avg_cost_ms, 0.0, "negative clamped");
}

#[test]
fn a_closed_or_full_stream_is_passed_over_for_the_next_candidate() {
    let reg = Registry::new(BalancerOptions {
        default: Strategy::RoundRobin,
        ..BalancerOptions::default()
    });
    let a = stream(&reg, "a", &["echo"], 5, &[]);
    let _b = stream(&reg, "b", &["echo"], 5, &[]);
    drop(a);
    let t = task("echo", &[], None);
    for i in 0..3 {
        assert_eq!(pick(&reg, &t, &format!("e{i}")).as_deref(), Some("b"));
    }
    // A push that failed after the claim marks the stream the same way.
    let reg = Registry::default();
    let (tx, mut rx) = mpsc::channel(1);
    reg.insert(Registration {
        push: false,
        session_id: "x".into(),
        namespace: taskmesh_core::validate::DEFAULT_NAMESPACE.into(),
        owner: String::new(),
        worker_id: "x".into(),
        name: "x".into(),
        handlers: ["echo".to_string()].into(),
        capacity: 5,
        labels: BTreeMap::new(),
        weight: 1,
        tx: tx.clone(),
        now: 0,
    });
    assert!(reg.reserve(&t, "x1").is_some());
    tx.try_send(Err(tonic::Status::internal("fill"))).unwrap();
    reg.finish_with("x1", After::Unsendable);
    assert_eq!(pick(&reg, &t, "x2"), None, "a full queue is busy");
    let _ = rx.try_recv();
    reg.heartbeat(
        "x",
        Heartbeat {
            active: 0,
            cpu_idle_percent: 50.0,
            avg_cost_ms: 1.0,
        },
    );
    assert!(reg.reserve(&t, "x3").is_some());
}

#[test]
fn strategy_per_handler_per_task_override_and_isolated_state() {
    let mut per_handler = BTreeMap::new();
    per_handler.insert("rr".to_string(), Strategy::RoundRobin);
    let reg = Registry::new(BalancerOptions {
        default: Strategy::LeastActive,
        per_handler,
        ..BalancerOptions::default()
    });
    let _a = stream(&reg, "a", &["rr", "la"], 100, &[]);
    let _b = stream(&reg, "b", &["rr", "la"], 100, &[]);
    let rr = task("rr", &[], None);
    let la = task("la", &[], None);
    // Round robin ignores load: a, b, a, b whatever the in-flight counts.
    let picks: Vec<String> = (0..4)
        .map(|i| pick(&reg, &rr, &format!("r{i}")).unwrap())
        .collect();
    assert_eq!(picks, ["a", "b", "a", "b"]);
    // Least-active on `la` starts its own rotation: `rr` traffic did not move it.
    assert_eq!(pick(&reg, &la, "l0").as_deref(), Some("a"));
    assert_eq!(pick(&reg, &la, "l1").as_deref(), Some("b"));
    reg.finish("r1");
    reg.finish("r3");
    reg.finish("l1");
    // a has 3 in flight, b has 0: least-active goes to b every time...
    assert_eq!(pick(&reg, &la, "l2").as_deref(), Some("b"));
    // ...and a per-task ROUND_ROBIN override on `la` still alternates.
    let over = task("la", &[], Some(Strategy::RoundRobin));
    let picks: Vec<String> = (0..2)
        .map(|i| pick(&reg, &over, &format!("o{i}")).unwrap())
        .collect();
    assert_eq!(picks, ["a", "b"]);
}

#[test]
fn membership_changes_keep_pools_in_step() {
    let reg = Registry::new(BalancerOptions {
        default: Strategy::WeightedRoundRobin,
        ..BalancerOptions::default()
    });
    let _a = stream(&reg, "a", &["echo", "other"], 100, &[]);
    let t = task("echo", &[], None);
    assert_eq!(pick(&reg, &t, "e0").as_deref(), Some("a"));
    let _b = stream(&reg, "b", &["echo"], 100, &[]);
    let got: HashSet<String> = (1..5)
        .map(|i| pick(&reg, &t, &format!("e{i}")).unwrap())
        .collect();
    assert_eq!(got.len(), 2, "the newcomer takes its share at once");
    reg.drop_handler("a", "echo");
    assert_eq!(reg.remove("a").len(), 3, "e0 and its share still in flight");
    for i in 5..8 {
        assert_eq!(pick(&reg, &t, &format!("e{i}")).as_deref(), Some("b"));
    }
    reg.remove("b");
    assert_eq!(pick(&reg, &t, "e9"), None);
    assert!(reg.free_slots_by_handler().is_empty());
}

#[test]
fn equal_cost_counts_our_pushes_plus_only_what_the_worker_reports_beyond_them() {
    let reg = Registry::new(BalancerOptions {
        default: Strategy::EqualCost,
        ..BalancerOptions::default()
    });
    let _a = stream(&reg, "a", &["h"], 50, &[]);
    let _b = stream(&reg, "b", &["h"], 50, &[]);
    let t = task("h", &[], None);
    let hb = |active| Heartbeat {
        active,
        cpu_idle_percent: 100.0,
        avg_cost_ms: 0.0,
    };
    // A burst spreads at once, heartbeats or not.
    let first: Vec<String> = (0..6)
        .map(|i| pick(&reg, &t, &format!("e{i}")).unwrap())
        .collect();
    assert_eq!(first.iter().filter(|s| *s == "a").count(), 3);
    // a reports its 3, then finishes them: its stale figure must not count.
    reg.heartbeat("a", hb(3));
    for (i, s) in first.iter().enumerate() {
        if s == "a" {
            reg.finish(&format!("e{i}"));
        }
    }
    for i in 6..9 {
        assert_eq!(pick(&reg, &t, &format!("e{i}")).as_deref(), Some("a"));
    }
    // b reports 10 beyond the 3 we pushed (work we no longer track): avoided.
    reg.heartbeat("b", hb(13));
    for i in 9..13 {
        assert_eq!(pick(&reg, &t, &format!("e{i}")).as_deref(), Some("a"));
    }
    let b = reg
        .snapshot("n", None)
        .into_iter()
        .find(|w| w.session_id == "b")
        .unwrap();
    assert_eq!(b.active, 13);
}
