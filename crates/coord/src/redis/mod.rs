//! The [`Coordinator`] on Redis, for many `serve` replicas sharing one Redis
//! (a single primary, optionally behind Sentinel; not Redis Cluster: the
//! scripts touch keys they compute from the prefix).
//!
//! Keys, all under `key_prefix`:
//!
//! | key | type | what |
//! | --- | --- | --- |
//! | `leader` | string `"{token}:{node_id}#{instance}"`, `PX lease_ttl` | the lease |
//! | `fence` | integer | the newest fencing token handed out |
//! | `workers` | set of session ids | index of the registry |
//! | `worker:{session_id}` | JSON, `PX worker_ttl` | one worker stream |
//! | `idem:{key}` | string, `PX ttl` | an idempotency key |
//! | `store-ok` | sorted set of node ids, scored by when their word lapses (Redis's clock, ms) | the nodes that reach their store |
//!
//! Every call runs under `op_timeout` on a [`ConnectionManager`] that
//! reconnects by itself, so an outage is an [`Error::Unavailable`] naming
//! the server within that bound, never a hang, and the first calls after
//! the server returns succeed again without anyone restarting anything.
//! How tokens stay increasing when Redis loses its data is in `lease.rs`.

mod lease;
mod registry;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};
use async_trait::async_trait;

use crate::{Coordinator, Error, Lease, Result, WorkerEntry, check_entry, check_idempotency};

/// Where the newest fencing token the store has accepted comes from (in
/// `serve`: `Store::fence_token`). A fresh lease is always issued above it,
/// so a Redis that lost its data never hands out a token the store has
/// already seen.
#[async_trait]
pub trait TokenFloor: Send + Sync + 'static {
    /// The newest token any leader has written, or why it cannot be read.
    async fn token_floor(&self) -> std::result::Result<u64, String>;
}

/// How to reach Redis and how long leases and registry entries last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://`, `unix://`).
    pub url: String,
    /// Prepended to every key, so several clusters (or tests) share a server.
    pub key_prefix: String,
    /// This replica's id, as shown in the registry and the lease.
    pub node_id: String,
    /// How long the lease lasts without renewal (default 10 s).
    pub lease_ttl: Duration,
    /// How often the holder renews (default 3 s); below `lease_ttl`.
    pub renew_interval: Duration,
    /// How long a registry entry lives unless put again (default 15 s, three
    /// worker heartbeats).
    pub worker_ttl: Duration,
    /// Upper bound of every call, reconnection included (default 1 s).
    pub op_timeout: Duration,
}

impl RedisOptions {
    /// Defaults for the server at `url` and the replica `node_id`.
    pub fn new(url: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            key_prefix: "taskmesh:".into(),
            node_id: node_id.into(),
            lease_ttl: Duration::from_secs(10),
            renew_interval: Duration::from_secs(3),
            worker_ttl: Duration::from_secs(15),
            op_timeout: Duration::from_secs(1),
        }
    }

    /// Refuses options the coordinator cannot honour.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidArgument(why));
        if self.url.is_empty() {
            return bad("redis url is empty".into());
        }
        if self.node_id.is_empty() {
            return bad("node id is empty".into());
        }
        if self.lease_ttl < Duration::from_millis(10) {
            return bad(format!(
                "lease ttl must be at least 10 ms, got {:?}",
                self.lease_ttl
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_ttl {
            return bad(format!(
                "renew interval must be above zero and below the lease ttl ({:?}), got {:?}",
                self.lease_ttl, self.renew_interval
            ));
        }
        if self.worker_ttl < Duration::from_millis(1) {
            return bad("worker ttl must be at least 1 ms".into());
        }
        if self.op_timeout.is_zero() {
            return bad("op timeout must be above zero".into());
        }
        Ok(())
    }
}

/// Coordination through one Redis server. Cheap to clone.
#[derive(Clone)]
pub struct RedisCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    opts: RedisOptions,
    /// `host:port` for messages; never the URL, which may hold a password.
    addr: String,
    /// The lease's owner field: node id plus a per-process nonce, so a
    /// restarted replica with the same node id does not inherit (and reuse
    /// the token of) its predecessor's lease.
    owner: String,
    conn: ConnectionManager,
    scripts: Scripts,
    /// The newest token this process has seen or been told about; fresh
    /// tokens are issued above it.
    floor: AtomicU64,
    floor_source: Mutex<Option<Arc<dyn TokenFloor>>>,
}

