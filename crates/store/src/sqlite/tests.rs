//! SQLite-specific checks the backend-independent conformance suite cannot
//! make: connection settings, query plans against the migration's indexes,
//! corrupt rows, unique-violation detection, and two stores (as two
//! processes would) sharing one file.

use std::collections::BTreeSet;
use std::sync::Arc;

use sqlx::Row;
use tempfile::TempDir;

use super::{SqliteOptions, SqliteStore};
use crate::conformance::{T0, new_task};
use crate::{Claim, Store};

async fn pragma(pool: &sqlx::SqlitePool, name: &str) -> String {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
        .fetch_one(pool)
        .await
        .expect("pragma");
    row.try_get::<String, _>(0)
        .or_else(|_| row.try_get::<i64, _>(0).map(|v| v.to_string()))
        .expect("pragma value")
}

async fn writer_pragma(store: &SqliteStore, name: &str) -> String {
    let sql = format!("PRAGMA {name}");
    store
        .backend()
        .writer
        .with(move |c| {
            c.query_row(&sql, [], |row| {
                let v: rusqlite::types::Value = row.get(0)?;
                Ok(match v {
                    rusqlite::types::Value::Text(s) => s,
                    rusqlite::types::Value::Integer(i) => i.to_string(),
                    other => format!("{other:?}"),
                })
            })
        })
        .await
        .expect("pragma")
}

#[tokio::test]
async fn open_creates_directories_and_applies_settings() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("a/b/store.db");
    let store = SqliteStore::open(SqliteOptions::new(&path))
        .await
        .expect("open");
    assert!(path.exists());
    let reader = &store.backend().reader;
    assert_eq!(writer_pragma(&store, "journal_mode").await, "wal");
    assert_eq!(pragma(reader, "journal_mode").await, "wal");
    assert_eq!(writer_pragma(&store, "synchronous").await, "2", "FULL");
    assert_eq!(writer_pragma(&store, "foreign_keys").await, "1");
    assert_eq!(writer_pragma(&store, "temp_store").await, "2", "MEMORY");
    assert_eq!(writer_pragma(&store, "cache_size").await, "-16384");
    assert_eq!(pragma(reader, "query_only").await, "1");
    let refused = sqlx::query("DELETE FROM tasks").execute(reader).await;
    assert!(refused.is_err(), "readers must not write");
    store.close().await;

    let relaxed = SqliteOptions {
        synchronous_full: false,
        ..SqliteOptions::new(&path)
    };
    let store = SqliteStore::open(relaxed).await.expect("reopen");
    assert_eq!(writer_pragma(&store, "synchronous").await, "1", "NORMAL");
    store.close().await;
    let closed = store.create_task(new_task("h"), "fp", T0).await;
    assert!(
        matches!(closed, Err(crate::Error::Unavailable(_))),
        "a closed store refuses writes: {closed:?}"
    );
}

/// Every fixed query reads through the index the migration made for it,
/// and none sorts rows by hand.
#[tokio::test]
async fn queries_use_their_indexes() {
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let cases = crate::sql::testing::indexed_queries(store.sql());
    for (index, sql, params) in cases {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
        for _ in params.chars() {
            q = q.bind(1_i64);
        }
        let plan: Vec<String> = q
            .fetch_all(&store.backend().reader)
            .await
            .expect("explain")
            .iter()
            .map(|row| row.get::<String, _>("detail"))
            .collect();
        let plan = plan.join(" | ");
        assert!(
            index.split('|').any(|i| plan.contains(i)),
            "{sql}\nuses {plan}, not {index}"
        );
        assert!(!plan.contains("TEMP B-TREE"), "{sql}\nsorts: {plan}");
    }
}

#[tokio::test]
async fn corrupt_rows_are_internal_errors_naming_the_task() {
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let task = store
        .create_task(new_task("h"), "fp", T0)
        .await
        .expect("create")
        .task;
    let id = task.id.clone();
    store
        .backend()
        .writer
        .with(move |c| {
            c.execute(
                "UPDATE tasks SET labels = 'not json' WHERE id = ?",
                [id.as_str()],
            )
        })
        .await
        .expect("corrupt the row");

    crate::sql::testing::corrupt_rows_are_internal_errors(&store, &task.id).await;
}

