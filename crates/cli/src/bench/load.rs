//! What the `throughput` and `latency` scenarios share: their flags, the
//! node under test (in process, on a fresh store), M `echo` workers (in
//! process or as `taskmesh worker` processes), a recorder of the store's
//! committed changes, a load generator on its own OS thread (so its CPU can
//! be told apart from the server's), CPU accounting and the progress bar.
//!
//! Timing method: every instant is taken on this process's monotonic clock.
//! The node runs in this process, so the store's change feed (published
//! right after each commit) tells when a task was claimed and pushed
//! (DISPATCHING), when the worker's ACK was durable (RUNNING; the SDK starts
//! the handler right after sending it) and when its result was durable
//! (SUCCEEDED) — the same for in-process and out-of-process workers.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use taskmesh::v1 as pb;
use taskmesh_core::TaskState;
use taskmesh_store::urls::redact;
use taskmesh_store::{DatabaseKind, Store, TaskFilter};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::cpu;
use super::scratch::Scratch;
use crate::node::{self, NodeOptions, RunningNode};

/// Where the workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkersAs {
    /// `taskmesh worker` child processes, talking gRPC over loopback.
    Processes,
    /// SDK workers on this process's runtime (still gRPC over loopback).
    InProcess,
}

/// How the throughput scenario loads the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Insert every task first, then start the workers and drain.
    Prefill,
    /// Submit and drain at the same time.
    Continuous,
}

/// Flags of the `throughput` and `latency` scenarios.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Workers serving `echo`.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Slots of each worker.
    #[arg(long, default_value_t = 256)]
    pub worker_concurrency: u32,
    /// Where the workers run.
    #[arg(long, value_enum, default_value_t = WorkersAs::Processes)]
    pub workers_as: WorkersAs,
    /// Arrival rate in tasks/s: `latency` (default 1000) and `throughput
    /// --mode continuous` (default: as fast as the node accepts); for
    /// `workflows`, workflows/s (default: as fast as the node accepts).
    #[arg(long)]
    pub rate: Option<f64>,
    /// How long `latency` submits.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Throughput mode.
    #[arg(long, value_enum, default_value_t = Mode::Prefill)]
    pub mode: Mode,
    /// Tasks per `SubmitTasks` call while loading.
    #[arg(long, default_value_t = 1_000)]
    pub submit_batch: usize,
    /// `latency`: this many tasks due an hour later are submitted before
    /// the run, so it measures beside that many PENDING rows.
    #[arg(long, default_value_t = 0)]
    pub pending: u64,
    /// `latency`: this many CANCELLED tasks that ended 30 days ago (past
    /// every default retention horizon) are written before the run, so it
    /// measures beside the leader's retention removing them (10,000
    /// through the store, the rest copied inside the database: 10^7 in
    /// minutes).
    #[arg(long, default_value_t = 0)]
    pub ended: u64,
    /// The node keeps every ended task (no retention): the quiet baseline
    /// for `--ended`.
    #[arg(long)]
    pub no_retention: bool,
    /// `latency`: the node removes SUCCEEDED tasks this long after they
    /// ended (the bench's own node: any length from 1 s, where `serve`
    /// takes 1 min at least), so a run shows SQLite's file under a steady
    /// load with retention on (sampled every 10 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retention_succeeded: Option<Duration>,
    /// `latency --ended N`: retention is paused through the fill, then
    /// off and on in turns for windows this long through the run (off
    /// first), so one backlog and one sitting give both figures; the
    /// report splits the latencies by the window each task was submitted
    /// in. `--duration` should hold several pairs.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retention_windows: Option<Duration>,
    /// Ended tasks the node's retention removes per state per pass, and
    /// fire records per schedule (as `serve --retention-batch`).
    #[arg(long, default_value_t = taskmesh_scheduler::retention::DEFAULT_BATCH, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub retention_batch: u32,
    /// `workers`: how many workers the extra process connects, each on a
    /// connection of its own.
    #[arg(long, default_value_t = super::fleet::DEFAULT_FLEET)]
    pub fleet: u32,
    /// The store: a fresh SQLite database in a temporary directory when
    /// unset; `sqlite://DIR` for a (new) data directory of your choosing;
    /// `postgres://…` or `mysql://…` (`mariadb://…`) for a server, where
    /// the bench creates a database of its own next to the one named (and
    /// drops it after).
    #[arg(long)]
    pub database_url: Option<String>,
    /// The `taskmesh` binary to start workers from (default: this one).
    #[arg(long, hide = true)]
    pub worker_bin: Option<PathBuf>,
}

