//! `--scenario latency`: tasks arrive at a fixed rate below saturation;
//! how long from submit to dispatch, to start and to completion.
//!
//! Arrival `i` is due at `t0 + i / rate`. The generator wakes at each due
//! instant and sends whatever has become due as one call (`SubmitTask` for
//! one task, `SubmitTasks` for more) without waiting for earlier calls, so
//! a slow server cannot hold arrivals back (no coordinated omission). Each
//! task's latency is counted from the instant its call went out, the point
//! peers count from; how late the generator sent against the due instants
//! (tokio's timer rounds a sleep up to the next millisecond) is reported on
//! its own line, so a generator that falls behind shows. The end instants come from the store's change
//! feed (see `load`): dispatched = the claim committed and the task pushed;
//! ACK durable = the task's RUNNING committed (an ACK is held to be written
//! with the result, so for a short task this is its end); completed = the
//! result committed. Started is the handler's start as the worker saw it:
//! each worker stamps it into a file (`worker --start-stamps`), read after
//! the run — the point peers measure to.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use taskmesh::v1 as pb;

use super::Percentiles;
use super::load::{self, CpuReport, LoadArgs, Recorder, Rig, Seen, Submitted, WorkersAs};

/// Default arrival rate.
pub const DEFAULT_RATE: f64 = 1_000.0;

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    /// `latency`.
    pub scenario: &'static str,
    /// The store.
    pub store: String,
    /// Arrival rate asked for, tasks/s.
    pub rate: f64,
    /// Submitting lasted this long, in seconds.
    pub duration_s: f64,
    /// PENDING tasks (due an hour later) in the store during the run.
    pub pending: u64,
    /// CANCELLED tasks past their retention horizon written before the run.
    pub ended: u64,
    /// Whether the node ran retention.
    pub retention: bool,
    /// Of the `ended` tasks, how many retention removed from the start of
    /// the run to its end, and how long that was (s).
    pub removed_during_run: u64,
    pub removal_window_s: f64,
    /// SUCCEEDED tasks' horizon on the node, s (`--retention-succeeded`).
    pub retention_succeeded_s: Option<f64>,
    /// Ended tasks removed per state per pass (`--retention-batch`).
    pub retention_batch: u32,
    /// SQLite: every 10 s of the run, the seconds since its start, the
    /// database file's and its WAL's bytes, and the SUCCEEDED tasks kept;
    /// empty on other stores.
    pub sqlite_bytes: Vec<SizeSample>,
    /// Workers.
    pub workers: usize,
    /// Slots per worker.
    pub worker_concurrency: u32,
    /// Where the workers ran.
    pub workers_as: WorkersAs,
    /// The run's figures (their fields at this level in JSON).
    #[serde(flatten)]
    pub measured: Measured,
}

/// Runs the scenario.
pub async fn run(args: &LoadArgs) -> anyhow::Result<LatencyReport> {
    args.validate()?;
    let rate = args.rate.unwrap_or(DEFAULT_RATE);
    let tasks = (rate * args.duration.as_secs_f64()).round().max(1.0) as usize;
    anyhow::ensure!(
        tasks <= 10_000_000,
        "rate × duration must stay below 10^7 tasks"
    );
    let mut rig = Rig::start(args).await?;
    rig.stamp_starts()?;
    rig.start_workers(args).await?;
    if args.pending > 0
        && let Err(err) = fill_pending(&rig, args.pending, args.submit_batch).await
    {
        rig.stop().await;
        return Err(err);
    }
    if args.ended > 0
        && let Err(err) = fill_ended(&rig, args.ended).await
    {
        rig.stop().await;
        return Err(err);
    }
    let window = std::time::Instant::now();
    let stop_sampling = tokio_util::sync::CancellationToken::new();
    let sampler = rig.sqlite_dir.clone().map(|dir| {
        let stop = stop_sampling.clone();
        let store = rig.node.store.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(SIZE_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = stop.cancelled() => {}
                }
                let succeeded = count_in(store.as_ref(), taskmesh_core::TaskState::Succeeded).await;
                let (db, wal) = sqlite_bytes(&dir);
                samples.push(SizeSample {
                    at_s: window.elapsed().as_secs_f64(),
                    db_bytes: db,
                    wal_bytes: wal,
                    succeeded_kept: succeeded.unwrap_or(0),
                });
                if stop.is_cancelled() || samples.len() >= 10_000 {
                    return samples;
                }
            }
        })
    });
    let result = measure(&rig, tasks, rate).await;
    stop_sampling.cancel();
    let sqlite_samples = match sampler {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let left = if args.ended > 0 {
        count_state(&rig, taskmesh_core::TaskState::Cancelled).await
    } else {
        Ok(0)
    };
    let removal_window_s = window.elapsed().as_secs_f64();
    let store = rig.store_label.clone();
    rig.stop().await;
    Ok(LatencyReport {
        scenario: "latency",
        store,
        rate,
        duration_s: args.duration.as_secs_f64(),
        pending: args.pending,
        ended: args.ended,
        retention: !args.no_retention,
        removed_during_run: args.ended.saturating_sub(left?),
        removal_window_s,
        retention_succeeded_s: args.retention_succeeded.map(|d| d.as_secs_f64()),
        retention_batch: super::load::retention_batch(args),
        sqlite_bytes: sqlite_samples,
        workers: args.workers,
        worker_concurrency: args.worker_concurrency,
        workers_as: args.workers_as,
        measured: result?,
    })
}

