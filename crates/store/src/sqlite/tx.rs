//! Statements run on one connection, mostly inside a write transaction: read
//! a task, insert it, and persist a [`Transition`] computed by
//! `taskmesh_core::apply` with a compare-and-set on the version plus its
//! attempts change.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, SqliteConnection};
use taskmesh_core::{
    AttemptChange, AttemptRecord, CallbackDelivery, CallbackState, Event, TaskRecord, Transition,
    UnixMillis,
};

use super::rows::{
    CALLBACK_COLUMNS, INSERT_TASK, UPDATE_TASK_CAS, attempt_from_row, bind_body, callback_from_row,
    fingerprint_from_row, task_from_row,
};
use crate::{Error, Result};

/// Re-reads and re-applies this many times after a lost compare-and-set
/// before giving up with [`Error::Conflict`].
const MAX_CAS_TRIES: usize = 5;

/// The task `id` without attempts, if it exists.
pub(super) async fn load_task(conn: &mut SqliteConnection, id: &str) -> Result<Option<TaskRecord>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(task_from_row).transpose()
}

/// The attempts of task `id`, oldest first.
pub(super) async fn load_attempts(
    conn: &mut SqliteConnection,
    id: &str,
) -> Result<Vec<AttemptRecord>> {
    let rows = sqlx::query(
        "SELECT number, execution_id, worker_id, started_at, ended_at, outcome, message \
         FROM attempts WHERE task_id = ? ORDER BY number",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(|row| attempt_from_row(row, id)).collect()
}

/// The task holding `client_request_id` (with its attempts) and the
/// fingerprint of the request that created it.
pub(super) async fn find_by_request_id(
    conn: &mut SqliteConnection,
    client_request_id: &str,
) -> Result<Option<(TaskRecord, String)>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE client_request_id = ?"
    ))
    .bind(client_request_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut task = task_from_row(&row)?;
    let fingerprint = fingerprint_from_row(&row)?;
    task.attempts = load_attempts(conn, &task.id).await?;
    task.callback = load_callback(conn, &task.id).await?;
    Ok(Some((task, fingerprint)))
}

/// Inserts a new task row. The raw sqlx error is returned so the caller can
/// tell a unique violation (a racing create) from other failures.
pub(super) async fn insert_task(
    conn: &mut SqliteConnection,
    task: &TaskRecord,
    fingerprint: &str,
) -> Result<Result<(), sqlx::Error>> {
    let q = sqlx::query(INSERT_TASK)
        .bind(task.id.clone())
        .bind(task.client_request_id.clone())
        .bind(fingerprint.to_string());
    let q = bind_body(q, task)?;
    Ok(q.execute(&mut *conn).await.map(|_| ()))
}

/// The callback outbox entry of task `task_id`, if it has one.
pub(super) async fn load_callback(
    conn: &mut SqliteConnection,
    task_id: &str,
) -> Result<Option<CallbackDelivery>> {
    let sql = format!("SELECT {CALLBACK_COLUMNS} FROM callbacks WHERE task_id = ?");
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(task_id)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(callback_from_row).transpose()
}

/// The callback outbox entries of the tasks among `task_ids` that have one.
pub(super) async fn load_callbacks(
    conn: &mut SqliteConnection,
    task_ids: &[&str],
) -> Result<HashMap<String, CallbackDelivery>> {
    let mut out = HashMap::new();
    // Chunks keep each statement well below SQLite's bound-variable limit.
    for chunk in task_ids.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = format!("SELECT {CALLBACK_COLUMNS} FROM callbacks WHERE task_id IN ({marks})");
        // Only placeholders are spliced in; every value is bound.
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.to_string());
        }
        for row in q.fetch_all(&mut *conn).await? {
            let task_id: String = sqlx::Row::try_get(&row, "task_id")?;
            out.insert(task_id, callback_from_row(&row)?);
        }
    }
    Ok(out)
}

