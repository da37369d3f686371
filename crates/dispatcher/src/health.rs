//! gRPC health checking (`grpc.health.v1.Health`) whose answer follows the
//! node's real dependencies, and server reflection built from the contract's
//! descriptor set.
//!
//! Health is polled, not pushed: neither the store nor the coordinator tells
//! anyone when it breaks, so a cheap ping of each every
//! `DispatcherOptions::health_interval` decides SERVING or NOT_SERVING for the
//! whole server ("") and for every service on the port at once. A node whose
//! store is gone cannot accept or move a task, so no service of it is healthy
//! on its own.
//!
//! The same probes hand workers over when only this node lost its store
//! (a partition between it and the database): every probe that finds the
//! store well says so through the coordinator for three intervals
//! (`Coordinator::mark_store_reachable`); a node whose store has failed two
//! probes in a row, while another node's word is fresh, ends every worker
//! stream with UNAVAILABLE ([`SHED_MESSAGE`]), refuses `Connect` until its
//! store answers again and gives up the lease if it holds it, so its
//! workers fail over to the nodes that can record their work and one of
//! those leads. Alone (one node, or every node cut off from the
//! store) it keeps its streams: results wait for the store there rather
//! than being run again elsewhere.

use std::sync::atomic::Ordering;
use std::time::Duration;

use taskmesh::v1::{dispatcher_server::DispatcherServer, task_api_server::TaskApiServer};
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::engine::Shared;

/// The names a health check may ask about: the whole server and each
/// service served on the port.
pub const HEALTH_SERVICE_NAMES: [&str; 3] = [
    "",
    <TaskApiServer<crate::TaskApiService> as NamedService>::NAME,
    <DispatcherServer<crate::DispatcherService> as NamedService>::NAME,
];

/// Reflection services (v1 and v1alpha) describing the contract and the
/// health service. v1alpha stays because Python's grpcio-reflection and
/// older grpcurl releases speak only v1alpha.
pub(crate) fn reflection() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    // The encoded set keeps the `google.api.http` options, so a reflection
    // client sees the REST mapping too. Every service in it is listed,
    // `Worker` included: workers implement it, and clients need its schema.
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(taskmesh::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// Why a node that cannot reach its store ends its worker streams and
/// refuses new ones.
pub const SHED_MESSAGE: &str = "this server cannot reach its store; connect to another server";

/// Keeps the health statuses in line with the store and the coordinator,
/// and sheds the worker streams while only this node has lost its store.
pub(crate) struct HealthWatch {
    reporter: HealthReporter,
    shared: Shared,
    interval: Duration,
    /// Whether the last probe found everything healthy (`None` before the first).
    last: Option<bool>,
    /// Store probes failed in a row.
    store_failures: u32,
}

impl HealthWatch {
    pub(crate) fn new(reporter: HealthReporter, shared: Shared, interval: Duration) -> Self {
        Self {
            reporter,
            shared,
            interval,
            last: None,
            store_failures: 0,
        }
    }

    /// Pings the store and the coordinator once and publishes the outcome.
    pub(crate) async fn probe(&mut self) {
        // A ping that hangs is as bad as one that fails: bound it by the
        // polling interval so a stuck store reads NOT_SERVING, not stale SERVING.
        let limit = self.interval.max(Duration::from_millis(100));
        let store = tokio::time::timeout(limit, self.shared.store.ping()).await;
        let coord = tokio::time::timeout(limit, self.shared.coord.ping()).await;
        self.follow_store(matches!(store, Ok(Ok(())))).await;
        let problem = match (store, coord) {
            (Ok(Ok(())), Ok(Ok(()))) => None,
            (Err(_), _) => Some(format!("store ping took over {} ms", limit.as_millis())),
            (Ok(Err(err)), _) => Some(format!("store: {err}")),
            (_, Err(_)) => Some(format!(
                "coordination ping took over {} ms",
                limit.as_millis()
            )),
            (_, Ok(Err(err))) => Some(format!("coordination: {err}")),
        };
        let healthy = problem.is_none();
        match (&problem, self.last) {
            (Some(problem), Some(true) | None) => warn!(problem, "health: not serving"),
            (None, Some(false)) => info!("health: serving again"),
            _ => {}
        }
        if self.last != Some(healthy) {
            let status = if healthy {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            self.set_all(status).await;
            self.last = Some(healthy);
        }
    }

    /// Probes every interval until `shutdown`, then reports NOT_SERVING so
    /// load balancers stop sending while the server drains.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticker.tick() => self.probe().await,
            }
        }
        self.set_all(ServingStatus::NotServing).await;
    }

    /// After a store probe: says the store is reachable, or sheds the
    /// worker streams when it has failed twice in a row and another node
    /// reaches it; takes workers again once it answers.
    async fn follow_store(&mut self, store_ok: bool) {
        let coord = &self.shared.coord;
        let shedding = &self.shared.shedding;
        if store_ok {
            self.store_failures = 0;
            // Best effort: a coordinator outage shows in health already.
            let _ = coord.mark_store_reachable(self.interval * 3).await;
            if shedding.swap(false, Ordering::Relaxed) {
                info!("store reachable again: taking worker streams");
            }
            return;
        }
        self.store_failures += 1;
        if self.store_failures < 2 || shedding.load(Ordering::Relaxed) {
            return;
        }
        let peers = match coord.peers_reaching_store().await {
            Ok(peers) if !peers.is_empty() => peers,
            // Alone, or coordination is down too: keep the streams.
            _ => return,
        };
        shedding.store(true, Ordering::Relaxed);
        // A leader that cannot reach its store cannot fire or sweep; if its
        // store calls fail fast its rounds would still renew the lease. It
        // gives the lease up, and cannot take it again until its store
        // answers (a fresh lease reads the store's newest token first).
        if let Err(err) = coord.resign().await {
            warn!(error = %err, "cannot give up the lease");
        }
        let senders = self.shared.registry.senders();
        warn!(
            streams = senders.len(),
            ?peers,
            "store unreachable from this node but not from others: ending worker streams so they fail over"
        );
        for tx in senders {
            tokio::spawn(async move {
                let _ = tx
                    .send_timeout(
                        Err(tonic::Status::unavailable(SHED_MESSAGE)),
                        Duration::from_secs(1),
                    )
                    .await;
            });
        }
    }

    async fn set_all(&self, status: ServingStatus) {
        for name in HEALTH_SERVICE_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
