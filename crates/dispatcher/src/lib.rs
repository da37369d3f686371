//! The gRPC front of taskmesh: the `TaskApi` and `Dispatcher` services, the
//! registry of live worker streams, the balancer, and the engine that claims
//! due tasks and pushes them.
//!
//! Architecture invariant: this crate speaks gRPC only; it never parses HTTP
//! or JSON (that is the gateway's job) and never writes SQL (the store's).

mod admin_api;
pub mod auth;
pub mod balancer;
mod batcher;
mod children;
pub mod convert;
mod engine;
mod error;
mod gauges;
mod health;
pub mod layers;
mod log_api;
mod logs;
mod lost;
mod ops_api;
mod push;
pub mod quota;
mod registry;
mod retention_api;
pub mod rules;
mod schedule_api;
mod stream;
mod submitter;
mod task_api;
pub mod trace_context;
mod workflow_api;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use taskmesh::v1::{dispatcher_server::DispatcherServer, task_api_server::TaskApiServer};
use taskmesh_coord::Coordinator;
use taskmesh_core::Clock;
use taskmesh_core::breaker::Breakers;
use taskmesh_scheduler::{Reaped, SchedulerHandle};
use taskmesh_store::Store;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use admin_api::AdminService;
pub use balancer::BalancerOptions;
pub use batcher::Batcher;
pub use engine::{DispatchStats, Shared};
pub use error::{Error, grpc_code};
pub use health::HEALTH_SERVICE_NAMES;
pub use logs::{LOG_LINES_TOTAL, LogOptions, LogWriter};
pub use lost::RECONNECTED as RELEASE_RECONNECTED;
pub use push::PushWorkers;
pub use registry::{Heartbeat, Registration, Registry, Reserved};
pub use stream::DispatcherService;
pub use submitter::Submitter;
pub use task_api::TaskApiService;

/// How long a node shutting down waits for its queued task log lines to
/// be written.
const LOG_DRAIN_WITHIN: Duration = Duration::from_secs(5);

/// How the dispatcher and its gRPC server behave.
#[derive(Debug, Clone)]
pub struct DispatcherOptions {
    /// A push not ACKed within this is taken back and sent elsewhere.
    pub ack_timeout: Duration,
    /// How long a stream's ACK is held in memory to be written with the
    /// task's result (`batcher` module); at most half `ack_timeout`.
    pub ack_hold: Duration,
    /// How often workers must send a heartbeat; three missed ones lose the stream.
    pub heartbeat_interval: Duration,
    /// Largest task payload accepted at submit.
    pub max_payload_bytes: usize,
    /// Most steps a workflow may have (1..=`workflow::MAX_STEPS`).
    pub max_workflow_steps: usize,
    /// Largest gRPC message decoded.
    pub max_message_bytes: usize,
    /// Unary requests running longer are cancelled with DEADLINE_EXCEEDED.
    pub request_timeout: Duration,
    /// Requests in flight above this are refused with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    /// A request's body (all but the bidirectional streams) must arrive
    /// within this, else DEADLINE_EXCEEDED; until it has, it holds no
    /// concurrency slot.
    pub request_body_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_streams_per_connection: u32,
    /// HTTP/2 keepalive: a PING after this much silence on a connection;
    /// unanswered within the same time, the connection is closed.
    pub keepalive_interval: Duration,
    /// Most tasks claimed per store transaction.
    pub claim_batch: usize,
    /// How often the store and coordination are pinged to decide the gRPC
    /// health status (each ping is also bounded by this).
    pub health_interval: Duration,
    /// Which balancer strategy serves which handler.
    pub balancer: BalancerOptions,
    /// How often the queue-depth and worker gauges are refreshed.
    pub gauge_interval: Duration,
    /// Authentication: tokens, the bootstrap token, what stays open.
    pub auth: auth::AuthOptions,
    /// Where callback URLs and push addresses may point.
    pub egress: taskmesh_core::egress::EgressPolicy,
    /// Quotas and rates per namespace.
    pub quotas: quota::QuotaOptions,
    /// Task logs: the cap per attempt, the node's write queue.
    pub logs: LogOptions,
    /// The server's retention horizons (its `--retention-*` flags), as
    /// `Admin.GetRetention` shows them; the node sets them from the
    /// scheduler's, which applies them.
    pub retention: taskmesh_core::retention::Horizons,
}

