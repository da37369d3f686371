//! The one SQL implementation of [`Store`](crate::Store): every algorithm
//! of the store — compare-and-set transitions and their batches, claims,
//! creates with idempotency, schedule fires, the callback outbox, the
//! leader fence, lists and paging — written once over the [`Backend`] seam.
//!
//! A backend supplies only what truly differs between databases: its SQL
//! dialect (placeholders, JSON columns, locking clauses; see `dialect`),
//! transactions and statement execution, its bulk write form, the database
//! clock, its wake-up transport, and its error-code table (`crate::error`).
//!
//! Layout: `backend` is the seam, `dialect` and `statements` the SQL,
//! `rows` the column lists and arguments; `tasks` creates and reads tasks,
//! `transitions` and `batch` write events, `claims` claims READY tasks,
//! `callbacks` the outbox, `workflows` workflows, `logs` task logs, `stats` GetStats' figures, `schedules` and `fires` the schedules, and
//! `store_impl` implements the trait by calling them.

mod backend;
mod batch;
mod callbacks;
mod claims;
mod dialect;
mod fires;
mod logs;
mod retention;
mod rows;
mod schedules;
mod statements;
mod stats;
mod store_impl;
mod tasks;
mod tokens;
mod transitions;
mod workflows;

use std::sync::Arc;

pub use backend::{Args, Backend, Val};

/// Prepared statements each connection keeps: above the number of texts
/// the store runs (about 150 with the ladder sizes), so none is evicted
/// and parsed again. sqlx's default is 100.
pub(crate) const STATEMENT_CACHE: usize = 1_024;
pub(crate) use backend::{args, bind_all, sqlx_backend};
pub use batch::Batch;
pub use dialect::{BulkForm, Dialect, LADDER, Ladder, PARTIAL_UNHELD};
pub use statements::{ListState, Statements, list_index};
pub use workflows::CreatedWorkflow;

pub use crate::decode::Columns;

use crate::wake::Channels;
use crate::{ScheduleChange, TaskChange};

/// A [`Store`](crate::Store) on the database behind backend `B`. Cheap to
/// clone: clones share the backend (its pools) and the change channels.
pub struct SqlStore<B: Backend> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    backend: B,
    channels: Arc<Channels>,
}

impl<B: Backend> Clone for SqlStore<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B: Backend + std::fmt::Debug> std::fmt::Debug for SqlStore<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.inner.backend)
            .finish()
    }
}

impl<B: Backend> SqlStore<B> {
    /// A store on `backend`, publishing to `channels` (which the backend's
    /// wake-up transport also feeds with other processes' changes).
    pub(crate) fn new(backend: B, channels: Arc<Channels>) -> Self {
        Self {
            inner: Arc::new(Inner { backend, channels }),
        }
    }

    /// The backend.
    pub(crate) fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The statements of the backend's dialect.
    pub(crate) fn sql(&self) -> &'static Statements {
        self.inner.backend.sql()
    }

    /// Publishes committed changes to this process's subscribers and
    /// announces them to the other processes.
    pub(crate) fn publish(&self, tasks: &[TaskChange], schedules: &[ScheduleChange]) {
        if tasks.is_empty() && schedules.is_empty() {
            return;
        }
        self.inner.channels.send(tasks, schedules);
        self.inner.backend.announce(tasks, schedules);
    }

    fn channels(&self) -> &Channels {
        &self.inner.channels
    }
}

