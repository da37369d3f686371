//! Runs the backend-independent conformance suite against [`MysqlStore`]
//! on the machine's MariaDB (or `TASKMESH_TEST_MYSQL_URL`), each scenario
//! in a database of its own, dropped at the end. A server that cannot be
//! reached fails every test, saying so.

use std::sync::Arc;

use async_trait::async_trait;
use taskmesh_store::conformance::StoreFixture;
use taskmesh_store::mysql::scratch::ScratchDatabase;
use taskmesh_store::{MysqlStore, Store};

/// A fresh database; every `open` connects a new store (new pool, new
/// poller) to it, so a reopen sees what the previous store committed.
struct MysqlFixture {
    database: ScratchDatabase,
}

#[async_trait]
impl StoreFixture for MysqlFixture {
    async fn open(&self) -> Arc<dyn Store> {
        let store = MysqlStore::connect(self.database.options())
            .await
            .unwrap_or_else(|err| panic!("connect the MySQL store: {err}"));
        Arc::new(store)
    }
}

async fn mysql_fixture() -> MysqlFixture {
    let database = ScratchDatabase::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    MysqlFixture { database }
}

taskmesh_store::store_conformance_suite!(mysql_fixture());
