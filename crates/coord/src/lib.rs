//! Coordination between replicas: the leader lease with its fencing token,
//! the cluster-wide worker registry and idempotency keys, behind the
//! [`Coordinator`] trait.
//!
//! Architecture invariant: a coordinator never touches SQL. The fencing token
//! it hands out is the only proof of leadership the store accepts; a leader
//! that lost its lease must stop acting as leader before its next round.

mod local;

use std::collections::BTreeMap;

use async_trait::async_trait;
use taskmesh_core::{ErrorCode, UnixMillis};

pub use local::LocalCoordinator;

/// Result of coordinator operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in coordination.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The coordination service cannot be reached.
    #[error("coordination unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error("coordination error: {0}")]
    Internal(String),
}

impl Error {
    /// The transport-independent code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// Proof of leadership: valid until `expires_at`; every leader write carries
/// `token`, and the store refuses tokens older than the newest it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Monotonic fencing token; a new leader always gets a larger one.
    pub token: u64,
    /// When the lease lapses unless renewed.
    pub expires_at: UnixMillis,
}

/// A worker stream as the cluster sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerEntry {
    /// Session id of the stream (unique per connection).
    pub session_id: String,
    /// The worker's own id.
    pub worker_id: String,
    /// Human-readable name.
    pub name: String,
    /// The replica holding the stream.
    pub node_id: String,
    /// Handlers served.
    pub handlers: Vec<String>,
    /// Slots.
    pub capacity: u32,
    /// Labels carried.
    pub labels: BTreeMap<String, String>,
    /// Balancer weight.
    pub weight: u32,
    /// Latest load figures.
    pub load: WorkerLoad,
    /// When last heard from.
    pub last_seen: UnixMillis,
    /// True once draining.
    pub draining: bool,
}

/// Load figures from a heartbeat plus the dispatcher's own count.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WorkerLoad {
    /// Tasks pushed and not finished, as the dispatcher counts them.
    pub active: u32,
    /// CPU idle percentage reported by the worker.
    pub cpu_idle_percent: f64,
    /// Average task cost reported by the worker.
    pub avg_cost_ms: f64,
}

/// Leader election, worker registry and idempotency keys.
#[async_trait]
pub trait Coordinator: Send + Sync + 'static {
    /// This replica's id.
    fn node_id(&self) -> &str;

    /// Takes the lease if it is free or renews it if this node holds it.
    /// `None` when another node holds it.
    async fn acquire_or_renew(&self) -> Result<Option<Lease>>;

    /// Gives the lease up (on shutdown), so a successor need not wait for it
    /// to lapse.
    async fn resign(&self) -> Result<()>;

    /// Adds or replaces a worker stream in the registry.
    async fn put_worker(&self, entry: WorkerEntry) -> Result<()>;

    /// Removes a worker stream from the registry.
    async fn remove_worker(&self, session_id: &str) -> Result<()>;

    /// Every registered worker stream, in session-id order.
    async fn list_workers(&self) -> Result<Vec<WorkerEntry>>;

    /// Stores `value` under `key` for `ttl_ms` unless the key exists; returns
    /// the value already stored, or `None` when this call stored it.
    async fn put_idempotency_key(
        &self,
        key: &str,
        value: &str,
        ttl_ms: i64,
    ) -> Result<Option<String>>;

    /// Checks the coordination service answers.
    async fn ping(&self) -> Result<()>;
}
