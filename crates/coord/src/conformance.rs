//! The behaviour every [`Coordinator`] backend must have, as reusable
//! scenarios.
//!
//! Each `pub async fn` here is one scenario run against a fresh backend
//! obtained from a [`CoordinatorFixture`], which hands out handles for
//! several node ids sharing that backend (two replicas, as far as the
//! coordinator can tell). [`coordinator_conformance_suite!`](crate::coordinator_conformance_suite)
//! expands to one `#[tokio::test]` per scenario; the in-process backend runs
//! it in `tests/local_conformance.rs`, Redis in `tests/redis_conformance.rs`.
//!
//! Compiled always, as the store's suite is: it adds no dependency and a
//! backend in another crate can use it. Scenarios panic on failure, as tests
//! do; production code never calls them.
//!
//! No scenario sleeps to synchronise. Lease expiry is observed by polling
//! `acquire_or_renew` with a short TTL until it succeeds, under a deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use taskmesh_core::{Clock, ErrorCode, SystemClock};

use crate::{Coordinator, Error, Lease, WorkerEntry, WorkerLoad};

/// Opens coordinators on one shared backend.
#[async_trait]
pub trait CoordinatorFixture: Send + Sync {
    /// A coordinator for `node_id` whose leases last `lease_ttl`. Every
    /// handle from one fixture shares the lease, the registry and the keys;
    /// the backend starts empty.
    async fn open(&self, node_id: &str, lease_ttl: Duration) -> Arc<dyn Coordinator>;
}

/// Expands to one `#[tokio::test]` per conformance scenario. The argument is
/// an expression evaluating to a future of a fresh
/// [`CoordinatorFixture`](crate::conformance::CoordinatorFixture), evaluated
/// once per test. The calling crate needs `tokio` (with `macros` and
/// `rt-multi-thread`) as a dev-dependency.
///
/// ```text
/// taskmesh_coord::coordinator_conformance_suite!(my_fixture());
/// ```
#[macro_export]
macro_rules! coordinator_conformance_suite {
    ($fixture:expr) => {
        $crate::coordinator_conformance_suite!(@each $fixture;
            one_holder_at_a_time,
            renewal_keeps_the_token,
            lease_expiry_is_conservative,
            resign_hands_over_with_a_larger_token,
            lapsed_lease_goes_to_the_other_with_a_larger_token,
            tokens_never_repeat,
            concurrent_acquirers_elect_one,
            registry_is_shared_across_nodes,
            registry_put_replaces_and_remove_is_idempotent,
            idempotency_first_writer_wins,
            idempotency_keys_expire,
            bad_input_is_refused_and_changes_nothing,
            ping_answers,
            store_reachability_is_shared_and_lapses,
        );
    };
    (@each $fixture:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let fixture = $fixture.await;
                $crate::conformance::$scenario(&fixture).await;
            }
        )+
    };
}

/// The default lease TTL of the scenarios: long enough that a renewal on a
/// loaded machine never misses it.
const LONG: Duration = Duration::from_secs(30);
/// The TTL of scenarios that wait for a lease to lapse.
const SHORT: Duration = Duration::from_millis(300);
/// How long a condition may take before the scenario fails.
const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `check` until it returns `Some`, failing after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        // Polling interval of a condition with a deadline, not a synchronisation sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A registry entry for `session` held by `node`.
pub fn entry(session: &str, node: &str) -> WorkerEntry {
    WorkerEntry {
        push: false,
        session_id: session.into(),
        worker_id: format!("w-{session}"),
        namespace: "default".into(),
        owner: "open".into(),
        name: format!("worker {session}"),
        node_id: node.into(),
        handlers: vec!["echo".into(), "sleep".into()],
        capacity: 4,
        labels: [("zone".to_string(), "eu-1".to_string())].into(),
        weight: 2,
        load: WorkerLoad {
            active: 1,
            cpu_idle_percent: 75.5,
            avg_cost_ms: 12.25,
        },
        last_seen: 1_700_000_000_000,
        draining: false,
    }
}

async fn acquire(c: &dyn Coordinator) -> Option<Lease> {
    c.acquire_or_renew().await.expect("acquire_or_renew")
}

async fn held(c: &dyn Coordinator) -> Lease {
    acquire(c)
        .await
        .unwrap_or_else(|| panic!("{} must hold the lease", c.node_id()))
}

async fn sessions(c: &dyn Coordinator) -> Vec<(String, String)> {
    c.list_workers()
        .await
        .expect("list_workers")
        .into_iter()
        .map(|w| (w.session_id, w.node_id))
        .collect()
}

/// Waits until `c` takes the lease (another holder's lapsed).
async fn take_when_free(c: &dyn Coordinator) -> Lease {
    wait_for("the lease to become free", DEADLINE, || acquire(c)).await
}

