//! Runs the backend-independent coordinator suite against the in-process
//! [`LocalCoordinator`]: each scenario on a fresh state, node handles made
//! with `sharing`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use taskmesh_coord::conformance::CoordinatorFixture;
use taskmesh_coord::{Coordinator, LocalCoordinator};

/// One in-memory state; every handle opened shares it.
struct LocalFixture {
    base: LocalCoordinator,
}

#[async_trait]
impl CoordinatorFixture for LocalFixture {
    async fn open(&self, node_id: &str, lease_ttl: Duration) -> Arc<dyn Coordinator> {
        Arc::new(self.base.sharing(node_id).with_lease_ttl(lease_ttl))
    }
}

async fn local_fixture() -> LocalFixture {
    LocalFixture {
        base: LocalCoordinator::new("fixture"),
    }
}

taskmesh_coord::coordinator_conformance_suite!(local_fixture());