/// SQLite's result codes map to the store's vocabulary.
#[tokio::test]
async fn error_codes_map_to_the_store_vocabulary() {
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    crate::sql::testing::error_codes_map_to_the_store_vocabulary(&store).await;
}

/// Two stores on one file have two writers, like two processes: SQLite's
/// lock (waited on with the busy timeout) still keeps claims exclusive and
/// idempotent creates single.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_never_double_claim() {
    let dir = TempDir::new().expect("tempdir");
    let a = Arc::new(SqliteStore::open_in(dir.path()).await.expect("open a"));
    let b = Arc::new(SqliteStore::open_in(dir.path()).await.expect("open b"));
    for _ in 0..60 {
        a.create_task(new_task("h"), "fp", T0)
            .await
            .expect("create");
    }
    let keyed = || {
        let mut t = new_task("h2");
        t.client_request_id = Some("req-shared".into());
        t
    };
    let first = a.create_task(keyed(), "fp", T0).await.expect("create");
    let second = b.create_task(keyed(), "fp", T0).await.expect("create");
    assert!(!first.existing && second.existing);
    assert_eq!(first.task.id, second.task.id);

    let claimer = |store: Arc<SqliteStore>, worker: &'static str| {
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..20 {
                let got = store
                    .claim_ready("default", "h", 2, T0 + 1, &mut |_| {
                        Some(Claim {
                            execution_id: taskmesh_core::id::new_execution_id(),
                            worker_id: worker.into(),
                            ack_deadline: T0 + 9_000,
                        })
                    })
                    .await
                    .expect("claim");
                ids.extend(got.into_iter().map(|t| t.id));
            }
            ids
        })
    };
    let (ia, ib) = (
        claimer(Arc::clone(&a), "w-a"),
        claimer(Arc::clone(&b), "w-b"),
    );
    let ids = [ia.await.expect("join"), ib.await.expect("join")].concat();
    let unique: BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a task was claimed twice");
    assert_eq!(ids.len(), 60);
}

/// A write transaction dropped before its commit (an error, a cancelled
/// caller) leaves nothing behind, and the writer serves the next one.
#[tokio::test]
async fn an_unfinished_write_rolls_back_and_frees_the_writer() {
    use crate::sql::Backend;
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let b = store.backend();
    let mut tx = b.begin_write().await.expect("begin");
    let written = b
        .exec(
            &mut tx,
            "INSERT INTO fences (name, token) VALUES ('probe', 7)",
            Vec::new(),
        )
        .await
        .expect("insert");
    assert_eq!(written, 1);
    drop(tx);
    let mut tx = b.begin_write().await.expect("the writer is free again");
    let rows = b
        .fetch(
            &mut tx,
            "SELECT COUNT(*) AS n FROM fences WHERE name = 'probe'",
            Vec::new(),
        )
        .await
        .expect("count");
    assert_eq!(crate::decode::Columns::int(&rows[0], "n"), Ok(0));
    b.commit(tx).await.expect("commit");
}

/// The writer's busy time counts every transaction, committed or not,
/// for as long as it held the writer.
#[tokio::test]
async fn the_writer_counts_each_transaction_and_the_time_it_held_it() {
    use crate::sql::Backend;
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let b = store.backend();
    // Other tests of this process write too: the counters only grow, so
    // what this test's transactions add is a lower bound.
    let (txs, held) = super::writer_held();
    let hold = std::time::Duration::from_millis(20);
    let tx = b.begin_write().await.expect("begin");
    std::thread::sleep(hold); // held on purpose: the time to be counted
    b.commit(tx).await.expect("commit");
    drop(b.begin_write().await.expect("begin"));
    let (txs_after, held_after) = super::writer_held();
    assert!(txs_after >= txs + 2, "{txs} then {txs_after}");
    assert!(held_after >= held + hold, "{held:?} then {held_after:?}");
}
