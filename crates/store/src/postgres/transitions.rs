//! `transition_many` (and `transition`, a batch of one) on Postgres: one
//! transaction that locks the batch's rows in id order, applies the events
//! in memory with `taskmesh_core::apply` and writes them with one
//! compare-and-set statement (`super::batch`). A row that moved anyway is
//! redone row by row; a batch the database refuses (a constraint) is
//! written again with a savepoint per event, so each event still succeeds
//! or fails on its own.

use std::collections::HashMap;

use sqlx::Row;
use taskmesh_core::{Event, TaskRecord, UnixMillis};

use super::batch::Batch;
use super::{PostgresStore, sql, tx};
use crate::error::{Kind, kind};
use crate::{Error, Result, TaskChange, decode};

/// The text of an [`Error::Internal`], to report one bad row to each event
/// that names it.
fn internal_text(err: Error) -> String {
    match err {
        Error::Internal(text) => text,
        other => other.to_string(),
    }
}

/// True when a failed batch statement is worth writing again row by row: a
/// constraint or data error, not a lost connection or an aborted
/// transaction (which the row path would meet again).
fn row_path_may_help(err: &sqlx::Error) -> bool {
    matches!(kind(err), Kind::Internal | Kind::AlreadyExists)
}

/// Applies one event in a savepoint of `db`: failing half-way (say, on its
/// attempts row) leaves nothing behind, and the transaction goes on.
async fn transition_in_savepoint(
    db: &mut sqlx::PgConnection,
    id: &str,
    event: &Event,
    now: UnixMillis,
) -> Result<Result<TaskRecord>> {
    let mut sp = sqlx::Connection::begin(&mut *db).await?;
    let result = tx::transition_one(&mut sp, id, event, now).await;
    if result.is_ok() {
        sp.commit().await?;
    } else {
        sp.rollback().await?;
    }
    Ok(result)
}

impl PostgresStore {
    /// `transition_many` in one statement; see the module comment.
    pub(super) async fn transition_batch(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        if events.is_empty() && fence.is_none() {
            return Ok(Vec::new());
        }
        let mut db = self.pool.begin().await?;
        tx::check_fence(&mut db, fence).await?;
        let mut ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        // Locked in id order: the batch statement updates rows in whatever
        // order its plan joins them, and two batches sharing rows must not
        // take their locks in opposite orders (a deadlock).
        let rows = sqlx::query(sql::LOCK_TASKS)
            .bind(&ids)
            .fetch_all(&mut *db)
            .await?;
        let mut current: HashMap<String, Result<TaskRecord, String>> = HashMap::new();
        for row in &rows {
            let id: String = row
                .try_get("id")
                .map_err(|e| Error::Internal(format!("task row without a readable id: {e}")))?;
            current.insert(id, decode::task(row).map_err(internal_text));
        }

        let mut batch = Batch::default();
        let mut results = Vec::with_capacity(events.len());
        for (id, event) in events {
            let result = match current.get_mut(id.as_str()) {
                None => Err(Error::NotFound(id.clone())),
                Some(Err(text)) => Err(Error::Internal(text.clone())),
                Some(Ok(task)) => match taskmesh_core::apply(task, event, now) {
                    Ok(mut transition) => {
                        batch.push(task, &mut transition);
                        *task = transition.task.clone();
                        Ok(transition.task)
                    }
                    Err(err) => Err(err.into()),
                },
            };
            results.push(result);
        }
        if batch.is_empty() {
            db.commit().await?;
            return Ok(results);
        }
        if batch.needs_full_rows() {
            db.rollback().await?;
            return self.transition_rows(events, now, fence).await;
        }
        let missed = match batch.write(&mut db).await {
            Ok(missed) => missed,
            Err(err) if row_path_may_help(&err) => {
                db.rollback().await?;
                tracing::debug!(error = %err, "batch write failed; writing row by row");
                return self.transition_rows(events, now, fence).await;
            }
            Err(err) => return Err(err.into()),
        };
        // Every event of a task whose row moved since it was read (it
        // cannot while locked; the check keeps the batch correct without
        // relying on that) is applied again to the task as it is now, a
        // savepoint each.
        for ((id, event), result) in events.iter().zip(results.iter_mut()) {
            if missed.contains(id) {
                tracing::debug!(task_id = %id, "lost compare-and-set in a batch; re-reading");
                *result = transition_in_savepoint(&mut db, id, event, now).await?;
            }
        }
        db.commit().await?;
        self.publish(results.iter().flatten().map(TaskChange::of), []);
        Ok(results)
    }

    /// `transition_many` row by row, a savepoint per event: an event failing
    /// half-way (say, on its attempts row) leaves nothing behind, and the
    /// others go on.
    async fn transition_rows(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        let mut db = self.pool.begin().await?;
        tx::check_fence(&mut db, fence).await?;
        // Locked up front in id order, as on the batch path.
        let mut ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        sqlx::query(sql::LOCK_TASKS)
            .bind(&ids)
            .execute(&mut *db)
            .await?;
        let mut results = Vec::with_capacity(events.len());
        for (id, event) in events {
            results.push(transition_in_savepoint(&mut db, id, event, now).await?);
        }
        db.commit().await?;
        self.publish(results.iter().flatten().map(TaskChange::of), []);
        Ok(results)
    }
}