impl Default for DispatcherOptions {
    fn default() -> Self {
        Self {
            ack_timeout: Duration::from_secs(10),
            ack_hold: Duration::from_millis(100),
            heartbeat_interval: Duration::from_secs(5),
            max_payload_bytes: 1024 * 1024,
            max_workflow_steps: taskmesh_core::workflow::DEFAULT_MAX_STEPS,
            max_message_bytes: 4 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            max_concurrent_requests: 1024,
            request_body_timeout: Duration::from_secs(10),
            max_streams_per_connection: 256,
            keepalive_interval: Duration::from_secs(30),
            claim_batch: 256,
            health_interval: Duration::from_secs(2),
            balancer: BalancerOptions::default(),
            gauge_interval: Duration::from_secs(2),
            auth: auth::AuthOptions {
                cache_ttl: Duration::from_secs(5),
                ..auth::AuthOptions::default()
            },
            egress: taskmesh_core::egress::EgressPolicy::public_only(),
            quotas: quota::QuotaOptions::default(),
            logs: LogOptions::default(),
            retention: taskmesh_core::retention::Horizons::default(),
        }
    }
}

/// The dispatcher: services plus the engine, ready to serve.
pub struct Dispatcher {
    shared: Shared,
    reaped: mpsc::Receiver<Reaped>,
    pushes: mpsc::UnboundedReceiver<taskmesh_core::TaskRecord>,
    /// Dispatch at a write: the submitter's, and schedule fires'.
    at_write: Arc<submitter::AtWrite>,
}

impl Dispatcher {
    /// Builds a dispatcher. `reaped` carries attempts the scheduler ended.
    pub fn build(
        opts: DispatcherOptions,
        store: Arc<dyn Store>,
        coord: Arc<dyn Coordinator>,
        clock: Arc<dyn Clock>,
        scheduler: SchedulerHandle,
        breakers: Breakers,
        reaped: mpsc::Receiver<Reaped>,
    ) -> Self {
        let registry = Registry::new(opts.balancer.clone());
        let ack_hold = opts.ack_hold.min(opts.ack_timeout / 2);
        let logs = LogWriter::start(store.clone(), clock.clone(), opts.logs);
        let drained = Arc::new(std::sync::Mutex::new(engine::Drained::default()));
        let (push_tx, pushes) = mpsc::unbounded_channel();
        let at_write = Arc::new(submitter::AtWrite {
            registry: registry.clone(),
            drained: drained.clone(),
            ack_timeout: opts.ack_timeout,
            pushes: push_tx,
            clock: clock.clone(),
        });
        let authenticator = Arc::new(auth::Authenticator::new(
            store.clone(),
            clock.clone(),
            opts.auth.clone(),
        ));
        Self {
            shared: Shared {
                auth: authenticator,
                cluster_key: Arc::default(),
                shedding: Arc::default(),
                quotas: Arc::new(quota::Quotas::new(opts.quotas.clone())),
                opts,
                coord,
                registry,
                wake: Arc::new(Notify::new()),
                scheduler,
                breakers,
                batcher: Batcher::start(store.clone(), clock.clone(), 1_024, ack_hold),
                logs,
                submitter: Submitter::start_with(
                    store.clone(),
                    clock.clone(),
                    1_000,
                    Some(at_write.clone()),
                ),
                drained,
                stats: Arc::default(),
                push: Default::default(),
                store,
                clock,
            },
            reaped,
            pushes,
            at_write,
        }
    }

