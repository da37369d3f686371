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
    /// `--retention-windows`: how long each window was (s), each
    /// window's figures, and the windows side by side.
    pub retention_window_s: Option<f64>,
    pub windows: Vec<Window>,
    pub windows_summary: Option<WindowsSummary>,
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
    // Counting the SUCCEEDED tasks reads an index that grows by every
    // task of the run (a pause on the live path every 10 s): only when
    // retention of SUCCEEDED tasks is what the run shows.
    let count_kept = args.retention_succeeded.is_some();
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
                let succeeded = if count_kept {
                    count_in(store.as_ref(), taskmesh_core::TaskState::Succeeded)
                        .await
                        .ok()
                } else {
                    None
                };
                let (db, wal) = sqlite_bytes(&dir);
                samples.push(SizeSample {
                    at_s: window.elapsed().as_secs_f64(),
                    db_bytes: db,
                    wal_bytes: wal,
                    succeeded_kept: succeeded,
                });
                if stop.is_cancelled() || samples.len() >= 10_000 {
                    return samples;
                }
            }
        })
    });
    let result = measure_with(&rig, tasks, rate, args.retention_windows).await;
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
        retention_batch: args.retention_batch,
        retention_window_s: args.retention_windows.map(|w| w.as_secs_f64()),
        windows_summary: match (&result, args.retention_windows) {
            (Ok((_, windows)), Some(w)) => WindowsSummary::of(windows, w),
            _ => None,
        },
        windows: result.as_ref().map(|(_, w)| w.clone()).unwrap_or_default(),
        sqlite_bytes: sqlite_samples,
        workers: args.workers,
        worker_concurrency: args.worker_concurrency,
        workers_as: args.workers_as,
        measured: result?.0,
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
    /// SUCCEEDED tasks in the store (only with `--retention-succeeded`:
    /// counting them costs the live path).
    pub succeeded_kept: Option<u64>,
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
    /// The tasks whose handler started last after their submit, worst
    /// first: where in the run a stall fell.
    pub slowest_starts: Vec<Slow>,
    /// CPU over the run.
    pub cpu: CpuReport,
}

/// One of a run's slowest tasks (submit → start).
#[derive(Debug, Clone, Serialize)]
pub struct Slow {
    /// Seconds from the first arrival to its submit.
    pub at_s: f64,
    /// Submit → dispatched, and → the handler's start (ms).
    pub dispatch_ms: Option<f64>,
    pub start_ms: f64,
}

/// How many of the slowest tasks a report names.
const SLOWEST: usize = 10;

/// The [`SLOWEST`] tasks of `submitted` by submit → start, worst first.
fn slowest(
    submitted: &[Submitted],
    seen: &HashMap<String, Seen>,
    started: &HashMap<String, Instant>,
    origin: Instant,
) -> Vec<Slow> {
    let ms = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1e3;
    let mut all: Vec<Slow> = submitted
        .iter()
        .filter_map(|(id, at)| {
            let start = started.get(id)?;
            Some(Slow {
                at_s: at.saturating_duration_since(origin).as_secs_f64(),
                dispatch_ms: seen.get(id).and_then(|s| s.dispatched).map(|d| ms(*at, d)),
                start_ms: ms(*at, *start),
            })
        })
        .collect();
    all.sort_unstable_by(|a, b| b.start_ms.total_cmp(&a.start_ms));
    all.truncate(SLOWEST);
    all
}

/// Sends `tasks` arrivals at `rate` to `rig` (whose workers stamp their
/// starts) and waits until they have ended; the figures of that run.
pub(super) async fn measure(rig: &Rig, tasks: usize, rate: f64) -> anyhow::Result<Measured> {
    Ok(measure_with(rig, tasks, rate, None).await?.0)
}