impl LoadArgs {
    /// Checks the flags make sense.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!((1..=64).contains(&self.workers), "--workers must be 1..=64");
        anyhow::ensure!(
            (1..=10_000).contains(&self.worker_concurrency),
            "--worker-concurrency must be 1..=10000"
        );
        anyhow::ensure!(
            (1..=10_000).contains(&self.submit_batch),
            "--submit-batch must be 1..=10000"
        );
        if let Some(rate) = self.rate {
            anyhow::ensure!(
                rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0,
                "--rate must be in (0, 1000000]"
            );
        }
        anyhow::ensure!(
            !self.duration.is_zero() && self.duration <= Duration::from_secs(3_600),
            "--duration must be in (0, 1h]"
        );
        anyhow::ensure!(
            self.pending <= 10_000_000,
            "--pending must be at most 10000000"
        );
        anyhow::ensure!(
            (1..=10_000).contains(&self.fleet),
            "--fleet must be 1..=10000"
        );
        if let Some(w) = self.retention_windows {
            anyhow::ensure!(
                self.ended > 0 && !self.no_retention,
                "--retention-windows needs --ended and retention on (no --no-retention)"
            );
            anyhow::ensure!(
                w >= Duration::from_secs(1) && self.duration >= w * 2,
                "--retention-windows must be at least 1s, and --duration at least two windows"
            );
        }
        Ok(())
    }
}

/// The `taskmesh` binary workers are started from.
fn worker_bin(args: &LoadArgs) -> anyhow::Result<PathBuf> {
    match &args.worker_bin {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe().context("locating the taskmesh binary"),
    }
}

/// One `taskmesh worker` process serving `echo`.
struct WorkerCommand<'a> {
    server: &'a str,
    /// Its id (with `copies` > 1, the copies' ids are `{worker_id}-{k}`).
    worker_id: &'a str,
    namespace: &'a str,
    concurrency: u32,
    copies: u32,
    /// Where its handlers' starts are stamped, if anywhere.
    stamps: Option<&'a std::path::Path>,
}

/// Starts the worker process `w` describes (killed when its handle drops).
fn spawn_worker(
    bin: &std::path::Path,
    w: WorkerCommand<'_>,
) -> anyhow::Result<tokio::process::Child> {
    let mut command = tokio::process::Command::new(bin);
    command.args(["worker", "--server", w.server, "--handlers", "echo"]);
    if let Some(path) = w.stamps {
        command.arg("--start-stamps").arg(path);
    }
    if w.copies > 1 {
        command.args(["--copies", &w.copies.to_string()]);
    }
    command
        .args(["--concurrency", &w.concurrency.to_string()])
        .args(["--worker-id", w.worker_id, "--log", "warn"])
        .args(["--namespace", w.namespace])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// The store a run uses, for the report (before it starts).
fn store_label(args: &LoadArgs) -> String {
    match &args.database_url {
        None => "sqlite (temporary directory, WAL, each commit synced)".into(),
        Some(url) => format!("{} (synchronous=FULL)", redact(url)),
    }
}

/// CPU used during a measured window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuReport {
    /// Wall time of the window, in seconds.
    pub wall_s: f64,
    /// The node's process (this one) minus the load generator's thread.
    /// With in-process workers it includes them.
    pub server_s: f64,
    /// The worker processes together (0 with in-process workers).
    pub workers_s: f64,
    /// The load generator's own thread.
    pub generator_s: f64,
    /// The database server's processes (`postgres`, `mariadbd`,
    /// machine-wide), when the store is on a server; 0 for SQLite (it runs
    /// inside the node).
    pub database_s: f64,
    /// server + workers + database, per task completed in the window, in µs.
    pub us_per_task: f64,
    /// (server + workers + database + generator) / wall: cores busy on
    /// average.
    pub cores_busy: f64,
}

/// Start of a CPU window.
pub struct CpuMark {
    at: Instant,
    process: Duration,
    workers: Duration,
    database: cpu::Processes,
}

/// The node, its workers and a client: everything a scenario runs against.
pub struct Rig {
    /// The node under test.
    pub node: RunningNode,
    /// A client of its TaskApi.
    pub channel: Channel,
    workers: Workers,
    _dir: Option<tempfile::TempDir>,
    /// The SQLite data directory, when the store is SQLite.
    pub sqlite_dir: Option<PathBuf>,
    scratch: Option<Scratch>,
    /// The store as measured (with the server's durability settings).
    pub store_label: String,
    /// Where workers stamp their handlers' starts, once asked
    /// ([`Rig::stamp_starts`]).
    stamps: Option<tempfile::TempDir>,
    /// One instant on both clocks: the monotonic one the bench measures
    /// with, and the wall clock (µs since the epoch) stamps are written in.
    epoch: (Instant, u128),
    /// The node's retention switch and tally.
    pub retention: std::sync::Arc<taskmesh_scheduler::retention::RetentionControl>,
}