/// How often the SQLite file's size is sampled during a run.
const SIZE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// One sample of SQLite's files during a run.
#[derive(Debug, Clone, Serialize)]
pub struct SizeSample {
    /// Seconds since the run began.
    pub at_s: f64,
    /// The database file.
    pub db_bytes: u64,
    /// Its write-ahead log.
    pub wal_bytes: u64,
    /// SUCCEEDED tasks in the store.
    pub succeeded_kept: u64,
}

/// The SQLite database in `dir` and its WAL, in bytes (0 for what is not
/// there).
fn sqlite_bytes(dir: &std::path::Path) -> (u64, u64) {
    let file = taskmesh_store::sqlite::DEFAULT_FILE_NAME;
    let size = |f: String| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len());
    (size(file.to_string()), size(format!("{file}-wal")))
}

/// One open-loop run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Tasks submitted.
    pub tasks: u64,
    /// Due instant → the call sent.
    pub generator_late: Percentiles,
    /// Submit → claimed and pushed.
    pub submit_to_dispatch: Percentiles,
    /// Submit → the handler started, as the worker saw it.
    pub submit_to_start: Percentiles,
    /// Submit → the task's RUNNING durable (the ACK written).
    pub submit_to_ack_durable: Percentiles,
    /// Submit → the result durable.
    pub submit_to_complete: Percentiles,
    /// Changes the recorder missed (tasks without a figure).
    pub missed_changes: u64,
    /// CPU over the run.
    pub cpu: CpuReport,
}

/// Sends `tasks` arrivals at `rate` to `rig` (whose workers stamp their
/// starts) and waits until they have ended; the figures of that run.
pub(super) async fn measure(rig: &Rig, tasks: usize, rate: f64) -> anyhow::Result<Measured> {
    let recorder = Recorder::start(rig.node.store.clone(), true);
    let result = async {
        let mark = rig.cpu_mark();
        let ((submitted, late), generator_cpu) =
            load::submit_while_draining(rig, &recorder, tasks as u64, move |api| async move {
                open_loop(&api, tasks, rate, "").await
            })
            .await?;
        let cpu = rig.cpu_since(&mark, generator_cpu, tasks as u64);
        Ok::<_, anyhow::Error>((submitted, late, cpu))
    }
    .await;
    let missed = recorder.missed.load(Ordering::Relaxed);
    let seen = recorder.finish().await;
    let (submitted, late, cpu) = result?;
    let [dispatch, start, ack, complete] = histograms(&submitted, &seen, &rig.started()?)?;
    Ok(Measured {
        tasks: submitted.len() as u64,
        generator_late: Percentiles::of(&late),
        submit_to_dispatch: Percentiles::of(&dispatch),
        submit_to_start: Percentiles::of(&start),
        submit_to_ack_durable: Percentiles::of(&ack),
        submit_to_complete: Percentiles::of(&complete),
        missed_changes: missed,
        cpu,
    })
}

