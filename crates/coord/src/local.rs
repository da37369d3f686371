//! The in-process coordinator for a single node: this node is always the
//! leader, the registry is a map. Same contract as the Redis one, so the
//! rest of the system cannot tell them apart.
//!
//! Handles made with [`LocalCoordinator::sharing`] share one state under
//! different node ids, which is how the conformance suite checks the
//! two-node rules (one holder at a time, larger tokens for successors)
//! without a network.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskmesh_core::{Clock, SystemClock, UnixMillis};

use crate::{Coordinator, Lease, Result, WorkerEntry, check_entry, check_idempotency};

/// How long an in-process lease lasts before it must be renewed.
const LEASE_MS: i64 = 10_000;

/// Single-node coordination held in memory.
#[derive(Debug, Clone)]
pub struct LocalCoordinator {
    node_id: String,
    clock: Arc<dyn Clock>,
    lease_ms: i64,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    token: u64,
    /// The holder's node id and its lease.
    held: Option<(String, Lease)>,
    workers: BTreeMap<String, WorkerEntry>,
    /// Nodes that said they reach the store, and until when.
    store_ok: BTreeMap<String, UnixMillis>,
    keys: BTreeMap<String, (String, UnixMillis)>,
}

impl LocalCoordinator {
    /// A coordinator for the node `node_id` on the system clock.
    pub fn new(node_id: impl Into<String>) -> Self {
        Self::with_clock(node_id, Arc::new(SystemClock))
    }

    /// A coordinator on the given clock (tests drive a fake one).
    pub fn with_clock(node_id: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self {
            node_id: node_id.into(),
            clock,
            lease_ms: LEASE_MS,
            state: Arc::default(),
        }
    }