enum Workers {
    None,
    InProcess {
        stop: CancellationToken,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    },
    Processes(Vec<tokio::process::Child>),
}

impl Rig {
    /// The database under the node, for a bulk fill of its own
    /// ([`super::fill`]).
    pub(super) fn fill_target(&self) -> Option<super::fill::Target> {
        use super::fill::Target;
        if let Some(dir) = &self.sqlite_dir {
            return Some(Target::Sqlite(dir.clone()));
        }
        self.scratch.as_ref().map(|db| match db.kind() {
            DatabaseKind::Postgres => Target::Postgres(db.url().to_string()),
            DatabaseKind::Mysql => Target::Mysql(db.url().to_string()),
        })
    }

    /// Starts a node on the store `args` names. Workers come later.
    pub async fn start(args: &LoadArgs) -> anyhow::Result<Self> {
        let mut opts = NodeOptions::new();
        // A benchmark measures the machine, not the per-namespace quotas.
        opts.dispatcher.quotas = taskmesh_dispatcher::quota::QuotaOptions::unlimited();
        if args.no_retention {
            opts.scheduler.retention = taskmesh_scheduler::retention::Retention::keep_all();
        }
        if let Some(horizon) = args.retention_succeeded {
            opts.scheduler.retention.succeeded = Some(horizon);
        }
        opts.scheduler.retention.batch = args.retention_batch as usize;
        let retention = opts.scheduler.retention_control.clone();
        // In turns from the run's start; not through the fill.
        retention.set_paused(args.retention_windows.is_some());
        // Nor the per-client connection limit: every connection of a bench
        // comes from 127.0.0.1 (`--scenario workers` opens up to 10,000).
        opts.conn_limits.max_total = 16_384;
        opts.conn_limits.max_per_peer = 16_384;
        let mut dir = None;
        let mut scratch = None;
        let mut sqlite_dir = None;
        let mut store_label = store_label(args);
        match &args.database_url {
            None => {
                let d = tempfile::tempdir().context("creating a temporary data directory")?;
                opts.data_dir = d.path().to_path_buf();
                sqlite_dir = Some(opts.data_dir.clone());
                dir = Some(d);
            }
            Some(url) => match (DatabaseKind::of_url(url), url.strip_prefix("sqlite://")) {
                (Some(kind), _) => {
                    // A database of its own, dropped at the end.
                    let (db, label) = Scratch::create(kind, url).await?;
                    store_label = label;
                    opts.database_url = Some(db.url().to_string());
                    scratch = Some(db);
                }
                (None, Some(path)) if !path.is_empty() => {
                    opts.data_dir = PathBuf::from(path);
                    sqlite_dir = Some(opts.data_dir.clone());
                }
                _ => anyhow::bail!(
                    "--database-url {} is not supported: use postgres://…, mysql://…, \
                     sqlite://DIR or leave it unset",
                    redact(url)
                ),
            },
        }
        opts.grpc_addr = ([127, 0, 0, 1], 0).into();
        opts.http_addr = ([127, 0, 0, 1], 0).into();
        let node = node::start(opts).await?;
        let page = node
            .store
            .list_tasks(&TaskFilter {
                limit: 1,
                ..TaskFilter::default()
            })
            .await?;
        anyhow::ensure!(
            page.tasks.is_empty(),
            "the bench needs an empty store; this one already holds tasks"
        );
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr))?
                .connect()
                .await
                .context("connecting to the node")?;
        Ok(Self {
            node,
            channel,
            workers: Workers::None,
            _dir: dir,
            sqlite_dir,
            scratch,
            store_label,
            stamps: None,
            epoch: (Instant::now(), crate::ledger::unix_micros()),
            retention,
        })
    }

    /// Starts the workers and waits until all of them are connected.
    /// Workers started from now on stamp each handler's start into a file
    /// of this rig ([`Rig::started`] reads them): the start as the worker
    /// sees it, one write per task.
    pub fn stamp_starts(&mut self) -> anyhow::Result<()> {
        if self.stamps.is_none() {
            self.stamps = Some(tempfile::tempdir().context("creating a stamps directory")?);
        }
        Ok(())
    }

    /// When each task's handler started, as its worker stamped it, on the
    /// bench's clock (empty unless [`Rig::stamp_starts`] was called).
    pub fn started(&self) -> anyhow::Result<HashMap<String, Instant>> {
        let mut out = HashMap::new();
        let Some(dir) = &self.stamps else {
            return Ok(out);
        };
        let (base, base_us) = self.epoch;
        for entry in std::fs::read_dir(dir.path())? {
            let text = std::fs::read_to_string(entry?.path())?;
            for line in text.lines() {
                let Some((id, us)) = line.split_once(' ') else {
                    continue;
                };
                let Ok(us) = us.parse::<u128>() else { continue };
                let at = if us >= base_us {
                    base + Duration::from_micros((us - base_us) as u64)
                } else {
                    base.checked_sub(Duration::from_micros((base_us - us) as u64))
                        .unwrap_or(base)
                };
                // A retried task keeps its first start.
                out.entry(id.to_string()).or_insert(at);
            }
        }
        Ok(out)
    }

    fn stamps_file(&self, worker_id: &str) -> Option<PathBuf> {
        self.stamps
            .as_ref()
            .map(|d| d.path().join(format!("stamps-{worker_id}")))
    }

    pub async fn start_workers(&mut self, args: &LoadArgs) -> anyhow::Result<()> {
        self.start_workers_in(args, "", "bench").await
    }

    /// Starts `args.workers` more workers for `namespace` (empty: the
    /// default), with ids `{prefix}-{i}`, and waits until all of them are
    /// connected.
    pub async fn start_workers_in(
        &mut self,
        args: &LoadArgs,
        namespace: &str,
        prefix: &str,
    ) -> anyhow::Result<()> {
        let server = format!("http://{}", self.node.grpc_addr);
        match args.workers_as {
            WorkersAs::InProcess => {
                if !matches!(self.workers, Workers::InProcess { .. }) {
                    self.workers = Workers::InProcess {
                        stop: CancellationToken::new(),
                        tasks: Vec::new(),
                    };
                }
                for i in 0..args.workers {
                    let stamps = match self.stamps_file(&format!("{prefix}-{i}")) {
                        Some(path) => Some(crate::ledger::Ledgered::open(&path)?),
                        None => None,
                    };
                    let Workers::InProcess { stop, tasks } = &mut self.workers else {
                        unreachable!("set just above")
                    };
                    let mut opts = taskmesh_worker::WorkerOptions::new(vec![server.clone()]);
                    opts.worker_id = format!("{prefix}-{i}");
                    opts.name = opts.worker_id.clone();
                    opts.namespace = namespace.to_string();
                    opts.concurrency = args.worker_concurrency;
                    let echo: Arc<dyn taskmesh_worker::Handler> =
                        Arc::new(taskmesh_worker::builtin::Echo);
                    let echo: Arc<dyn taskmesh_worker::Handler> = match stamps {
                        Some(file) => Arc::new(crate::ledger::Stamped::new(echo, file)),
                        None => echo,
                    };
                    let mut worker = taskmesh_worker::Worker::new(opts);
                    worker.add_handler("echo", echo);
                    let token = stop.child_token();
                    tasks.push(tokio::spawn(async move {
                        if let Err(err) = worker.run(token).await {
                            tracing::warn!(error = %err, "bench worker failed");
                        }
                    }));
                }
            }
            WorkersAs::Processes => {
                let bin = worker_bin(args)?;
                if !matches!(self.workers, Workers::Processes(_)) {
                    self.workers = Workers::Processes(Vec::new());
                }
                for i in 0..args.workers {
                    let worker_id = format!("{prefix}-{i}");
                    let stamps = self.stamps_file(&worker_id);
                    let child = spawn_worker(
                        &bin,
                        WorkerCommand {
                            server: &server,
                            worker_id: &worker_id,
                            namespace,
                            concurrency: args.worker_concurrency,
                            copies: 1,
                            stamps: stamps.as_deref(),
                        },
                    )?;
                    let Workers::Processes(children) = &mut self.workers else {
                        unreachable!("set just above")
                    };
                    children.push(child);
                }
            }
        }
        self.wait_connected(namespace, prefix, args.workers, Duration::from_secs(30))
            .await
    }

    /// Waits until `want` workers of `namespace` whose ids start with
    /// `{prefix}-` are connected, failing when a worker process exits or
    /// `within` passes.
    async fn wait_connected(
        &mut self,
        namespace: &str,
        prefix: &str,
        want: usize,
        within: Duration,
    ) -> anyhow::Result<()> {
        let mut api = pb::task_api_client::TaskApiClient::new(self.channel.clone());
        let deadline = Instant::now() + within;
        loop {
            let workers = api
                .list_workers(pb::ListWorkersRequest {
                    namespace: namespace.to_string(),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .workers;
            let connected = workers
                .iter()
                .filter(|w| w.worker_id.starts_with(&format!("{prefix}-")))
                .count();
            if connected >= want {
                return Ok(());
            }
            if let Workers::Processes(children) = &mut self.workers {
                for c in children.iter_mut() {
                    if let Some(status) = c.try_wait()? {
                        anyhow::bail!("a worker process exited early: {status}");
                    }
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {connected} of {want} workers ({prefix}-…) connected within {within:?}"
            );
            // Polling a condition with a deadline.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts one worker process running `copies` workers of `concurrency`
    /// slots each (`worker --copies`), ids `{prefix}-{k}`, each on a
    /// connection of its own, and waits up to `within` until all are
    /// connected. Needs the rig's workers to be processes.
    pub async fn start_fleet(
        &mut self,
        args: &LoadArgs,
        copies: u32,
        concurrency: u32,
        prefix: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            matches!(self.workers, Workers::Processes(_)),
            "a fleet needs --workers-as processes"
        );
        let stamps = self.stamps_file(prefix);
        let child = spawn_worker(
            &worker_bin(args)?,
            WorkerCommand {
                server: &format!("http://{}", self.node.grpc_addr),
                worker_id: prefix,
                namespace: "",
                concurrency,
                copies,
                stamps: stamps.as_deref(),
            },
        )?;
        if let Workers::Processes(children) = &mut self.workers {
            children.push(child);
        }
        self.wait_connected("", prefix, copies as usize, within)
            .await
    }

    /// The pid of the worker process started last, if workers are
    /// processes.
    pub fn last_worker_pid(&self) -> Option<u32> {
        match &self.workers {
            Workers::Processes(children) => children.last().and_then(|c| c.id()),
            _ => None,
        }
    }

    /// A mark to measure CPU from.
    pub fn cpu_mark(&self) -> CpuMark {
        CpuMark {
            at: Instant::now(),
            process: cpu::process(),
            workers: self.workers_cpu(),
            database: self.database_cpu(),
        }
    }

    /// CPU used since `mark`; `generator` is the load generator thread's
    /// share, `completed` the tasks completed in the window.
    pub fn cpu_since(&self, mark: &CpuMark, generator: Duration, completed: u64) -> CpuReport {
        let wall = mark.at.elapsed().as_secs_f64();
        let process = cpu::process().saturating_sub(mark.process);
        let server = process.saturating_sub(generator).as_secs_f64();
        let workers = self
            .workers_cpu()
            .saturating_sub(mark.workers)
            .as_secs_f64();
        let generator = generator.as_secs_f64();
        let database = self.database_cpu().since(&mark.database).as_secs_f64();
        CpuReport {
            wall_s: wall,
            server_s: server,
            workers_s: workers,
            generator_s: generator,
            database_s: database,
            us_per_task: (server + workers + database) * 1e6 / completed.max(1) as f64,
            cores_busy: (server + workers + database + generator) / wall.max(1e-9),
        }
    }

    fn database_cpu(&self) -> cpu::Processes {
        match &self.scratch {
            Some(db) => db
                .kind()
                .server_process()
                .iter()
                .map(|name| cpu::of_command(name))
                .fold(cpu::Processes::default(), cpu::Processes::with),
            None => cpu::Processes::default(),
        }
    }

    fn workers_cpu(&self) -> Duration {
        self.worker_pids().into_iter().filter_map(cpu::of_pid).sum()
    }

    /// The worker processes' ids (none with in-process workers).
    pub fn worker_pids(&self) -> Vec<u32> {
        match &self.workers {
            Workers::Processes(children) => children.iter().filter_map(|c| c.id()).collect(),
            _ => Vec::new(),
        }
    }

    /// Stops the workers (SIGTERM, then a kill after 10 s) and the node.
    pub async fn stop(self) {
        match self.workers {
            Workers::None => {}
            Workers::InProcess { stop, tasks } => {
                stop.cancel();
                for t in tasks {
                    let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
                }
            }
            Workers::Processes(children) => {
                for mut c in children {
                    if let Some(pid) = c.id() {
                        // SAFETY: kill has no memory preconditions; the pid
                        // is our own child's, not yet reaped.
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                    }
                    if tokio::time::timeout(Duration::from_secs(10), c.wait())
                        .await
                        .is_err()
                    {
                        let _ = c.kill().await;
                    }
                }
            }
        }
        self.node.stop(Duration::from_secs(10)).await;
        if let Some(db) = self.scratch
            && let Err(err) = db.drop_now().await
        {
            tracing::warn!(error = %err, "could not drop the bench database");
        }
    }
}

/// When each task reached the states the scenarios time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen {
    /// Claimed and pushed (DISPATCHING committed).
    pub dispatched: Option<Instant>,
    /// ACK durable (RUNNING committed).
    pub running: Option<Instant>,
    /// Result durable (terminal state committed).
    pub ended: Option<Instant>,
}

/// Follows the store's committed changes: counts terminal ones and, when
/// asked to, keeps per-task instants.
pub struct Recorder {
    /// Terminal changes seen.
    pub ended: Arc<AtomicU64>,
    /// Changes the feed dropped because the recorder fell behind.
    pub missed: Arc<AtomicU64>,
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Starts following `store`; with `per_task`, keeps instants per task.
    pub fn start(store: Arc<dyn Store>, per_task: bool) -> Self {
        let mut feed = store.subscribe();
        let ended = Arc::new(AtomicU64::new(0));
        let missed = Arc::new(AtomicU64::new(0));
        let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
        let stop = CancellationToken::new();
        let task = {
            let (ended, missed, seen, stop) =
                (ended.clone(), missed.clone(), seen.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    let change = tokio::select! {
                        _ = stop.cancelled() => return,
                        c = feed.recv() => c,
                    };
                    let change = match change {
                        Ok(c) => c,
                        Err(RecvError::Lagged(n)) => {
                            missed.fetch_add(n, Ordering::Relaxed);
                            continue;
                        }
                        Err(RecvError::Closed) => return,
                    };
                    let now = Instant::now();
                    if change.state.is_terminal() {
                        ended.fetch_add(1, Ordering::Relaxed);
                    }
                    if !per_task {
                        continue;
                    }
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    let entry = seen.entry(change.task_id).or_default();
                    match change.state {
                        TaskState::Dispatching => {
                            entry.dispatched.get_or_insert(now);
                        }
                        TaskState::Running => {
                            entry.running.get_or_insert(now);
                        }
                        s if s.is_terminal() => {
                            entry.ended.get_or_insert(now);
                        }
                        _ => {}
                    }
                }
            })
        };
        Self {
            ended,
            missed,
            seen,
            stop,
            task,
        }
    }

    /// Stops following and returns what was kept per task.
    pub async fn finish(self) -> HashMap<String, Seen> {
        self.stop.cancel();
        let _ = self.task.await;
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Ends a run whose counts come from the store: stops the recorder and
/// the rig, and notes when the progress feed lagged.
pub async fn end_run(recorder: Recorder, rig: Rig) {
    let missed = recorder.missed.load(Ordering::Relaxed);
    recorder.finish().await;
    rig.stop().await;
    if missed > 0 {
        tracing::debug!(
            missed,
            "the progress feed lagged; counts come from the store"
        );
    }
}

/// One submitted task: its id and the instant its arrival was due.
pub type Submitted = (String, Instant);

/// Runs `f` on a dedicated OS thread with its own single-threaded runtime
/// and returns its result with the CPU time that thread used.
pub async fn on_generator_thread<F, Fut, T>(f: F) -> anyhow::Result<(T, Duration)>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-load".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("building the load generator's runtime")
                .and_then(|rt| {
                    let before = cpu::thread();
                    let out = rt.block_on(f());
                    drop(rt);
                    out.map(|v| (v, cpu::thread().saturating_sub(before)))
                });
            let _ = tx.send(result);
        })
        .context("starting the load generator thread")?;
    rx.await.context("the load generator thread died")?
}