/// [`measure`], with retention paused and resumed in turns of `windows`
/// (off first) from the first arrival; the figures of each window by the
/// instant its tasks were submitted.
async fn measure_with(
    rig: &Rig,
    tasks: usize,
    rate: f64,
    windows: Option<Duration>,
) -> anyhow::Result<(Measured, Vec<Window>)> {
    let recorder = Recorder::start(rig.node.store.clone(), true);
    let origin = Instant::now();
    let stop_turns = tokio_util::sync::CancellationToken::new();
    let turns = windows.map(|w| {
        let control = rig.retention.clone();
        let stop = stop_turns.clone();
        let workers = rig.worker_pids();
        tokio::spawn(async move {
            // What the switch had counted, and whether on, at each
            // window's start.
            let mut starts = Vec::new();
            loop {
                let on = starts.len() % 2 == 1;
                control.set_paused(!on);
                starts.push(Turn::read(&control, on, &workers));
                let next = origin + w * starts.len() as u32;
                tokio::select! {
                    () = tokio::time::sleep_until(next.into()) => {}
                    () = stop.cancelled() => break,
                }
            }
            control.set_paused(true);
            starts.push(Turn::read(&control, false, &workers));
            starts
        })
    });
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
    stop_turns.cancel();
    let turns = match turns {
        Some(t) => t.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let missed = recorder.missed.load(Ordering::Relaxed);
    let seen = recorder.finish().await;
    let (submitted, late, cpu) = result?;
    let started = rig.started()?;
    let [dispatch, start, ack, complete] = histograms(&submitted, &seen, &started)?;
    let windows = match windows {
        Some(w) => split_windows(&submitted, &seen, &started, origin, w, &turns)?,
        None => Vec::new(),
    };
    let measured = Measured {
        tasks: submitted.len() as u64,
        generator_late: Percentiles::of(&late),
        submit_to_dispatch: Percentiles::of(&dispatch),
        submit_to_start: Percentiles::of(&start),
        submit_to_ack_durable: Percentiles::of(&ack),
        submit_to_complete: Percentiles::of(&complete),
        missed_changes: missed,
        slowest_starts: slowest(&submitted, &seen, &started, origin),
        cpu,
    };
    Ok((measured, windows))
}

/// One window of a `--retention-windows` run.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Seconds from the first arrival to the window's start.
    pub from_s: f64,
    /// Whether retention ran through it.
    pub retention: bool,
    /// Rows retention removed in it.
    pub removed: u64,
    /// Retention passes in it, and how long one took on average (ms).
    pub passes: u64,
    pub pass_ms_mean: f64,
    /// Cores busy through it: the node's process (with the load
    /// generator, which runs in it) and the worker processes.
    pub node_cores: f64,
    pub workers_cores: f64,
    /// On SQLite: write transactions a second, and the share of the
    /// window a transaction held the writer (0 on a server's store).
    pub writer_tx_per_s: f64,
    pub writer_busy: f64,
    /// On SQLite: syncs of the WAL a second (each covers every commit
    /// written before it began; 0 on a server's store).
    pub wal_syncs_per_s: f64,
    /// Submit → start of the tasks submitted in it.
    pub submit_to_start: Percentiles,
    /// Submit → ACK durable of those tasks.
    pub submit_to_ack_durable: Percentiles,
}

/// What the retention switch had counted at a window's start.
#[derive(Debug, Clone, Copy)]
struct Turn {
    on: bool,
    removed: u64,
    passes: u64,
    pass_micros: u64,
    /// When, and the CPU the node's process and the workers had used.
    at: Instant,
    node_cpu: Duration,
    workers_cpu: Duration,
    /// The SQLite writers' transactions and their time held.
    writer: (u64, Duration),
    /// The SQLite writers' syncs of their WAL.
    syncs: u64,
}

impl Turn {
    fn read(
        control: &taskmesh_scheduler::retention::RetentionControl,
        on: bool,
        workers: &[u32],
    ) -> Self {
        let (passes, pass_micros) = control.passes();
        Self {
            on,
            removed: control.removed(),
            passes,
            pass_micros,
            at: Instant::now(),
            node_cpu: super::cpu::process(),
            workers_cpu: workers.iter().filter_map(|p| super::cpu::of_pid(*p)).sum(),
            writer: taskmesh_store::sqlite::writer_held(),
            syncs: taskmesh_store::sqlite::wal_syncs().0,
        }
    }

