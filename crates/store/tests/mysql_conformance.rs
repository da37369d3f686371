//! Runs the backend-independent conformance suites against [`MysqlStore`]
//! on the machine's MariaDB (or `TASKMESH_TEST_MYSQL_URL`), each scenario
//! in a database of its own, dropped at the end; then what only this
//! backend has: polling the `changes` table through a failure, wake-ups
//! off, bad options. A server that cannot be reached fails every test,
//! saying so.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{change_of, resynced};
use sqlx::Connection;
use taskmesh_core::ErrorCode;
use taskmesh_store::conformance::{StoreFixture, T0, new_task};
use taskmesh_store::mysql::scratch::ScratchDatabase;
use taskmesh_store::{Error, MysqlOptions, MysqlStore, Store};

/// A fresh database; every `open` connects a new store (new pool, new
/// poller) to it, so a reopen sees what the previous store committed and
/// two opens are two replicas.
struct MysqlFixture {
    database: ScratchDatabase,
}

#[async_trait]
impl StoreFixture for MysqlFixture {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(replica(&self.database).await)
    }
}

async fn replica(database: &ScratchDatabase) -> MysqlStore {
    MysqlStore::connect(database.options())
        .await
        .unwrap_or_else(|err| panic!("connect the MySQL store: {err}"))
}

async fn database() -> ScratchDatabase {
    ScratchDatabase::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

async fn mysql_fixture() -> MysqlFixture {
    MysqlFixture {
        database: database().await,
    }
}

taskmesh_store::store_conformance_suite!(mysql_fixture());
taskmesh_store::cluster_conformance_suite!(mysql_fixture());

/// Polls that fail (the `changes` table gone for a while) end in a resync
/// once polling works again, and wake-ups flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_polls_resync_and_recover() {
    let database = database().await;
    let (a, b) = (replica(&database).await, replica(&database).await);
    let mut admin = sqlx::MySqlConnection::connect(database.url())
        .await
        .expect("admin connection");
    let mut on_b = b.subscribe();
    let before = b.poll_failures();
    sqlx::query("RENAME TABLE changes TO changes_away")
        .execute(&mut admin)
        .await
        .expect("rename");
    // A's announcement cannot be written meanwhile: it is retried.
    let during = a
        .create_task(new_task("n"), "fp", T0)
        .await
        .expect("create")
        .task;
    // Until B has seen a poll fail (a short outage can fall between polls).
    taskmesh_testkit::wait_for("a failed poll", Duration::from_secs(10), || {
        let failed = b.poll_failures() > before;
        async move { failed.then_some(()) }
    })
    .await;
    sqlx::query("RENAME TABLE changes_away TO changes")
        .execute(&mut admin)
        .await
        .expect("rename back");
    resynced(&mut on_b).await;
    let mut on_b = b.subscribe();
    let after = a
        .create_task(new_task("n"), "fp", T0)
        .await
        .expect("create")
        .task;
    assert_eq!(change_of(&mut on_b, &after.id).await.version, 1);
    assert!(b.get_task(&during.id).await.expect("get").is_some());
}

/// With wake-ups off a store still serves its own subscribers.
#[tokio::test]
async fn wake_ups_off_still_publish_locally() {
    let database = database().await;
    let opts = MysqlOptions {
        notify: false,
        ..database.options()
    };
    let store = MysqlStore::connect(opts).await.expect("connect");
    common::publishes_locally(&store).await;
}

/// Bad options, a missing database and an absent server are clear errors,
/// not hangs or panics.
#[tokio::test]
async fn bad_options_and_absent_servers_are_clear_errors() {
    let database = database().await;
    let err = MysqlStore::connect(MysqlOptions::new("not a url"))
        .await
        .expect_err("bad url");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let no_db = MysqlOptions::new("mysql://root@127.0.0.1:3306");
    let err = MysqlStore::connect(no_db).await.expect_err("no database");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let url = database
        .url()
        .replace(database.name(), "tm_no_such_database");
    let err = MysqlStore::connect(MysqlOptions::new(url))
        .await
        .expect_err("a database that does not exist");
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("create it first")),
        "{err:?}"
    );
    let zero = MysqlOptions {
        poll_interval: Duration::ZERO,
        ..database.options()
    };
    let err = MysqlStore::connect(zero)
        .await
        .expect_err("poll interval 0");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let mut nowhere = MysqlOptions::new("mariadb://root@127.0.0.1:1/test");
    nowhere.acquire_timeout = Duration::from_secs(2);
    let err = MysqlStore::connect(nowhere)
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

/// Replicas starting at once on an empty database migrate it once: every
/// one connects (MariaDB answers sqlx's own migration lock with NULL at
/// once, so without ours they raced to apply the same migration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_migrate_once() {
    let database = database().await;
    let starts = (0..4).map(|_| MysqlStore::connect(database.options()));
    let stores = futures::future::join_all(starts).await;
    for store in &stores {
        assert!(store.is_ok(), "{:?}", store.as_ref().err());
    }
}
