//! `--scenario throughput`: how many tasks per second the node drains end
//! to end — submit (batched), claim, push over gRPC, ACK, run `echo`,
//! result, every step durable.
//!
//! `--mode prefill` inserts `--tasks` with `SubmitTasks` first, then starts
//! the workers and measures the drain; `--mode continuous` starts the
//! workers first and submits while they drain (at `--rate`, or as fast as
//! the node accepts). Completed tasks/s is counted from the first to the
//! last completion, as the store recorded them (`ended_at`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::{self, CpuReport, LoadArgs, Mode, Recorder, Rig, WorkersAs};

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    /// `throughput`.
    pub scenario: &'static str,
    /// Prefill or continuous.
    pub mode: Mode,
    /// The store.
    pub store: String,
    /// Tasks submitted.
    pub tasks: u64,
    /// Workers.
    pub workers: usize,
    /// Slots per worker.
    pub worker_concurrency: u32,
    /// Where the workers ran.
    pub workers_as: WorkersAs,
    /// Tasks per `SubmitTasks` call.
    pub submit_batch: usize,
    /// Submitted tasks per second while loading.
    pub submit_per_s: f64,
    /// Tasks that succeeded.
    pub completed: u64,
    /// Tasks in any other state at the end (should be 0).
    pub not_completed: u64,
    /// First to last completion, in seconds.
    pub drain_s: f64,
    /// Completed tasks per second over that span.
    pub completed_per_s: f64,
    /// Store claim transactions and tasks claimed (mean claim size).
    pub claim_calls: u64,
    /// Tasks claimed.
    pub claimed: u64,
    /// CPU during the drain (prefill) or the whole run (continuous).
    pub cpu: CpuReport,
}

/// Runs the scenario.
pub async fn run(args: &LoadArgs, tasks: usize) -> anyhow::Result<ThroughputReport> {
    args.validate()?;
    anyhow::ensure!(
        (1..=10_000_000).contains(&tasks),
        "--tasks must be 1..=10000000"
    );
    let mut rig = Rig::start(args).await?;
    let recorder = Recorder::start(rig.node.store.clone(), false);
    let addr = rig.node.grpc_addr;
    let batch = args.submit_batch;
    let result = async {
        let (submit_per_s, cpu) = match args.mode {
            Mode::Prefill => {
                let started = Instant::now();
                let (ids, _) = load::on_generator_thread(move || async move {
                    let api = load::client(addr).await?;
                    load::submit_all(&api, tasks, batch, 4, load::echo_request).await
                })
                .await?;
                let submit_per_s = ids.len() as f64 / started.elapsed().as_secs_f64();
                let mark = rig.cpu_mark();
                rig.start_workers(args).await?;
                let submitted = AtomicBool::new(true);
                load::wait_drained(
                    &rig,
                    &recorder,
                    tasks as u64,
                    Duration::from_secs(60),
                    &submitted,
                )
                .await?;
                (
                    submit_per_s,
                    rig.cpu_since(&mark, Duration::ZERO, tasks as u64),
                )
            }
            Mode::Continuous => {
                rig.start_workers(args).await?;
                let mark = rig.cpu_mark();
                let rate = args.rate;
                let started = Instant::now();
                let (ids, generator_cpu) = load::submit_while_draining(
                    &rig,
                    &recorder,
                    tasks as u64,
                    move |api| async move {
                        match rate {
                            None => {
                                load::submit_all(&api, tasks, batch, 4, load::echo_request).await
                            }
                            Some(rate) => paced(&api, tasks, batch, rate).await,
                        }
                    },
                )
                .await?;
                let submit_per_s = ids.len() as f64 / started.elapsed().as_secs_f64();
                (
                    submit_per_s,
                    rig.cpu_since(&mark, generator_cpu, tasks as u64),
                )
            }
        };
        let tally = load::tally(rig.node.store.as_ref()).await?;
        let drain_ms = match (tally.first_end, tally.last_end) {
            (Some(a), Some(b)) => (b - a).max(1) as f64,
            _ => 0.0,
        };
        let (_, claim_calls, claimed, _) = rig.node.dispatch_stats.snapshot();
        Ok::<_, anyhow::Error>(ThroughputReport {
            scenario: "throughput",
            mode: args.mode,
            store: rig.store_label.clone(),
            tasks: tasks as u64,
            workers: args.workers,
            worker_concurrency: args.worker_concurrency,
            workers_as: args.workers_as,
            submit_batch: batch,
            submit_per_s,
            completed: tally.succeeded,
            not_completed: tally.other,
            drain_s: drain_ms / 1_000.0,
            completed_per_s: if drain_ms > 0.0 {
                // n completions span n-1 gaps.
                (tally.succeeded.saturating_sub(1)) as f64 * 1_000.0 / drain_ms
            } else {
                0.0
            },
            claim_calls,
            claimed,
            cpu,
        })
    }
    .await;
    load::end_run(recorder, rig).await;
    result
}