    /// The writer's transactions a second, busy share, and syncs of the
    /// WAL a second from `self` to `to`.
    fn writer_to(&self, to: &Self) -> (f64, f64, f64) {
        let wall = to
            .at
            .saturating_duration_since(self.at)
            .as_secs_f64()
            .max(1e-9);
        (
            to.writer.0.saturating_sub(self.writer.0) as f64 / wall,
            to.writer.1.saturating_sub(self.writer.1).as_secs_f64() / wall,
            to.syncs.saturating_sub(self.syncs) as f64 / wall,
        )
    }

    /// Cores busy from `self` to `to`: the node's, the workers'.
    fn cores_to(&self, to: &Self) -> (f64, f64) {
        let wall = to
            .at
            .saturating_duration_since(self.at)
            .as_secs_f64()
            .max(1e-9);
        let busy = |a: Duration, b: Duration| b.saturating_sub(a).as_secs_f64() / wall;
        (
            busy(self.node_cpu, to.node_cpu),
            busy(self.workers_cpu, to.workers_cpu),
        )
    }
}

/// The submit → start and → ACK durable figures of each window of `w`
/// from `origin`, by the instant each task was submitted; `turns` is what
/// the switch recorded at each window's start (and once at the end).
fn split_windows(
    submitted: &[Submitted],
    seen: &HashMap<String, Seen>,
    started: &HashMap<String, Instant>,
    origin: Instant,
    w: Duration,
    turns: &[Turn],
) -> anyhow::Result<Vec<Window>> {
    // Each window's tasks, then the same histograms as the whole run's.
    let mut by_window = vec![Vec::new(); turns.len().saturating_sub(1)];
    for (id, at) in submitted {
        let k = (at.saturating_duration_since(origin).as_secs_f64() / w.as_secs_f64()) as usize;
        if let Some(tasks) = by_window.get_mut(k) {
            tasks.push((id.clone(), *at));
        }
    }
    let h = by_window
        .iter()
        .map(|tasks| histograms(tasks, seen, started).map(|[_, start, ack, _]| [start, ack]))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(h.iter()
        .enumerate()
        .filter(|(_, [start, _])| !start.is_empty())
        .map(|(k, [start, ack])| {
            let (from, to) = (&turns[k], &turns[k + 1]);
            let passes = to.passes.saturating_sub(from.passes);
            let micros = to.pass_micros.saturating_sub(from.pass_micros);
            let (node_cores, workers_cores) = from.cores_to(to);
            let (writer_tx_per_s, writer_busy, wal_syncs_per_s) = from.writer_to(to);
            Window {
                from_s: (w * k as u32).as_secs_f64(),
                retention: from.on,
                removed: to.removed.saturating_sub(from.removed),
                passes,
                pass_ms_mean: micros as f64 / 1_000.0 / passes.max(1) as f64,
                node_cores,
                workers_cores,
                writer_tx_per_s,
                writer_busy,
                wal_syncs_per_s,
                submit_to_start: Percentiles::of(start),
                submit_to_ack_durable: Percentiles::of(ack),
            }
        })
        .collect())
}

