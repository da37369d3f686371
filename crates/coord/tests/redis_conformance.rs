//! Runs the backend-independent coordinator suite against
//! [`RedisCoordinator`] on the machine's Redis (`TASKMESH_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379`), each scenario under its own random key
//! prefix, deleted afterwards. An unreachable Redis fails every test with a
//! message saying so.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use taskmesh_coord::conformance::CoordinatorFixture;
use taskmesh_coord::{Coordinator, RedisOptions};
use taskmesh_testkit::services::{SharedRedis, connect_redis};

/// One key prefix on the shared server; its keys go when the fixture does.
struct RedisFixture(SharedRedis);

#[async_trait]
impl CoordinatorFixture for RedisFixture {
    async fn open(&self, node_id: &str, lease_ttl: Duration) -> Arc<dyn Coordinator> {
        let mut opts = RedisOptions::new(&self.0.url, node_id);
        opts.key_prefix = self.0.prefix.clone();
        opts.lease_ttl = lease_ttl;
        opts.renew_interval = lease_ttl / 3;
        Arc::new(connect_redis(opts).await)
    }
}

async fn redis_fixture() -> RedisFixture {
    RedisFixture(SharedRedis::new())
}

taskmesh_coord::coordinator_conformance_suite!(redis_fixture());
