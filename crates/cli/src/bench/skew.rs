//! The `skew` scenario: does the balancer route around slow workers?
//!
//! One in-process node on a temporary SQLite directory, per strategy. Four
//! workers with the same slots but different speed: each runs at most
//! `cores` tasks at a time (the rest of its slots queue locally, like a
//! thread pool with a queue) and stretches every task by its slowdown
//! factor. Tasks of mixed duration arrive as a Poisson stream at a fraction
//! of the workers' total execution capacity; the same seeded workload is
//! replayed for every strategy.
//!
//! Measured per strategy: makespan (first submit → last finish), wait
//! (submit → the handler starts executing, so queueing on a worker counts)
//! at p50/p99, and turnaround p99 (submit → finish); each strategy runs
//! `repeats` times, interleaved, and the table shows medians.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use taskmesh::v1 as pb;
use taskmesh_core::Strategy;
use taskmesh_worker::{HandlerError, Output, TaskContext, Worker, WorkerOptions, handler_fn};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use clap::Args;

use crate::node::{self, NodeOptions};

/// Flags of the skew scenario.
#[derive(Debug, Args)]
pub struct SkewArgs {
    /// Offered load as a fraction of the workers' total execution capacity.
    /// At 0.5 several streams usually have room, so the strategy decides;
    /// near 1.0 every strategy degenerates to "whoever frees a slot".
    #[arg(long, default_value_t = 0.5)]
    load: f64,
    /// Seed of the generated workload, so runs compare like with like.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Runs per strategy, interleaved; the table shows medians.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Strategies to compare, comma-separated; all by default.
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy)]
    strategies: Vec<Strategy>,
}

fn parse_strategy(text: &str) -> Result<Strategy, String> {
    Strategy::parse(text.trim()).ok_or_else(|| format!("unknown balancer strategy {text:?}"))
}

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct SkewReport {
    /// The parameters.
    pub config: SkewConfig,
    /// Worker names, in the order of the per-worker column.
    pub workers: Vec<String>,
    /// Per strategy, the median of its runs.
    pub medians: Vec<SkewRun>,
    /// Per strategy, every run.
    pub all: Vec<Vec<SkewRun>>,
}

/// Runs the scenario from its flags.
pub async fn run_args(args: &SkewArgs, tasks: usize) -> anyhow::Result<SkewReport> {
    anyhow::ensure!(tasks > 0, "--tasks must be at least 1");
    anyhow::ensure!(
        args.load > 0.0 && args.load <= 2.0,
        "--load must be in (0, 2], got {}",
        args.load
    );
    anyhow::ensure!((1..=100).contains(&args.repeat), "--repeat must be 1..=100");
    let strategies = if args.strategies.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        args.strategies.clone()
    };
    let mut cfg = SkewConfig::standard(tasks, args.load, args.seed);
    cfg.repeats = args.repeat;
    run(&cfg, &strategies).await
}

/// Prints the report as a table.
pub fn print(r: &SkewReport) {
    let c = &r.config;
    println!("scenario: skew");
    println!("  tasks per strategy: {}", c.tasks);
    println!(
        "  offered load: {:.0}% of capacity = {:.0} tasks/s (capacity {:.0} tasks/s)",
        c.load * 100.0,
        c.load * c.capacity_per_sec(),
        c.capacity_per_sec()
    );
    let workers: Vec<String> = c
        .workers
        .iter()
        .map(|w| {
            format!(
                "{} (x{} slower, {} cores, {} slots, weight {})",
                w.name, w.slowdown, w.cores, w.slots, w.weight
            )
        })
        .collect();
    println!("  workers: {}", workers.join("; "));
    let durations: Vec<String> = c
        .durations_ms
        .iter()
        .map(|(ms, f)| format!("{ms} ms x{f}"))
        .collect();
    println!("  durations: {}", durations.join(", "));
    println!("  seed: {}", c.seed);
    println!(
        "  runs per strategy: {} (interleaved; medians shown, tasks per worker averaged)",
        c.repeats.max(1)
    );
    for line in table(r) {
        println!("{line}");
    }
}

