//! [`Metered`]: a [`Coordinator`] that times every call of the one it
//! wraps, as the histogram
//! `taskmesh_coord_call_duration_seconds{backend, op, outcome}` (Redis call
//! latencies when the backend is Redis). Every method is forwarded, those
//! with a default body included.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::{Coordinator, Lease, Result, WorkerEntry};

/// Name of the coordination latency histogram.
pub const COORD_CALL_SECONDS: &str = "taskmesh_coord_call_duration_seconds";

/// Times every call of the wrapped coordinator.
pub struct Metered<C> {
    inner: C,
    backend: &'static str,
}

impl<C: Coordinator> Metered<C> {
    /// Wraps `inner`; `backend` labels its figures ("local", "redis").
    pub fn new(inner: C, backend: &'static str) -> Self {
        Self { inner, backend }
    }

    async fn timed<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = call.await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!(COORD_CALL_SECONDS, "backend" => self.backend, "op" => op, "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        result
    }
}

#[async_trait]
impl<C: Coordinator> Coordinator for Metered<C> {
    fn node_id(&self) -> &str {
        self.inner.node_id()
    }

    fn renew_interval(&self) -> Duration {
        self.inner.renew_interval()
    }

    async fn acquire_or_renew(&self) -> Result<Option<Lease>> {
        self.timed("acquire_or_renew", self.inner.acquire_or_renew())
            .await
    }

    async fn resign(&self) -> Result<()> {
        self.timed("resign", self.inner.resign()).await
    }

    async fn leader(&self) -> Result<Option<String>> {
        self.timed("leader", self.inner.leader()).await
    }

    async fn put_worker(&self, entry: WorkerEntry) -> Result<()> {
        self.timed("put_worker", self.inner.put_worker(entry)).await
    }

    async fn remove_worker(&self, session_id: &str) -> Result<()> {
        self.timed("remove_worker", self.inner.remove_worker(session_id))
            .await
    }

    async fn list_workers(&self) -> Result<Vec<WorkerEntry>> {
        self.timed("list_workers", self.inner.list_workers()).await
    }

    async fn put_idempotency_key(
        &self,
        key: &str,
        value: &str,
        ttl_ms: i64,
    ) -> Result<Option<String>> {
        self.timed(
            "put_idempotency_key",
            self.inner.put_idempotency_key(key, value, ttl_ms),
        )
        .await
    }

    async fn mark_store_reachable(&self, ttl: Duration) -> Result<()> {
        self.timed("mark_store_reachable", self.inner.mark_store_reachable(ttl))
            .await
    }

    async fn peers_reaching_store(&self) -> Result<Vec<String>> {
        self.timed("peers_reaching_store", self.inner.peers_reaching_store())
            .await
    }

    async fn ping(&self) -> Result<()> {
        self.timed("ping", self.inner.ping()).await
    }
}
