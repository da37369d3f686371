//! `--scenario cron`: fire lateness. Many schedules fire on an in-process
//! node (SQLite in a temporary directory, an in-process worker running
//! `echo`), once per trigger engine: all every second at the same instants
//! (`--cadence every-second`, the burst), or spread over cadences from every
//! second to hourly at staggered instants (`--cadence mixed`, a large fleet
//! of schedules loaded, most of them idle at any moment). For every fire in
//! the measured window it measures handled − scheduled (the scheduler's own
//! lateness), claimed − scheduled (the instant the store's claim of the
//! task was stamped, before that claim's commit) and started − scheduled
//! (the handler's start as the bench's own in-process worker saw it, the
//! point peers measure to), and counts early fires (which must be zero);
//! with the node in this process, it reports the process's memory before
//! and after the schedules are loaded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde::Serialize;
use taskmesh::v1 as pb;
use taskmesh_core::{Clock, SystemClock};
use taskmesh_scheduler::EngineKind;
use taskmesh_store::TaskFilter;

use super::Percentiles;
use crate::node::{self, NodeOptions};

/// How often the scenario's schedules fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cadence {
    /// Every schedule every second, all at the same instants.
    EverySecond,
    /// One in 1,000 every second, one in 100 every 10 s, one in 10 every
    /// minute, the rest every 5 minutes or hourly; each at a second (and
    /// minute) of its own, so ~0.5 % of the schedules fire per second.
    Mixed,
}

impl Cadence {
    /// The cron expression (6 fields, seconds first) of schedule `i`: within
    /// each cadence, consecutive schedules take consecutive seconds (and
    /// minutes), so no second carries more than its share.
    fn expression(self, i: u32) -> String {
        match self {
            Cadence::EverySecond => "* * * * * *".into(),
            Cadence::Mixed if i.is_multiple_of(1_000) => "* * * * * *".into(),
            Cadence::Mixed if i.is_multiple_of(100) => {
                format!("{}-59/10 * * * * *", (i / 100) % 10)
            }
            Cadence::Mixed if i.is_multiple_of(10) => format!("{} * * * * *", (i / 10) % 60),
            Cadence::Mixed if i.is_multiple_of(2) => {
                format!("{} {}-59/5 * * * *", (i / 2) % 60, (i / 120) % 5)
            }
            Cadence::Mixed => format!("{} {} * * * *", (i / 2) % 60, (i / 120) % 60),
        }
    }
}

/// Flags of the cron scenario.
#[derive(Debug, Args)]
pub struct CronArgs {
    /// Schedules (every-second: all firing at the same instants).
    #[arg(long, default_value_t = 100)]
    schedules: u32,
    /// How often they fire.
    #[arg(long, value_enum, default_value_t = Cadence::EverySecond)]
    cadence: Cadence,
    /// How long the fires are measured, in seconds, from when every
    /// schedule exists (every-second: fires = schedules × seconds).
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
    /// Seconds it took to create the schedules (through the API).
    pub load_s: f64,
    /// This process's resident memory (the node, its worker and the
    /// bench client), MiB: before the schedules were created, and at the
    /// end of the window.
    pub rss_before_mib: f64,
    /// See `rss_before_mib`.
    pub rss_after_mib: f64,
    /// Scheduled → handled by the scheduler.
    pub handled: Percentiles,
    /// Scheduled → the store's claim for a worker (the attempt's start,
    /// stamped before the claim's commit).
    pub dispatched: Percentiles,
    /// Scheduled → the handler's start, as the worker saw it.
    pub started: Percentiles,
}