/// While one node holds the lease the other gets `None`, however often it
/// asks.
pub async fn one_holder_at_a_time(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let b = f.open("node-b", LONG).await;
    let lease = held(&*a).await;
    for _ in 0..3 {
        assert_eq!(acquire(&*b).await, None, "b must not get a held lease");
        assert_eq!(held(&*a).await.token, lease.token);
    }
    // Both see who leads.
    for node in [&a, &b] {
        assert_eq!(
            node.leader().await.expect("leader").as_deref(),
            Some("node-a")
        );
    }
}

/// Renewing keeps the token and moves the expiry forward (or keeps it).
pub async fn renewal_keeps_the_token(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let first = held(&*a).await;
    let mut last = first;
    for _ in 0..5 {
        let renewed = held(&*a).await;
        assert_eq!(renewed.token, first.token, "a renewal keeps the token");
        assert!(renewed.expires_at >= last.expires_at);
        last = renewed;
    }
}

/// `expires_at` lies after the call and no later than one TTL after it,
/// and the renew interval is below the TTL.
pub async fn lease_expiry_is_conservative(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let ttl = LONG.as_millis() as i64;
    let before = SystemClock.now_millis();
    let lease = held(&*a).await;
    let after = SystemClock.now_millis();
    assert!(lease.expires_at > after, "{lease:?} already expired");
    assert!(
        lease.expires_at <= after + ttl,
        "{lease:?} outlives the ttl ({ttl} ms after {before}..{after})"
    );
    assert!(a.renew_interval() < LONG);
    assert!(!a.renew_interval().is_zero());
}

/// A holder that resigns lets the other in at once with a larger token; a
/// node that does not hold the lease cannot resign it for the holder.
pub async fn resign_hands_over_with_a_larger_token(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let b = f.open("node-b", LONG).await;
    let first = held(&*a).await;
    a.resign().await.expect("resign");
    assert_eq!(
        b.leader().await.expect("leader"),
        None,
        "nobody leads after a resign"
    );
    let second = held(&*b).await;
    assert_eq!(a.leader().await.expect("leader").as_deref(), Some("node-b"));
    assert!(
        second.token > first.token,
        "{second:?} must be newer than {first:?}"
    );
    a.resign().await.expect("resign by a non-holder is a no-op");
    assert_eq!(
        acquire(&*a).await,
        None,
        "a's resign must not free b's lease"
    );
    assert_eq!(held(&*b).await.token, second.token);
}

/// A lease nobody renews lapses; the other node then gets a larger token and
/// the old holder is refused.
pub async fn lapsed_lease_goes_to_the_other_with_a_larger_token(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", SHORT).await;
    let b = f.open("node-b", SHORT).await;
    let first = held(&*a).await;
    let second = take_when_free(&*b).await;
    assert!(second.token > first.token);
    assert!(
        second.expires_at > first.expires_at,
        "the successor's lease ends later"
    );
    // The old holder must not get its old lease back. Whether b's short
    // lease is still running when a asks depends on timing; either a is
    // refused, or b's lapsed too and a takes a fresh, newer token.
    if let Some(again) = acquire(&*a).await {
        assert!(
            again.token > second.token,
            "the old holder renewed a lapsed lease: {again:?} after {second:?}"
        );
    }
}

