//! `taskmesh`: run a node, run a worker, or talk to a node as a client.

mod bench;
mod client;
mod ledger;
mod logging;
mod logs_cmd;
mod retention_cmd;
mod schedule_cmd;
mod sqlite_memory;
mod token_cmd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use taskmesh_cli::{env, node};
use taskmesh_core::Strategy;
use taskmesh_dispatcher::BalancerOptions;
use tokio_util::sync::CancellationToken;

/// mimalloc, not glibc's malloc: the hot path allocates and frees many
/// short-lived buffers across threads (rows, messages, records), where
/// glibc's arenas spent a fifth of the drain's CPU (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A distributed task scheduler and dispatcher whose every interface is a
/// Protobuf contract.
#[derive(Debug, Parser)]
#[command(name = "taskmesh", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node: the gRPC API and dispatcher, the scheduler and the HTTP port.
    Serve(ServeArgs),
    /// Run a node with an in-process worker serving the built-in handlers
    /// (echo, sleep, fail, log): the one-command demo.
    Dev(ServeArgs),
    /// Run a worker with the built-in handlers against one or more servers:
    /// over a stream (default), or in push mode with --push-listen.
    Worker(WorkerArgs),
    /// Submit a task.
    Submit(client::SubmitArgs),
    /// Show a task with its attempts.
    Get(client::GetArgs),
    /// List tasks, newest first.
    List(client::ListArgs),
    /// Cancel a task.
    Cancel(client::CancelArgs),
    /// Print a task's log lines; --follow prints new ones until it ends.
    Logs(logs_cmd::LogsArgs),
    /// Manage API tokens: create (the secret is printed once), list, revoke.
    Token(token_cmd::TokenArgs),
    /// Show or set how long ended tasks are kept, per namespace and handler.
    Retention(retention_cmd::RetentionArgs),
    /// Manage schedules (cron, fixed rate, fixed delay).
    Schedule(schedule_cmd::ScheduleArgs),
    /// Run a benchmark scenario and report what it measured.
    Bench(bench::BenchArgs),
    /// Print the OpenAPI document of the REST gateway (as in docs/openapi.json).
    Openapi,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Directory for the SQLite database (created if missing).
    #[arg(long, env = env::DATA_DIR, default_value = "taskmesh-data")]
    data_dir: PathBuf,
    /// gRPC listen address (TaskApi and Dispatcher).
    #[arg(long, env = env::GRPC_ADDR, default_value = "127.0.0.1:50051")]
    grpc_addr: SocketAddr,
    /// HTTP listen address: the REST gateway (/api/...), /openapi.json, /healthz, /readyz.
    #[arg(long, env = env::HTTP_ADDR, default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// A push not ACKed within this is taken back and re-dispatched.
    #[arg(long, env = env::ACK_TIMEOUT, default_value = "10s", value_parser = humantime::parse_duration)]
    ack_timeout: Duration,
    /// How long a worker's ACK may be held in memory before it is written:
    /// a task ending sooner is written once (ACK and result together);
    /// one still running shows RUNNING after this. 0 writes every ACK at
    /// once. At most half the ACK timeout.
    #[arg(long, env = env::ACK_HOLD, default_value = "100ms", value_parser = humantime::parse_duration)]
    ack_hold: Duration,
    /// Heartbeat interval asked of workers; three missed ones lose the worker.
    #[arg(long, env = env::HEARTBEAT_INTERVAL, default_value = "5s", value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// Largest task payload accepted, in bytes.
    #[arg(long, env = env::MAX_PAYLOAD_BYTES, default_value_t = 1024 * 1024)]
    max_payload_bytes: usize,
    /// Most steps a submitted workflow may have (1-10000).
    #[arg(long, env = env::MAX_WORKFLOW_STEPS, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_workflow_steps: u32,
    /// gRPC requests in flight before new ones are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = env::MAX_CONCURRENT_REQUESTS, default_value_t = 1024)]
    max_concurrent_requests: usize,
    /// A gRPC request's body must arrive within this (else
    /// DEADLINE_EXCEEDED); until it has, it takes none of the slots above.
    #[arg(long, env = env::REQUEST_BODY_TIMEOUT, default_value = "10s", value_parser = humantime::parse_duration)]
    request_body_timeout: Duration,
    /// HTTP/2 streams one connection (either port) may have open at once.
    #[arg(long, env = env::MAX_STREAMS_PER_CONNECTION, default_value_t = 256)]
    max_streams_per_connection: u32,
    /// Open connections per port; more are closed as they arrive.
    #[arg(long, env = env::MAX_CONNECTIONS, default_value_t = 4096)]
    max_connections: usize,
    /// Open connections per port from one client address.
    #[arg(long, env = env::MAX_CONNECTIONS_PER_PEER, default_value_t = 256)]
    max_connections_per_peer: usize,
    /// A connection that sends nothing within this is closed (either
    /// port); a REST request's headers must arrive within it too.
    #[arg(long, env = env::HEADER_READ_TIMEOUT, default_value = "10s", value_parser = humantime::parse_duration)]
    header_read_timeout: Duration,
    /// Requests per second to TaskApi and Admin per namespace (a token
    /// bucket; over it, RESOURCE_EXHAUSTED / 429 with when to retry); 0
    /// turns it off. Workers' own calls are not counted.
    #[arg(long, env = env::RATE_LIMIT, default_value_t = 5_000)]
    rate_limit: u32,
    /// Requests per namespace allowed at once above --rate-limit.
    #[arg(long, env = env::RATE_BURST, default_value_t = 10_000)]
    rate_burst: u32,
    /// READY tasks (waiting for a worker) per namespace before submits are
    /// refused with RESOURCE_EXHAUSTED; 0 turns it off.
    #[arg(long, env = env::MAX_READY_TASKS, default_value_t = 1_000_000)]
    max_ready_tasks: u64,
    /// Schedules per namespace; 0 turns it off.
    #[arg(long, env = env::MAX_SCHEDULES, default_value_t = 10_000)]
    max_schedules: u64,
    /// Shortest time allowed between two fires of a schedule.
    #[arg(long, env = env::MIN_SCHEDULE_INTERVAL, default_value = "1s", value_parser = humantime::parse_duration)]
    min_schedule_interval: Duration,
    /// Open WatchTask streams per namespace on this server; 0 turns it off.
    #[arg(long, env = env::MAX_WATCHES, default_value_t = 1_000)]
    max_watches: u32,
    /// Worker sessions per namespace on this server; 0 turns it off.
    #[arg(long, env = env::MAX_WORKERS, default_value_t = 1_000)]
    max_workers: u32,
    /// Handlers one worker registration may name; 0 turns it off.
    #[arg(long, env = env::MAX_HANDLERS_PER_WORKER, default_value_t = 256)]
    max_handlers_per_worker: usize,
    /// Trigger engine: "wheel" (in-memory timing wheel, ~1 ms late) or
    /// "poll" (database polling every --poll-interval).
    #[arg(long, env = env::TRIGGER_ENGINE, default_value = "wheel", value_parser = ["wheel", "poll"])]
    trigger_engine: String,
    /// Interval of the polling trigger engine.
    #[arg(long, env = env::POLL_INTERVAL, default_value = "500ms", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
    /// Keep SUCCEEDED tasks (with their attempts and callbacks) this long
    /// after they ended, then remove them (the leader does, in batches).
    #[arg(long, env = env::RETENTION_SUCCEEDED, default_value = "24h", value_parser = humantime::parse_duration)]
    retention_succeeded: Duration,
    /// Keep FAILED tasks this long after they ended; also TIMED_OUT and
    /// CANCELLED ones unless --retention-timed-out or --retention-cancelled
    /// says otherwise [default: 7 days for FAILED and TIMED_OUT, 24h for
    /// CANCELLED].
    #[arg(long, env = env::RETENTION_FAILED, value_parser = humantime::parse_duration)]
    retention_failed: Option<Duration>,
    /// Keep TIMED_OUT tasks this long after they ended.
    #[arg(long, env = env::RETENTION_TIMED_OUT, value_parser = humantime::parse_duration)]
    retention_timed_out: Option<Duration>,
    /// Keep CANCELLED tasks this long after they ended.
    #[arg(long, env = env::RETENTION_CANCELLED, value_parser = humantime::parse_duration)]
    retention_cancelled: Option<Duration>,
    /// Ended tasks removed per state in one retention batch (one short
    /// write transaction; the leader pauses at least 9 times as long as a
    /// pass took before the next), and fire records trimmed per schedule:
    /// smaller batches hold the store for less at a time, larger ones
    /// remove a backlog faster.
    #[arg(long, env = env::RETENTION_BATCH, default_value_t = taskmesh_scheduler::retention::DEFAULT_BATCH, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    retention_batch: u32,
    /// Fire records kept per schedule (the newest; older ones are removed
    /// by the leader, in batches).
    #[arg(long, env = env::FIRE_HISTORY, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    fire_history: u32,
    /// Task log lines kept per attempt; later lines are refused and the
    /// attempt's log is marked truncated.
    #[arg(long, env = env::LOG_MAX_LINES, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    log_max_lines: u64,
    /// Task log text kept per attempt, in bytes (default 1 MiB); as
    /// --log-max-lines.
    #[arg(long, env = env::LOG_MAX_BYTES, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    log_max_bytes: u64,
    /// A schedule fire time further behind than this when handled counts as
    /// missed, and the schedule's misfire policy applies.
    #[arg(long, env = env::MISFIRE_THRESHOLD, default_value = "5s", value_parser = humantime::parse_duration)]
    misfire_threshold: Duration,
    /// Balancer strategy for one handler, as handler=STRATEGY (repeat the
    /// flag or separate with commas). Strategies: LEAST_ACTIVE, ROUND_ROBIN,
    /// RANDOM, WEIGHTED_ROUND_ROBIN, CONSISTENT_HASH, EQUAL_COST.
    #[arg(long = "balancer", env = env::BALANCER, value_delimiter = ',', value_parser = parse_handler_strategy)]
    balancer: Vec<(String, Strategy)>,
    /// Balancer strategy for handlers not named by --balancer (a task may
    /// still choose its own).
    #[arg(long, env = env::BALANCER_DEFAULT, default_value = "LEAST_ACTIVE", value_parser = parse_strategy)]
    balancer_default: Strategy,
    /// Virtual nodes per stream on CONSISTENT_HASH rings.
    #[arg(long, env = env::HASH_VNODES, default_value_t = taskmesh_dispatcher::balancer::DEFAULT_HASH_VNODES)]
    hash_vnodes: u32,
    /// Largest REST request body, in bytes; larger ones are refused with 413.
    #[arg(long, env = env::MAX_BODY_BYTES, default_value_t = 4 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Addresses callbacks and push workers may use beyond public ones, as
    /// CIDR ranges or single addresses (repeat the flag or separate with
    /// commas), e.g. 10.0.0.0/8,127.0.0.1. Loopback, private, link-local
    /// and other non-public ranges are refused unless listed (`dev` allows
    /// loopback).
    #[arg(long, env = env::EGRESS_ALLOW, value_name = "CIDR", value_delimiter = ',', value_parser = taskmesh_core::egress::parse_net)]
    egress_allow: Vec<ipnet::IpNet>,
    /// Callback POSTs in flight at once.
    #[arg(long, env = env::CALLBACK_CONCURRENCY, default_value_t = 64)]
    callback_concurrency: usize,
    /// Callback POSTs in flight at once to one receiver (scheme://host:port),
    /// so a slow receiver cannot hold up the others.
    #[arg(long, env = env::CALLBACK_PER_HOST, default_value_t = 8)]
    callback_per_host: usize,
    /// Tries per callback (the first included) before it is given up.
    /// Callbacks are signed (Standard Webhooks) with the keys in
    /// TASKMESH_CALLBACK_SECRET, environment only, space-separated.
    #[arg(long, env = env::CALLBACK_MAX_ATTEMPTS, default_value_t = 15)]
    callback_max_attempts: u32,
    /// Database of the store for cluster mode: Postgres
    /// (postgres://postgres@127.0.0.1:5432/taskmesh) or MySQL 8 / MariaDB
    /// 10.6+ (mysql://root@127.0.0.1:3306/taskmesh, the database created
    /// beforehand); unset uses SQLite in --data-dir. Prefer the variable
    /// when the URL holds a password.
    #[arg(long, env = env::DATABASE_URL, hide_env_values = true)]
    database_url: Option<String>,
    /// Redis URL for cluster coordination (leader lease with fencing token,
    /// worker registry across replicas), e.g. redis://127.0.0.1:6379; unset
    /// coordinates in process (one node).
    #[arg(long, env = env::REDIS_URL, hide_env_values = true)]
    redis_url: Option<String>,
    /// Prefix of every Redis key (several clusters may share a server).
    #[arg(long, env = env::REDIS_PREFIX, default_value = "taskmesh:")]
    redis_prefix: String,
    /// Leader lease TTL (cluster mode).
    #[arg(long, env = env::LEASE_TTL, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
    /// How often the leader renews its lease (cluster mode).
    #[arg(long, env = env::LEASE_RENEW, default_value = "3s", value_parser = humantime::parse_duration)]
    lease_renew: Duration,
    /// Require an API token on every call but health checks (see `taskmesh
    /// token --help`). The bootstrap token, an admin of every namespace, is
    /// read from TASKMESH_BOOTSTRAP_TOKEN (environment only, at least 32
    /// characters).
    #[arg(long, env = env::AUTH)]
    auth: bool,
    /// Serve addresses beyond loopback without --auth. Without it, a node
    /// listening on anything but loopback and not requiring tokens refuses
    /// to start (protected mode).
    #[arg(long, env = env::INSECURE)]
    insecure: bool,
    /// Serve /metrics without a token (default: open only when the HTTP
    /// port is on loopback, or authentication is off).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    open_metrics: Option<bool>,
    /// Serve gRPC server reflection without a token (default: open only
    /// when the gRPC port is on loopback, or authentication is off).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    open_reflection: Option<bool>,
    /// Serve gRPC and HTTP over TLS with this certificate chain (PEM, leaf
    /// first); with --tls-key. Reloaded on SIGHUP and when the file changes.
    #[arg(long, env = env::TLS_CERT, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = env::TLS_KEY, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates on the gRPC port signed by these CA
    /// certificates (PEM): mutual TLS. The REST port does not ask for one.
    #[arg(long, env = env::TLS_CLIENT_CA, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Also run an in-process worker with the built-in handlers.
    #[arg(long)]
    with_worker: bool,
    /// Slots of the in-process worker.
    #[arg(long, default_value_t = 8)]
    worker_concurrency: u32,
    #[command(flatten)]
    log: logging::LogArgs,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    /// Server URL(s), comma-separated; the worker fails over between them.
    /// https:// URLs connect over TLS (see --tls-ca).
    #[arg(long, env = env::SERVER, value_delimiter = ',', default_value = "http://127.0.0.1:50051")]
    server: Vec<String>,
    #[command(flatten)]
    tls: taskmesh_cli::tls::ClientTlsFiles,
    /// Built-in handlers to serve, comma-separated (echo, sleep, fail).
    #[arg(long, env = env::HANDLERS, value_delimiter = ',', default_value = "echo,sleep,fail,log")]
    handlers: Vec<String>,
    /// Tasks run at once.
    #[arg(long, env = env::CONCURRENCY, default_value_t = 8)]
    concurrency: u32,
    /// Worker id (default: a fresh UUID).
    #[arg(long)]
    worker_id: Option<String>,
    /// The namespace whose tasks to run (default: the token's, or
    /// "default" without authentication).
    #[arg(long, env = env::NAMESPACE, default_value = "")]
    namespace: String,
    /// A file holding the worker's API token (a worker token of its
    /// namespace). Without it the token is read from $TASKMESH_TOKEN.
    #[arg(long, env = env::TOKEN_FILE, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Labels the worker carries, as key=value, comma-separated.
    #[arg(long, value_delimiter = ',')]
    label: Vec<String>,
    /// Append one line per handler execution (task_id attempt execution_id
    /// worker_id) to this file before it runs.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// Bench tool: append `task_id unix_micros` to this file as each
    /// handler starts (how `taskmesh bench` sees the start from the worker).
    #[arg(long, hide = true, value_name = "FILE")]
    start_stamps: Option<PathBuf>,
    /// Bench tool: run this many workers in this one process, each with a
    /// connection and stream of its own and the id `{worker-id}-{k}` (how
    /// `taskmesh bench --scenario workers` opens a thousand cheaply).
    #[arg(long, hide = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    copies: u32,
    /// Push mode: instead of holding a stream, serve the taskmesh.v1.Worker
    /// gRPC service on this address (e.g. 127.0.0.1:7070; port 0 picks one)
    /// and register it with the server, which then calls Worker.Execute for
    /// each task and probes the worker to see that it is alive.
    #[arg(long, env = env::PUSH_LISTEN, value_name = "HOST:PORT")]
    push_listen: Option<std::net::SocketAddr>,
    /// Push mode: the URL the servers call, e.g. http://10.0.0.7:7070
    /// (default: http:// and the address bound by --push-listen; required
    /// when that listens on 0.0.0.0).
    #[arg(long, env = env::PUSH_ADVERTISE, value_name = "URL", requires = "push_listen")]
    push_advertise: Option<String>,
    #[command(flatten)]
    log: logging::LogArgs,
}

