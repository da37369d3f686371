//! SQLite-specific checks the backend-independent conformance suite cannot
//! make: connection settings, query plans against the migration's indexes,
//! corrupt rows, unique-violation detection, and two stores (as two
//! processes would) sharing one file.

use std::collections::BTreeSet;
use std::sync::Arc;

use sqlx::Row;
use taskmesh_core::TaskState;
use tempfile::TempDir;

use super::store_impl::{
    CLAIM_CALLBACKS_SQL, CLAIM_SQL, DUE_SQL, NEXT_CALLBACK_SQL, NEXT_DUE_SQL, READY_COUNTS_SQL,
    list_sql,
};
use super::{SqliteOptions, SqliteStore, tx};
use crate::conformance::{T0, new_task};
use crate::error::is_unique_violation;
use crate::{Claim, Error, Store, TaskFilter};

async fn pragma(pool: &sqlx::SqlitePool, name: &str) -> String {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
        .fetch_one(pool)
        .await
        .expect("pragma");
    row.try_get::<String, _>(0)
        .or_else(|_| row.try_get::<i64, _>(0).map(|v| v.to_string()))
        .expect("pragma value")
}

#[tokio::test]
async fn open_creates_directories_and_applies_settings() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("a/b/store.db");
    let store = SqliteStore::open(SqliteOptions::new(&path))
        .await
        .expect("open");
    assert!(path.exists());
    assert_eq!(pragma(&store.writer, "journal_mode").await, "wal");
    assert_eq!(pragma(&store.reader, "journal_mode").await, "wal");
    assert_eq!(pragma(&store.writer, "synchronous").await, "2", "FULL");
    assert_eq!(pragma(&store.writer, "foreign_keys").await, "1");
    assert_eq!(pragma(&store.reader, "query_only").await, "1");
    let refused = sqlx::query("DELETE FROM tasks")
        .execute(&store.reader)
        .await;
    assert!(refused.is_err(), "readers must not write");
    store.close().await;

    let relaxed = SqliteOptions {
        synchronous_full: false,
        ..SqliteOptions::new(&path)
    };
    let store = SqliteStore::open(relaxed).await.expect("reopen");
    assert_eq!(pragma(&store.writer, "synchronous").await, "1", "NORMAL");
}

/// Every fixed query reads through the index the migration made for it,
/// and none sorts rows by hand.
#[tokio::test]
async fn queries_use_their_indexes() {
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let by_state = list_sql(&TaskFilter {
        state: Some(TaskState::Ready),
        ..TaskFilter::default()
    });
    let by_handler = list_sql(&TaskFilter {
        handler: Some("h".into()),
        before_id: Some("z".into()),
        ..TaskFilter::default()
    });
    let cases: [(&str, String, usize); 8] = [
        ("callbacks_due", CLAIM_CALLBACKS_SQL.into(), 2),
        ("callbacks_due", NEXT_CALLBACK_SQL.into(), 0),
        ("tasks_ready_claim", CLAIM_SQL.into(), 3),
        ("tasks_next_at", DUE_SQL.into(), 2),
        ("tasks_next_at", NEXT_DUE_SQL.into(), 0),
        ("tasks_ready_claim", READY_COUNTS_SQL.into(), 0),
        ("tasks_state_id", by_state, 2),
        ("tasks_handler_id", by_handler, 3),
    ];
    for (index, sql, params) in cases {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
        for _ in 0..params {
            q = q.bind(1_i64);
        }
        let plan: Vec<String> = q
            .fetch_all(&store.reader)
            .await
            .expect("explain")
            .iter()
            .map(|row| row.get::<String, _>("detail"))
            .collect();
        let plan = plan.join(" | ");
        assert!(plan.contains(index), "{sql}\nuses {plan}, not {index}");
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
    sqlx::query("UPDATE tasks SET labels = 'not json' WHERE id = ?")
        .bind(&task.id)
        .execute(&store.writer)
        .await
        .expect("corrupt the row");

    let errors = [
        store.get_task(&task.id).await.expect_err("get"),
        store
            .list_tasks(&TaskFilter {
                limit: 10,
                ..TaskFilter::default()
            })
            .await
            .expect_err("list"),
        store
            .transition(&task.id, &taskmesh_core::Event::Due, T0)
            .await
            .expect_err("transition"),
        store
            .claim_ready("h", 1, T0, &mut |_| None)
            .await
            .expect_err("claim"),
    ];
    for err in errors {
        assert!(
            matches!(&err, Error::Internal(text) if text.contains(&task.id)),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn duplicate_request_id_insert_is_a_unique_violation() {
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let keyed = || {
        let mut t = new_task("h");
        t.client_request_id = Some("req".into());
        t.into_record(T0)
    };
    let mut conn = store.writer.acquire().await.expect("conn");
    tx::insert_task(&mut conn, &keyed(), "fp")
        .await
        .expect("bind")
        .expect("first insert");
    let err = tx::insert_task(&mut conn, &keyed(), "fp")
        .await
        .expect("bind")
        .expect_err("second insert");
    assert!(is_unique_violation(&err), "{err:?}");
    let other = sqlx::query("SELECT nope FROM tasks")
        .execute(&mut *conn)
        .await
        .expect_err("bad SQL");
    assert!(!is_unique_violation(&other));
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
                    .claim_ready("h", 2, T0 + 1, &mut |_| {
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
