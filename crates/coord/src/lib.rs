//! Coordination between replicas: the leader lease with its fencing token,
//! the cluster-wide worker registry and idempotency keys, behind the
//! [`Coordinator`] trait.
//!
//! Two backends: [`LocalCoordinator`] (one process, in memory) and
//! [`RedisCoordinator`] (many replicas sharing one Redis). Both pass the
//! same [`conformance`] suite, so the rest of the system cannot tell them
//! apart.
//!
//! Architecture invariant: a coordinator never touches SQL. The fencing token
//! it hands out is the only proof of leadership the store accepts; a leader
//! that lost its lease must stop acting as leader before its next round.
//! Tokens strictly increase across leaders and are never handed out twice.

pub mod conformance;
mod local;
pub mod metered;
mod redis;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use taskmesh_core::{ErrorCode, UnixMillis};

pub use self::local::LocalCoordinator;
pub use self::metered::Metered;
pub use self::redis::{RedisCoordinator, RedisOptions, TokenFloor};

/// Result of coordinator operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in coordination.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; nothing was changed.
    #[error("invalid coordination request: {0}")]
    InvalidArgument(String),
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
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
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
    /// The namespace whose tasks it runs.
    pub namespace: String,
    /// Who opened the session (the dispatcher's `Identity::principal`): no
    /// other identity may register under this worker id while it lives.
    pub owner: String,
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
    /// True for a push worker (the dispatcher calls its Worker service);
    /// false for one holding a stream.
    pub push: bool,
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
///
/// Timing contract of the lease: the holder calls
/// [`acquire_or_renew`](Coordinator::acquire_or_renew) at least every
/// [`renew_interval`](Coordinator::renew_interval) and before every round of
/// leader work, and stops acting as leader once the returned
/// `expires_at` has passed without a successful renewal. `expires_at` is
/// computed conservatively (from the moment the request was sent, less a
/// drift allowance), so the holder stops before any other node can take the
/// lease. A holder that is paused past that point and acts anyway is
/// refused by the store, because its token is older than its successor's.
#[async_trait]
pub trait Coordinator: Send + Sync + 'static {
    /// This replica's id.
    fn node_id(&self) -> &str;

    /// How often the holder should renew its lease (a third of the TTL or
    /// less, so one lost renewal does not cost the lease).
    fn renew_interval(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// Takes the lease if it is free or renews it if this node holds it.
    /// `None` when another node holds it. A renewal keeps the token; a fresh
    /// acquisition gets a token larger than any handed out before.
    async fn acquire_or_renew(&self) -> Result<Option<Lease>>;

    /// Gives the lease up (on shutdown), so a successor need not wait for it
    /// to lapse. Does nothing when another node holds it.
    async fn resign(&self) -> Result<()>;

    /// The node holding the lease now, if any (for operators' views; a
    /// node acts as leader only on its own `acquire_or_renew`).
    async fn leader(&self) -> Result<Option<String>>;

    /// Adds or replaces a worker stream in the registry. Backends shared by
    /// many replicas forget an entry that is not put again within their
    /// worker TTL (its replica died), so the holder re-puts it on every
    /// heartbeat. An empty session id is [`Error::InvalidArgument`].
    async fn put_worker(&self, entry: WorkerEntry) -> Result<()>;

    /// Removes a worker stream from the registry.
    async fn remove_worker(&self, session_id: &str) -> Result<()>;

    /// Every registered worker stream, in session-id order.
    async fn list_workers(&self) -> Result<Vec<WorkerEntry>>;

    /// Stores `value` under `key` for `ttl_ms` unless the key exists; returns
    /// the value already stored, or `None` when this call stored it. An
    /// empty key or a `ttl_ms` below 1 is [`Error::InvalidArgument`].
    async fn put_idempotency_key(
        &self,
        key: &str,
        value: &str,
        ttl_ms: i64,
    ) -> Result<Option<String>>;

    /// Says, for `ttl`, that this node reaches its store. The health watch
    /// says it again after every probe that finds the store well, so a node
    /// that loses its store can tell whether another node could take its
    /// workers ([`peers_reaching_store`](Self::peers_reaching_store)). A
    /// `ttl` below 1 ms is [`Error::InvalidArgument`].
    async fn mark_store_reachable(&self, ttl: Duration) -> Result<()>;

    /// The other nodes whose word that they reach the store has not lapsed,
    /// in node-id order.
    async fn peers_reaching_store(&self) -> Result<Vec<String>>;

    /// Checks the coordination service answers.
    async fn ping(&self) -> Result<()>;
}

/// Refuses a reachability mark that cannot be stored.
pub(crate) fn check_mark_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) {
        return Err(Error::InvalidArgument(
            "a store reachability mark needs a ttl of at least 1 ms".into(),
        ));
    }
    Ok(())
}

/// Refuses a registry entry that cannot be stored.
pub(crate) fn check_entry(entry: &WorkerEntry) -> Result<()> {
    if entry.session_id.is_empty() {
        return Err(Error::InvalidArgument(
            "worker entry has an empty session_id".into(),
        ));
    }
    Ok(())
}

/// Refuses an idempotency key that cannot be stored.
pub(crate) fn check_idempotency(key: &str, ttl_ms: i64) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidArgument("idempotency key is empty".into()));
    }
    if ttl_ms < 1 {
        return Err(Error::InvalidArgument(format!(
            "idempotency key ttl_ms must be at least 1, got {ttl_ms}"
        )));
    }
    Ok(())
}