/// Submits with `submit` (on the generator thread, with its own client of
/// the node) while waiting for `expected` tasks to drain; the store is asked
/// whether the drain is over only once `submit` has returned. Returns what
/// `submit` returned and the generator thread's CPU time.
pub async fn submit_while_draining<F, Fut, T>(
    rig: &Rig,
    recorder: &Recorder,
    expected: u64,
    submit: F,
) -> anyhow::Result<(T, Duration)>
where
    F: FnOnce(pb::task_api_client::TaskApiClient<Channel>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    let addr = rig.node.grpc_addr;
    let submitted = Arc::new(AtomicBool::new(false));
    let done = submitted.clone();
    let generator = on_generator_thread(move || async move {
        let result = submit(client(addr).await?).await;
        done.store(true, Ordering::Release);
        result
    });
    let drained = wait_drained(rig, recorder, expected, Duration::from_secs(60), &submitted);
    let (out, _) = tokio::try_join!(generator, drained)?;
    Ok(out)
}

/// A connected TaskApi client on the current runtime.
pub async fn client(
    addr: std::net::SocketAddr,
) -> anyhow::Result<pb::task_api_client::TaskApiClient<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await
        .context("connecting the load generator")?;
    Ok(pb::task_api_client::TaskApiClient::new(channel)
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024))
}

