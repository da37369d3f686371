//! `--scenario fairness`: one namespace flooding beside a quiet one. Two
//! namespaces on one node, each with `--workers` workers of its own (a
//! worker serves one namespace): the quiet one submits at `--rate`
//! (default 100/s) for `--duration`, once alone and once while the other
//! has `--tasks` (default 200,000) to run — half inserted before the quiet
//! arrivals start, half submitted as fast as the node takes them while they
//! run. What the two share is the node: its accept loop, dispatch rounds,
//! store and group commits. The figure is the quiet namespace's wait,
//! submit → start (as its worker saw it), alone and flooded; arrivals are
//! counted from their due instants (no coordinated omission, see
//! `latency`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;
use taskmesh::v1 as pb;

use super::Percentiles;
use super::latency::{histograms, open_loop};
use super::load::{self, LoadArgs, Recorder, Rig, WorkersAs};

/// Default arrival rate of the quiet namespace.
pub const DEFAULT_RATE: f64 = 100.0;
/// Default flood.
pub const DEFAULT_FLOOD: usize = 200_000;

/// One run of the quiet namespace.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Tasks of the flooding namespace in this run.
    pub flood_tasks: u64,
    /// Of those, ended while the quiet one was submitting.
    pub flood_ended_during: u64,
    /// The quiet namespace's submit → start.
    pub quiet_submit_to_start: Percentiles,
    /// The quiet namespace's submit → the result durable.
    pub quiet_submit_to_complete: Percentiles,
}

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessReport {
    /// `fairness`.
    pub scenario: &'static str,
    /// The store.
    pub store: String,
    /// The quiet namespace's arrival rate, tasks/s.
    pub quiet_rate: f64,
    /// How long the quiet namespace submitted, in seconds.
    pub duration_s: f64,
    /// Workers per namespace.
    pub workers: usize,
    /// Slots per worker.
    pub worker_concurrency: u32,
    /// Where the workers ran.
    pub workers_as: WorkersAs,
    /// The quiet namespace alone.
    pub alone: Phase,
    /// Beside the flood.
    pub flooded: Phase,
    /// Changes the recorder missed.
    pub missed_changes: u64,
}

/// Runs the scenario: alone, then flooded.
pub async fn run(args: &LoadArgs, flood: usize) -> anyhow::Result<FairnessReport> {
    args.validate()?;
    anyhow::ensure!(flood <= 10_000_000, "--tasks must stay below 10^7");
    let rate = args.rate.unwrap_or(DEFAULT_RATE);
    let quiet = (rate * args.duration.as_secs_f64()).round().max(1.0) as usize;
    let (alone, missed_a, store) = phase(args, rate, quiet, 0).await?;
    let (flooded, missed_b, _) = phase(args, rate, quiet, flood).await?;
    Ok(FairnessReport {
        scenario: "fairness",
        store,
        quiet_rate: rate,
        duration_s: args.duration.as_secs_f64(),
        workers: args.workers,
        worker_concurrency: args.worker_concurrency,
        workers_as: args.workers_as,
        alone,
        flooded,
        missed_changes: missed_a + missed_b,
    })
}

