//! Mapping between SQLite rows and the domain records, in one place so the
//! column order of reads and writes cannot drift apart. Bad data in a row is
//! an [`Error::Internal`] naming the task, never a panic.

use std::collections::BTreeMap;
use std::fmt::Display;

use sqlx::Row;
use sqlx::sqlite::{Sqlite, SqliteArguments, SqliteRow};
use taskmesh_core::{
    AttemptOutcome, AttemptRecord, CallbackDelivery, CallbackState, RetryPolicy, StateTimes,
    Strategy, TaskRecord, TaskState,
};

use crate::{Error, Result};

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
    let labels = serde_json::to_string(&task.labels)
        .map_err(|e| bad(&task.id, format_args!("cannot encode labels: {e}")))?;
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
    let id: String = row
        .try_get("id")
        .map_err(|e| Error::Internal(format!("task row without a readable id: {e}")))?;
    decode_task(row, &id).map_err(|e| bad(&id, e))
}

/// The stored request fingerprint of a task row.
pub(super) fn fingerprint_from_row(row: &SqliteRow) -> Result<String> {
    row.try_get("request_fingerprint")
        .map_err(|e| Error::Internal(format!("bad request_fingerprint: {e}")))
}

fn decode_task(row: &SqliteRow, id: &str) -> Result<TaskRecord, String> {
    let text = |col: &str| row.try_get::<String, _>(col).map_err(|e| e.to_string());
    let int = |col: &str| row.try_get::<i64, _>(col).map_err(|e| e.to_string());
    let opt_int = |col: &str| {
        row.try_get::<Option<i64>, _>(col)
            .map_err(|e| e.to_string())
    };
    let opt_text = |col: &str| {
        row.try_get::<Option<String>, _>(col)
            .map_err(|e| e.to_string())
    };
    let u32_col = |col: &str| -> Result<u32, String> {
        let v = int(col)?;
        u32::try_from(v).map_err(|_| format!("{col} = {v} is out of range"))
    };

    let state_text = text("state")?;
    let state =
        TaskState::parse(&state_text).ok_or_else(|| format!("unknown state {state_text:?}"))?;
    let labels: BTreeMap<String, String> =
        serde_json::from_str(&text("labels")?).map_err(|e| format!("bad labels JSON: {e}"))?;
    let priority = row
        .try_get::<i32, _>("priority")
        .map_err(|e| e.to_string())?;
    Ok(TaskRecord {
        id: id.to_string(),
        handler: text("handler")?,
        payload: row.try_get("payload").map_err(|e| e.to_string())?,
        content_type: text("content_type")?,
        state,
        priority,
        labels,
        routing_key: text("routing_key")?,
        client_request_id: opt_text("client_request_id")?,
        callback_url: text("callback_url")?,
        retry: RetryPolicy {
            max_attempts: u32_col("max_attempts")?,
            initial_backoff_ms: int("initial_backoff_ms")?,
            multiplier: row
                .try_get::<f64, _>("backoff_multiplier")
                .map_err(|e| e.to_string())?,
            max_backoff_ms: int("max_backoff_ms")?,
        },
        timeout_ms: int("timeout_ms")?,
        run_at: int("run_at")?,
        created_at: int("created_at")?,
        updated_at: int("updated_at")?,
        times: StateTimes {
            pending: opt_int("pending_at")?,
            ready: opt_int("ready_at")?,
            dispatching: opt_int("dispatching_at")?,
            running: opt_int("running_at")?,
            retrying: opt_int("retrying_at")?,
            end: opt_int("ended_at")?,
        },
        attempt: u32_col("attempt")?,
        run_count: u32_col("run_count")?,
        execution_id: opt_text("execution_id")?,
        worker_id: opt_text("worker_id")?,
        next_at: opt_int("next_at")?,
        output: row.try_get("output").map_err(|e| e.to_string())?,
        output_content_type: text("output_content_type")?,
        error_message: text("error_message")?,
        version: int("version")?,
        traceparent: text("traceparent")?,
        balancer: match opt_text("balancer")? {
            None => None,
            Some(b) => Some(Strategy::parse(&b).ok_or_else(|| format!("unknown balancer {b:?}"))?),
        },
        schedule_id: opt_text("schedule_id")?,
        attempts: Vec::new(),
        callback: None,
    })
}

/// Reads an attempt of task `task_id` from a row of the `attempts` table.
pub(super) fn attempt_from_row(row: &SqliteRow, task_id: &str) -> Result<AttemptRecord> {
    decode_attempt(row).map_err(|e| bad(task_id, format_args!("bad attempts row: {e}")))
}

fn decode_attempt(row: &SqliteRow) -> Result<AttemptRecord, String> {
    let number: i64 = row.try_get("number").map_err(|e| e.to_string())?;
    let outcome = match row
        .try_get::<Option<String>, _>("outcome")
        .map_err(|e| e.to_string())?
    {
        None => None,
        Some(text) => {
            Some(AttemptOutcome::parse(&text).ok_or_else(|| format!("unknown outcome {text:?}"))?)
        }
    };
    Ok(AttemptRecord {
        number: u32::try_from(number).map_err(|_| format!("number = {number} is out of range"))?,
        execution_id: row.try_get("execution_id").map_err(|e| e.to_string())?,
        worker_id: row.try_get("worker_id").map_err(|e| e.to_string())?,
        started_at: row.try_get("started_at").map_err(|e| e.to_string())?,
        ended_at: row.try_get("ended_at").map_err(|e| e.to_string())?,
        outcome,
        message: row.try_get("message").map_err(|e| e.to_string())?,
    })
}

/// The error for a task row that cannot be read or written.
fn bad(task_id: &str, what: impl Display) -> Error {
    Error::Internal(format!("task {task_id}: bad row: {what}"))
}

/// The `callbacks` columns in the order [`callback_from_row`] reads them
/// (plus `task_id`, which it does not).
pub(super) const CALLBACK_COLUMNS: &str = "delivery_id, task_id, url, state, attempts, \
    last_error, next_attempt_at, delivered_at, created_at";

/// Reads an outbox entry from a row of [`CALLBACK_COLUMNS`].
pub(super) fn callback_from_row(row: &SqliteRow) -> Result<CallbackDelivery> {
    let task_id: String = row.try_get("task_id").unwrap_or_default();
    decode_callback(row).map_err(|e| bad(&task_id, format_args!("bad callbacks row: {e}")))
}

fn decode_callback(row: &SqliteRow) -> Result<CallbackDelivery, String> {
    let state: String = row.try_get("state").map_err(|e| e.to_string())?;
    let attempts: i64 = row.try_get("attempts").map_err(|e| e.to_string())?;
    Ok(CallbackDelivery {
        delivery_id: row.try_get("delivery_id").map_err(|e| e.to_string())?,
        url: row.try_get("url").map_err(|e| e.to_string())?,
        state: CallbackState::parse(&state).ok_or_else(|| format!("unknown state {state:?}"))?,
        attempts: u32::try_from(attempts)
            .map_err(|_| format!("attempts = {attempts} is out of range"))?,
        last_error: row.try_get("last_error").map_err(|e| e.to_string())?,
        next_attempt_at: row.try_get("next_attempt_at").map_err(|e| e.to_string())?,
        delivered_at: row.try_get("delivered_at").map_err(|e| e.to_string())?,
        created_at: row.try_get("created_at").map_err(|e| e.to_string())?,
    })
}
