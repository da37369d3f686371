//! Starting and stopping one node (`taskmesh serve`): store, coordination,
//! scheduler, the gRPC dispatcher, the REST gateway on the HTTP port and
//! the callback deliverer.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use taskmesh_callbacks::{CallbackOptions, Deliverer};
use taskmesh_coord::{Coordinator, LocalCoordinator, RedisCoordinator, RedisOptions, TokenFloor};
use taskmesh_core::breaker::{BreakerOptions, Breakers};
use taskmesh_core::egress::EgressPolicy;
use taskmesh_core::{Clock, SystemClock};
use taskmesh_dispatcher::{DispatchStats, Dispatcher, DispatcherOptions};
use taskmesh_gateway::{Gateway, GatewayOptions, Readiness};
use taskmesh_scheduler::{Scheduler, SchedulerOptions};
use taskmesh_store::{
    DatabaseKind, Metered, MysqlOptions, MysqlStore, PostgresOptions, PostgresStore, SqliteOptions,
    SqliteStore, Store, StoreClock,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What a node needs to start.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Directory of the SQLite database (created if missing).
    pub data_dir: PathBuf,
    /// gRPC listen address; port 0 picks a free one.
    pub grpc_addr: SocketAddr,
    /// HTTP listen address; port 0 picks a free one.
    pub http_addr: SocketAddr,
    /// Dispatcher options.
    pub dispatcher: DispatcherOptions,
    /// Scheduler options.
    pub scheduler: SchedulerOptions,
    /// Callback delivery options.
    pub callbacks: CallbackOptions,
    /// Largest REST request body; larger ones are refused with 413.
    pub max_body_bytes: usize,
    /// Start an in-process worker with the built-in handlers and this many
    /// slots (`taskmesh dev`).
    pub with_worker: Option<u32>,
    /// Redis for coordination across replicas (leader lease, worker
    /// registry); `None` coordinates in process (a single node).
    pub redis: Option<RedisOptions>,
    /// Postgres or MySQL/MariaDB URL for the store; `None` uses SQLite in
    /// `data_dir`.
    pub database_url: Option<String>,
    /// Serve a non-loopback address without authentication (otherwise the
    /// node refuses to start: protected mode).
    pub insecure: bool,
    /// Serve `/metrics` without a token (default: only when the HTTP port
    /// is on loopback).
    pub open_metrics: Option<bool>,
    /// Serve both ports over TLS with these files (`None`: plaintext).
    pub tls: Option<crate::tls::TlsFiles>,
    /// How often the TLS files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Where callbacks and push workers' addresses may point (copied into
    /// the dispatcher's and the deliverer's options at start).
    pub egress: EgressPolicy,
    /// Connection limits of each port.
    pub conn_limits: crate::conn::ConnLimits,
    /// A REST request's headers must arrive within this.
    pub header_read_timeout: Duration,
}

impl NodeOptions {
    /// Defaults: `./taskmesh-data`, gRPC on 127.0.0.1:50051, HTTP on 127.0.0.1:8080.
    pub fn new() -> Self {
        Self {
            data_dir: PathBuf::from("taskmesh-data"),
            grpc_addr: ([127, 0, 0, 1], 50051).into(),
            http_addr: ([127, 0, 0, 1], 8080).into(),
            dispatcher: DispatcherOptions::default(),
            scheduler: SchedulerOptions::default(),
            callbacks: CallbackOptions::default(),
            max_body_bytes: 4 * 1024 * 1024,
            with_worker: None,
            redis: None,
            database_url: None,
            insecure: false,
            open_metrics: None,
            tls: None,
            tls_reload_interval: Duration::from_secs(2),
            egress: EgressPolicy::public_only(),
            conn_limits: crate::conn::ConnLimits::default(),
            header_read_timeout: Duration::from_secs(10),
        }
    }

    /// True when both ports listen on loopback only.
    pub fn loopback_only(&self) -> bool {
        self.grpc_addr.ip().is_loopback() && self.http_addr.ip().is_loopback()
    }

