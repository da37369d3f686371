//! MySQL-specific checks the conformance suites cannot make: the fixed
//! queries read through the migration's indexes without sorting, error
//! numbers land in the store's vocabulary, and corrupt rows are errors
//! naming the task.

use sqlx::Row;

use super::MysqlStore;
use super::scratch::ScratchDatabase;
use crate::Store;
use crate::conformance::{T0, new_task};

async fn store() -> (ScratchDatabase, MysqlStore) {
    let database = ScratchDatabase::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let store = MysqlStore::connect(database.options())
        .await
        .expect("connect");
    (database, store)
}

async fn finish(database: ScratchDatabase, store: MysqlStore) {
    store.close().await;
    database.drop_now().await.expect("drop the database");
}

/// Every fixed query reads through the index the migration made for it,
/// and none sorts rows by hand (`Using filesort`), on a table with enough
/// rows (and fresh statistics) that the optimizer's choice means something.
#[tokio::test]
async fn queries_use_their_indexes() {
    let (database, store) = store().await;
    let tasks = (0..400)
        .map(|i| (new_task(&format!("h{}", i % 20)), "fp".to_string()))
        .collect();
    store.create_tasks(tasks, T0).await.expect("create");
    // Some callbacks too: with none, MySQL answers MIN() from nothing.
    let mut ended = Vec::new();
    for _ in 0..10 {
        let t = taskmesh_core::NewTask {
            callback_url: "http://127.0.0.1:9/cb".into(),
            ..new_task("cb")
        };
        let t = store.create_task(t, "fp", T0).await.expect("create").task;
        let cancel = taskmesh_core::Event::Cancel {
            reason: "done".into(),
        };
        ended.push((t.id, cancel));
    }
    store
        .transition_many(&ended, T0 + 1, None)
        .await
        .expect("cancel");
    let pool = &store.backend().pool;
    sqlx::query("ANALYZE TABLE tasks, callbacks, schedules")
        .fetch_all(pool)
        .await
        .expect("analyze");
    let cases = crate::sql::testing::indexed_queries(store.sql());
    for (index, query, params) in cases {
        // EXPLAIN of a locking read explains the read.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {query}")));
        for kind in params.chars() {
            q = match kind {
                'n' => q.bind(taskmesh_core::validate::DEFAULT_NAMESPACE),
                't' => q.bind("h1"),
                _ => q.bind(1_i64),
            };
        }
        let rows = q
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        let plan: Vec<(Option<String>, Option<String>)> = rows
            .iter()
            .map(|r| (r.get("key"), r.get("Extra")))
            .collect();
        // A MIN() answered from the index's end while planning shows no key
        // but "Select tables optimized away": the best plan there is.
        let optimized_away = plan
            .iter()
            .any(|(_, extra)| extra.as_deref() == Some("Select tables optimized away"));
        assert!(
            optimized_away
                || plan.iter().any(|(key, _)| key
                    .as_deref()
                    .is_some_and(|k| index.split('|').any(|i| i == k))),
            "{query}\nuses {plan:?}, not {index}"
        );
        assert!(
            !plan
                .iter()
                .any(|(_, extra)| extra.as_deref().unwrap_or("").contains("filesort")),
            "{query}\nsorts: {plan:?}"
        );
    }
    finish(database, store).await;
}

#[tokio::test]
async fn corrupt_rows_are_internal_errors_naming_the_task() {
    let (database, store) = store().await;
    let task = store
        .create_task(new_task("h"), "fp", T0)
        .await
        .expect("create")
        .task;
    let pool = &store.backend().pool;
    sqlx::query("UPDATE tasks SET state = 'NOPE' WHERE id = ?")
        .bind(&task.id)
        .execute(pool)
        .await
        .expect_err("the CHECK constraint guards the state");
    // Past the constraints: labels that are JSON but not an object.
    sqlx::query("UPDATE tasks SET labels = '[1]' WHERE id = ?")
        .bind(&task.id)
        .execute(pool)
        .await
        .expect("corrupt the row");
    crate::sql::testing::corrupt_rows_are_internal_errors(&store, &task.id).await;
    finish(database, store).await;
}

/// MySQL's error numbers map to the store's vocabulary.
#[tokio::test]
async fn error_codes_map_to_the_store_vocabulary() {
    let (database, store) = store().await;
    crate::sql::testing::error_codes_map_to_the_store_vocabulary(&store).await;
    finish(database, store).await;
}
