//! Runs the backend-independent conformance suite against [`SqliteStore`],
//! each scenario on a fresh database file in its own temporary directory.

use std::sync::Arc;

use async_trait::async_trait;
use taskmesh_store::conformance::StoreFixture;
use taskmesh_store::{SqliteStore, Store};
use tempfile::TempDir;

/// A temporary directory holding one SQLite database; removed on drop.
struct SqliteFixture {
    dir: TempDir,
}

#[async_trait]
impl StoreFixture for SqliteFixture {
    async fn open(&self) -> Arc<dyn Store> {
        let store = SqliteStore::open_in(self.dir.path())
            .await
            .expect("open SQLite store");
        Arc::new(store)
    }
}

async fn sqlite_fixture() -> SqliteFixture {
    SqliteFixture {
        dir: TempDir::new().expect("temporary directory"),
    }
}

taskmesh_store::store_conformance_suite!(sqlite_fixture());