struct Scripts {
    lease: Script,
    resign: Script,
    list: Script,
    idempotency: Script,
    mark_store: Script,
    peers_store: Script,
}

impl RedisCoordinator {
    /// Connects to the server in `opts.url` and checks it answers. An
    /// unreachable server is [`Error::Unavailable`] naming it, after at most
    /// `op_timeout`.
    pub async fn connect(opts: RedisOptions) -> Result<Self> {
        opts.validate()?;
        // The parse error never repeats the URL, which may carry a password.
        let client = ::redis::Client::open(opts.url.as_str())
            .map_err(|e| Error::InvalidArgument(format!("invalid redis url: {e}")))?;
        let addr = client.get_connection_info().addr().to_string();
        // One quick retry inside the manager; the caller's next call starts a
        // fresh attempt, so a long outage costs each call at most op_timeout.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.op_timeout))
            .set_response_timeout(Some(opts.op_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| Error::Internal(format!("redis connection manager: {e}")))?;
        let owner = format!("{}#{}", opts.node_id, uuid::Uuid::new_v4().simple());
        let this = Self {
            inner: Arc::new(Inner {
                opts,
                addr,
                owner,
                conn,
                scripts: Scripts {
                    lease: Script::new(lease::LEASE_LUA),
                    resign: Script::new(lease::RESIGN_LUA),
                    list: Script::new(registry::LIST_LUA),
                    idempotency: Script::new(IDEMPOTENCY_LUA),
                    mark_store: Script::new(MARK_STORE_LUA),
                    peers_store: Script::new(PEERS_STORE_LUA),
                },
                floor: AtomicU64::new(0),
                floor_source: Mutex::new(None),
            }),
        };
        this.ping().await?;
        Ok(this)
    }

    /// The options this coordinator runs with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.opts
    }

    /// Raises the token floor: every later fresh lease gets a token above
    /// `floor`. Never lowers it.
    pub fn set_token_floor(&self, floor: u64) {
        self.inner.floor.fetch_max(floor, Ordering::SeqCst);
    }

    /// Consults `source` (in `serve`: the store's newest fencing token) each
    /// time this node takes a free lease, and issues the token above it. If
    /// the source cannot be read the lease is not taken
    /// ([`Error::Unavailable`]): a leader that cannot reach the store could
    /// not lead anyway.
    pub fn set_token_floor_source(&self, source: Arc<dyn TokenFloor>) {
        *self
            .inner
            .floor_source
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// The node id of the lease holder, if any.
    pub async fn leader(&self) -> Result<Option<String>> {
        let key = self.key("leader");
        let mut conn = self.inner.conn.clone();
        let value: Option<String> = self
            .call("get leader", async move {
                ::redis::cmd("GET").arg(key).query_async(&mut conn).await
            })
            .await?;
        Ok(value.as_deref().and_then(lease::holder_node))
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.inner.opts.key_prefix)
    }

    /// Runs one Redis call under `op_timeout`, naming `op` in the error.
    async fn call<T>(&self, op: &str, fut: impl Future<Output = RedisResult<T>>) -> Result<T> {
        let limit = self.inner.opts.op_timeout;
        match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.map_err(op, &e)),
            Err(_) => Err(Error::Unavailable(format!(
                "redis at {} did not answer {op} within {} ms",
                self.inner.addr,
                limit.as_millis()
            ))),
        }
    }

    fn map_err(&self, op: &str, e: &RedisError) -> Error {
        let unreachable = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::ClusterDown
                )
            );
        if unreachable {
            Error::Unavailable(format!(
                "redis at {} is unreachable ({op}): {e}",
                self.inner.addr
            ))
        } else {
            Error::Internal(format!("redis {op} at {} failed: {e}", self.inner.addr))
        }
    }
}

impl fmt::Debug for RedisCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCoordinator")
            .field("addr", &self.inner.addr)
            .field("key_prefix", &self.inner.opts.key_prefix)
            .field("owner", &self.inner.owner)
            .finish_non_exhaustive()
    }
}

/// Marks ARGV[1] as reaching its store for ARGV[2] ms, on Redis's clock
/// (no replica's clock matters); drops lapsed marks; the set itself lapses
/// when nobody marks for a while.
const MARK_STORE_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 4)
return 1
";

/// The nodes whose mark has not lapsed, on Redis's clock.
const PEERS_STORE_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
";

/// First writer wins: store unless present, else return what is there.
/// One script so the answer and the write cannot be split by an expiry.
const IDEMPOTENCY_LUA: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
";