async fn phase(
    args: &LoadArgs,
    rate: f64,
    quiet: usize,
    flood: usize,
) -> anyhow::Result<(Phase, u64, String)> {
    let mut rig = Rig::start(args).await?;
    rig.stamp_starts()?;
    let result = async {
        rig.start_workers_in(args, "quiet", "quiet").await?;
        rig.start_workers_in(args, "flood", "flood").await?;
        let recorder = Recorder::start(rig.node.store.clone(), true);
        let api = load::client(rig.node.grpc_addr).await?;
        // Half the flood first, so it is there when the quiet arrivals start.
        let first = flood / 2;
        submit_flood(&api, first, args.submit_batch).await?;
        let ended_before = recorder.ended.load(Ordering::Relaxed);
        // The rest while the quiet namespace submits.
        let stop = Arc::new(AtomicBool::new(false));
        let flooded = Arc::new(AtomicU64::new(first as u64));
        let flooder = {
            let (api, stop, flooded) = (api.clone(), stop.clone(), flooded.clone());
            let (rest, batch) = (flood - first, args.submit_batch);
            tokio::spawn(async move {
                let mut sent = 0;
                while sent < rest && !stop.load(Ordering::Relaxed) {
                    let n = batch.min(rest - sent);
                    submit_flood(&api, n, batch).await?;
                    sent += n;
                    flooded.fetch_add(n as u64, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        };
        let submitted = AtomicBool::new(false);
        let ((arrivals, _), _) = load::on_generator_thread({
            let addr = rig.node.grpc_addr;
            move || async move {
                let api = load::client(addr).await?;
                open_loop(&api, quiet, rate, "quiet").await
            }
        })
        .await?;
        stop.store(true, Ordering::Relaxed);
        let ended_during = recorder.ended.load(Ordering::Relaxed) - ended_before;
        flooder.await??;
        submitted.store(true, Ordering::Release);
        let total = flooded.load(Ordering::Relaxed) + arrivals.len() as u64;
        load::wait_drained(
            &rig,
            &recorder,
            total,
            std::time::Duration::from_secs(60),
            &submitted,
        )
        .await?;
        let missed = recorder.missed.load(Ordering::Relaxed);
        let seen = recorder.finish().await;
        let [_, start, _, complete] = histograms(&arrivals, &seen, &rig.started()?)?;
        let quiet_ended = arrivals
            .iter()
            .filter(|(id, _)| seen.get(id).is_some_and(|s| s.ended.is_some()))
            .count() as u64;
        Ok::<_, anyhow::Error>((
            Phase {
                flood_tasks: flooded.load(Ordering::Relaxed),
                // Terminal changes during the quiet run, less the quiet ones.
                flood_ended_during: ended_during.saturating_sub(quiet_ended),
                quiet_submit_to_start: Percentiles::of(&start),
                quiet_submit_to_complete: Percentiles::of(&complete),
            },
            missed,
        ))
    }
    .await;
    let store = rig.store_label.clone();
    rig.stop().await;
    let (phase, missed) = result?;
    Ok((phase, missed, store))
}

/// `n` echo tasks of the flooding namespace, in batches, two calls in flight.
async fn submit_flood(
    api: &pb::task_api_client::TaskApiClient<tonic::transport::Channel>,
    n: usize,
    batch: usize,
) -> anyhow::Result<()> {
    let mut calls = tokio::task::JoinSet::new();
    let mut queued = 0;
    while queued < n || !calls.is_empty() {
        while queued < n && calls.len() < 2 {
            let k = batch.min(n - queued);
            queued += k;
            let mut api = api.clone();
            calls.spawn(async move {
                api.submit_tasks(pb::SubmitTasksRequest {
                    tasks: (0..k).map(|_| load::echo_request_in("flood")).collect(),
                })
                .await
            });
        }
        if let Some(done) = calls.join_next().await {
            done??;
        }
    }
    Ok(())
}

/// Prints the report as a table.
pub fn print(r: &FairnessReport) {
    let p = |x: &Percentiles| {
        format!(
            "{:.2} / {:.2} / {:.2} / {:.2} (n={})",
            x.p50_ms, x.p90_ms, x.p99_ms, x.max_ms, x.count
        )
    };
    println!("scenario         fairness");
    println!("store            {}", r.store);
    println!(
        "workers          {} × {} slots per namespace ({:?})",
        r.workers, r.worker_concurrency, r.workers_as
    );
    println!(
        "quiet namespace  {} tasks/s for {:.0} s",
        r.quiet_rate, r.duration_s
    );
    for (name, ph) in [("alone", &r.alone), ("flooded", &r.flooded)] {
        println!(
            "{name:<8} flood {} tasks ({} ended during the quiet run)",
            ph.flood_tasks, ph.flood_ended_during
        );
        println!(
            "{name:<8} quiet submit → start     p50/p90/p99/max ms: {}",
            p(&ph.quiet_submit_to_start)
        );
        println!(
            "{name:<8} quiet submit → complete  p50/p90/p99/max ms: {}",
            p(&ph.quiet_submit_to_complete)
        );
    }
    if r.missed_changes > 0 {
        println!("missed changes   {}", r.missed_changes);
    }
}