fn main() -> std::process::ExitCode {
    // First, while the process has one thread and SQLite is unused.
    if let Err(rc) = sqlite_memory::install() {
        eprintln!("warning: SQLite kept its own allocator (sqlite3_config returned {rc})");
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args, false).await,
        Command::Dev(args) => serve(args, true).await,
        Command::Worker(args) => worker(args).await,
        Command::Submit(args) => client::submit(args).await,
        Command::Get(args) => client::get(args).await,
        Command::List(args) => client::list(args).await,
        Command::Cancel(args) => client::cancel(args).await,
        Command::Logs(args) => logs_cmd::run(args).await,
        Command::Token(args) => token_cmd::run(args).await,
        Command::Schedule(args) => schedule_cmd::run(args).await,
        Command::Retention(args) => retention_cmd::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Openapi => {
            let document = taskmesh_gateway::openapi::document()?;
            print!("{}", taskmesh_gateway::openapi::render(&document));
            Ok(())
        }
    }
}

async fn serve(args: ServeArgs, dev: bool) -> anyhow::Result<()> {
    let _tracing = args.log.init("taskmesh");
    let mut opts = node::NodeOptions::new();
    let retention = retention(&args)?;
    opts.data_dir = args.data_dir;
    opts.grpc_addr = args.grpc_addr;
    opts.http_addr = args.http_addr;
    opts.dispatcher.ack_timeout = args.ack_timeout;
    opts.dispatcher.ack_hold = args.ack_hold;
    opts.dispatcher.heartbeat_interval = args.heartbeat_interval;
    opts.dispatcher.max_payload_bytes = args.max_payload_bytes;
    opts.dispatcher.max_workflow_steps = args.max_workflow_steps as usize;
    opts.dispatcher.max_concurrent_requests = args.max_concurrent_requests;
    opts.dispatcher.request_body_timeout = args.request_body_timeout;
    opts.dispatcher.max_streams_per_connection = args.max_streams_per_connection;
    opts.dispatcher.quotas = taskmesh_dispatcher::quota::QuotaOptions {
        rate_per_sec: args.rate_limit,
        burst: args.rate_burst,
        max_ready_tasks: args.max_ready_tasks,
        max_schedules: args.max_schedules,
        min_schedule_interval: args.min_schedule_interval,
        max_watches: args.max_watches,
        max_workers: args.max_workers,
        max_handlers_per_worker: args.max_handlers_per_worker,
    };
    opts.conn_limits = taskmesh_cli::conn::ConnLimits {
        max_total: args.max_connections,
        max_per_peer: args.max_connections_per_peer,
        first_bytes: args.header_read_timeout,
    };
    opts.header_read_timeout = args.header_read_timeout;
    opts.scheduler.engine = taskmesh_scheduler::EngineKind::parse(&args.trigger_engine)
        .ok_or_else(|| anyhow::anyhow!("unknown trigger engine {:?}", args.trigger_engine))?;
    opts.scheduler.poll_interval = args.poll_interval;
    opts.scheduler.misfire_threshold = args.misfire_threshold;
    opts.scheduler.retention = retention;
    opts.dispatcher.logs.cap = taskmesh_core::logs::LogCap {
        lines: args.log_max_lines,
        bytes: args.log_max_bytes,
    };
    opts.scheduler.fault_hold_round = std::env::var_os(env::FAULT_HOLD_ROUND).map(PathBuf::from);
    opts.dispatcher.balancer = BalancerOptions {
        default: args.balancer_default,
        per_handler: args.balancer.into_iter().collect(),
        hash_vnodes: args.hash_vnodes,
    };
    opts.max_body_bytes = args.max_body_bytes;
    // Signing secrets come from the environment only (flags show in `ps`);
    // several, separated by white space, all sign (key rotation).
    opts.callbacks.secrets = std::env::var(env::CALLBACK_SECRET)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    opts.callbacks.concurrency = args.callback_concurrency;
    opts.callbacks.per_host = args.callback_per_host;
    let mut allow = args.egress_allow;
    if dev {
        allow.extend(taskmesh_core::egress::loopback_nets());
    }
    opts.egress = taskmesh_core::egress::EgressPolicy::allowing(allow);
    opts.callbacks.policy.max_attempts = args.callback_max_attempts;
    opts.database_url = args.database_url;
    // Dev is open on loopback, always; serve only when asked.
    opts.dispatcher.auth.enabled = args.auth && !dev;
    opts.dispatcher.auth.bootstrap = std::env::var(env::BOOTSTRAP_TOKEN)
        .ok()
        .filter(|t| !t.is_empty());
    opts.dispatcher.auth.open_reflection = args
        .open_reflection
        .unwrap_or(args.grpc_addr.ip().is_loopback());
    opts.insecure = args.insecure;
    opts.open_metrics = args.open_metrics;
    if dev {
        anyhow::ensure!(
            opts.loopback_only(),
            "taskmesh dev serves without authentication and only on loopback; use `taskmesh serve --auth` for other addresses"
        );
        tracing::warn!(
            "dev mode: no authentication (every caller may do everything); loopback only"
        );
    } else if !opts.dispatcher.auth.enabled {
        // Refuse first (protected mode), warn only about what will run.
        opts.validate()?;
        tracing::warn!(
            "authentication is off: every caller may do everything (serve --auth turns it on)"
        );
    }
    if let Some(url) = args.redis_url {
        let mut r = taskmesh_coord::RedisOptions::new(url, "this-node");
        r.key_prefix = args.redis_prefix;
        r.lease_ttl = args.lease_ttl;
        r.renew_interval = args.lease_renew;
        r.validate()?;
        opts.redis = Some(r);
    }
    if let (Some(cert), Some(key)) = (args.tls_cert, args.tls_key) {
        opts.tls = Some(taskmesh_cli::tls::TlsFiles {
            cert,
            key,
            client_ca: args.tls_client_ca,
        });
    }
    if dev || args.with_worker {
        opts.with_worker = Some(args.worker_concurrency);
    }
    let node = node::start(opts).await?;
    let token = node.shutdown_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown signal received");
        token.cancel();
    });
    node.wait(Duration::from_secs(15)).await;
    Ok(())
}

