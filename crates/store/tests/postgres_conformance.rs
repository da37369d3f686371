//! Runs the backend-independent conformance suites against
//! [`PostgresStore`] on the machine's Postgres (or
//! `TASKMESH_TEST_DATABASE_URL`), each scenario in a schema of its own,
//! dropped at the end; then what only Postgres has: its LISTEN connection
//! lost and rebuilt, notifications off, bad options. A server that cannot
//! be reached fails every test, saying so.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{change_of, resynced};
use taskmesh_core::ErrorCode;
use taskmesh_store::conformance::{StoreFixture, T0, new_task};
use taskmesh_store::postgres::scratch::ScratchSchema;
use taskmesh_store::{Error, PostgresOptions, PostgresStore, Store};
use taskmesh_testkit::wait_for;

/// A fresh schema; every `open` connects a new store (new pool, new
/// listener) to it, so a reopen sees what the previous store committed and
/// two opens are two replicas.
struct PostgresFixture {
    schema: ScratchSchema,
}

#[async_trait]
impl StoreFixture for PostgresFixture {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(replica(&self.schema).await)
    }
}

async fn replica(schema: &ScratchSchema) -> PostgresStore {
    PostgresStore::connect(schema.options())
        .await
        .unwrap_or_else(|err| panic!("connect the Postgres store: {err}"))
}

async fn schema() -> ScratchSchema {
    ScratchSchema::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn postgres_fixture() -> PostgresFixture {
    PostgresFixture {
        schema: schema().await,
    }
}

taskmesh_store::store_conformance_suite!(postgres_fixture());
taskmesh_store::cluster_conformance_suite!(postgres_fixture());

/// A lost LISTEN connection is re-established, subscribers are told to
/// resync, and notifications flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_notification_connection_resyncs_and_recovers() {
    use sqlx::Connection;
    let schema = schema().await;
    let (a, b) = (replica(&schema).await, replica(&schema).await);
    let mut on_b = b.subscribe();
    let old = b.listener_backend_pid().expect("listening");
    let mut admin = sqlx::PgConnection::connect(schema.url())
        .await
        .expect("admin connection");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(i32::try_from(old).expect("pid"))
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(killed);
    resynced(&mut on_b).await;
    let new = wait_for(
        "a new LISTEN connection",
        Duration::from_secs(20),
        || async { b.listener_backend_pid().filter(|pid| *pid != old) },
    )
    .await;
    assert_ne!(new, old);
    let mut on_b = b.subscribe();
    let t = a
        .create_task(new_task("n"), "fp", T0)
        .await
        .expect("create")
        .task;
    assert_eq!(change_of(&mut on_b, &t.id).await.version, 1);
}

/// With notifications off a store still serves its own subscribers.
#[tokio::test]
async fn notifications_off_still_publishes_locally() {
    let schema = schema().await;
    let opts = PostgresOptions {
        notify: false,
        ..schema.options()
    };
    let store = PostgresStore::connect(opts).await.expect("connect");
    assert_eq!(store.channel(), None);
    assert_eq!(store.listener_backend_pid(), None);
    common::publishes_locally(&store).await;
}

/// Bad options and an absent server are clear errors, not hangs or panics.
#[tokio::test]
async fn bad_options_and_absent_servers_are_clear_errors() {
    let schema = schema().await;
    for bad in ["Upper", "has-dash", "pg_catalog", "", &"x".repeat(49)] {
        let err = PostgresStore::connect(schema.options().with_schema(bad))
            .await
            .expect_err("bad schema");
        assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}: {err:?}");
    }
    let err = PostgresStore::connect(PostgresOptions::new("not a url"))
        .await
        .expect_err("bad url");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let mut nowhere = PostgresOptions::new("postgres://postgres@127.0.0.1:1/test");
    nowhere.acquire_timeout = Duration::from_secs(2);
    let err = PostgresStore::connect(nowhere)
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::Unavailable);
}
