//! What one choice costs among 1,000 streams: each strategy on its own (the
//! `Balancer` seam, candidates as the registry keeps them), then the whole
//! `Registry::reserve` + `finish` path a claimed task takes under the lock.
//! Run with `make bench` or `cargo bench -p taskmesh-dispatcher --bench choose`.

use std::collections::{BTreeMap, HashSet};

use divan::Bencher;
use taskmesh_core::{NewTask, Strategy};
use taskmesh_dispatcher::balancer::{Candidate, Pick, StrategySet, hash};
use taskmesh_dispatcher::{BalancerOptions, Registration, Registry};

const STREAMS: usize = 1_000;
const STRATEGIES: [&str; 6] = [
    "LEAST_ACTIVE",
    "ROUND_ROBIN",
    "RANDOM",
    "WEIGHTED_ROUND_ROBIN",
    "CONSISTENT_HASH",
    "EQUAL_COST",
];

fn main() {
    divan::main();
}

/// 1,000 open streams with varied figures (deterministic).
fn candidates() -> Vec<Candidate> {
    (0..STREAMS)
        .map(|i| {
            let mut c = Candidate::idle(i as u64, &format!("worker-{i}"));
            c.in_flight = (i * 7 % 9) as u32;
            c.extra_active = (i % 31 == 0) as u32;
            c.weight = 1 + (i % 5) as u32;
            c.cpu_idle_percent = (i * 13 % 100) as f64;
            c.avg_cost_ms = (i * 37 % 5_000) as f64;
            c.update_load()
        })
        .collect()
}

#[divan::bench(args = STRATEGIES)]
fn choose_among_1000(bencher: Bencher, name: &str) {
    let strategy = Strategy::parse(name).expect("a strategy");
    let cands = candidates();
    let mut set = StrategySet::new(160, 42);
    let mut n: u64 = 0;
    // Build the ring (and WRR state) once, as the first real pick would.
    set.get(strategy).choose(&Pick {
        candidates: &cands,
        mask: None,
        key: 0,
        epoch: 1,
    });
    bencher.bench_local(move || {
        n += 1;
        let pick = Pick {
            candidates: &cands,
            mask: None,
            key: hash::vnode(n, 0),
            epoch: 1,
        };
        set.get(strategy).choose(divan::black_box(&pick))
    });
}

#[divan::bench(args = STRATEGIES)]
fn reserve_and_finish_among_1000(bencher: Bencher, name: &str) {
    let strategy = Strategy::parse(name).expect("a strategy");
    let registry = Registry::new(BalancerOptions {
        default: strategy,
        ..BalancerOptions::default()
    });
    let mut keep = Vec::new();
    for i in 0..STREAMS {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        keep.push(rx);
        registry.insert(Registration {
            push: false,
            session_id: format!("session-{i}"),
            namespace: taskmesh_core::validate::DEFAULT_NAMESPACE.into(),
            owner: String::new(),
            worker_id: format!("worker-{i}"),
            name: format!("worker-{i}"),
            handlers: HashSet::from(["echo".to_string()]),
            capacity: 64,
            labels: BTreeMap::new(),
            weight: 1 + (i % 5) as u32,
            tx,
            now: 0,
        });
    }
    let mut task = NewTask {
        id: "0190a4c0-0000-7000-8000-000000000000".into(),
        timeout_ms: 1_000,
        ..NewTask::new("echo", 0)
    }
    .into_record(0);
    // Leave some load behind so the figures differ from stream to stream.
    for i in 0..3 * STREAMS {
        task.routing_key = format!("warm-{i}");
        registry.reserve(&task, &format!("warm-{i}"));
    }
    let mut n: u64 = 0;
    bencher.bench_local(move || {
        n += 1;
        task.routing_key = format!("customer-{}", n % 10_000);
        let exec = format!("exec-{n}");
        let got = registry.reserve(&task, &exec);
        registry.finish(&exec);
        got
    });
    drop(keep);
}
