//! `--scenario cron`: fire lateness. Many schedules fire every second on an
//! in-process node (SQLite in a temporary directory, an in-process worker
//! running `echo`), once per trigger engine. For every fire it measures
//! handled − scheduled (the scheduler's own lateness) and dispatched −
//! scheduled (until the task is pushed to a worker), and counts early fires
//! (which must be zero).

use std::time::Duration;

use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use taskmesh::v1 as pb;
use taskmesh_scheduler::EngineKind;
use taskmesh_store::TaskFilter;

use super::Percentiles;
use crate::node::{self, NodeOptions};

/// Flags of the cron scenario.
#[derive(Debug, Args)]
pub struct CronArgs {
    /// Schedules firing every second, at the same instants.
    #[arg(long, default_value_t = 100)]
    schedules: u32,
    /// How long they fire, in seconds (fires = schedules × seconds).
    #[arg(long, default_value_t = 12)]
    seconds: u64,
    /// Engines to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "wheel,poll")]
    engines: Vec<String>,
    /// Interval of the polling engine.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
}

/// What one engine did.
#[derive(Debug, Serialize)]
pub struct EngineReport {
    /// The engine.
    pub engine: String,
    /// Fires handled (tasks created).
    pub fires: u64,
    /// Fires handled before their instant (must be 0).
    pub early_fires: u64,
    /// Scheduled → handled by the scheduler.
    pub handled: Percentiles,
    /// Scheduled → pushed to a worker.
    pub dispatched: Percentiles,
}

/// The scenario's report.
#[derive(Debug, Serialize)]
pub struct CronReport {
    /// Schedules.
    pub schedules: u32,
    /// Seconds of firing.
    pub seconds: u64,
    /// One entry per engine.
    pub engines: Vec<EngineReport>,
}

/// Runs the scenario.
pub async fn run(args: &CronArgs) -> anyhow::Result<CronReport> {
    let mut engines = Vec::new();
    for name in &args.engines {
        let kind =
            EngineKind::parse(name).ok_or_else(|| anyhow::anyhow!("unknown engine {name:?}"))?;
        engines.push(run_engine(args, kind).await?);
    }
    Ok(CronReport {
        schedules: args.schedules,
        seconds: args.seconds,
        engines,
    })
}

async fn run_engine(args: &CronArgs, kind: EngineKind) -> anyhow::Result<EngineReport> {
    if kind == EngineKind::Poll {
        // A polling engine's lateness depends on where its ticks fall
        // within the second; start at a random phase rather than at
        // whatever phase the previous run left.
        let phase = args.poll_interval.mul_f64(rand_fraction());
        tokio::time::sleep(phase).await;
    }
    let dir = tempfile::tempdir()?;
    let mut opts = NodeOptions::new();
    opts.data_dir = dir.path().to_path_buf();
    opts.grpc_addr = ([127, 0, 0, 1], 0).into();
    opts.http_addr = ([127, 0, 0, 1], 0).into();
    opts.scheduler.engine = kind;
    opts.scheduler.poll_interval = args.poll_interval;
    opts.with_worker = Some(256);
    let node = node::start(opts).await?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr))?
        .connect()
        .await?;
    let mut api = pb::task_api_client::TaskApiClient::new(channel);
    let mut ids = Vec::new();
    for i in 0..args.schedules {
        let s = api
            .create_schedule(pb::CreateScheduleRequest {
                schedule: Some(pb::Schedule {
                    name: format!("bench-{i}"),
                    kind: pb::ScheduleKind::Cron as i32,
                    cron_expression: "* * * * * *".into(),
                    template: Some(pb::TaskTemplate {
                        handler: "echo".into(),
                        ..Default::default()
                    }),
                    misfire_policy: pb::MisfirePolicy::Skip as i32,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        ids.push(s.schedule.map(|s| s.schedule_id).unwrap_or_default());
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    for id in &ids {
        api.pause_schedule(pb::PauseScheduleRequest {
            schedule_id: id.clone(),
            ..Default::default()
        })
        .await?;
    }

    // Collect: every fire's handled time, and its task's dispatch time.
    let mut handled = Histogram::<u64>::new(3)?;
    let mut dispatched = Histogram::<u64>::new(3)?;
    let mut early = 0u64;
    let mut fires = 0u64;
    let store = node.store.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for id in &ids {
        for f in store.recent_fires(id, 1_000).await? {
            let Some(task_id) = f.task_id else { continue };
            fires += 1;
            let late = f.handled_at - f.fire_at;
            if late < 0 {
                early += 1;
            }
            handled.record((late.max(0) as u64) * 1_000)?;
            // Wait for the task to be pushed (the worker is fast; bounded).
            let task = loop {
                let t = store.get_task(&task_id).await?;
                match t {
                    Some(t) if t.times.dispatching.is_some() => break t,
                    _ if tokio::time::Instant::now() > deadline => {
                        anyhow::bail!("task {task_id} was never dispatched")
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            let first_push = task
                .attempts
                .first()
                .map(|a| a.started_at)
                .unwrap_or(f.fire_at);
            let push_late = first_push - f.fire_at;
            if push_late < 0 {
                early += 1;
            }
            dispatched.record((push_late.max(0) as u64) * 1_000)?;
        }
    }
    let _ = store
        .list_tasks(&TaskFilter {
            limit: 1,
            ..Default::default()
        })
        .await?;
    node.stop(Duration::from_secs(5)).await;
    Ok(EngineReport {
        engine: kind.as_str().to_string(),
        fires,
        early_fires: early,
        handled: Percentiles::of(&handled),
        dispatched: Percentiles::of(&dispatched),
    })
}

/// Prints the report as a table.
pub fn print(r: &CronReport) {
    println!(
        "cron fire lateness: {} schedules firing every second for {} s (ms after the scheduled instant)",
        r.schedules, r.seconds
    );
    println!(
        "{:<7} {:>6} {:>6}  {:>9} {:>9} {:>9}  {:>9} {:>9} {:>9}",
        "engine",
        "fires",
        "early",
        "hand p50",
        "hand p99",
        "hand max",
        "disp p50",
        "disp p99",
        "disp max"
    );
    for e in &r.engines {
        println!(
            "{:<7} {:>6} {:>6}  {:>9.1} {:>9.1} {:>9.1}  {:>9.1} {:>9.1} {:>9.1}",
            e.engine,
            e.fires,
            e.early_fires,
            e.handled.p50_ms,
            e.handled.p99_ms,
            e.handled.max_ms,
            e.dispatched.p50_ms,
            e.dispatched.p99_ms,
            e.dispatched.max_ms
        );
    }
}

fn rand_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(nanos % 1_000_000) / 1_000_000.0
}