    /// Checks the options make sense together.
    pub fn validate(&self) -> anyhow::Result<()> {
        let auth = &self.dispatcher.auth;
        anyhow::ensure!(
            auth.enabled || self.insecure || self.loopback_only(),
            "protected mode: gRPC on {} and HTTP on {} reach beyond loopback without authentication; \
             add --auth (with TASKMESH_BOOTSTRAP_TOKEN or tokens), or --insecure to serve them open",
            self.grpc_addr,
            self.http_addr
        );
        if let Some(bootstrap) = &auth.bootstrap {
            anyhow::ensure!(
                bootstrap.len() >= 32 && bootstrap.bytes().all(|b| b.is_ascii_graphic()),
                "the bootstrap token must be at least 32 printable ASCII characters"
            );
        }
        anyhow::ensure!(
            self.tls.is_none() || self.with_worker.is_none(),
            "the in-process worker (--with-worker, dev) cannot be combined with TLS yet; \
             run `taskmesh worker --server https://… --tls-ca FILE` beside the node"
        );
        let d = &self.dispatcher;
        anyhow::ensure!(!d.ack_timeout.is_zero(), "ack timeout must be above zero");
        anyhow::ensure!(
            !d.request_body_timeout.is_zero(),
            "request body timeout must be above zero"
        );
        anyhow::ensure!(
            d.max_streams_per_connection > 0,
            "max streams per connection must be above zero"
        );
        anyhow::ensure!(
            !d.heartbeat_interval.is_zero(),
            "heartbeat interval must be above zero"
        );
        anyhow::ensure!(
            d.max_payload_bytes > 0,
            "max payload bytes must be above zero"
        );
        anyhow::ensure!(
            d.max_payload_bytes < d.max_message_bytes,
            "max payload bytes ({}) must be below the gRPC message limit ({})",
            d.max_payload_bytes,
            d.max_message_bytes
        );
        anyhow::ensure!(
            d.max_concurrent_requests > 0,
            "max concurrent requests must be above zero"
        );
        d.balancer.validate().map_err(anyhow::Error::msg)?;
        anyhow::ensure!(self.max_body_bytes > 0, "max body bytes must be above zero");
        let c = &self.callbacks;
        anyhow::ensure!(
            c.policy.max_attempts > 0,
            "callback max attempts must be above zero"
        );
        anyhow::ensure!(
            c.lease > c.request_timeout,
            "the callback lease ({:?}) must be longer than the callback request timeout ({:?})",
            c.lease,
            c.request_timeout
        );
        for secret in &c.secrets {
            taskmesh_callbacks::signing_key(secret).map_err(|e| {
                anyhow::anyhow!(
                    "{e} (leave TASKMESH_CALLBACK_SECRET unset to send unsigned callbacks)"
                )
            })?;
        }
        let l = &self.conn_limits;
        anyhow::ensure!(
            l.max_total > 0 && l.max_per_peer > 0,
            "connection limits must be above zero"
        );
        anyhow::ensure!(
            !l.first_bytes.is_zero() && !self.header_read_timeout.is_zero(),
            "the first-bytes and header read timeouts must be above zero"
        );
        anyhow::ensure!(
            c.concurrency > 0 && c.per_host > 0,
            "callback concurrency and per-receiver limit must be above zero"
        );
        Ok(())
    }
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads the store's newest fencing token for the Redis coordinator, so a
/// fresh (or restarted) Redis never hands out a token the store would refuse.
struct StoreFloor(Arc<dyn Store>);

#[async_trait::async_trait]
impl TokenFloor for StoreFloor {
    async fn token_floor(&self) -> Result<u64, String> {
        self.0.fence_token().await.map_err(|e| e.to_string())
    }
}

/// The coordinator the options ask for.
async fn coordinator(
    opts: &NodeOptions,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<Arc<dyn Coordinator>> {
    let node_id = format!(
        "{}-{}",
        hostname(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    if let Some(redis) = &opts.redis {
        let mut redis = redis.clone();
        redis.node_id = node_id;
        let coord = RedisCoordinator::connect(redis.clone())
            .await
            .with_context(|| format!("connecting to Redis at {}", redis.url))?;
        coord.set_token_floor_source(Arc::new(StoreFloor(store)));
        return Ok(Arc::new(taskmesh_coord::Metered::new(coord, "redis")));
    }
    let local = LocalCoordinator::with_clock(node_id, clock);
    // Tokens must keep rising across restarts: the store refuses leader
    // writes with a token older than the newest it has seen.
    local.set_token_floor(
        store
            .fence_token()
            .await
            .context("reading the fencing token")?,
    );
    Ok(Arc::new(taskmesh_coord::Metered::new(local, "local")))
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into())
}

/// A running node.
pub struct RunningNode {
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where HTTP is served.
    pub http_addr: SocketAddr,
    /// The store (tests read it directly).
    pub store: Arc<dyn Store>,
    /// The dispatch engine's counters.
    pub dispatch_stats: Arc<DispatchStats>,
    shutdown: CancellationToken,
    tasks: Vec<Component>,
}

/// One part of a running node: its name and its task, which returns a
/// failure as text (the part has logged it already).
struct Component {
    name: &'static str,
    join: JoinHandle<Result<(), String>>,
}

impl Component {
    fn spawn(
        name: &'static str,
        part: impl std::future::Future<Output = Result<(), String>> + Send + 'static,
    ) -> Self {
        Self {
            name,
            join: tokio::spawn(part),
        }
    }
}

impl RunningNode {
    /// The token that stops the node when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops the node and waits for its parts to end (at most `grace`, then
    /// they are aborted). Returns what went wrong, one line per part that
    /// failed, panicked or had to be aborted (empty when all ended well).
    pub async fn stop(self, grace: Duration) -> Vec<String> {
        self.shutdown.cancel();
        self.wait(grace).await
    }

    /// Waits until the node's shutdown token is cancelled and its parts end;
    /// returns what went wrong, as [`stop`](Self::stop) does.
    pub async fn wait(self, grace: Duration) -> Vec<String> {
        self.shutdown.cancelled().await;
        let deadline = tokio::time::Instant::now() + grace;
        let mut failures = Vec::new();
        for Component { name, mut join } in self.tasks {
            match tokio::time::timeout_at(deadline, &mut join).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => failures.push(format!("{name} failed: {err}")),
                Ok(Err(err)) => failures.push(format!("{name} panicked: {err}")),
                Err(_) => {
                    join.abort();
                    failures.push(format!("{name} did not stop within {grace:?}"));
                }
            }
        }
        info!("node stopped");
        failures
    }
}

/// Starts a node: opens the store, recovers orphaned attempts (single
/// node only), then serves.
pub async fn start(mut opts: NodeOptions) -> anyhow::Result<RunningNode> {
    opts.validate()?;
    if opts.with_worker.is_some() && opts.dispatcher.auth.enabled {
        // The in-process worker's own credential: random, never stored.
        let secret = taskmesh_core::auth::new_token(
            "node",
            "default",
            taskmesh_core::auth::Role::Worker,
            0,
            None,
        )
        .0;
        opts.dispatcher.auth.node_worker = Some(secret);
    }
    // Before any component records a figure.
    let metrics = crate::telemetry::prometheus();
    let (store, clock): (Arc<dyn Store>, Arc<dyn Clock>) = match &opts.database_url {
        Some(url) => {
            let store: Arc<dyn Store> = match DatabaseKind::of_url(url) {
                Some(DatabaseKind::Postgres) => Arc::new(Metered::new(
                    PostgresStore::connect(PostgresOptions::new(url.clone()))
                        .await
                        .context("connecting to Postgres")?,
                )),
                Some(DatabaseKind::Mysql) => Arc::new(Metered::new(
                    MysqlStore::connect(MysqlOptions::new(url.clone()))
                        .await
                        .context("connecting to MySQL/MariaDB")?,
                )),
                None => anyhow::bail!(
                    "the database URL must start with postgres://, postgresql://, mysql:// \
                     or mariadb:// (leave it unset for SQLite in the data directory)"
                ),
            };
            // Due-ness by the database's clock: a replica on a skewed host
            // still fires nothing early.
            let clock =
                StoreClock::start(store.clone(), Arc::new(SystemClock), Duration::from_secs(5))
                    .await
                    .context("reading the database clock")?;
            (store, Arc::new(clock))
        }
        None => {
            let db = opts.data_dir.join("taskmesh.db");
            let store: Arc<dyn Store> = Arc::new(Metered::new(
                SqliteStore::open(SqliteOptions::new(db.clone()))
                    .await
                    .with_context(|| format!("opening the SQLite store at {}", db.display()))?,
            ));
            (store, Arc::new(SystemClock))
        }
    };
    let coord = coordinator(&opts, store.clone(), clock.clone()).await?;

    let (reaped_tx, reaped_rx) = tokio::sync::mpsc::channel(1024);
    let breakers = Breakers::new(BreakerOptions::default());
    let mut scheduler_opts = opts.scheduler.clone();
    if let Some(redis) = &opts.redis {
        // Every live stream re-puts its registry entry within the worker TTL.
        scheduler_opts.registry_grace = redis.worker_ttl;
    }
    let mut scheduler = Scheduler::build(
        scheduler_opts,
        store.clone(),
        coord.clone(),
        clock.clone(),
        breakers.clone(),
        reaped_tx,
    );
    let mut dispatcher_opts = opts.dispatcher.clone();
    // What Admin.GetRetention shows is what the scheduler applies.
    dispatcher_opts.retention = opts.scheduler.retention.horizons_ms();
    dispatcher_opts.egress = opts.egress.clone();
    let dispatcher = Dispatcher::build(
        dispatcher_opts,
        store.clone(),
        coord.clone(),
        clock.clone(),
        scheduler.handle(),
        breakers,
        reaped_rx,
    );
    // A fired task may be claimed for one of this node's streams in the
    // fire's own commit (when this node leads and has a free stream).
    scheduler.dispatch_fires_with(dispatcher.fire_dispatch());
    let dispatch_stats = dispatcher.stats();
    // A single node held every stream: whatever is in flight now was pushed
    // by its previous life and no stream survived. A cluster replica must
    // not do this: the other replicas' workers are running those attempts
    // (taking them back would run them twice). There the leader's orphan
    // sweep takes back the attempts of workers gone from the cluster-wide
    // registry, and a worker that reconnects has its earlier attempts taken
    // back when it registers.
    if opts.redis.is_none() {
        dispatcher
            .recover()
            .await
            .context("recovering in-flight tasks")?;
    }

    let grpc = TcpListener::bind(opts.grpc_addr)
        .await
        .with_context(|| format!("binding the gRPC address {}", opts.grpc_addr))?;
    let http = TcpListener::bind(opts.http_addr)
        .await
        .with_context(|| format!("binding the HTTP address {}", opts.http_addr))?;
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.local_addr()?;
    let shutdown = CancellationToken::new();
    // With TLS, connections are accepted (and handshaken) here; the gateway
    // reaches the gRPC service through an in-process pipe.
    let grpc_gate = crate::conn::Gate::new(opts.conn_limits, "grpc");
    let http_gate = crate::conn::Gate::new(opts.conn_limits, "http");
    let (plain, tls) = match &opts.tls {
        Some(files) => {
            let tls = crate::tls::Tls::load(files.clone()).context("loading the TLS files")?;
            tls.watch(opts.tls_reload_interval, shutdown.child_token());
            let (incoming, local) =
                crate::tls::grpc_incoming(grpc, grpc_gate, tls.clone(), shutdown.child_token());
            let http = crate::tls::http_listener(http, http_gate, tls, shutdown.child_token())?;
            (None, Some((incoming, local, http)))
        }
        None => (Some((grpc, grpc_gate, http, http_gate)), None),
    };
    let local_channel = tls.as_ref().map(|(_, local, _)| local.clone());

    let gateway = Gateway::build(
        GatewayOptions {
            max_body_bytes: opts.max_body_bytes,
            max_message_bytes: opts.dispatcher.max_message_bytes,
            grpc_channel: local_channel,
            header_read_timeout: opts.header_read_timeout,
            body_read_timeout: opts.dispatcher.request_body_timeout,
            max_streams_per_connection: opts.dispatcher.max_streams_per_connection,
            ..GatewayOptions::new(format!("http://{}", loopback(grpc_addr)))
        },
        readiness(store.clone(), coord.clone()),
    )
    .context("building the REST gateway")?
    .with_routes(metrics_router(
        dispatcher.shared().auth.clone(),
        opts.open_metrics
            .unwrap_or(opts.http_addr.ip().is_loopback())
            || !opts.dispatcher.auth.enabled,
    ));
    let mut callback_opts = opts.callbacks.clone();
    callback_opts.egress = opts.egress.clone();
    let deliverer = Deliverer::build(callback_opts, store.clone(), clock.clone())
        .context("building the callback deliverer")?;

    let mut tasks = Vec::new();
    let scheduler_shutdown = shutdown.child_token();
    tasks.push(Component::spawn("scheduler", async move {
        scheduler.run(scheduler_shutdown).await;
        Ok(())
    }));
    let grpc_shutdown = shutdown.child_token();
    let http_shutdown = shutdown.child_token();
    type Serving<E> = futures::future::BoxFuture<'static, Result<(), E>>;
    let (grpc_server, http_server): (Serving<taskmesh_dispatcher::Error>, Serving<std::io::Error>) =
        match (plain, tls) {
            (Some((grpc, grpc_gate, http, http_gate)), _) => {
                info!(grpc_addr = %grpc_addr, http_addr = %http_addr, "serving");
                (
                    Box::pin(
                        dispatcher
                            .serve_incoming(crate::conn::incoming(grpc, grpc_gate), grpc_shutdown),
                    ),
                    Box::pin(gateway.serve_on(
                        crate::conn::GatedListener::new(http, http_gate),
                        http_shutdown,
                    )),
                )
            }
            (None, Some((incoming, _, http))) => {
                info!(grpc_addr = %grpc_addr, http_addr = %http_addr, "serving over TLS");
                (
                    Box::pin(dispatcher.serve_incoming(incoming, grpc_shutdown)),
                    Box::pin(gateway.serve_on(http, http_shutdown)),
                )
            }
            (None, None) => unreachable!("the listeners are plain or TLS"),
        };
    tasks.push(Component::spawn("grpc server", async move {
        grpc_server.await.map_err(|err| {
            warn!(error = %err, "grpc server failed");
            err.to_string()
        })
    }));
    tasks.push(Component::spawn("http server", async move {
        http_server.await.map_err(|err| {
            warn!(error = %err, "http server failed");
            err.to_string()
        })
    }));
    let deliverer_shutdown = shutdown.child_token();
    tasks.push(Component::spawn("callback deliverer", async move {
        deliverer.run(deliverer_shutdown).await;
        Ok(())
    }));
    if let Some(handle) = metrics {
        // Folds recorded histogram samples into their buckets between
        // scrapes, so memory stays bounded when nobody scrapes.
        let token = shutdown.child_token();
        tasks.push(Component::spawn("metrics upkeep", async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = token.cancelled() => return Ok(()),
                    _ = tick.tick() => handle.run_upkeep(),
                }
            }
        }));
    }
    if let Some(slots) = opts.with_worker {
        let token = opts.dispatcher.auth.node_worker.clone();
        tasks.push(Component::spawn(
            "local worker",
            local_worker(grpc_addr, slots, token, shutdown.child_token()),
        ));
    }
    info!(%grpc_addr, %http_addr, data_dir = %opts.data_dir.display(), "taskmesh node started");
    Ok(RunningNode {
        grpc_addr,
        http_addr,
        store,
        dispatch_stats,
        shutdown,
        tasks,
    })
}