/// The windows' figures side by side: all tasks of the windows without
/// retention, all of those with it, and each pair's p99 (off, then on).
#[derive(Debug, Clone, Serialize)]
pub struct WindowsSummary {
    /// Each window's p99 start, off then on, as pairs: the change in %.
    pub pair_p99_change_pct: Vec<f64>,
    /// Their median.
    pub median_pair_p99_change_pct: f64,
    /// Each window with retention against the mean of the windows without
    /// it on either side (whole windows only): a p99 that drifts through
    /// the run (the store grows) then weighs on neither side, where the
    /// pairs above, off always first, count a rise as removal's. And their
    /// median (NaN when no window with retention has both neighbours).
    pub bracket_p99_change_pct: Vec<f64>,
    pub median_bracket_p99_change_pct: f64,
    /// The median p99 of the windows without and with retention.
    pub median_p99_off_ms: f64,
    pub median_p99_on_ms: f64,
    /// Rows removed per second of the windows with retention.
    pub removed_per_s_on: f64,
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
                        let kept = s
                            .succeeded_kept
                            .map_or_else(|| "-".into(), |k| format!("{:.0}", k as f64 / 1e3));
                        format!(
                            "{:.0}+{:.0} ({kept})",
                            s.db_bytes as f64 / 1e6,
                            s.wal_bytes as f64 / 1e6,
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
        (
            "slowest starts: at s (dispatch ms / start ms)".into(),
            r.measured
                .slowest_starts
                .iter()
                .map(|s| {
                    let d = s
                        .dispatch_ms
                        .map_or_else(|| "-".into(), |d| format!("{d:.0}"));
                    format!("{:.1} ({d} / {:.0})", s.at_s, s.start_ms)
                })
                .collect::<Vec<_>>()
                .join(", "),
        ),
    ];
    for (k, w) in r.windows.iter().enumerate() {
        rows.push((
            format!(
                "window {k} from {:.0} s, retention {}: start p50/p99 ms, ACK p99, removed, passes (mean ms), cores node + workers, writer tx/s (busy %), WAL syncs/s",
                w.from_s,
                if w.retention { "on" } else { "off" }
            ),
            format!(
                "{:.2} / {:.2}, {:.2}, {}, {} ({:.1}), {:.2} + {:.2}, {:.0} ({:.1} %), {:.0}",
                w.submit_to_start.p50_ms,
                w.submit_to_start.p99_ms,
                w.submit_to_ack_durable.p99_ms,
                w.removed,
                w.passes,
                w.pass_ms_mean,
                w.node_cores,
                w.workers_cores,
                w.writer_tx_per_s,
                w.writer_busy * 100.0,
                w.wal_syncs_per_s
            ),
        ));
    }
    if let Some(s) = &r.windows_summary {
        rows.push((
            "windows: median p99 start off / on ms; pairs' p99 change".into(),
            format!(
                "{:.2} / {:.2}; median {:+.1} % ({}); removed {:.0}/s while on",
                s.median_p99_off_ms,
                s.median_p99_on_ms,
                s.median_pair_p99_change_pct,
                s.pair_p99_change_pct
                    .iter()
                    .map(|c| format!("{c:+.1} %"))
                    .collect::<Vec<_>>()
                    .join(", "),
                s.removed_per_s_on
            ),
        ));
        rows.push((
            "windows: p99 start on against the mean of the off windows either side".into(),
            format!(
                "median {:+.1} % ({})",
                s.median_bracket_p99_change_pct,
                s.bracket_p99_change_pct
                    .iter()
                    .map(|c| format!("{c:+.1} %"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    rows.extend(load::cpu_rows(&r.measured.cpu));
    load::print_rows("scenario: latency", &rows);
}

impl WindowsSummary {
    /// Of `windows` (off and on in turns, off first), each `w` long.
    pub fn of(windows: &[Window], w: Duration) -> Option<Self> {
        let median = |mut v: Vec<f64>| -> f64 {
            if v.is_empty() {
                return f64::NAN;
            }
            v.sort_by(f64::total_cmp);
            let m = v.len() / 2;
            if v.len() % 2 == 1 {
                v[m]
            } else {
                (v[m - 1] + v[m]) / 2.0
            }
        };
        // The last window may hold only the run's tail (the few arrivals
        // after the last whole window): it counts in no figure.
        let most = windows
            .iter()
            .map(|x| x.submit_to_start.count)
            .max()
            .unwrap_or(0);
        let whole = |x: &Window| x.submit_to_start.count * 2 >= most;
        let p99 = |x: &Window| x.submit_to_start.p99_ms;
        let change = |on: f64, off: f64| (on / off - 1.0) * 100.0;
        let pairs: Vec<f64> = windows
            .chunks_exact(2)
            .filter(|p| !p[0].retention && p[1].retention && whole(&p[0]) && whole(&p[1]))
            .map(|p| change(p99(&p[1]), p99(&p[0])))
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let brackets: Vec<f64> = windows
            .windows(3)
            .filter(|t| !t[0].retention && t[1].retention && !t[2].retention)
            .filter(|t| t.iter().all(whole))
            .map(|t| change(p99(&t[1]), (p99(&t[0]) + p99(&t[2])) / 2.0))
            .collect();
        let p99s = |on: bool| {
            windows
                .iter()
                .filter(|x| x.retention == on && whole(x))
                .map(p99)
                .collect::<Vec<_>>()
        };
        let on: Vec<&Window> = windows.iter().filter(|x| x.retention).collect();
        let removed: u64 = on.iter().map(|x| x.removed).sum();
        Some(Self {
            median_pair_p99_change_pct: median(pairs.clone()),
            pair_p99_change_pct: pairs,
            median_bracket_p99_change_pct: median(brackets.clone()),
            bracket_p99_change_pct: brackets,
            median_p99_off_ms: median(p99s(false)),
            median_p99_on_ms: median(p99s(true)),
            removed_per_s_on: removed as f64 / (w.as_secs_f64() * on.len() as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(retention: bool, p99_ms: f64, removed: u64) -> Window {
        let p = Percentiles {
            count: 100,
            p50_ms: p99_ms / 4.0,
            p90_ms: p99_ms / 2.0,
            p99_ms,
            max_ms: p99_ms * 2.0,
        };
        Window {
            from_s: 0.0,
            retention,
            removed,
            passes: 1,
            pass_ms_mean: 1.0,
            node_cores: 0.5,
            workers_cores: 0.25,
            writer_tx_per_s: 0.0,
            writer_busy: 0.0,
            wal_syncs_per_s: 0.0,
            submit_to_start: p.clone(),
            submit_to_ack_durable: p,
        }
    }

    #[test]
    fn windows_pair_off_then_on_and_take_medians() {
        let w = [
            window(false, 10.0, 0),
            window(true, 11.0, 100),
            window(false, 20.0, 0),
            window(true, 18.0, 300),
            window(false, 10.0, 0),
            window(true, 15.0, 200),
        ];
        let s = WindowsSummary::of(&w, Duration::from_secs(10)).expect("three pairs");
        let rounded: Vec<i64> = s
            .pair_p99_change_pct
            .iter()
            .map(|c| c.round() as i64)
            .collect();
        assert_eq!(rounded, [10, -10, 50]);
        assert_eq!(s.median_pair_p99_change_pct.round() as i64, 10);
        assert_eq!(s.median_p99_off_ms, 10.0);
        assert_eq!(s.median_p99_on_ms, 15.0);
        assert_eq!(
            s.removed_per_s_on, 20.0,
            "600 rows in 30 s with retention on"
        );
        // Against both neighbours: 11 / 15 and 18 / 15; the last window
        // with retention has none after it.
        let rounded: Vec<i64> = s
            .bracket_p99_change_pct
            .iter()
            .map(|c| c.round() as i64)
            .collect();
        assert_eq!(rounded, [-27, 20]);
        assert_eq!(s.median_bracket_p99_change_pct.round() as i64, -3);
        // A tail window (a few arrivals after the last whole one) counts
        // in nothing.
        let mut tail = w.to_vec();
        tail.push(window(false, 1.0, 0));
        tail.last_mut().unwrap().submit_to_start.count = 3;
        let t = WindowsSummary::of(&tail, Duration::from_secs(10)).expect("three pairs");
        assert_eq!(
            t.median_p99_off_ms, 10.0,
            "the tail's 1 ms is not an off window"
        );
        assert_eq!(t.bracket_p99_change_pct.len(), 2, "nor a neighbour");
        assert!(
            WindowsSummary::of(&w[..1], Duration::from_secs(10)).is_none(),
            "no pair"
        );
    }

    #[test]
    fn the_slowest_starts_are_named_worst_first_with_their_submit() {
        let origin = Instant::now();
        let ms = Duration::from_millis;
        // Task k is submitted at k ms and starts k² µs later; task 20 never
        // started and "k3" was never seen dispatched.
        let submitted: Vec<Submitted> = (0..=20u64)
            .map(|k| (format!("k{k}"), origin + ms(k)))
            .collect();
        let started: HashMap<String, Instant> = (0..20u64)
            .map(|k| {
                (
                    format!("k{k}"),
                    origin + ms(k) + Duration::from_micros(k * k),
                )
            })
            .collect();
        let seen: HashMap<String, Seen> = (0..20u64)
            .filter(|k| *k != 19)
            .map(|k| {
                let s = Seen {
                    dispatched: Some(origin + ms(k)),
                    ..Seen::default()
                };
                (format!("k{k}"), s)
            })
            .collect();
        let slow = slowest(&submitted, &seen, &started, origin);
        assert_eq!(slow.len(), SLOWEST);
        let at_ms: Vec<u64> = slow.iter().map(|s| (s.at_s * 1e3).round() as u64).collect();
        assert_eq!(at_ms, [19, 18, 17, 16, 15, 14, 13, 12, 11, 10]);
        assert!(
            (slow[0].start_ms - 0.361).abs() < 1e-6,
            "{}",
            slow[0].start_ms
        );
        assert_eq!(slow[0].dispatch_ms, None, "never seen dispatched");
        assert_eq!(slow[1].dispatch_ms, Some(0.0));
        assert!(slowest(&[], &seen, &started, origin).is_empty());
    }

    #[test]
    fn tasks_fall_in_the_window_they_were_submitted_in() {
        let origin = Instant::now();
        let w = Duration::from_secs(10);
        let at = |s: u64| origin + Duration::from_secs(s);
        let submitted: Vec<Submitted> = vec![
            ("a".into(), at(1)),
            ("b".into(), at(12)),
            ("c".into(), at(13)),
        ];
        let started: HashMap<String, Instant> = [
            ("a".to_string(), at(1) + Duration::from_millis(5)),
            ("b".to_string(), at(12) + Duration::from_millis(40)),
            ("c".to_string(), at(13) + Duration::from_millis(40)),
        ]
        .into();
        // Turn k at k × 10 s: by then the node had used 5 s of CPU a
        // window, the workers 2 s, and the writer k × 1,000 transactions
        // holding it 3 s a window, with 400 syncs of the WAL a window.
        let turn = |k: u32, on, removed, passes| Turn {
            on,
            removed,
            passes,
            pass_micros: passes * 2_000,
            at: origin + w * k,
            node_cpu: Duration::from_secs(5) * k,
            workers_cpu: Duration::from_secs(2) * k,
            writer: (1_000 * u64::from(k), Duration::from_secs(3) * k),
            syncs: 400 * u64::from(k),
        };
        let turns = [
            turn(0, false, 0, 0),
            turn(1, true, 0, 0),
            turn(2, false, 64, 4),
        ];
        let windows =
            split_windows(&submitted, &HashMap::new(), &started, origin, w, &turns).unwrap();
        assert_eq!(windows.len(), 2);
        assert!(!windows[0].retention && windows[1].retention);
        assert_eq!(windows[0].submit_to_start.count, 1);
        assert_eq!(windows[1].submit_to_start.count, 2);
        assert!((windows[1].submit_to_start.p99_ms - 40.0).abs() < 0.1);
        assert_eq!((windows[1].removed, windows[1].passes), (64, 4));
        assert_eq!(windows[1].pass_ms_mean, 2.0);
        for window in &windows {
            assert!((window.node_cores - 0.5).abs() < 1e-9);
            assert!((window.workers_cores - 0.2).abs() < 1e-9);
            assert!((window.writer_tx_per_s - 100.0).abs() < 1e-9);
            assert!((window.writer_busy - 0.3).abs() < 1e-9);
            assert!((window.wal_syncs_per_s - 40.0).abs() < 1e-9);
        }
        assert_eq!(windows[0].submit_to_ack_durable.count, 0, "no ACK seen");
    }
}