/// The scenario's report.
#[derive(Debug, Serialize)]
pub struct CronReport {
    /// Schedules.
    pub schedules: u32,
    /// Their cadence.
    pub cadence: Cadence,
    /// Seconds of firing measured (after every schedule exists).
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
        cadence: args.cadence,
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
    // A benchmark measures the machine, not the per-namespace quotas
    // (10,000 schedules, one second between fires).
    opts.dispatcher.quotas = taskmesh_dispatcher::quota::QuotaOptions::unlimited();
    let node = node::start(opts).await?;
    let starts = Starts::default();
    let worker_stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(starts.clone().worker(node.grpc_addr, worker_stop.clone()));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr))?
        .connect()
        .await?;
    let api = pb::task_api_client::TaskApiClient::new(channel);
    let rss_before = super::fleet::rss_kib(None)?;
    let loading = std::time::Instant::now();
    let mut bar = super::load::progress(u64::from(args.schedules), "schedules created");
    let mut created = 0u64;
    let ids: Vec<String> = futures::stream::iter(0..args.schedules)
        .map(|i| {
            let mut api = api.clone();
            let cron_expression = args.cadence.expression(i);
            async move {
                let s = api
                    .create_schedule(pb::CreateScheduleRequest {
                        schedule: Some(pb::Schedule {
                            name: format!("bench-{i}"),
                            kind: pb::ScheduleKind::Cron as i32,
                            cron_expression,
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
                anyhow::Ok(s.schedule.map(|s| s.schedule_id).unwrap_or_default())
            }
        })
        // Creates in flight at once: the store's writer takes them one at
        // a time; more in flight keep it busy between commits.
        .buffer_unordered(64)
        .inspect_ok(|_| {
            created += 1;
            bar.set_position(created);
        })
        .try_collect()
        .await?;
    bar.finish_and_clear();
    let load_s = loading.elapsed().as_secs_f64();
    // The window starts once every schedule exists: fires while they were
    // being created met the creates' writes, which is not what is measured.
    let from = SystemClock.now_millis();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let until = SystemClock.now_millis();
    let rss_after = super::fleet::rss_kib(None)?;
    futures::stream::iter(&ids)
        .map(|id| {
            let mut api = api.clone();
            async move {
                api.pause_schedule(pb::PauseScheduleRequest {
                    schedule_id: id.clone(),
                    ..Default::default()
                })
                .await
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await?;

    // Collect: every fire's handled time, and its task's dispatch time.
    let mut handled = Histogram::<u64>::new(3)?;
    let mut dispatched = Histogram::<u64>::new(3)?;
    let mut started = Histogram::<u64>::new(3)?;
    let mut early = 0u64;
    let mut fires = 0u64;
    let store = node.store.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for id in &ids {
        for f in store.recent_fires(id, 1_000).await? {
            if f.fire_at < from || f.fire_at >= until {
                continue;
            }
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
            // The worker stamps the start before it answers; bounded.
            let start_us = loop {
                if let Some(us) = starts.of(&task_id) {
                    break us;
                }
                if tokio::time::Instant::now() > deadline {
                    anyhow::bail!("task {task_id} was never started by the worker");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let start_late = start_us - f.fire_at * 1_000;
            if start_late < 0 {
                early += 1;
            }
            started.record(start_late.max(0) as u64)?;
        }
    }
    let _ = store
        .list_tasks(&TaskFilter {
            limit: 1,
            ..Default::default()
        })
        .await?;
    worker_stop.cancel();
    worker
        .await?
        .map_err(|e| anyhow::anyhow!("the bench's worker failed: {e}"))?;
    node.stop(Duration::from_secs(5)).await;
    Ok(EngineReport {
        engine: kind.as_str().to_string(),
        fires,
        early_fires: early,
        load_s,
        rss_before_mib: rss_before as f64 / 1024.0,
        rss_after_mib: rss_after as f64 / 1024.0,
        handled: Percentiles::of(&handled),
        dispatched: Percentiles::of(&dispatched),
        started: Percentiles::of(&started),
    })
}

/// When the bench's worker started each task's handler (task id → Unix
/// microseconds).
#[derive(Clone, Default)]
struct Starts(Arc<Mutex<HashMap<String, i64>>>);

impl Starts {
    fn of(&self, task_id: &str) -> Option<i64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(task_id)
            .copied()
    }

    /// A worker on `grpc_addr` running `echo`, stamping each start, with
    /// room for every fire of an instant at once (~500 of 100,000 mixed
    /// schedules): a fire waiting for a free slot would measure the worker.
    async fn worker(
        self,
        grpc_addr: std::net::SocketAddr,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), taskmesh_worker::Error> {
        let mut opts = taskmesh_worker::WorkerOptions::new(vec![format!("http://{grpc_addr}")]);
        opts.concurrency = 4_096;
        opts.name = "bench-cron".into();
        let mut worker = taskmesh_worker::Worker::new(opts);
        worker.add_handler("echo", Arc::new(self));
        worker.run(stop).await
    }
}

#[async_trait::async_trait]
impl taskmesh_worker::Handler for Starts {
    async fn run(
        &self,
        ctx: taskmesh_worker::TaskContext,
    ) -> Result<taskmesh_worker::Output, taskmesh_worker::HandlerError> {
        let now = crate::ledger::unix_micros() as i64;
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ctx.task_id.clone(), now);
        Ok(taskmesh_worker::Output::default())
    }
}

/// Prints the report as a table.
pub fn print(r: &CronReport) {
    let cadence = match r.cadence {
        Cadence::EverySecond => "firing every second at the same instants",
        Cadence::Mixed => "of mixed cadence (every second to hourly, staggered)",
    };
    println!(
        "cron fire lateness: {} schedules {cadence}, {} s measured (ms after the scheduled instant)",
        r.schedules, r.seconds
    );
    println!(
        "{:<7} {:>6} {:>6}  {:>9} {:>9} {:>9}  {:>9} {:>9}  {:>9} {:>9} {:>9}  {:>7} {:>9} {:>9}",
        "engine",
        "fires",
        "early",
        "hand p50",
        "hand p99",
        "hand max",
        "claim p50",
        "claim p99",
        "start p50",
        "start p99",
        "start max",
        "load s",
        "RSS0 MiB",
        "RSS1 MiB"
    );
    for e in &r.engines {
        println!(
            "{:<7} {:>6} {:>6}  {:>9.1} {:>9.1} {:>9.1}  {:>9.1} {:>9.1}  {:>9.2} {:>9.2} {:>9.2}  {:>7.1} {:>9.1} {:>9.1}",
            e.engine,
            e.fires,
            e.early_fires,
            e.handled.p50_ms,
            e.handled.p99_ms,
            e.handled.max_ms,
            e.dispatched.p50_ms,
            e.dispatched.p99_ms,
            e.started.p50_ms,
            e.started.p99_ms,
            e.started.max_ms,
            e.load_s,
            e.rss_before_mib,
            e.rss_after_mib
        );
    }
    println!(
        "(claim: the store's claim for a worker, stamped in whole ms before its commit; \
         start: the handler's start as the worker saw it; \
         RSS0: this process before the schedules were created; RSS1: at the window's end)"
    );
}

fn rand_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(nanos % 1_000_000) / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_cadence_expressions_parse_and_spread_over_cadences() {
        let mut every_second = 0;
        for i in 0..10_000 {
            let expr = Cadence::Mixed.expression(i);
            taskmesh_core::timetable::parse_cron(&expr)
                .unwrap_or_else(|e| panic!("schedule {i}: {expr:?}: {e}"));
            if expr == "* * * * * *" {
                every_second += 1;
            }
        }
        assert_eq!(every_second, 10, "one in 1,000 fires every second");
        assert_eq!(Cadence::Mixed.expression(10_100), "1-59/10 * * * * *");
        assert_eq!(Cadence::Mixed.expression(70), "7 * * * * *");
        assert_eq!(Cadence::Mixed.expression(62), "31 0-59/5 * * * *");
        assert_eq!(Cadence::Mixed.expression(3_661), "30 30 * * * *");
        // Fires per second over the first hour: none carries much more than
        // its share (the every-10-s and every-minute ones once all fell on
        // the same six seconds: 267 fires at one instant for 10,000).
        let mut per_second = vec![0u32; 3_600];
        for i in 0..10_000 {
            let cron = taskmesh_core::timetable::cached_cron(&Cadence::Mixed.expression(i));
            let tt = taskmesh_core::timetable::Timetable::Cron {
                cron: cron.unwrap(),
                tz: taskmesh_core::timetable::parse_zone("UTC").unwrap(),
            };
            let mut at = -1;
            while let Some(next) = tt.next_after(at).filter(|&t| t < 3_600_000) {
                per_second[(next / 1_000) as usize] += 1;
                at = next;
            }
        }
        let total: u32 = per_second.iter().sum();
        let most = *per_second.iter().max().unwrap();
        assert!(
            most <= 3 * total / 3_600,
            "{most} fires in one second, {} on average",
            total / 3_600
        );
        assert_eq!(Cadence::EverySecond.expression(3_661), "* * * * * *");
    }
}