/// Submits `tasks` at `rate` per second in calls of up to `batch`: every
/// millisecond, whatever arrived since the last call goes as one call.
async fn paced(
    api: &taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
    tasks: usize,
    batch: usize,
    rate: f64,
) -> anyhow::Result<Vec<load::Submitted>> {
    let out = Arc::new(std::sync::Mutex::new(Vec::with_capacity(tasks)));
    let t0 = tokio::time::Instant::now();
    let mut sent = 0usize;
    let mut calls = tokio::task::JoinSet::new();
    while sent < tasks {
        let due = ((t0.elapsed().as_secs_f64() * rate) as usize + 1).min(tasks);
        while sent < due {
            let n = (due - sent).min(batch);
            sent += n;
            let (mut api, out) = (api.clone(), out.clone());
            calls.spawn(async move {
                let at = Instant::now();
                let req = taskmesh::v1::SubmitTasksRequest {
                    tasks: (0..n).map(|_| load::echo_request()).collect(),
                };
                let resp = api.submit_tasks(req).await?.into_inner();
                let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
                for r in resp.results {
                    if let Some(a) = r.accepted {
                        out.push((a.task_id, at));
                    }
                }
                Ok::<_, tonic::Status>(())
            });
        }
        while let Some(done) = calls.try_join_next() {
            done??;
        }
        let next = Duration::from_secs_f64((sent as f64) / rate);
        tokio::time::sleep_until(t0 + next.max(Duration::from_millis(1))).await;
    }
    while let Some(done) = calls.join_next().await {
        done??;
    }
    let out = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(out)
}

/// Prints the report as a table.
pub fn print(r: &ThroughputReport) {
    let mut rows = vec![
        ("mode".to_string(), format!("{:?}", r.mode).to_lowercase()),
        ("store".into(), r.store.clone()),
        (
            "workers".into(),
            format!(
                "{} × {} slots ({})",
                r.workers,
                r.worker_concurrency,
                match r.workers_as {
                    WorkersAs::Processes => "processes",
                    WorkersAs::InProcess => "in process",
                }
            ),
        ),
        ("tasks".into(), r.tasks.to_string()),
        (
            "submitted/s".into(),
            format!("{:.0} (SubmitTasks of {})", r.submit_per_s, r.submit_batch),
        ),
        ("completed".into(), r.completed.to_string()),
        ("not completed".into(), r.not_completed.to_string()),
        (
            "first → last completion (s)".into(),
            format!("{:.3}", r.drain_s),
        ),
        (
            "completed tasks/s".into(),
            format!("{:.0}", r.completed_per_s),
        ),
        (
            "claims (tasks per claim)".into(),
            format!(
                "{} ({:.1})",
                r.claim_calls,
                r.claimed as f64 / r.claim_calls.max(1) as f64
            ),
        ),
    ];
    rows.extend(load::cpu_rows(&r.cpu));
    load::print_rows("scenario: throughput", &rows);
}