#[async_trait]
impl Coordinator for RedisCoordinator {
    fn node_id(&self) -> &str {
        &self.inner.opts.node_id
    }

    fn renew_interval(&self) -> Duration {
        self.inner.opts.renew_interval
    }

    async fn acquire_or_renew(&self) -> Result<Option<Lease>> {
        self.lease_round().await
    }

    async fn resign(&self) -> Result<()> {
        self.resign_lease().await
    }

    async fn leader(&self) -> Result<Option<String>> {
        RedisCoordinator::leader(self).await
    }

    async fn put_worker(&self, entry: WorkerEntry) -> Result<()> {
        check_entry(&entry)?;
        self.put_entry(&entry).await
    }

    async fn remove_worker(&self, session_id: &str) -> Result<()> {
        self.remove_entry(session_id).await
    }

    async fn list_workers(&self) -> Result<Vec<WorkerEntry>> {
        self.list_entries().await
    }

    async fn put_idempotency_key(
        &self,
        key: &str,
        value: &str,
        ttl_ms: i64,
    ) -> Result<Option<String>> {
        check_idempotency(key, ttl_ms)?;
        let mut conn = self.inner.conn.clone();
        let mut invocation = self
            .inner
            .scripts
            .idempotency
            .key(self.key(&format!("idem:{key}")));
        invocation.arg(value).arg(ttl_ms);
        self.call("idempotency key", async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    async fn mark_store_reachable(&self, ttl: Duration) -> Result<()> {
        crate::check_mark_ttl(ttl)?;
        let mut conn = self.inner.conn.clone();
        let mut invocation = self.inner.scripts.mark_store.key(self.key("store-ok"));
        invocation
            .arg(&self.inner.opts.node_id)
            .arg(ttl.as_millis() as u64);
        let _: i64 = self
            .call("store reachability mark", async move {
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        Ok(())
    }

    async fn peers_reaching_store(&self) -> Result<Vec<String>> {
        let mut conn = self.inner.conn.clone();
        let invocation = self.inner.scripts.peers_store.key(self.key("store-ok"));
        let mut nodes: Vec<String> = self
            .call("store reachability peers", async move {
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        nodes.retain(|n| *n != self.inner.opts.node_id);
        nodes.sort();
        Ok(nodes)
    }

    async fn ping(&self) -> Result<()> {
        let mut conn = self.inner.conn.clone();
        let answer: String = self
            .call("ping", async move {
                ::redis::cmd("PING").query_async(&mut conn).await
            })
            .await?;
        if answer != "PONG" {
            return Err(Error::Internal(format!(
                "redis at {} answered ping with {answer:?}",
                self.inner.addr
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(change: impl FnOnce(&mut RedisOptions), wanted: &str) {
        let mut opts = RedisOptions::new("redis://127.0.0.1:6379", "n1");
        change(&mut opts);
        match opts.validate() {
            Err(Error::InvalidArgument(why)) => assert!(
                why.contains(wanted),
                "expected an error mentioning {wanted:?}, got {why:?}"
            ),
            other => panic!("expected InvalidArgument mentioning {wanted:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let opts = RedisOptions::new("redis://127.0.0.1:6379", "n1");
        opts.validate().unwrap();
        assert_eq!(opts.lease_ttl, Duration::from_secs(10));
        assert_eq!(opts.renew_interval, Duration::from_secs(3));
    }

    #[test]
    fn bad_options_are_refused_with_the_reason() {
        check(|o| o.url.clear(), "url is empty");
        check(|o| o.node_id.clear(), "node id is empty");
        check(|o| o.lease_ttl = Duration::from_millis(5), "lease ttl");
        check(|o| o.renew_interval = o.lease_ttl, "renew interval");
        check(|o| o.renew_interval = Duration::ZERO, "renew interval");
        check(|o| o.worker_ttl = Duration::ZERO, "worker ttl");
        check(|o| o.op_timeout = Duration::ZERO, "op timeout");
    }

    #[tokio::test]
    async fn a_malformed_url_is_invalid_argument_without_echoing_it() {
        let mut opts = RedisOptions::new("http://user:secret@host", "n1");
        opts.url = "not a url with secret".into();
        match RedisCoordinator::connect(opts).await {
            Err(Error::InvalidArgument(why)) => {
                assert!(why.contains("invalid redis url"), "{why}");
                assert!(!why.contains("secret"), "the url leaked: {why}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
