//! Mapping between SQLite rows and the domain records, in one place so the
//! column order of reads and writes cannot drift apart. Decoding is shared
//! with Postgres (`crate::decode`); bad data in a row is an
//! [`Error::Internal`](crate::Error::Internal) naming the task, never a panic.

use sqlx::sqlite::{Sqlite, SqliteArguments, SqliteRow};
use taskmesh_core::{AttemptRecord, CallbackDelivery, TaskRecord};

use crate::{Result, decode};

/// A query with positional arguments, as bound here.
pub(super) type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

/// Inserts a new task row: id, client_request_id, request_fingerprint, then
/// the body columns in [`bind_body`] order.
pub(super) const INSERT_TASK: &str = "INSERT INTO tasks (id, client_request_id, \
    request_fingerprint, handler, payload, content_type, state, priority, labels, routing_key, \
    callback_url, max_attempts, initial_backoff_ms, backoff_multiplier, max_backoff_ms, \
    timeout_ms, run_at, created_at, updated_at, pending_at, ready_at, dispatching_at, \
    running_at, retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, \
    output, output_content_type, error_message, version, traceparent, balancer, schedule_id) \
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, \
    ?, ?, ?, ?, ?, ?, ?, ?)";

/// Rewrites a whole task row (body columns in [`bind_body`] order), then
/// `WHERE id = ? AND version = ?`: the compare-and-set.
pub(super) const UPDATE_TASK_CAS: &str = "UPDATE tasks SET handler = ?, payload = ?, \
    content_type = ?, state = ?, priority = ?, labels = ?, routing_key = ?, callback_url = ?, \
    max_attempts = ?, initial_backoff_ms = ?, backoff_multiplier = ?, max_backoff_ms = ?, \
    timeout_ms = ?, run_at = ?, created_at = ?, updated_at = ?, pending_at = ?, ready_at = ?, \
    dispatching_at = ?, running_at = ?, retrying_at = ?, ended_at = ?, attempt = ?, \
    run_count = ?, execution_id = ?, worker_id = ?, next_at = ?, output = ?, \
    output_content_type = ?, error_message = ?, version = ?, traceparent = ?, balancer = ?, \
    schedule_id = ? WHERE id = ? AND version = ?";

/// Binds every column of `task` except id, client_request_id and
/// request_fingerprint (which never change after insert), in the order of
/// [`INSERT_TASK`] and [`UPDATE_TASK_CAS`].
pub(super) fn bind_body<'q>(q: SqliteQuery<'q>, task: &TaskRecord) -> Result<SqliteQuery<'q>> {
    let labels = decode::labels_json(task)?;
    let t = &task.times;
    Ok(q.bind(task.handler.clone())
        .bind(task.payload.clone())
        .bind(task.content_type.clone())
        .bind(task.state.as_str())
        .bind(task.priority)
        .bind(labels)
        .bind(task.routing_key.clone())
        .bind(task.callback_url.clone())
        .bind(i64::from(task.retry.max_attempts))
        .bind(task.retry.initial_backoff_ms)
        .bind(task.retry.multiplier)
        .bind(task.retry.max_backoff_ms)
        .bind(task.timeout_ms)
        .bind(task.run_at)
        .bind(task.created_at)
        .bind(task.updated_at)
        .bind(t.pending)
        .bind(t.ready)
        .bind(t.dispatching)
        .bind(t.running)
        .bind(t.retrying)
        .bind(t.end)
        .bind(i64::from(task.attempt))
        .bind(i64::from(task.run_count))
        .bind(task.execution_id.clone())
        .bind(task.worker_id.clone())
        .bind(task.next_at)
        .bind(task.output.clone())
        .bind(task.output_content_type.clone())
        .bind(task.error_message.clone())
        .bind(task.version)
        .bind(task.traceparent.clone())
        .bind(task.balancer.map(|b| b.as_str()))
        .bind(task.schedule_id.clone()))
}

/// Reads a task (attempts left empty) from a row of `task_columns!()`.
pub(super) fn task_from_row(row: &SqliteRow) -> Result<TaskRecord> {
    decode::task(row)
}

/// The stored request fingerprint of a task row.
pub(super) fn fingerprint_from_row(row: &SqliteRow) -> Result<String> {
    decode::fingerprint(row)
}

/// Reads an attempt of task `task_id` from a row of the `attempts` table.
pub(super) fn attempt_from_row(row: &SqliteRow, task_id: &str) -> Result<AttemptRecord> {
    decode::attempt(row, task_id)
}

/// The `callbacks` columns in the order [`callback_from_row`] reads them
/// (plus `task_id`, which it does not).
pub(super) const CALLBACK_COLUMNS: &str = "delivery_id, task_id, url, state, attempts, \
    last_error, next_attempt_at, delivered_at, created_at";

/// Reads an outbox entry from a row of [`CALLBACK_COLUMNS`].
pub(super) fn callback_from_row(row: &SqliteRow) -> Result<CallbackDelivery> {
    decode::callback(row)
}
