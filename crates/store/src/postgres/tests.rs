//! Postgres-specific checks the conformance suite cannot make: the fixed
//! queries can read through the migration's indexes without sorting, and
//! corrupt rows are errors naming the task, on every read path (the batch
//! paths included).

use sqlx::Row;

use super::PostgresStore;
use super::scratch::ScratchSchema;
use crate::Store;
use crate::conformance::{T0, new_task};

async fn store() -> (ScratchSchema, PostgresStore) {
    let schema = ScratchSchema::create()
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let store = PostgresStore::connect(schema.options())
        .await
        .expect("connect");
    (schema, store)
}

/// Closes the store (so no connection still holds locks) and drops the
/// schema, failing the test if that fails.
async fn finish(schema: ScratchSchema, store: PostgresStore) {
    store.close().await;
    schema.drop_now().await.expect("drop the schema");
}

/// Every fixed query can read through the index the migration made for it,
/// in order. The tables are small, so the planner would rightly prefer
/// scanning or sorting them; with sequential scans, bitmap scans and sorts
/// priced out, a plan still holding a Sort means no index gives the order.
/// They are not empty, and their statistics are fresh: on an empty table
/// every index costs the same, and the planner may take a partial one it
/// can prove (the delete of ended tasks by id, the index of the states out
/// of flight) over the primary key.
#[tokio::test]
async fn queries_can_use_their_indexes() {
    let (schema, store) = store().await;
    let tasks = (0..400)
        .map(|i| (new_task(&format!("h{}", i % 20)), "fp".to_string()))
        .collect();
    let created = store.create_tasks(tasks, T0).await.expect("create");
    let cancel = taskmesh_core::Event::Cancel {
        reason: "done".into(),
    };
    let ended: Vec<_> = created
        .iter()
        .step_by(2)
        .map(|c| {
            let task = &c.as_ref().expect("created").task;
            (task.id.clone(), cancel.clone())
        })
        .collect();
    store
        .transition_many(&ended, T0 + 1, None)
        .await
        .expect("cancel");
    let cases = crate::sql::testing::indexed_queries(store.sql());
    let mut conn = store.backend().pool.acquire().await.expect("conn");
    sqlx::raw_sql("ANALYZE")
        .execute(&mut *conn)
        .await
        .expect("analyze");
    // Generic plans: what the prepared statements run, whatever the values.
    sqlx::raw_sql(
        "SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off; \
         SET plan_cache_mode = force_generic_plan",
    )
    .execute(&mut *conn)
    .await
    .expect("set");
    for (index, query, params) in cases {
        // Untyped literals: Postgres infers each parameter's type from the
        // statement, as it does for the driver's prepared statements.
        let args = if params.is_empty() {
            String::new()
        } else {
            format!("({})", vec!["'1'"; params.len()].join(", "))
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE q AS {query}")))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        let plan: Vec<String> =
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("EXPLAIN EXECUTE q{args}")))
                .fetch_all(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("explain {query}: {e}"))
                .iter()
                .map(|row| row.get::<String, _>(0))
                .collect();
        let plan = plan.join("\n");
        assert!(
            index.split('|').any(|i| plan.contains(i)),
            "{query}\nuses\n{plan}\nnot {index}"
        );
        assert!(!plan.contains("Sort"), "{query}\nsorts:\n{plan}");
        sqlx::raw_sql("DEALLOCATE q")
            .execute(&mut *conn)
            .await
            .expect("deallocate");
    }
    drop(conn);
    finish(schema, store).await;
}

#[tokio::test]
async fn corrupt_rows_are_internal_errors_naming_the_task() {
    let (schema, store) = store().await;
    let task = store
        .create_task(new_task("h"), "fp", T0)
        .await
        .expect("create")
        .task;
    sqlx::query("UPDATE tasks SET state = 'NOPE' WHERE id = $1")
        .bind(&task.id)
        .execute(&store.backend().pool)
        .await
        .expect_err("the CHECK constraint guards the state");
    // Past the constraints: labels that are JSON but not an object.
    sqlx::query("UPDATE tasks SET labels = '[1]' WHERE id = $1")
        .bind(&task.id)
        .execute(&store.backend().pool)
        .await
        .expect("corrupt the row");

    crate::sql::testing::corrupt_rows_are_internal_errors(&store, &task.id).await;
    finish(schema, store).await;
}

/// Postgres's SQLSTATEs map to the store's vocabulary.
#[tokio::test]
async fn error_codes_map_to_the_store_vocabulary() {
    let (schema, store) = store().await;
    crate::sql::testing::error_codes_map_to_the_store_vocabulary(&store).await;
    finish(schema, store).await;
}