    /// The same coordinator with leases lasting `ttl` (at least 1 ms)
    /// instead of 10 s.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        self
    }

    /// Another handle on this coordinator's state under `node_id`, as a
    /// second replica would see it: same lease, registry and keys, same
    /// clock and lease TTL.
    pub fn sharing(&self, node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            ..self.clone()
        }
    }

    /// Raises the token counter to `floor`, so the next fresh lease gets a
    /// token above it; never lowers it. Call it at start-up with the store's
    /// newest fencing token: this state is lost with the process, the
    /// store's token is not, and a restarted node would otherwise start at 1
    /// and have every leader write refused.
    pub fn set_token_floor(&self, floor: u64) {
        let mut st = self.lock();
        st.token = st.token.max(floor);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves only plain maps behind;
        // carrying on with them is safe.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Coordinator for LocalCoordinator {
    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn renew_interval(&self) -> Duration {
        Duration::from_millis((self.lease_ms / 3).max(1) as u64)
    }

    async fn acquire_or_renew(&self) -> Result<Option<Lease>> {
        let now = self.clock.now_millis();
        let mut st = self.lock();
        let token = match &st.held {
            Some((holder, lease)) if lease.expires_at > now => {
                if *holder != self.node_id {
                    return Ok(None);
                }
                lease.token
            }
            _ => {
                st.token += 1;
                st.token
            }
        };
        let lease = Lease {
            token,
            expires_at: now.saturating_add(self.lease_ms),
        };
        st.held = Some((self.node_id.clone(), lease));
        Ok(Some(lease))
    }

    async fn leader(&self) -> Result<Option<String>> {
        let now = self.clock.now_millis();
        Ok(self
            .lock()
            .held
            .as_ref()
            .filter(|(_, lease)| lease.expires_at > now)
            .map(|(holder, _)| holder.clone()))
    }

    async fn resign(&self) -> Result<()> {
        let mut st = self.lock();
        if st.held.as_ref().is_some_and(|(h, _)| *h == self.node_id) {
            st.held = None;
        }
        Ok(())
    }

    async fn put_worker(&self, entry: WorkerEntry) -> Result<()> {
        check_entry(&entry)?;
        self.lock().workers.insert(entry.session_id.clone(), entry);
        Ok(())
    }

    async fn remove_worker(&self, session_id: &str) -> Result<()> {
        self.lock().workers.remove(session_id);
        Ok(())
    }

    async fn list_workers(&self) -> Result<Vec<WorkerEntry>> {
        Ok(self.lock().workers.values().cloned().collect())
    }

    async fn put_idempotency_key(
        &self,
        key: &str,
        value: &str,
        ttl_ms: i64,
    ) -> Result<Option<String>> {
        check_idempotency(key, ttl_ms)?;
        let now = self.clock.now_millis();
        let mut st = self.lock();
        st.keys.retain(|_, (_, expires)| *expires > now);
        if let Some((existing, _)) = st.keys.get(key) {
            return Ok(Some(existing.clone()));
        }
        st.keys.insert(
            key.to_string(),
            (value.to_string(), now.saturating_add(ttl_ms)),
        );
        Ok(None)
    }

    async fn mark_store_reachable(&self, ttl: Duration) -> Result<()> {
        crate::check_mark_ttl(ttl)?;
        let until = self.clock.now_millis() + ttl.as_millis() as i64;
        self.lock().store_ok.insert(self.node_id.clone(), until);
        Ok(())
    }

    async fn peers_reaching_store(&self) -> Result<Vec<String>> {
        let now = self.clock.now_millis();
        Ok(self
            .lock()
            .store_ok
            .iter()
            .filter(|(node, until)| **until > now && **node != self.node_id)
            .map(|(node, _)| node.clone())
            .collect())
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskmesh_core::FakeClock;

    fn coord() -> (LocalCoordinator, FakeClock) {
        let clock = FakeClock::new(1_000);
        (
            LocalCoordinator::with_clock("n1", Arc::new(clock.clone())),
            clock,
        )
    }

    #[tokio::test]
    async fn renewing_keeps_the_token_and_a_lapsed_lease_gets_a_larger_one() {
        let (c, clock) = coord();
        let first = c.acquire_or_renew().await.unwrap().unwrap();
        clock.advance(LEASE_MS / 2);
        let renewed = c.acquire_or_renew().await.unwrap().unwrap();
        assert_eq!(renewed.token, first.token);
        assert!(renewed.expires_at > first.expires_at);
        clock.advance(LEASE_MS + 1);
        let fresh = c.acquire_or_renew().await.unwrap().unwrap();
        assert!(fresh.token > first.token);
        c.resign().await.unwrap();
        let after = c.acquire_or_renew().await.unwrap().unwrap();
        assert!(after.token > fresh.token);
    }

    #[tokio::test]
    async fn another_node_waits_for_the_lease_to_lapse_and_a_floor_lifts_tokens() {
        let (a, clock) = coord();
        let b = a.sharing("n2");
        let first = a.acquire_or_renew().await.unwrap().unwrap();
        assert_eq!(b.acquire_or_renew().await.unwrap(), None);
        clock.advance(LEASE_MS - 1);
        assert_eq!(b.acquire_or_renew().await.unwrap(), None);
        clock.advance(1);
        b.set_token_floor(41);
        b.set_token_floor(7);
        let second = b.acquire_or_renew().await.unwrap().unwrap();
        assert_eq!(second.token, 42, "above the floor, after {first:?}");
        assert_eq!(a.acquire_or_renew().await.unwrap(), None);
    }

    #[tokio::test]
    async fn idempotency_keys_keep_the_first_value_until_they_expire() {
        let (c, clock) = coord();
        assert_eq!(c.put_idempotency_key("k", "a", 100).await.unwrap(), None);
        assert_eq!(
            c.put_idempotency_key("k", "b", 100)
                .await
                .unwrap()
                .as_deref(),
            Some("a")
        );
        clock.advance(101);
        assert_eq!(c.put_idempotency_key("k", "b", 100).await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_registry_lists_what_was_put_and_not_removed() {
        let (c, _) = coord();
        for s in ["s2", "s1"] {
            c.put_worker(WorkerEntry {
                push: false,
                session_id: s.into(),
                worker_id: format!("w-{s}"),
                namespace: "default".into(),
                owner: "open".into(),
                name: String::new(),
                node_id: "n1".into(),
                handlers: vec!["echo".into()],
                capacity: 1,
                labels: Default::default(),
                weight: 1,
                load: Default::default(),
                last_seen: 0,
                draining: false,
            })
            .await
            .unwrap();
        }
        c.remove_worker("s2").await.unwrap();
        let ids: Vec<_> = c
            .list_workers()
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.session_id)
            .collect();
        assert_eq!(ids, vec!["s1"]);
    }
}
