//! Redis-only rules beyond the shared suite, on the machine's Redis under a
//! random key prefix per test: the token floor (the store's newest token)
//! lifts fresh tokens, a floor that cannot be read keeps the lease free, a
//! restarted replica with the same node id does not inherit its
//! predecessor's lease, and registry entries of a replica that stopped
//! refreshing them expire.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use taskmesh_coord::conformance::entry;
use taskmesh_coord::{Coordinator, Error, RedisCoordinator, RedisOptions, TokenFloor};
use taskmesh_core::{Clock, SystemClock};
use taskmesh_testkit::services::{SharedRedis, connect_redis};
use taskmesh_testkit::wait_for;

/// A key prefix on the shared server, deleted when dropped.
struct Prefix(SharedRedis);

impl Prefix {
    fn new() -> Self {
        Self(SharedRedis::new())
    }

    fn options(&self, node_id: &str) -> RedisOptions {
        let mut opts = RedisOptions::new(&self.0.url, node_id);
        opts.key_prefix = self.0.prefix.clone();
        opts
    }

    async fn open(&self, node_id: &str) -> RedisCoordinator {
        connect_redis(self.options(node_id)).await
    }
}

/// A store whose newest token is the one wrapped.
struct Fixed(u64);

#[async_trait]
impl TokenFloor for Fixed {
    async fn token_floor(&self) -> Result<u64, String> {
        Ok(self.0)
    }
}

/// A store that cannot be reached.
struct Down;

#[async_trait]
impl TokenFloor for Down {
    async fn token_floor(&self) -> Result<u64, String> {
        Err("store unreachable".into())
    }
}

/// A floor far above anything the counter or the clock would give.
fn high_floor() -> u64 {
    SystemClock.now_millis() as u64 + 1_000_000_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_token_is_issued_above_the_floor_source_and_the_counter_follows() {
    let p = Prefix::new();
    let floor = high_floor();
    let a = p.open("a").await;
    a.set_token_floor_source(Arc::new(Fixed(floor)));
    let first = a.acquire_or_renew().await.unwrap().expect("lease");
    assert_eq!(first.token, floor + 1);
    a.resign().await.unwrap();
    // b has no floor of its own: the counter alone now continues above it.
    let b = p.open("b").await;
    let second = b.acquire_or_renew().await.unwrap().expect("lease");
    assert_eq!(second.token, floor + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_floor_lifts_the_next_fresh_token_and_never_goes_down() {
    let p = Prefix::new();
    let floor = high_floor();
    let a = p.open("a").await;
    a.set_token_floor(floor);
    a.set_token_floor(5); // lower: ignored
    assert_eq!(
        a.acquire_or_renew().await.unwrap().expect("lease").token,
        floor + 1
    );
    // A renewal keeps the token whatever the floor says meanwhile.
    a.set_token_floor(floor + 100);
    assert_eq!(
        a.acquire_or_renew().await.unwrap().expect("lease").token,
        floor + 1
    );
    a.resign().await.unwrap();
    assert_eq!(
        a.acquire_or_renew().await.unwrap().expect("lease").token,
        floor + 101
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_floor_keeps_the_lease_free_for_others() {
    let p = Prefix::new();
    let a = p.open("a").await;
    a.set_token_floor_source(Arc::new(Down));
    match a.acquire_or_renew().await {
        Err(e @ Error::Unavailable(_)) => {
            assert!(e.to_string().contains("token floor"), "{e}");
            assert!(e.to_string().contains("store unreachable"), "{e}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(a.leader().await.unwrap(), None);
    let b = p.open("b").await;
    assert!(b.acquire_or_renew().await.unwrap().is_some());
    assert_eq!(a.leader().await.unwrap().as_deref(), Some("b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_beyond_exact_lua_numbers_is_refused() {
    let p = Prefix::new();
    let a = p.open("a").await;
    a.set_token_floor(1 << 60);
    match a.acquire_or_renew().await {
        Err(Error::Internal(why)) => assert!(why.contains("2^53"), "{why}"),
        other => panic!("expected Internal, got {other:?}"),
    }
    assert_eq!(a.leader().await.unwrap(), None, "nothing was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_with_the_same_node_id_does_not_inherit_the_lease() {
    let p = Prefix::new();
    let before = p.open("n1").await;
    before.acquire_or_renew().await.unwrap().expect("lease");
    // The same node id in a new process (the old one may only be paused).
    let after = p.open("n1").await;
    assert_eq!(after.acquire_or_renew().await.unwrap(), None);
    after.resign().await.unwrap();
    assert_eq!(after.leader().await.unwrap().as_deref(), Some("n1"));
    assert!(before.acquire_or_renew().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_entries_not_put_again_expire_and_leave_the_index() {
    let p = Prefix::new();
    let mut opts = p.options("a");
    opts.worker_ttl = Duration::from_millis(300);
    let short = connect_redis(opts).await;
    let long = p.open("b").await;
    short.put_worker(entry("s1", "a")).await.unwrap();
    long.put_worker(entry("s2", "b")).await.unwrap();
    wait_for("s1 to expire", Duration::from_secs(10), || async {
        let ids: Vec<_> = long
            .list_workers()
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.session_id)
            .collect();
        (ids == ["s2"]).then_some(())
    })
    .await;
    let client = redis::Client::open(p.0.url.as_str()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{}workers", p.0.prefix))
        .query(&mut conn)
        .unwrap();
    assert_eq!(members, ["s2"], "the listing removed the stale member");
}