/// Where the node reaches its own gRPC port: a wildcard listen address is
/// reached on loopback.
fn loopback(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            (std::net::Ipv4Addr::LOCALHOST, addr.port()).into()
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            (std::net::Ipv6Addr::LOCALHOST, addr.port()).into()
        }
        _ => addr,
    }
}

/// The `/metrics` route: open, or for callers whose token may read.
fn metrics_router(auth: Arc<taskmesh_dispatcher::auth::Authenticator>, open: bool) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let auth = auth.clone();
            async move {
                if !open {
                    let presented = headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok());
                    match auth.identify(presented).await {
                        Ok(who) if who.allows(taskmesh_dispatcher::auth::Need::Read) => {}
                        Ok(_) => {
                            return (StatusCode::FORBIDDEN, "this token may not read metrics\n")
                                .into_response();
                        }
                        Err(_) => {
                            return (
                                StatusCode::UNAUTHORIZED,
                                "missing or invalid token (authorization: Bearer <token>)\n",
                            )
                                .into_response();
                        }
                    }
                }
                metrics_route().await.into_response()
            }
        }),
    )
}

/// `GET /metrics`: the Prometheus text exposition format.
async fn metrics_route() -> (
    axum::http::StatusCode,
    [(axum::http::HeaderName, &'static str); 1],
    String,
) {
    use axum::http::{StatusCode, header::CONTENT_TYPE};
    match crate::telemetry::render() {
        Some(text) => (
            StatusCode::OK,
            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            text,
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
            "metrics are disabled: another recorder was installed in this process\n".into(),
        ),
    }
}

/// What `/readyz` checks: the store and coordination answer.
fn readiness(store: Arc<dyn Store>, coord: Arc<dyn Coordinator>) -> Readiness {
    Readiness::new()
        .check("store", move || {
            let store = store.clone();
            async move { store.ping().await.map_err(|e| e.to_string()) }
        })
        .check("coordination", move || {
            let coord = coord.clone();
            async move { coord.ping().await.map_err(|e| e.to_string()) }
        })
}

async fn local_worker(
    grpc_addr: SocketAddr,
    slots: u32,
    token: Option<String>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let mut opts = taskmesh_worker::WorkerOptions::new(vec![format!("http://{grpc_addr}")]);
    opts.concurrency = slots;
    opts.name = "local".into();
    opts.token = token.map(taskmesh_worker::Secret::new);
    let mut worker = taskmesh_worker::Worker::new(opts);
    for name in taskmesh_worker::builtin::BUILTIN_NAMES {
        if let Some(h) = taskmesh_worker::builtin::builtin(name) {
            worker.add_handler(*name, h);
        }
    }
    worker.run(shutdown).await.map_err(|err| {
        warn!(error = %err, "local worker failed");
        err.to_string()
    })
}