/// Alternating holders (by resigning and by lapsing) get strictly
/// increasing tokens; no token is handed out twice.
pub async fn tokens_never_repeat(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let b = f.open("node-b", LONG).await;
    let mut tokens = Vec::new();
    for round in 0..10 {
        let c = if round % 2 == 0 { &a } else { &b };
        tokens.push(held(&**c).await.token);
        c.resign().await.expect("resign");
    }
    let short_a = f.open("node-c", SHORT).await;
    let short_b = f.open("node-d", SHORT).await;
    tokens.push(held(&*short_a).await.token);
    tokens.push(take_when_free(&*short_b).await.token);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

/// Many nodes racing for a free lease: exactly one wins.
pub async fn concurrent_acquirers_elect_one(f: &dyn CoordinatorFixture) {
    let mut nodes = Vec::new();
    for i in 0..8 {
        nodes.push(f.open(&format!("node-{i}"), LONG).await);
    }
    let mut set = tokio::task::JoinSet::new();
    for c in nodes {
        set.spawn(async move { (c.node_id().to_string(), acquire(&*c).await) });
    }
    let mut winners = Vec::new();
    while let Some(joined) = set.join_next().await {
        let (node, lease) = joined.expect("acquirer task");
        if let Some(lease) = lease {
            winners.push((node, lease));
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner, got {winners:?}");
}

/// What one node registers, every node lists, with all fields intact, in
/// session-id order.
pub async fn registry_is_shared_across_nodes(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let b = f.open("node-b", LONG).await;
    a.put_worker(entry("s2", "node-a")).await.expect("put");
    b.put_worker(entry("s1", "node-b")).await.expect("put");
    let want = vec![
        ("s1".to_string(), "node-b".to_string()),
        ("s2".to_string(), "node-a".to_string()),
    ];
    assert_eq!(sessions(&*a).await, want);
    assert_eq!(sessions(&*b).await, want);
    let listed = b.list_workers().await.expect("list");
    assert_eq!(listed[1], entry("s2", "node-a"), "every field round-trips");
}

/// A second put replaces the entry (new load, draining); any node may remove
/// it; removing what is not there is fine.
pub async fn registry_put_replaces_and_remove_is_idempotent(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let b = f.open("node-b", LONG).await;
    a.put_worker(entry("s1", "node-a")).await.expect("put");
    a.put_worker(entry("s2", "node-a")).await.expect("put");
    let mut updated = entry("s1", "node-a");
    updated.load.active = 3;
    updated.draining = true;
    updated.last_seen += 5_000;
    a.put_worker(updated.clone()).await.expect("re-put");
    let listed = b.list_workers().await.expect("list");
    assert_eq!(listed.len(), 2, "a re-put must not duplicate: {listed:?}");
    assert_eq!(listed[0], updated);
    b.remove_worker("s1").await.expect("remove");
    b.remove_worker("s1").await.expect("remove again");
    b.remove_worker("never-there")
        .await
        .expect("remove unknown");
    assert_eq!(
        sessions(&*a).await,
        vec![("s2".to_string(), "node-a".to_string())]
    );
}

/// The first writer of a key wins, whichever node asks later; keys are
/// independent.
pub async fn idempotency_first_writer_wins(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let b = f.open("node-b", LONG).await;
    assert_eq!(
        a.put_idempotency_key("k1", "task-1", 60_000).await.unwrap(),
        None
    );
    for c in [&a, &b] {
        assert_eq!(
            c.put_idempotency_key("k1", "task-2", 60_000)
                .await
                .unwrap()
                .as_deref(),
            Some("task-1")
        );
    }
    assert_eq!(
        b.put_idempotency_key("k2", "task-3", 60_000).await.unwrap(),
        None
    );
}

/// A key stops counting once its TTL has passed.
pub async fn idempotency_keys_expire(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    assert_eq!(
        a.put_idempotency_key("k", "first", 200).await.unwrap(),
        None
    );
    wait_for("the idempotency key to expire", DEADLINE, || async {
        match a.put_idempotency_key("k", "second", 60_000).await.unwrap() {
            None => Some(()),
            Some(old) => {
                assert_eq!(old, "first");
                None
            }
        }
    })
    .await;
    assert_eq!(
        a.put_idempotency_key("k", "third", 60_000)
            .await
            .unwrap()
            .as_deref(),
        Some("second")
    );
}

/// Malformed requests are `InvalidArgument` and leave no trace.
pub async fn bad_input_is_refused_and_changes_nothing(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    let invalid = |r: Result<(), Error>, what: &str| match r {
        Err(e @ Error::InvalidArgument(_)) => assert_eq!(e.code(), ErrorCode::InvalidArgument),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    invalid(
        a.put_worker(entry("", "node-a")).await.map(|_| ()),
        "empty session",
    );
    invalid(
        a.put_idempotency_key("", "v", 1_000).await.map(|_| ()),
        "empty key",
    );
    for ttl in [0, -5] {
        invalid(
            a.put_idempotency_key("k", "v", ttl).await.map(|_| ()),
            "non-positive ttl",
        );
    }
    assert!(a.list_workers().await.unwrap().is_empty());
    assert_eq!(a.put_idempotency_key("k", "v", 60_000).await.unwrap(), None);
}

/// A reachable backend answers a ping.
pub async fn ping_answers(f: &dyn CoordinatorFixture) {
    let a = f.open("node-a", LONG).await;
    a.ping().await.expect("ping");
    assert_eq!(a.node_id(), "node-a");
}

/// A node's word that it reaches its store is seen by the others (not by
/// itself) until its ttl lapses; a bad ttl is refused.
pub async fn store_reachability_is_shared_and_lapses(f: &dyn CoordinatorFixture) {
    let a = f.open("a", LONG).await;
    let b = f.open("b", LONG).await;
    assert!(a.peers_reaching_store().await.unwrap().is_empty());
    a.mark_store_reachable(SHORT).await.expect("mark");
    b.mark_store_reachable(LONG).await.expect("mark");
    assert_eq!(
        b.peers_reaching_store().await.unwrap(),
        vec!["a".to_string()]
    );
    assert_eq!(
        a.peers_reaching_store().await.unwrap(),
        vec!["b".to_string()]
    );
    wait_for("a's mark to lapse", DEADLINE, || async {
        b.peers_reaching_store()
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    let err = a
        .mark_store_reachable(Duration::ZERO)
        .await
        .expect_err("a zero ttl");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        a.peers_reaching_store().await.unwrap(),
        vec!["b".to_string()]
    );
}
