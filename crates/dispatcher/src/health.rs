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

use std::sync::Arc;
use std::time::Duration;

use taskmesh::v1::{dispatcher_server::DispatcherServer, task_api_server::TaskApiServer};
use taskmesh_coord::Coordinator;
use taskmesh_store::Store;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

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

/// Keeps the health statuses in line with the store and the coordinator.
pub(crate) struct HealthWatch {
    reporter: HealthReporter,
    store: Arc<dyn Store>,
    coord: Arc<dyn Coordinator>,
    interval: Duration,
    /// Whether the last probe found everything healthy (`None` before the first).
    last: Option<bool>,
}

impl HealthWatch {
    pub(crate) fn new(
        reporter: HealthReporter,
        store: Arc<dyn Store>,
        coord: Arc<dyn Coordinator>,
        interval: Duration,
    ) -> Self {
        Self {
            reporter,
            store,
            coord,
            interval,
            last: None,
        }
    }

    /// Pings the store and the coordinator once and publishes the outcome.
    pub(crate) async fn probe(&mut self) {
        // A ping that hangs is as bad as one that fails: bound it by the
        // polling interval so a stuck store reads NOT_SERVING, not stale SERVING.
        let limit = self.interval.max(Duration::from_millis(100));
        let store = tokio::time::timeout(limit, self.store.ping()).await;
        let coord = tokio::time::timeout(limit, self.coord.ping()).await;
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

    async fn set_all(&self, status: ServingStatus) {
        for name in HEALTH_SERVICE_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