/// One `echo` task as submitted by the bench.
pub fn echo_request() -> pb::SubmitTaskRequest {
    echo_request_in("")
}

/// An `echo` task of `namespace` (empty: the default).
pub fn echo_request_in(namespace: &str) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        handler: "echo".into(),
        payload: Some(pb::Payload {
            data: b"{}".to_vec(),
            content_type: "application/json".into(),
        }),
        namespace: namespace.to_string(),
        ..Default::default()
    }
}

/// An `echo` task due an hour from its submit: it stays PENDING for the
/// whole of a run (`latency --pending`).
pub fn pending_request() -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        delay: Some(prost_types::Duration {
            seconds: 3_600,
            nanos: 0,
        }),
        ..echo_request()
    }
}

/// Sends `tasks` requests made by `request` as `SubmitTasks` calls of
/// `batch`, at most `parallel` in flight, as fast as they are accepted.
/// Returns the ids, each with the instant its call was sent.
pub async fn submit_all(
    api: &pb::task_api_client::TaskApiClient<Channel>,
    tasks: usize,
    batch: usize,
    parallel: usize,
    request: fn() -> pb::SubmitTaskRequest,
) -> anyhow::Result<Vec<Submitted>> {
    let mut out = Vec::with_capacity(tasks);
    let mut calls = tokio::task::JoinSet::new();
    let mut queued = 0usize;
    while queued < tasks || !calls.is_empty() {
        while queued < tasks && calls.len() < parallel {
            let n = batch.min(tasks - queued);
            queued += n;
            let mut api = api.clone();
            calls.spawn(async move {
                let at = Instant::now();
                let req = pb::SubmitTasksRequest {
                    tasks: (0..n).map(|_| request()).collect(),
                };
                api.submit_tasks(req).await.map(|r| (r.into_inner(), at))
            });
        }
        if let Some(done) = calls.join_next().await {
            let (resp, at) = done?.context("SubmitTasks failed")?;
            for r in resp.results {
                let accepted = r.accepted.with_context(|| {
                    format!("a task was refused: {} ({})", r.error_message, r.error_code)
                })?;
                out.push((accepted.task_id, at));
            }
        }
    }
    Ok(out)
}