/// The result table as markdown lines.
pub fn table(r: &SkewReport) -> Vec<String> {
    let mut rows = vec![vec![
        "strategy".to_string(),
        "makespan ms".into(),
        "wait p50 ms".into(),
        "wait p99 ms".into(),
        "turnaround p99 ms".into(),
        format!("tasks per worker ({})", r.workers.join("/")),
    ]];
    for m in &r.medians {
        rows.push(vec![
            m.strategy.clone(),
            format!("{:.0}", m.makespan_ms),
            format!("{:.1}", m.wait_p50_ms),
            format!("{:.1}", m.wait_p99_ms),
            format!("{:.1}", m.turnaround_p99_ms),
            r.workers
                .iter()
                .map(|n| m.per_worker.get(n).copied().unwrap_or(0).to_string())
                .collect::<Vec<_>>()
                .join("/"),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let line = |cells: &[String]| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    let mut out = vec![line(&rows[0])];
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push(format!("| {} |", rule.join(" | ")));
    out.extend(rows[1..].iter().map(|r| line(r)));
    out
}

/// One worker of the scenario.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerSpec {
    /// Worker id.
    pub name: String,
    /// Every task takes this many times its nominal duration.
    pub slowdown: f64,
    /// Tasks executing at once; the others wait in the worker's queue.
    pub cores: usize,
    /// Slots registered with the dispatcher (executing + queued).
    pub slots: u32,
    /// Weight registered for WEIGHTED_ROUND_ROBIN (proportional to speed).
    pub weight: u32,
}

/// The scenario's parameters.
#[derive(Debug, Clone, Serialize)]
pub struct SkewConfig {
    /// Tasks per strategy.
    pub tasks: usize,
    /// Offered load as a fraction of [`SkewConfig::capacity_per_sec`].
    pub load: f64,
    /// Workload seed.
    pub seed: u64,
    /// The workers.
    pub workers: Vec<WorkerSpec>,
    /// Nominal task durations in ms with their relative frequency.
    pub durations_ms: Vec<(u64, u32)>,
    /// Distinct routing keys (for CONSISTENT_HASH).
    pub routing_keys: u32,
    /// Heartbeat interval asked of the workers.
    pub heartbeat: Duration,
    /// Runs per strategy, interleaved (every strategy once, then again), so
    /// drift in the machine's load falls on every strategy alike; the table
    /// shows the median of each figure.
    pub repeats: usize,
}

impl SkewConfig {
    /// Four workers (×1, ×1, ×2, ×4 slower; 2 cores and 16 slots each) and
    /// tasks of 10 ms (70%), 40 ms (25%) and 200 ms (5%), long enough that
    /// the node's own per-task cost (a few durable writes) stays small
    /// beside them.
    pub fn standard(tasks: usize, load: f64, seed: u64) -> Self {
        let worker = |name: &str, slowdown: f64, weight: u32| WorkerSpec {
            name: name.into(),
            slowdown,
            cores: 2,
            slots: 16,
            weight,
        };
        Self {
            tasks,
            load,
            seed,
            workers: vec![
                worker("fast-1", 1.0, 4),
                worker("fast-2", 1.0, 4),
                worker("half-speed", 2.0, 2),
                worker("quarter-speed", 4.0, 1),
            ],
            durations_ms: vec![(10, 70), (40, 25), (200, 5)],
            routing_keys: 64,
            heartbeat: Duration::from_millis(500),
            repeats: 3,
        }
    }

    /// Mean nominal duration in ms.
    pub fn mean_ms(&self) -> f64 {
        let total: u32 = self.durations_ms.iter().map(|d| d.1).sum();
        let sum: f64 = self
            .durations_ms
            .iter()
            .map(|&(ms, f)| ms as f64 * f64::from(f))
            .sum();
        sum / f64::from(total.max(1))
    }

    /// Tasks per second the workers can execute at most.
    pub fn capacity_per_sec(&self) -> f64 {
        self.workers
            .iter()
            .map(|w| w.cores as f64 / (w.slowdown * self.mean_ms()))
            .sum::<f64>()
            * 1_000.0
    }
}

/// One strategy's results.
#[derive(Debug, Clone, Serialize)]
pub struct SkewRun {
    /// Strategy.
    pub strategy: String,
    /// Tasks finished.
    pub tasks: usize,
    /// First submit to last finish.
    pub makespan_ms: f64,
    /// Submit to execution start, median.
    pub wait_p50_ms: f64,
    /// Submit to execution start, 99th percentile.
    pub wait_p99_ms: f64,
    /// Submit to finish, 99th percentile.
    pub turnaround_p99_ms: f64,
    /// Tasks run per worker.
    pub per_worker: BTreeMap<String, usize>,
}

/// Runs the scenario `repeats` times per strategy.
pub async fn run(cfg: &SkewConfig, strategies: &[Strategy]) -> anyhow::Result<SkewReport> {
    let jobs = workload(cfg);
    let mut all: Vec<Vec<SkewRun>> = vec![Vec::new(); strategies.len()];
    for _ in 0..cfg.repeats.max(1) {
        for (i, &s) in strategies.iter().enumerate() {
            all[i].push(run_one(cfg, s, &jobs).await?);
        }
    }
    Ok(SkewReport {
        config: cfg.clone(),
        workers: cfg.workers.iter().map(|w| w.name.clone()).collect(),
        medians: all.iter().map(|r| median_run(r)).collect(),
        all,
    })
}

/// The median of each figure over `runs` (one strategy), per-worker counts
/// averaged.
fn median_run(runs: &[SkewRun]) -> SkewRun {
    let median = |f: fn(&SkewRun) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mut per_worker = BTreeMap::new();
    for r in runs {
        for (w, n) in &r.per_worker {
            *per_worker.entry(w.clone()).or_insert(0) += n;
        }
    }
    let n = runs.len().max(1);
    for v in per_worker.values_mut() {
        *v = (*v + n / 2) / n;
    }
    SkewRun {
        strategy: runs.first().map(|r| r.strategy.clone()).unwrap_or_default(),
        tasks: runs.iter().map(|r| r.tasks).min().unwrap_or(0),
        makespan_ms: median(|r| r.makespan_ms),
        wait_p50_ms: median(|r| r.wait_p50_ms),
        wait_p99_ms: median(|r| r.wait_p99_ms),
        turnaround_p99_ms: median(|r| r.turnaround_p99_ms),
        per_worker,
    }
}

/// One task of the workload.
#[derive(Debug, Clone)]
struct Job {
    at: Duration,
    ms: u64,
    key: String,
}

fn workload(cfg: &SkewConfig) -> Vec<Job> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let rate_per_ms = cfg.load * cfg.capacity_per_sec() / 1_000.0;
    let total: u32 = cfg.durations_ms.iter().map(|d| d.1).sum();
    let mut at = 0.0f64;
    (0..cfg.tasks)
        .map(|_| {
            // Exponential gaps: a Poisson arrival stream.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            at += -u.ln() / rate_per_ms;
            let mut draw = rng.random_range(0..total.max(1));
            let ms = cfg
                .durations_ms
                .iter()
                .find(|(_, f)| {
                    let hit = draw < *f;
                    draw = draw.saturating_sub(*f);
                    hit
                })
                .map_or(1, |d| d.0);
            Job {
                at: Duration::from_secs_f64(at / 1_000.0),
                ms,
                key: format!("key-{}", rng.random_range(0..cfg.routing_keys.max(1))),
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Exec {
    worker: String,
    start: Instant,
    end: Instant,
}

type Records = Arc<Mutex<HashMap<String, Exec>>>;

async fn run_one(cfg: &SkewConfig, strategy: Strategy, jobs: &[Job]) -> anyhow::Result<SkewRun> {
    let dir = tempfile::tempdir().context("creating a temporary data directory")?;
    let mut opts = NodeOptions::new();
    opts.data_dir = dir.path().to_path_buf();
    opts.grpc_addr = ([127, 0, 0, 1], 0).into();
    opts.http_addr = ([127, 0, 0, 1], 0).into();
    opts.dispatcher.heartbeat_interval = cfg.heartbeat;
    opts.dispatcher.balancer.default = strategy;
    let node = node::start(opts).await?;
    let records: Records = Arc::default();
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for spec in &cfg.workers {
        let mut wopts = WorkerOptions::new(vec![format!("http://{}", node.grpc_addr)]);
        wopts.worker_id = spec.name.clone();
        wopts.name = spec.name.clone();
        wopts.concurrency = spec.slots;
        wopts.weight = spec.weight;
        let worker = Worker::new(wopts).handler("work", work_handler(spec, records.clone()));
        let handle = worker.handle();
        let token = shutdown.child_token();
        workers.push(tokio::spawn(async move { worker.run(token).await }));
        anyhow::ensure!(
            handle.wait_connected(Duration::from_secs(10)).await,
            "bench worker {} did not connect",
            spec.name
        );
    }

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr))?
        .connect()
        .await?;
    let api = pb::task_api_client::TaskApiClient::new(channel);
    let t0 = tokio::time::Instant::now();
    let mut submits = tokio::task::JoinSet::new();
    for job in jobs {
        tokio::time::sleep_until(t0 + job.at).await;
        let mut api = api.clone();
        let req = pb::SubmitTaskRequest {
            handler: "work".into(),
            payload: Some(pb::Payload {
                data: format!("{{\"ms\":{}}}", job.ms).into_bytes(),
                content_type: "application/json".into(),
            }),
            routing_key: job.key.clone(),
            ..Default::default()
        };
        // Each submit on its own task: a slow store write does not hold
        // back the arrivals behind it.
        submits.spawn(async move {
            let at = Instant::now();
            api.submit_task(req)
                .await
                .map(|r| (r.into_inner().task_id, at))
        });
    }
    let mut submitted: HashMap<String, Instant> = HashMap::new();
    while let Some(r) = submits.join_next().await {
        let (id, at) = r?.context("submitting a bench task")?;
        submitted.insert(id, at);
    }

    let limit = jobs.last().map_or(Duration::ZERO, |j| j.at) * 20 + Duration::from_secs(60);
    let deadline = Instant::now() + limit;
    loop {
        let done = records.lock().map(|r| r.len()).unwrap_or(0);
        if done >= jobs.len() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{strategy:?}: only {done} of {} tasks finished within {limit:?}",
            jobs.len()
        );
        // The bench polls its own in-memory records; nothing to wait on.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    node.stop(Duration::from_secs(5)).await;

    let records = records.lock().map(|r| r.clone()).unwrap_or_default();
    summarize(strategy, &submitted, &records)
}

fn work_handler(spec: &WorkerSpec, records: Records) -> impl taskmesh_worker::Handler {
    let cores = Arc::new(Semaphore::new(spec.cores));
    let slowdown = spec.slowdown;
    let name = spec.name.clone();
    handler_fn(move |ctx: TaskContext| {
        let (cores, records, name) = (cores.clone(), records.clone(), name.clone());
        async move {
            let v: serde_json::Value = serde_json::from_slice(&ctx.payload)
                .map_err(|e| HandlerError::fatal(format!("payload: {e}")))?;
            let ms = v["ms"].as_u64().unwrap_or(1);
            // Queue for a core, like a task in a thread pool's queue.
            let _core = cores
                .acquire_owned()
                .await
                .map_err(|_| HandlerError::retryable("worker stopping"))?;
            let start = Instant::now();
            tokio::time::sleep(Duration::from_secs_f64(ms as f64 * slowdown / 1_000.0)).await;
            let end = Instant::now();
            if let Ok(mut r) = records.lock() {
                r.entry(ctx.task_id.clone()).or_insert(Exec {
                    worker: name,
                    start,
                    end,
                });
            }
            Ok::<_, HandlerError>(Output::empty())
        }
    })
}

fn summarize(
    strategy: Strategy,
    submitted: &HashMap<String, Instant>,
    records: &HashMap<String, Exec>,
) -> anyhow::Result<SkewRun> {
    let mut wait = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut turnaround = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut per_worker = BTreeMap::new();
    let first = submitted
        .values()
        .min()
        .copied()
        .context("no task submitted")?;
    let mut last = first;
    for (id, exec) in records {
        let Some(&at) = submitted.get(id) else {
            continue;
        };
        let us = |d: Duration| (d.as_micros() as u64).max(1);
        wait.saturating_record(us(exec.start.saturating_duration_since(at)));
        turnaround.saturating_record(us(exec.end.saturating_duration_since(at)));
        *per_worker.entry(exec.worker.clone()).or_insert(0) += 1;
        last = last.max(exec.end);
    }
    let ms = |us: u64| us as f64 / 1_000.0;
    Ok(SkewRun {
        strategy: strategy.as_str().to_string(),
        tasks: wait.len() as usize,
        makespan_ms: (last - first).as_secs_f64() * 1_000.0,
        wait_p50_ms: ms(wait.value_at_quantile(0.50)),
        wait_p99_ms: ms(wait.value_at_quantile(0.99)),
        turnaround_p99_ms: ms(turnaround.value_at_quantile(0.99)),
        per_worker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_reproducible_and_at_the_asked_rate() {
        let cfg = SkewConfig::standard(2_000, 0.5, 3);
        let (a, b) = (workload(&cfg), workload(&cfg));
        assert_eq!(a.len(), 2_000);
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.at == y.at && x.ms == y.ms && x.key == y.key)
        );
        let span = a.last().unwrap().at.as_secs_f64();
        let rate = 2_000.0 / span;
        let want = 0.5 * cfg.capacity_per_sec();
        assert!((rate - want).abs() < want * 0.1, "rate {rate} vs {want}");
        let long = a.iter().filter(|j| j.ms == 200).count();
        assert!((60..140).contains(&long), "about 5% long tasks: {long}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_run_finishes_every_task_for_each_strategy_asked() {
        let mut cfg = SkewConfig::standard(40, 0.5, 1);
        cfg.heartbeat = Duration::from_millis(200);
        cfg.repeats = 1;
        let report = run(&cfg, &[Strategy::LeastActive, Strategy::ConsistentHash])
            .await
            .expect("bench runs");
        assert_eq!(report.medians.len(), 2);
        for run in &report.medians {
            assert_eq!(run.tasks, 40, "{run:?}");
            assert_eq!(run.per_worker.values().sum::<usize>(), 40);
            assert!(run.makespan_ms > 0.0);
        }
        let text = table(&report).join("\n");
        assert!(text.contains("| LEAST_ACTIVE"), "{text}");
        assert!(text.contains("| CONSISTENT_HASH"), "{text}");
    }
}