/// Checks every backend's tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Backend, SqlStore};
    use crate::conformance::{T0, new_task};
    use crate::error::{Kind, kind};
    use crate::{Claim, Error, Store, TaskFilter};

    /// The fixed queries each backend checks its plans of: the index the
    /// migration made for each (or `|`-separated indexes, any of which
    /// will do), the statement, and its placeholders' kinds in order (`n` a namespace, `t` other text, `i` an integer).
    /// States are bound as text no row has: the lists by state are indexed
    /// for a selective state; when every row matches, a backend may rightly
    /// read the table in id order instead.
    pub(crate) fn indexed_queries(
        sql: &'static super::Statements,
    ) -> Vec<(&'static str, &'static str, &'static str)> {
        use super::{ListState, list_index};
        vec![
            ("callbacks_due", &sql.claim_callbacks, "ii"),
            ("callbacks_due", &sql.next_callback, ""),
            ("tasks_ready_claim", &sql.claim_first, "nti"),
            ("tasks_ready_claim", &sql.claim_after, "ntiiti"),
            (
                "tasks_ready_claim",
                sql.claim_after_except.get(1),
                "ntiitti",
            ),
            ("tasks_concurrency", &sql.in_flight_of_key, "nt"),
            ("tasks_next_at", &sql.due, "ii"),
            ("tasks_next_at", &sql.next_due, ""),
            ("tasks_ready_claim", &sql.ready_counts, ""),
            // InnoDB has no partial index: its claim index leads with the
            // state.
            ("tasks_in_flight|tasks_ready_claim", &sql.in_flight, ""),
            ("tasks_in_flight|tasks_ready_claim", &sql.in_flight_of, "t"),
            (
                "tasks_namespace_id",
                &sql.list[list_index(true, ListState::Any, false, true, false, false)],
                "nti",
            ),
            // A state out of flight: the partial index that leaves the
            // tasks in flight out (InnoDB has no partial index: the full
            // one).
            (
                "tasks_namespace_state_id_unheld|tasks_namespace_state_id",
                &sql.list[list_index(true, ListState::Unheld, false, false, false, false)],
                "nti",
            ),
            // Retention's first kept task of an ended state.
            (
                "tasks_namespace_state_id_unheld|tasks_namespace_state_id",
                &sql.oldest_ended,
                "nt",
            ),
            (
                "tasks_handler_id",
                &sql.list[list_index(true, ListState::Any, true, true, false, false)],
                "ntti",
            ),
            // Retention's scan: a range of ended tasks in the order they
            // ended, never those kept.
            ("tasks_ended", &sql.ended_ids, "tiiii"),
            // Workflow retention: ended workflows in the order they ended.
            ("workflows_ended", &sql.ended_workflows, "tiiii"),
            ("tasks_workflow", &sql.workflow_step_ids, "ti"),
            // Its delete goes by id (the states beside it match every
            // ended task).
            (
                "sqlite_autoindex_tasks_1|tasks_pkey|PRIMARY",
                sql.delete_ended.get(4),
                "tttt",
            ),
            // GetStats' queues, by the claim's index (or, on Postgres with
            // statistics, by the index of the states out of flight: the same
            // rows, hashed by handler).
            (
                "tasks_ready_claim|tasks_namespace_state_id_unheld",
                &sql.stats_queues,
                "n",
            ),
            // A workflow's steps, and its parents' outputs at a claim.
            ("tasks_workflow", &sql.steps_of, "t"),
            ("tasks_workflow", sql.step_outputs.get(1), "tt"),
            // A parent's children, newest first, and the next page.
            ("tasks_parent", &sql.by_parent[0], "ti"),
            ("tasks_parent", &sql.by_parent[3], "ttni"),
            ("schedules_due", &sql.due_schedules, "ii"),
            ("schedules_due", &sql.next_schedule_due, ""),
        ]
    }

    /// A statement of the test, leaked to live as long as statements do.
    fn statement(sql: String) -> &'static str {
        Box::leak(sql.into_boxed_str())
    }

    /// The backend's error codes land in the store's vocabulary: a taken
    /// key and a taken primary key are `AlreadyExists`, a statement the
    /// database refuses otherwise `Internal`.
    pub(crate) async fn error_codes_map_to_the_store_vocabulary<B: Backend>(store: &SqlStore<B>) {
        let mut keyed = new_task("h");
        keyed.client_request_id = Some("req".into());
        store.create_task(keyed, "fp", T0).await.expect("create");
        let other = store
            .create_task(new_task("h"), "fp", T0)
            .await
            .expect("create")
            .task;
        let b = store.backend();
        let taken_key = format!(
            "UPDATE tasks SET client_request_id = 'req' WHERE id = '{}'",
            other.id
        );
        // Each in a write transaction of its own, rolled back.
        let refused = async |sql: &'static str| {
            let mut tx = b.begin_write().await.expect("begin");
            b.exec(&mut tx, sql, Vec::new())
                .await
                .expect_err("the statement must be refused")
        };
        let err = refused(statement(taken_key)).await;
        assert_eq!(kind(&err), Kind::AlreadyExists, "{err:?}");
        let taken_id = "INSERT INTO fences (name, token) VALUES ('leader', 1)";
        let err = refused(taken_id).await;
        assert_eq!(kind(&err), Kind::AlreadyExists, "{err:?}");
        let err = refused("SELECT nope FROM tasks").await;
        assert_eq!(kind(&err), Kind::Internal, "{err:?}");
    }

    /// `task_id`'s row has been corrupted past the database's constraints:
    /// every read path and every write path that reads it (the batch
    /// paths included) is an `Internal` error naming the task, never a
    /// panic.
    pub(crate) async fn corrupt_rows_are_internal_errors(store: &dyn Store, task_id: &str) {
        let batch = store
            .transition_many(
                &[(task_id.to_string(), taskmesh_core::Event::Due)],
                T0,
                None,
            )
            .await
            .expect("the batch itself runs");
        let errors = [
            store.get_task(task_id).await.expect_err("get"),
            store
                .list_tasks(&TaskFilter {
                    limit: 10,
                    ..TaskFilter::default()
                })
                .await
                .expect_err("list"),
            store
                .transition(task_id, &taskmesh_core::Event::Due, T0)
                .await
                .expect_err("transition"),
            batch
                .into_iter()
                .next()
                .expect("one result")
                .expect_err("batch"),
            store
                .claim_ready("default", "h", 1, T0, &mut |_| {
                    Some(Claim {
                        execution_id: "e".into(),
                        worker_id: "w".into(),
                        ack_deadline: T0 + 1,
                    })
                })
                .await
                .expect_err("claim"),
        ];
        for err in errors {
            assert!(
                matches!(&err, Error::Internal(text) if text.contains(task_id)),
                "{err:?}"
            );
        }
    }
}