/// Tasks in the store by outcome, and the first and last `ended_at`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// SUCCEEDED tasks.
    pub succeeded: u64,
    /// Tasks in any other state.
    pub other: u64,
    /// Earliest end (unix ms).
    pub first_end: Option<i64>,
    /// Latest end (unix ms).
    pub last_end: Option<i64>,
}

/// Reads every task of the store (pages of 1000) and tallies them.
pub async fn tally(store: &dyn Store) -> anyhow::Result<Tally> {
    let mut t = Tally::default();
    let mut before_id = None;
    loop {
        let page = store
            .list_tasks(&TaskFilter {
                limit: 1_000,
                before_id,
                ..TaskFilter::default()
            })
            .await?;
        for task in &page.tasks {
            if task.state == TaskState::Succeeded {
                t.succeeded += 1;
                let end = task.times.end;
                t.first_end = t.first_end.min(end).or(t.first_end).or(end);
                t.last_end = t.last_end.max(end);
            } else {
                t.other += 1;
            }
        }
        match page.next_before_id {
            Some(id) => before_id = Some(id),
            None => return Ok(t),
        }
    }
}

/// Waits until `expected` tasks have ended, with a progress bar on a
/// terminal. Gives up when nothing ends for `stall`. The store is asked
/// only once `submitted` is set: while the generator still submits, a
/// moment with nothing READY and nothing in flight is not the end. And only
/// when the feed counted every task ended, or stood still for
/// [`FEED_STILL`] (it may drop changes under load; then every 500 ms):
/// asking counts every READY task, a cost of the node's process that grew
/// with the backlog when it was asked every 500 ms through the drain.
pub async fn wait_drained(
    rig: &Rig,
    recorder: &Recorder,
    expected: u64,
    stall: Duration,
    submitted: &AtomicBool,
) -> anyhow::Result<Instant> {
    let mut bar = progress(expected, "drained");
    let mut last = (0u64, Instant::now());
    let mut next_check = Instant::now();
    loop {
        let ended = recorder.ended.load(Ordering::Relaxed);
        bar.set_position(ended.min(expected));
        // The feed may drop changes under load; the store has the truth.
        let feed_still = last.1.elapsed() >= FEED_STILL && Instant::now() >= next_check;
        if submitted.load(Ordering::Acquire) && (ended >= expected || feed_still) {
            next_check = Instant::now() + Duration::from_millis(500);
            if drained(rig.node.store.as_ref()).await? {
                let at = Instant::now();
                bar.finish_and_clear();
                return Ok(at);
            }
        }
        if ended != last.0 {
            last = (ended, Instant::now());
        }
        anyhow::ensure!(
            last.1.elapsed() < stall,
            "no task ended for {stall:?}; {ended} of {expected} ended"
        );
        // Polling a condition with a stall limit.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long the feed of ended tasks stands still before the store is asked
/// whether the drain is over.
const FEED_STILL: Duration = Duration::from_secs(1);

/// True when nothing is READY or in flight.
async fn drained(store: &dyn Store) -> anyhow::Result<bool> {
    let ready: u64 = store.ready_counts().await?.iter().map(|(_, _, n)| n).sum();
    if ready > 0 {
        return Ok(false);
    }
    Ok(store.in_flight(None).await?.is_empty())
}

/// Progress on stderr: a bar with the rate on a terminal; otherwise a plain
/// line every [`PLAIN_EVERY`] (`drained 41200/100000 (9850/s)`), so a log
/// or CI output shows the run moving without a terminal's escape codes.
pub struct Progress {
    bar: Option<ProgressBar>,
    plain: Option<PlainProgress>,
}

/// What the plain lines need: the total, the label, and when and where the
/// last line was printed.
struct PlainProgress {
    len: u64,
    what: &'static str,
    last: (Instant, u64),
}

/// How often a plain progress line is printed.
pub const PLAIN_EVERY: Duration = Duration::from_secs(2);

impl Progress {
    /// Moves the progress to `pos`.
    pub fn set_position(&mut self, pos: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
        }
        if let Some(p) = &mut self.plain {
            let elapsed = p.last.0.elapsed();
            if elapsed >= PLAIN_EVERY {
                let rate = (pos.saturating_sub(p.last.1)) as f64 / elapsed.as_secs_f64();
                eprintln!("{} {pos}/{} ({rate:.0}/s)", p.what, p.len);
                p.last = (Instant::now(), pos);
            }
        }
    }

    /// Ends the progress (the bar is cleared).
    pub fn finish_and_clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A [`Progress`] of `len` steps named `what`.
pub fn progress(len: u64, what: &'static str) -> Progress {
    if !std::io::stderr().is_terminal() {
        return Progress {
            bar: None,
            plain: Some(PlainProgress {
                len,
                what,
                last: (Instant::now(), 0),
            }),
        };
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{spinner} {msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what);
    Progress {
        bar: Some(bar),
        plain: None,
    }
}

/// Prints `rows` as a two-column markdown table.
pub fn print_rows(title: &str, rows: &[(String, String)]) {
    println!("{title}");
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let v = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    println!("| {:<w$} | {:<v$} |", "figure", "value");
    println!("| {} | {} |", "-".repeat(w), "-".repeat(v));
    for (k, val) in rows {
        println!("| {k:<w$} | {val:<v$} |");
    }
}

/// The CPU rows of a report table.
pub fn cpu_rows(c: &CpuReport) -> Vec<(String, String)> {
    vec![
        ("cpu window (s)".into(), format!("{:.2}", c.wall_s)),
        ("cpu server (s)".into(), format!("{:.2}", c.server_s)),
        ("cpu workers (s)".into(), format!("{:.2}", c.workers_s)),
        ("cpu database (s)".into(), format!("{:.2}", c.database_s)),
        (
            "cpu load generator (s)".into(),
            format!("{:.2}", c.generator_s),
        ),
        (
            "cpu server+workers+database per task (µs)".into(),
            format!("{:.1}", c.us_per_task),
        ),
        ("cores busy (of 2)".into(), format!("{:.2}", c.cores_busy)),
    ]
}