/// Queues the callback of a task that has just ended.
pub(super) async fn insert_callback(
    conn: &mut SqliteConnection,
    task: &TaskRecord,
) -> Result<CallbackDelivery> {
    let entry = CallbackDelivery {
        delivery_id: taskmesh_core::id::new_delivery_id(),
        url: task.callback_url.clone(),
        state: CallbackState::Pending,
        attempts: 0,
        last_error: String::new(),
        next_attempt_at: Some(task.updated_at),
        delivered_at: None,
        created_at: task.updated_at,
    };
    sqlx::query(
        "INSERT INTO callbacks (delivery_id, task_id, url, state, attempts, last_error, \
         next_attempt_at, delivered_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(entry.delivery_id.clone())
    .bind(task.id.clone())
    .bind(entry.url.clone())
    .bind(entry.state.as_str())
    .bind(i64::from(entry.attempts))
    .bind(entry.last_error.clone())
    .bind(entry.next_attempt_at)
    .bind(entry.delivered_at)
    .bind(entry.created_at)
    .execute(&mut *conn)
    .await?;
    Ok(entry)
}

/// Writes `transition` if the row still has `expected_version`, together
/// with its attempts change and, when the task has just ended with a
/// callback URL, its callback outbox entry (set on `transition.task`). False
/// when the compare-and-set missed (nothing was written).
pub(super) async fn write_transition(
    conn: &mut SqliteConnection,
    expected_version: i64,
    transition: &mut Transition,
) -> Result<bool> {
    let task = &transition.task;
    let q = bind_body(sqlx::query(UPDATE_TASK_CAS), task)?
        .bind(task.id.clone())
        .bind(expected_version);
    if q.execute(&mut *conn).await?.rows_affected() == 0 {
        return Ok(false);
    }
    match &transition.attempt {
        AttemptChange::None => {}
        AttemptChange::Open(attempt) => {
            sqlx::query(
                "INSERT INTO attempts (task_id, number, execution_id, worker_id, started_at, \
                 ended_at, outcome, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(task.id.clone())
            .bind(i64::from(attempt.number))
            .bind(attempt.execution_id.clone())
            .bind(attempt.worker_id.clone())
            .bind(attempt.started_at)
            .bind(attempt.ended_at)
            .bind(attempt.outcome.map(|o| o.as_str()))
            .bind(attempt.message.clone())
            .execute(&mut *conn)
            .await?;
        }
        AttemptChange::Close {
            execution_id,
            outcome,
            message,
            ended_at,
        } => {
            let closed = sqlx::query(
                "UPDATE attempts SET ended_at = ?, outcome = ?, message = ? \
                 WHERE task_id = ? AND execution_id = ?",
            )
            .bind(*ended_at)
            .bind(outcome.as_str())
            .bind(message.clone())
            .bind(task.id.clone())
            .bind(execution_id.clone())
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if closed == 0 {
                // The task row is authoritative; a missing attempts row must
                // not block the task's life, but it is worth a look.
                tracing::warn!(task_id = %task.id, execution_id = %execution_id, "no attempts row to close");
            }
        }
    }
    if task.wants_callback() {
        let entry = insert_callback(conn, task).await?;
        transition.task.callback = Some(entry);
    }
    Ok(true)
}

/// Applies `event` to task `id` at `now` and writes the result, re-reading
/// and re-applying when the compare-and-set misses. Returns the task as
/// written (attempts empty).
pub(super) async fn transition_one(
    conn: &mut SqliteConnection,
    id: &str,
    event: &Event,
    now: UnixMillis,
) -> Result<TaskRecord> {
    for _ in 0..MAX_CAS_TRIES {
        let task = load_task(conn, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_string()))?;
        let mut transition = taskmesh_core::apply(&task, event, now)?;
        if write_transition(conn, task.version, &mut transition).await? {
            return Ok(transition.task);
        }
        tracing::debug!(task_id = %id, version = task.version, "lost compare-and-set; re-reading");
    }
    Err(Error::Conflict(format!("task {id}")))
}

/// Raises the leader fence to `token` inside the caller's transaction, or
/// refuses with [`Error::Fenced`] when a newer leader has written already.
pub(super) async fn check_fence(conn: &mut SqliteConnection, fence: Option<u64>) -> Result<()> {
    let Some(token) = fence else { return Ok(()) };
    let token = i64::try_from(token)
        .map_err(|_| Error::Internal(format!("fencing token {token} out of range")))?;
    let raised = sqlx::query("UPDATE fences SET token = ? WHERE name = 'leader' AND token <= ?")
        .bind(token)
        .bind(token)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if raised == 1 {
        return Ok(());
    }
    let newest: i64 = sqlx::query_scalar("SELECT token FROM fences WHERE name = 'leader'")
        .fetch_one(&mut *conn)
        .await?;
    Err(Error::Fenced(format!(
        "fencing token {token} is older than {newest}: this node is no longer the leader"
    )))
}
