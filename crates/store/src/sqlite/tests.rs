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

/// Waits (with a deadline) until `n` callers queue for the writer.
async fn until_queued(store: &SqliteStore, n: usize) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (queued, _) = store.backend().writer.counts();
        if queued == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{queued} callers queued for the writer, waited for {n}"
        );
        tokio::task::yield_now().await;
    }
}

/// Starts a task that writes the fence `name` and commits (or, with
/// `keep: false`, drops its transaction unfinished), answering with its
/// commit's outcome.
fn write_fence(
    store: &SqliteStore,
    name: &'static str,
    keep: bool,
) -> tokio::task::JoinHandle<Result<(), String>> {
    use crate::sql::Backend;
    let store = store.clone();
    tokio::spawn(async move {
        let b = store.backend();
        let mut tx = b.begin_write().await.map_err(|e| e.to_string())?;
        b.exec(
            &mut tx,
            "INSERT INTO fences (name, token) VALUES (?, 1)",
            vec![crate::sql::Val::Text(Some(name.to_string()))],
        )
        .await
        .map_err(|e| e.to_string())?;
        if keep {
            b.commit(tx).await.map_err(|e| e.to_string())
        } else {
            drop(tx);
            Ok(())
        }
    })
}

async fn fences(store: &SqliteStore) -> BTreeSet<String> {
    sqlx::query_scalar::<_, String>("SELECT name FROM fences WHERE name LIKE 'probe-%'")
        .fetch_all(&store.backend().reader)
        .await
        .expect("read fences")
        .into_iter()
        .collect()
}

/// Transactions that end while others are queued leave their commit to the
/// last of them: one commit for all, each caller answered once it is
/// durable, and one that rolls back takes only its own writes with it.
#[tokio::test]
async fn queued_writers_share_one_commit() {
    use crate::sql::Backend;
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let b = store.backend();
    let (_, commits_before) = b.writer.counts();
    let mut first = b.begin_write().await.expect("begin");
    b.exec(
        &mut first,
        "INSERT INTO fences (name, token) VALUES ('probe-first', 1)",
        Vec::new(),
    )
    .await
    .expect("insert");
    let mut queued = Vec::new();
    for (i, (name, keep)) in [
        ("probe-a", true),
        ("probe-dropped", false),
        ("probe-b", true),
        ("probe-c", true),
    ]
    .into_iter()
    .enumerate()
    {
        queued.push(write_fence(&store, name, keep));
        until_queued(&store, i + 1).await;
    }
    b.commit(first).await.expect("the group commits");
    for task in queued {
        task.await.expect("joined").expect("each member's commit");
    }
    let (_, commits_after) = b.writer.counts();
    assert_eq!(
        commits_after - commits_before,
        1,
        "five transactions, one commit"
    );
    let names: BTreeSet<String> = ["probe-a", "probe-b", "probe-c", "probe-first"]
        .map(String::from)
        .into();
    assert_eq!(fences(&store).await, names, "the dropped one left nothing");
}

/// When SQLite rolls the whole transaction back under a member (as it does
/// on a full disk), every member of the group is told its write failed and
/// none of it is there.
#[tokio::test]
async fn a_group_lost_under_its_members_fails_them_all() {
    use crate::sql::Backend;
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let b = store.backend();
    let mut first = b.begin_write().await.expect("begin");
    b.exec(
        &mut first,
        "INSERT INTO fences (name, token) VALUES ('probe-first', 1)",
        Vec::new(),
    )
    .await
    .expect("insert");
    let wrecker = {
        let store = store.clone();
        tokio::spawn(async move {
            let b = store.backend();
            let mut tx = b.begin_write().await.map_err(|e| e.to_string())?;
            b.raw(&mut tx, "ROLLBACK")
                .await
                .map_err(|e| e.to_string())?;
            b.commit(tx).await.map_err(|e| e.to_string())
        })
    };
    until_queued(&store, 1).await;
    let first = b.commit(first).await;
    assert!(
        first.is_err(),
        "the first member's work was lost: {first:?}"
    );
    let wrecked = wrecker.await.expect("joined");
    assert!(wrecked.is_err(), "{wrecked:?}");
    assert_eq!(fences(&store).await, BTreeSet::new());
    // The writer goes on.
    write_fence(&store, "probe-after", true)
        .await
        .expect("joined")
        .expect("a later write");
    assert_eq!(fences(&store).await, ["probe-after".to_string()].into());
}

/// A group left for a caller that went away before it got the writer is
/// committed by its own member once nobody has.
#[tokio::test]
async fn a_group_whose_next_caller_went_away_commits_anyway() {
    use crate::sql::Backend;
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let b = store.backend();
    let mut tx = b.begin_write().await.expect("begin");
    b.exec(
        &mut tx,
        "INSERT INTO fences (name, token) VALUES ('probe-alone', 1)",
        Vec::new(),
    )
    .await
    .expect("insert");
    b.writer.phantom_queued(1);
    let committed = tokio::time::timeout(std::time::Duration::from_secs(10), b.commit(tx)).await;
    b.writer.phantom_queued(-1);
    committed
        .expect("committed without the caller")
        .expect("commit");
    assert_eq!(fences(&store).await, ["probe-alone".to_string()].into());
}

/// A bulk write (retention's removals) never joins an open group: the
/// transactions already in it commit before the bulk one begins, without
/// waiting for it.
#[tokio::test]
async fn a_bulk_write_commits_the_open_group_before_it_begins() {
    use crate::sql::Backend;
    let dir = TempDir::new().expect("tempdir");
    let store = SqliteStore::open_in(dir.path()).await.expect("open");
    let b = store.backend();
    let mut first = b.begin_write().await.expect("begin");
    b.exec(
        &mut first,
        "INSERT INTO fences (name, token) VALUES ('probe-first', 1)",
        Vec::new(),
    )
    .await
    .expect("insert");
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let bulk = {
        let store = store.clone();
        tokio::spawn(async move {
            let b = store.backend();
            let mut tx = b.begin_bulk_write().await.map_err(|e| e.to_string())?;
            b.exec(
                &mut tx,
                "INSERT INTO fences (name, token) VALUES ('probe-bulk', 1)",
                Vec::new(),
            )
            .await
            .map_err(|e| e.to_string())?;
            finished.await.map_err(|e| e.to_string())?;
            b.commit(tx).await.map_err(|e| e.to_string())
        })
    };
    until_queued(&store, 1).await;
    let (_, commits_before) = b.writer.counts();
    tokio::time::timeout(std::time::Duration::from_secs(10), b.commit(first))
        .await
        .expect("committed while the bulk write is still open")
        .expect("commit");
    assert_eq!(
        fences(&store).await,
        ["probe-first".to_string()].into(),
        "durable before the bulk write ends"
    );
    finish.send(()).expect("the bulk write waits");
    bulk.await.expect("joined").expect("the bulk write commits");
    let (_, commits_after) = b.writer.counts();
    assert_eq!(commits_after - commits_before, 2);
}