async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let _tracing = args.log.init("taskmesh-worker");
    let mut opts = taskmesh_worker::WorkerOptions::new(args.server);
    opts.tls = args.tls.load()?;
    opts.concurrency = args.concurrency;
    opts.namespace = args.namespace;
    let token =
        match &args.token_file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("cannot read the token file {}: {e}", path.display())
            })?),
            None => std::env::var(env::TOKEN).ok(),
        };
    opts.token = token
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .map(taskmesh_worker::Secret::new);
    opts.push_listen = args.push_listen;
    opts.push_advertise = args.push_advertise;
    if let Some(id) = args.worker_id {
        opts.worker_id = id;
    }
    for kv in &args.label {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("label {kv:?} must look like key=value"))?;
        opts.labels.insert(k.to_string(), v.to_string());
    }
    opts.validate()?;
    let worker_id = opts.worker_id.clone();
    let ledger = match &args.ledger {
        Some(path) => Some(
            ledger::Ledgered::open(path)
                .map_err(|e| anyhow::anyhow!("cannot open the ledger {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let stamps =
        match &args.start_stamps {
            Some(path) => Some(ledger::Ledgered::open(path).map_err(|e| {
                anyhow::anyhow!("cannot open the stamps file {}: {e}", path.display())
            })?),
            None => None,
        };
    let mut handlers = Vec::with_capacity(args.handlers.len());
    for name in &args.handlers {
        let handler = taskmesh_worker::builtin::builtin(name).ok_or_else(|| {
            anyhow::anyhow!(
                "no built-in handler {name:?}; built-ins are {}",
                taskmesh_worker::builtin::BUILTIN_NAMES.join(", ")
            )
        })?;
        let handler: std::sync::Arc<dyn taskmesh_worker::Handler> = match &ledger {
            Some(file) => std::sync::Arc::new(ledger::Ledgered::new(
                handler,
                file.clone(),
                worker_id.clone(),
            )),
            None => handler,
        };
        let handler: std::sync::Arc<dyn taskmesh_worker::Handler> = match &stamps {
            Some(file) => std::sync::Arc::new(ledger::Stamped::new(handler, file.clone())),
            None => handler,
        };
        handlers.push((name.clone(), handler));
    }
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown signal received, draining");
        token.cancel();
    });
    let make = |opts: taskmesh_worker::WorkerOptions| {
        let mut worker = taskmesh_worker::Worker::new(opts);
        for (name, handler) in &handlers {
            worker.add_handler(name.as_str(), std::sync::Arc::clone(handler));
        }
        worker
    };
    if args.copies == 1 {
        make(opts).run(shutdown).await?;
        return Ok(());
    }
    let mut copies = tokio::task::JoinSet::new();
    for k in 0..args.copies {
        let mut opts = opts.clone();
        opts.worker_id = format!("{worker_id}-{k}");
        opts.name = opts.worker_id.clone();
        copies.spawn(make(opts).run(shutdown.child_token()));
    }
    while let Some(done) = copies.join_next().await {
        done??;
    }
    Ok(())
}

fn parse_strategy(text: &str) -> Result<Strategy, String> {
    Strategy::parse(text.trim()).ok_or_else(|| {
        let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown balancer {text:?}; one of {}", names.join(", "))
    })
}

fn parse_handler_strategy(text: &str) -> Result<(String, Strategy), String> {
    let (handler, strategy) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} must look like handler=STRATEGY"))?;
    let handler = handler.trim();
    taskmesh_core::validate::handler_name(handler)?;
    Ok((handler.to_string(), parse_strategy(strategy)?))
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// The retention horizons `serve` was given: `--retention-failed` covers
/// TIMED_OUT and CANCELLED too unless their own flags are given; each
/// horizon at least a minute.
fn retention(args: &ServeArgs) -> anyhow::Result<taskmesh_scheduler::retention::Retention> {
    let defaults = taskmesh_scheduler::retention::Retention::default();
    let failed = args.retention_failed;
    let r = taskmesh_scheduler::retention::Retention {
        succeeded: Some(args.retention_succeeded),
        failed: failed.or(defaults.failed),
        timed_out: args.retention_timed_out.or(failed).or(defaults.timed_out),
        cancelled: args.retention_cancelled.or(failed).or(defaults.cancelled),
        batch: args.retention_batch as usize,
        fire_history: args.fire_history,
    };
    for (state, horizon) in r.horizons() {
        if horizon.is_some_and(|h| h < Duration::from_secs(60)) {
            anyhow::bail!(
                "the retention of {} tasks must be at least 1 minute",
                state.as_str()
            );
        }
    }
    Ok(r)
}
