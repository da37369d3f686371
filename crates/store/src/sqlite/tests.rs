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
    // NORMAL on the connection: the WAL's sync after each commit is the
    // writer's own thread's (`WalSync`), and a commit waits for it.
    assert_eq!(writer_pragma(&store, "synchronous").await, "1", "NORMAL");
    assert!(
        store.backend().writer.syncs(),
        "durable commits sync the WAL"
    );
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
    assert!(
        !store.backend().writer.syncs(),
        "relaxed: no sync of its own"
    );
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

/// A writer on a new file at `dir`, whose syncs of the WAL each wait for a
/// permit on the returned sender (or fail, with `fail`), with a table `t`,
/// and the count of syncs begun.
fn held_back_writer(
    dir: &TempDir,
    fail: bool,
) -> (
    super::Writer,
    std::sync::mpsc::Sender<()>,
    Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (permit, permits) = std::sync::mpsc::channel::<()>();
    let permits = std::sync::Mutex::new(permits);
    let begun = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&begun);
    let hook = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        if fail {
            return Err(std::io::Error::other("the disk went away"));
        }
        permits
            .lock()
            .expect("permits")
            .recv()
            .map_err(std::io::Error::other)
    };
    let writer = super::Writer::open(
        &dir.path().join("held.db"),
        &super::WriterSettings {
            synchronous_full: true,
            busy_timeout: std::time::Duration::from_secs(5),
            statements: 16,
            before_sync: Some(super::writer::BeforeSync(Arc::new(hook))),
        },
    )
    .expect("open the writer");
    (writer, permit, begun)
}

/// Polls `f` once, as an executor would, without waiting.
fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::Pin::new(f).poll(&mut cx)
}

/// Waits (up to 10 s) until `n` syncs have begun.
async fn syncs_begun(begun: &std::sync::atomic::AtomicU64, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while begun.load(std::sync::atomic::Ordering::SeqCst) < n {
        assert!(std::time::Instant::now() < deadline, "sync {n} never began");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// A commit is answered only after a sync of the WAL that began after it
/// was written; the writer serves the next transactions meanwhile, and one
/// sync covers every commit written while the one before it ran.
#[tokio::test]
async fn a_commit_waits_for_its_sync_and_the_writer_does_not() {
    let dir = TempDir::new().expect("tempdir");
    let (writer, permit, begun) = held_back_writer(&dir, false);
    let within = std::time::Duration::from_secs(10);
    // Yields the commit still waiting for its sync, on purpose.
    #[allow(clippy::async_yields_async)]
    let write = |sql: &'static str| {
        let writer = writer.clone();
        async move {
            let mut tx = tokio::time::timeout(within, writer.begin())
                .await
                .expect("the writer is free while a sync runs")
                .expect("begin");
            tx.exec(sql, Vec::new()).expect("statement");
            // Polled once, as an executor would: it commits, lets the
            // writer go, and waits for its sync.
            let mut commit = Box::pin(tx.commit());
            assert!(
                poll_once(&mut commit).is_pending(),
                "answered before a sync"
            );
            commit
        }
    };
    let mut first = write("CREATE TABLE t (x INTEGER)").await;
    syncs_begun(&begun, 1).await;
    let mut second = write("INSERT INTO t VALUES (1)").await;
    let mut third = write("INSERT INTO t VALUES (2)").await;
    for commit in [&mut first, &mut second, &mut third] {
        assert!(
            poll_once(commit).is_pending(),
            "answered while its sync is held"
        );
    }
    permit.send(()).expect("first sync");
    tokio::time::timeout(within, &mut first)
        .await
        .expect("the first sync ended")
        .expect("first commit");
    syncs_begun(&begun, 2).await;
    assert!(
        poll_once(&mut second).is_pending(),
        "the second sync is held"
    );
    permit.send(()).expect("second sync");
    for commit in [second, third] {
        tokio::time::timeout(within, commit)
            .await
            .expect("the second sync ended")
            .expect("commit");
    }
    assert_eq!(
        begun.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one sync for both commits written while the first ran"
    );
    let mut tx = writer.begin().await.expect("begin");
    let rows = tx
        .fetch("SELECT COUNT(*) AS n FROM t", Vec::new())
        .expect("count");
    assert_eq!(crate::decode::Columns::int(&rows[0], "n"), Ok(2));
}

/// A failed sync fails the commits it was to cover and every write after
/// it, with an error that says why and what to do.
#[tokio::test]
async fn a_failed_sync_fails_its_commit_and_every_write_after_it() {
    let dir = TempDir::new().expect("tempdir");
    let (writer, _permit, _begun) = held_back_writer(&dir, true);
    let mut tx = writer.begin().await.expect("begin");
    tx.exec("CREATE TABLE t (x INTEGER)", Vec::new())
        .expect("statement");
    let err = tx.commit().await.expect_err("its sync failed");
    assert!(matches!(err, sqlx::Error::Io(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("syncing the SQLite WAL failed (the disk went away)")
            && text.contains("restart"),
        "{text}"
    );
    let refused = writer.begin().await.expect_err("nothing is built on it");
    assert_eq!(refused.to_string(), text);
    let store_err = crate::Error::from(refused);
    assert!(
        matches!(store_err, crate::Error::Unavailable(_)),
        "{store_err:?}"
    );
}
