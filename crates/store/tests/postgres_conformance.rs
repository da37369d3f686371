//! Runs the backend-independent conformance suite against [`PostgresStore`]
//! on the machine's Postgres (or `TASKMESH_TEST_DATABASE_URL`), each
//! scenario in a schema of its own, dropped at the end. A server that
//! cannot be reached fails every test, saying so.

use std::sync::Arc;

use async_trait::async_trait;
use taskmesh_store::conformance::StoreFixture;
use taskmesh_store::postgres::scratch::ScratchSchema;
use taskmesh_store::{PostgresStore, Store};

/// A fresh schema; every `open` connects a new store (new pool, new
/// listener) to it, so a reopen sees what the previous store committed.
struct PostgresFixture {
    schema: ScratchSchema,
}

#[async_trait]
impl StoreFixture for PostgresFixture {
    async fn open(&self) -> Arc<dyn Store> {
        let store = PostgresStore::connect(self.schema.options())
            .await
            .unwrap_or_else(|err| panic!("connect the Postgres store: {err}"));
        Arc::new(store)
    }
}

async fn postgres_fixture() -> PostgresFixture {
    let schema = ScratchSchema::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    PostgresFixture { schema }
}

taskmesh_store::store_conformance_suite!(postgres_fixture());