/// Submits `pending` tasks due an hour later, in calls of `batch`.
async fn fill_pending(rig: &Rig, pending: u64, batch: usize) -> anyhow::Result<()> {
    let api = load::client(rig.node.grpc_addr).await?;
    let mut bar = load::progress(pending, "pending");
    let mut done = 0u64;
    while done < pending {
        let n = (pending - done).min(100_000) as usize;
        load::submit_all(&api, n, batch, 4, load::pending_request).await?;
        done += n as u64;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Ended tasks written through the store before the rest are copied in the
/// database ([`super::fill`]).
const ENDED_SEED: u64 = 10_000;

/// Writes `ended` CANCELLED tasks that ended 30 days ago, of a handler no
/// worker serves: the first [`ENDED_SEED`] straight into the node's store
/// (1,000 per create and per cancel), the rest copies of those made in the
/// database.
async fn fill_ended(rig: &Rig, ended: u64) -> anyhow::Result<()> {
    let store = rig.node.store.clone();
    let past = taskmesh_core::Clock::now_millis(&taskmesh_core::SystemClock) - 30 * 24 * 3_600_000;
    let mut bar = load::progress(ended, "ended");
    let mut done = 0u64;
    let seed = match rig.fill_target() {
        Some(_) => ended.min(ENDED_SEED),
        None => ended,
    };
    while done < seed {
        let n = (ended - done).min(1_000) as usize;
        let tasks = (0..n)
            // A handler no bench worker serves: never dispatched.
            .map(|_| {
                (
                    taskmesh_core::NewTask::new("bench-ended", past),
                    String::new(),
                )
            })
            .collect();
        let mut events = Vec::with_capacity(n);
        for created in store.create_tasks(tasks, past).await? {
            let cancel = taskmesh_core::Event::Cancel {
                reason: "bench: ended long ago".into(),
            };
            events.push((created?.task.id, cancel));
        }
        for r in store.transition_many(&events, past, None).await? {
            r?;
        }
        done += n as u64;
        bar.set_position(done);
    }
    if let Some(target) = rig.fill_target()
        && done < ended
    {
        super::fill::copy_tasks(&target, "bench-ended", ended - done, |copied| {
            bar.set_position(done + copied)
        })
        .await?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// How many tasks are in `state` (one count in the database, or paging
/// through the store, 1,000 a page).
async fn count_state(rig: &Rig, state: taskmesh_core::TaskState) -> anyhow::Result<u64> {
    match rig.fill_target() {
        Some(target) => super::fill::count_state(&target, state).await,
        None => count_in(rig.node.store.as_ref(), state).await,
    }
}

/// How many tasks of `store` are in `state` (listed a page at a time),
/// all in the default namespace, where the scenario puts them (a list by
/// state is indexed within a namespace).
async fn count_in(
    store: &dyn taskmesh_store::Store,
    state: taskmesh_core::TaskState,
) -> anyhow::Result<u64> {
    let mut filter = taskmesh_store::TaskFilter {
        namespace: Some(taskmesh_core::validate::DEFAULT_NAMESPACE.to_string()),
        state: Some(state),
        limit: 1_000,
        ..taskmesh_store::TaskFilter::default()
    };
    let mut n = 0u64;
    loop {
        let page = store.list_tasks(&filter).await?;
        n += page.tasks.len() as u64;
        match page.next_before_id {
            Some(id) => filter.before_id = Some(id),
            None => return Ok(n),
        }
    }
}

/// Sends `tasks` arrivals at `rate` to `namespace`; returns each id with
/// the instant its call went out, and how late each call went out against
/// its first task's due instant (µs).
pub(super) async fn open_loop(
    api: &pb::task_api_client::TaskApiClient<tonic::transport::Channel>,
    tasks: usize,
    rate: f64,
    namespace: &'static str,
) -> anyhow::Result<(Vec<Submitted>, Histogram<u64>)> {
    let mut late = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let t0 = Instant::now();
    let due_at = |i: usize| t0 + Duration::from_secs_f64(i as f64 / rate);
    let mut calls = tokio::task::JoinSet::new();
    let mut out = Vec::with_capacity(tasks);
    let mut sent = 0usize;
    while sent < tasks {
        let now = Instant::now();
        let due = ((now.duration_since(t0).as_secs_f64() * rate) as usize + 1).min(tasks);
        if due > sent {
            let first = sent;
            let n = due - first;
            sent = due;
            let mut api = api.clone();
            let sent_at = Instant::now();
            let behind = sent_at.saturating_duration_since(due_at(first));
            late.saturating_record((behind.as_micros() as u64).max(1));
            calls.spawn(async move {
                let ids: Vec<String> = if n == 1 {
                    let r = api
                        .submit_task(load::echo_request_in(namespace))
                        .await?
                        .into_inner();
                    vec![r.task_id]
                } else {
                    let req = pb::SubmitTasksRequest {
                        tasks: (0..n).map(|_| load::echo_request_in(namespace)).collect(),
                    };
                    let resp = api.submit_tasks(req).await?.into_inner();
                    resp.results
                        .into_iter()
                        .filter_map(|r| r.accepted.map(|a| a.task_id))
                        .collect()
                };
                Ok::<_, tonic::Status>((sent_at, ids))
            });
        }
        while let Some(done) = calls.try_join_next() {
            let (sent_at, ids) = done??;
            out.extend(ids.into_iter().map(|id| (id, sent_at)));
        }
        // Wake at the next arrival (timer granularity is about 1 ms, so
        // several arrivals may go together at high rates).
        tokio::time::sleep_until(due_at(sent).into()).await;
    }
    while let Some(done) = calls.join_next().await {
        let (sent_at, ids) = done??;
        out.extend(ids.into_iter().map(|id| (id, sent_at)));
    }
    Ok((out, late))
}

/// Per task, from the instant its call went out: to dispatch, to the handler's start as
/// its worker stamped it, to its ACK durable, to its end durable.
pub(super) fn histograms(
    submitted: &[Submitted],
    seen: &HashMap<String, Seen>,
    started: &HashMap<String, Instant>,
) -> anyhow::Result<[Histogram<u64>; 4]> {
    let new = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3);
    let mut h = [new()?, new()?, new()?, new()?];
    let us =
        |from: Instant, to: Instant| (to.saturating_duration_since(from).as_micros() as u64).max(1);
    for (id, at) in submitted {
        let s = seen.get(id).copied().unwrap_or_default();
        let start = started.get(id).copied();
        for (hist, end) in h.iter_mut().zip([s.dispatched, start, s.running, s.ended]) {
            if let Some(end) = end {
                hist.saturating_record(us(*at, end));
            }
        }
    }
    Ok(h)
}

/// Prints the report as a table.
pub fn print(r: &LatencyReport) {
    let p = |x: &Percentiles| {
        format!(
            "{:.2} / {:.2} / {:.2} / {:.2} (n={})",
            x.p50_ms, x.p90_ms, x.p99_ms, x.max_ms, x.count
        )
    };
    let mut rows = vec![
        ("store".to_string(), r.store.clone()),
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
        (
            "arrivals".into(),
            format!(
                "{:.0}/s for {:.1} s = {} tasks",
                r.rate, r.duration_s, r.measured.tasks
            ),
        ),
        (
            "PENDING tasks (due in an hour)".into(),
            r.pending.to_string(),
        ),
        (
            "ended tasks past their horizon / retention".into(),
            if r.retention {
                format!("{} / on, {} per batch", r.ended, r.retention_batch)
            } else {
                format!("{} / off", r.ended)
            },
        ),
        (
            "removed by retention during the run".into(),
            format!(
                "{} in {:.1} s ({:.0}/s)",
                r.removed_during_run,
                r.removal_window_s,
                r.removed_during_run as f64 / r.removal_window_s.max(1e-9)
            ),
        ),
        (
            "SUCCEEDED tasks kept".into(),
            match r.retention_succeeded_s {
                Some(s) => format!("{s:.0} s after they ended"),
                None => "the default (24 h)".into(),
            },
        ),
        (
            "SQLite every 10 s: db MB + WAL MB (SUCCEEDED kept, k)".into(),
            if r.sqlite_bytes.is_empty() {
                "-".into()
            } else {
                r.sqlite_bytes
                    .iter()
                    .map(|s| {
                        format!(
                            "{:.0}+{:.0} ({:.0})",
                            s.db_bytes as f64 / 1e6,
                            s.wal_bytes as f64 / 1e6,
                            s.succeeded_kept as f64 / 1e3
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
        (
            "generator late (due → sent) p50/p90/p99/max ms".into(),
            p(&r.measured.generator_late),
        ),
        (
            "submit → dispatch p50/p90/p99/max ms".into(),
            p(&r.measured.submit_to_dispatch),
        ),
        (
            "submit → start p50/p90/p99/max ms".into(),
            p(&r.measured.submit_to_start),
        ),
        (
            "submit → ACK durable p50/p90/p99/max ms".into(),
            p(&r.measured.submit_to_ack_durable),
        ),
        (
            "submit → complete p50/p90/p99/max ms".into(),
            p(&r.measured.submit_to_complete),
        ),
        (
            "changes missed by the recorder".into(),
            r.measured.missed_changes.to_string(),
        ),
    ];
    rows.extend(load::cpu_rows(&r.measured.cpu));
    load::print_rows("scenario: latency", &rows);
}