    /// Commits schedule fires claiming their tasks for this node's free
    /// streams at once (`Scheduler::dispatch_fires_with`), as submits do.
    pub fn fire_dispatch(&self) -> Arc<dyn taskmesh_scheduler::FireDispatch> {
        self.at_write.clone()
    }

    /// Takes back every attempt left in flight by an earlier run of this
    /// node: no stream survives a restart, so their workers are lost to us.
    pub async fn recover(&self) -> Result<usize, Error> {
        let orphans = self.shared.store.in_flight(None).await?;
        let recovered = lost::release_lost(
            &self.shared,
            orphans,
            |_| true,
            "server restarted during the attempt",
        )
        .await?
        .len();
        if recovered > 0 {
            info!(
                recovered,
                "in-flight tasks from before the restart taken back"
            );
        }
        Ok(recovered)
    }

    /// The engine's counters.
    pub fn stats(&self) -> Arc<DispatchStats> {
        self.shared.stats.clone()
    }

    /// Refreshes the queue-depth and worker gauges now (the node does it
    /// every `gauge_interval`).
    pub async fn refresh_gauges(shared: &Shared) {
        gauges::refresh(shared, &mut Default::default()).await;
    }

    /// The shared state (for in-process callers such as the REST gateway).
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Serves gRPC on `listener` until `shutdown`, running the engine and
    /// the health watch alongside: `TaskApi`, `Dispatcher`,
    /// `grpc.health.v1.Health` and server reflection (v1 and v1alpha).
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), Error> {
        let addr: Option<SocketAddr> = listener.local_addr().ok();
        info!(grpc_addr = ?addr, "grpc server listening");
        // Nagle off on every accepted connection: an assignment or a receipt
        // is one small frame, and held back until the peer's delayed ACK
        // (40 ms on Linux) it cost every task that much between push and
        // ACK. tonic ignores `Server::tcp_nodelay` with an incoming stream of
        // our own, so it is set here.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |conn| {
                conn.inspect(|tcp| {
                    if let Err(err) = tcp.set_nodelay(true) {
                        warn!(error = %err, "cannot set TCP_NODELAY on a connection");
                    }
                })
            },
        );
        self.serve_incoming(incoming, shutdown).await
    }

    /// [`serve`](Self::serve) on connections the caller accepts (TLS
    /// streams, in-process pipes): whatever `incoming` yields.
    pub async fn serve_incoming<I, IO, IE>(
        self,
        incoming: I,
        shutdown: CancellationToken,
    ) -> Result<(), Error>
    where
        I: futures::Stream<Item = Result<IO, IE>>,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Dispatcher {
            shared,
            reaped,
            pushes,
            at_write: _,
        } = self;
        let opts = shared.opts.clone();
        // Assignment secrets need the cluster key before the first push.
        if shared.cluster_key.get().is_none() {
            let key = shared.store.cluster_key().await?;
            let _ = shared.cluster_key.set(key);
        }
        // Built first: the descriptor set is fixed at compile time, but a bad
        // one must stop the node before it listens, not fail per request.
        let (reflection_v1, reflection_v1alpha) = health::reflection()?;
        let rules = std::sync::Arc::new(rules::RequestRules::load().map_err(Error::Rules)?);

        // The first probe runs before the port opens, so the very first
        // health check already tells the truth (and names every service).
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let mut health = health::HealthWatch::new(reporter, shared.clone(), opts.health_interval);
        health.probe().await;
        let health_task = tokio::spawn(health.run(shutdown.clone()));
        let engine = tokio::spawn(engine::run(
            shared.clone(),
            reaped,
            pushes,
            shutdown.clone(),
        ));
        // The first refresh before the port opens: the gauges and the
        // backlog quota start from the store's counts, not from zero.
        let mut seen = gauges::Seen::default();
        gauges::refresh(&shared, &mut seen).await;
        let gauges = tokio::spawn(gauges::run(
            shared.clone(),
            opts.gauge_interval,
            seen,
            shutdown.clone(),
        ));

        let max = opts.max_message_bytes;
        let task_api = TaskApiServer::new(TaskApiService::new(shared.clone()))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let dispatcher = DispatcherServer::new(DispatcherService::new(shared.clone()))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let admin = taskmesh::v1::admin_server::AdminServer::new(AdminService::new(shared.clone()))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);

        let drain = shared.clone();
        let result = tonic::transport::Server::builder()
            // Outermost: a span per request, so everything below logs inside
            // it; it continues the caller's W3C trace (`traceparent`).
            .trace_fn(|req| {
                let path = req.uri().path();
                let span = tracing::info_span!("grpc", path = %path, otel.name = %path, otel.kind = "server");
                if let Some(tp) = req.headers().get("traceparent").and_then(|v| v.to_str().ok()) {
                    trace_context::continue_from(&span, tp);
                }
                span
            })
            // Then the deadline: a unary call that takes longer is cut off
            // (streams are unaffected once their response has started).
            .timeout(opts.request_timeout)
            // Per connection: a bound on open streams, and PINGs that close
            // a connection whose peer went silent.
            .max_concurrent_streams(Some(opts.max_streams_per_connection))
            .http2_keepalive_interval(Some(opts.keepalive_interval))
            .http2_keepalive_timeout(Some(opts.keepalive_interval))
            // Then the whole request is read (within request_body_timeout)
            // before it may take a slot: headers without a body hold none.
            .layer(layers::WholeBodyLayer::new(
                opts.request_body_timeout,
                opts.max_message_bytes.saturating_add(64 * 1024),
            ))
            // Then shedding: refuse at once past the limit rather than queue.
            // Health checks pass through it on purpose: a node refusing work
            // should also look unavailable to a load balancer's probe.
            .layer(layers::ShedLayer::new(opts.max_concurrent_requests))
            // Then who is calling: inside the shedder, so a flood of bad
            // tokens is refused before it costs token look-ups, and before
            // every service, so none is reached unidentified. Health passes
            // (a probe carries no token); what a request names (its
            // namespace) is checked by the handler.
            .layer(auth::AuthLayer::new(shared.auth.clone()))
            // Then the contract's rules (buf.validate in proto/): a request
            // that breaks one is INVALID_ARGUMENT before any handler runs.
            .layer(rules::RulesLayer::new(rules))
            // The contract's services.
            .add_service(task_api)
            .add_service(dispatcher)
            .add_service(admin)
            // Operations: health follows the store and coordination; reflection
            // lets grpcurl and friends discover the contract without proto/.
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .serve_with_incoming_shutdown(incoming, async move {
                shutdown.cancelled().await;
                // Push links stop; their sessions are lost like the streams
                // this shutdown closes.
                drain.push.stop();
                for tx in drain.registry.senders() {
                    let _ = tx.try_send(Ok(Box::new(taskmesh::v1::ConnectResponse {
                        message: Some(taskmesh::v1::connect_response::Message::Drain(
                            taskmesh::v1::WorkerDrain {
                                reason: "server shutting down".into(),
                            },
                        )),
                    })));
                }
            })
            .await;
        // The streams are closed: what their workers sent last is written
        // before the node goes, within a bound (a store that does not
        // answer must not hold the shutdown).
        if !shared.logs.drain(LOG_DRAIN_WITHIN).await {
            warn!(
                within_s = LOG_DRAIN_WITHIN.as_secs(),
                "task log lines still queued at shutdown were not written"
            );
        }
        if let Err(err) = engine.await {
            warn!(error = %err, "dispatch engine ended abnormally");
        }
        if let Err(err) = gauges.await {
            warn!(error = %err, "gauge refresher ended abnormally");
        }
        if let Err(err) = health_task.await {
            warn!(error = %err, "health watch ended abnormally");
        }
        Ok(result?)
    }
}
