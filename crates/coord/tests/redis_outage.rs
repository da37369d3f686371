//! Redis outages, on a private `redis-server` child per test (the machine's
//! shared server is never touched): a killed or frozen server turns every
//! call into `Unavailable` within a bound instead of a hang, and the
//! coordinator recovers by itself when the server returns — with tokens
//! still newer than before, although the restarted server forgot its
//! counter.

use std::future::Future;
use std::time::{Duration, Instant};

use taskmesh_coord::conformance::entry;
use taskmesh_coord::{Coordinator, Error, RedisCoordinator, RedisOptions};
use taskmesh_core::ErrorCode;
use taskmesh_testkit::services::{PrivateRedis, connect_redis};
use taskmesh_testkit::wait_for;

/// Generous for a loaded two-core machine; `op_timeout` is 1 s.
const BOUND: Duration = Duration::from_secs(5);

fn options(redis: &PrivateRedis, node_id: &str) -> RedisOptions {
    let mut opts = RedisOptions::new(redis.url(), node_id);
    opts.key_prefix = "outage:".into();
    opts
}

/// Runs `call`, which must fail with `Unavailable` naming the server,
/// within [`BOUND`].
async fn unavailable<T: std::fmt::Debug>(
    what: &str,
    port: u16,
    call: impl Future<Output = Result<T, Error>>,
) -> String {
    let started = Instant::now();
    let outcome = tokio::time::timeout(BOUND * 2, call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung during the outage"));
    let took = started.elapsed();
    assert!(took < BOUND, "{what} took {took:?} to fail");
    match outcome {
        Err(e @ Error::Unavailable(_)) => {
            assert_eq!(e.code(), ErrorCode::Unavailable);
            let text = e.to_string();
            assert!(
                text.contains(&format!("127.0.0.1:{port}")),
                "{what}: the message should name the server: {text}"
            );
            text
        }
        other => panic!("{what}: expected Unavailable, got {other:?}"),
    }
}

async fn every_call_is_unavailable(c: &RedisCoordinator, port: u16) {
    unavailable("acquire_or_renew", port, c.acquire_or_renew()).await;
    unavailable("put_worker", port, c.put_worker(entry("s1", "n1"))).await;
    unavailable("list_workers", port, c.list_workers()).await;
    unavailable("remove_worker", port, c.remove_worker("s1")).await;
    unavailable(
        "put_idempotency_key",
        port,
        c.put_idempotency_key("k", "v", 1_000),
    )
    .await;
    unavailable("ping", port, c.ping()).await;
    unavailable("resign", port, c.resign()).await;
}

async fn answers_again(c: &RedisCoordinator) {
    wait_for(
        "the coordinator to reach redis again",
        Duration::from_secs(15),
        || async { c.ping().await.ok() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_unavailable_quickly_and_a_restarted_one_is_used_again() {
    let mut redis = PrivateRedis::start();
    let port = redis.port;
    let c = connect_redis(options(&redis, "n1")).await;
    let before = c.acquire_or_renew().await.unwrap().expect("lease");
    c.put_worker(entry("s1", "n1")).await.unwrap();

    redis.kill();
    every_call_is_unavailable(&c, port).await;

    redis.restart();
    answers_again(&c).await;
    // The restarted server is empty: the lease is free again and the counter
    // is gone, yet the new token is newer than the one handed out before.
    let after = c.acquire_or_renew().await.unwrap().expect("lease");
    assert!(
        after.token > before.token,
        "{after:?} must be newer than {before:?}"
    );
    c.put_worker(entry("s2", "n1")).await.unwrap();
    let listed: Vec<_> = c
        .list_workers()
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.session_id)
        .collect();
    assert_eq!(listed, vec!["s2"], "the restarted server forgot s1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_saw_the_old_tokens_gets_newer_ones_after_redis_lost_its_data() {
    let mut redis = PrivateRedis::start();
    let old = connect_redis(options(&redis, "n1")).await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(old.acquire_or_renew().await.unwrap().expect("lease").token);
        old.resign().await.unwrap();
    }
    redis.restart();
    // A new process: no memory of any token, no floor source; only the
    // server's clock keeps its token above the forgotten ones.
    let fresh = connect_redis(options(&redis, "n2")).await;
    let lease = fresh.acquire_or_renew().await.unwrap().expect("lease");
    assert!(
        tokens.iter().all(|t| lease.token > *t),
        "{lease:?} must be newer than every earlier token {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_times_out_instead_of_hanging_and_is_used_again_when_it_thaws() {
    let redis = PrivateRedis::start();
    let port = redis.port;
    let c = connect_redis(options(&redis, "n1")).await;
    let before = c.acquire_or_renew().await.unwrap().expect("lease");

    redis.signal(libc::SIGSTOP);
    let text = unavailable("ping", port, c.ping()).await;
    assert!(text.contains("ping"), "{text}");
    unavailable("acquire_or_renew", port, c.acquire_or_renew()).await;
    unavailable("put_worker", port, c.put_worker(entry("s1", "n1"))).await;

    redis.signal(libc::SIGCONT);
    answers_again(&c).await;
    let after = c.acquire_or_renew().await.unwrap().expect("still ours");
    assert_eq!(after.token, before.token, "the lease survived the freeze");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_server_that_is_not_there_fails_fast_and_names_it() {
    let mut redis = PrivateRedis::start();
    let port = redis.port;
    let opts = options(&redis, "n1");
    redis.kill();
    let text = unavailable("connect", port, RedisCoordinator::connect(opts)).await;
    assert!(text.contains("ping"), "{text}");
}
