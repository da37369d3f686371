//! One-row statements run on one connection, mostly inside a transaction:
//! read a task (locking it or not), insert it, persist a [`Transition`]
//! computed by `taskmesh_core::apply` with a compare-and-set on the version
//! plus its attempts change and callback, and raise the leader fence.
//! The batched paths (`super::batch`) fall back to these when a batch
//! cannot be written in one statement.

use sqlx::PgConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Postgres, Row};
use taskmesh_core::{
    AttemptChange, AttemptRecord, CallbackDelivery, CallbackState, Event, TaskRecord, Transition,
    UnixMillis,
};

use super::sql;
use crate::{Error, Result, decode};

/// A query with positional arguments, as bound here.
pub(super) type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// Re-reads and re-applies this many times after a lost compare-and-set
/// before giving up with [`Error::Conflict`].
const MAX_CAS_TRIES: usize = 5;

/// Binds the columns of [`sql::INSERT_TASK`] (`$1`..`$37`).
pub(super) fn bind_insert<'q>(
    q: PgQuery<'q>,
    task: &TaskRecord,
    fingerprint: &str,
) -> Result<PgQuery<'q>> {
    let q = q
        .bind(task.id.clone())
        .bind(task.client_request_id.clone())
        .bind(fingerprint.to_string())
        .bind(task.handler.clone())
        .bind(task.payload.clone())
        .bind(task.content_type.clone())
        .bind(task.state.as_str())
        .bind(task.priority)
        .bind(decode::labels_json(task)?)
        .bind(task.routing_key.clone())
        .bind(task.callback_url.clone());
    Ok(bind_tail(q, task))
}

/// Binds the columns of [`sql::UPDATE_TASK_CAS`] (`$1`..`$36`).
fn bind_update<'q>(q: PgQuery<'q>, task: &TaskRecord, expected: i64) -> Result<PgQuery<'q>> {
    let q = q
        .bind(task.handler.clone())
        .bind(task.payload.clone())
        .bind(task.content_type.clone())
        .bind(task.state.as_str())
        .bind(task.priority)
        .bind(decode::labels_json(task)?)
        .bind(task.routing_key.clone())
        .bind(task.callback_url.clone());
    Ok(bind_tail(q, task).bind(task.id.clone()).bind(expected))
}

/// The columns from `max_attempts` to `schedule_id`, common to inserts and
/// updates.
fn bind_tail<'q>(q: PgQuery<'q>, task: &TaskRecord) -> PgQuery<'q> {
    let t = &task.times;
    q.bind(i64::from(task.retry.max_attempts))
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
        .bind(task.schedule_id.clone())
}

/// Reads a row of [`sql::GET_TASK`]: the task with its attempts and
/// callback.
pub(super) fn task_with_attempts(row: &PgRow) -> Result<TaskRecord> {
    let mut task = task_with_callback(row)?;
    let json: String = row
        .try_get("attempts_json")
        .map_err(|e| decode::bad_task(&task.id, format_args!("bad attempts: {e}")))?;
    task.attempts = attempts_from_json(&json)
        .map_err(|e| decode::bad_task(&task.id, format_args!("bad attempts row: {e}")))?;
    Ok(task)
}

/// Reads a task row with `callback_json!()`: the task with its callback.
pub(super) fn task_with_callback(row: &PgRow) -> Result<TaskRecord> {
    let mut task = decode::task(row)?;
    let json: Option<String> = row
        .try_get("callback_json")
        .map_err(|e| decode::bad_task(&task.id, format_args!("bad callback: {e}")))?;
    task.callback = json
        .map(|json| callback_from_json(&json))
        .transpose()
        .map_err(|e| decode::bad_task(&task.id, format_args!("bad callbacks row: {e}")))?;
    Ok(task)
}

/// One callback as `callback_json!()` renders it.
type CallbackJson = (
    String,
    String,
    String,
    i64,
    String,
    Option<i64>,
    Option<i64>,
    i64,
);

fn callback_from_json(json: &str) -> Result<CallbackDelivery, String> {
    let (delivery_id, url, state, attempts, last_error, next_attempt_at, delivered_at, created_at): CallbackJson =
        serde_json::from_str(json).map_err(|e| e.to_string())?;
    Ok(CallbackDelivery {
        delivery_id,
        url,
        state: decode::parse_callback_state(&state)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| format!("attempts = {attempts} is out of range"))?,
        last_error,
        next_attempt_at,
        delivered_at,
        created_at,
    })
}

/// The outbox entry a task that has just ended queues: due at once, the
/// same delivery id on every try.
pub(super) fn new_callback(task: &TaskRecord) -> CallbackDelivery {
    CallbackDelivery {
        delivery_id: taskmesh_core::id::new_delivery_id(),
        url: task.callback_url.clone(),
        state: CallbackState::Pending,
        attempts: 0,
        last_error: String::new(),
        next_attempt_at: Some(task.updated_at),
        delivered_at: None,
        created_at: task.updated_at,
    }
}

/// Queues the callback of a task that has just ended.
async fn insert_callback(conn: &mut PgConnection, task: &TaskRecord) -> Result<CallbackDelivery> {
    let entry = new_callback(task);
    sqlx::query(sql::INSERT_CALLBACK)
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

/// One attempt as `attempts_json!()` renders it.
type AttemptJson = (
    i64,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    String,
);

fn attempts_from_json(json: &str) -> Result<Vec<AttemptRecord>, String> {
    let rows: Vec<AttemptJson> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    rows.into_iter()
        .map(
            |(number, execution_id, worker_id, started_at, ended_at, outcome, message)| {
                Ok(AttemptRecord {
                    number: u32::try_from(number)
                        .map_err(|_| format!("number = {number} is out of range"))?,
                    execution_id,
                    worker_id,
                    started_at,
                    ended_at,
                    outcome: decode::parse_outcome(outcome)?,
                    message,
                })
            },
        )
        .collect()
}

/// The task holding `client_request_id` (with its attempts) and the
/// fingerprint of the request that created it.
pub(super) async fn find_by_request_id(
    conn: &mut PgConnection,
    client_request_id: &str,
) -> Result<Option<(TaskRecord, String)>> {
    let row = sqlx::query(sql::GET_BY_REQUEST_ID)
        .bind(client_request_id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some((
        task_with_attempts(&row)?,
        decode::fingerprint(&row)?,
    )))
}

/// The task `id` without attempts, locked until the transaction ends.
pub(super) async fn lock_task(conn: &mut PgConnection, id: &str) -> Result<Option<TaskRecord>> {
    let row = sqlx::query(sql::LOCK_TASK)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(decode::task).transpose()
}

/// Inserts a new task row unless its idempotency key is taken (`Ok(false)`).
/// The raw sqlx error is returned so the caller can tell a taken task id
/// (a unique violation) from other failures.
pub(super) async fn insert_task(
    conn: &mut PgConnection,
    task: &TaskRecord,
    fingerprint: &str,
) -> Result<Result<bool, sqlx::Error>> {
    let q = bind_insert(sqlx::query(sql::INSERT_TASK), task, fingerprint)?;
    Ok(q.fetch_optional(&mut *conn).await.map(|row| row.is_some()))
}

/// Writes `transition` if the row still has `expected_version`, together
/// with its attempts change and, when the task has just ended with a
/// callback URL, its callback outbox entry (set on `transition.task`). False
/// when the compare-and-set missed (nothing was written).
pub(super) async fn write_transition(
    conn: &mut PgConnection,
    expected_version: i64,
    transition: &mut Transition,
) -> Result<bool> {
    let task = &transition.task;
    let q = bind_update(sqlx::query(sql::UPDATE_TASK_CAS), task, expected_version)?;
    if q.execute(&mut *conn).await?.rows_affected() == 0 {
        return Ok(false);
    }
    match &transition.attempt {
        AttemptChange::None => {}
        AttemptChange::Open(attempt) => {
            sqlx::query(sql::INSERT_ATTEMPT)
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
            let closed = sqlx::query(sql::CLOSE_ATTEMPT)
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

/// Applies `event` to task `id` at `now` and writes the result. The row is
/// locked first, so the compare-and-set cannot miss inside this
/// transaction; the loop stays so the invariant holds for every write.
pub(super) async fn transition_one(
    conn: &mut PgConnection,
    id: &str,
    event: &Event,
    now: UnixMillis,
) -> Result<TaskRecord> {
    for _ in 0..MAX_CAS_TRIES {
        let task = lock_task(conn, id)
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
/// The row lock taken by the UPDATE queues concurrent leader writes until
/// this transaction ends.
pub(super) async fn check_fence(conn: &mut PgConnection, fence: Option<u64>) -> Result<()> {
    let Some(token) = fence else { return Ok(()) };
    let token = i64::try_from(token)
        .map_err(|_| Error::InvalidArgument(format!("fencing token {token} out of range")))?;
    let raised = sqlx::query(sql::RAISE_FENCE)
        .bind(token)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if raised == 1 {
        return Ok(());
    }
    let newest: i64 = sqlx::query_scalar(sql::FENCE_TOKEN)
        .fetch_one(&mut *conn)
        .await?;
    Err(Error::Fenced(format!(
        "fencing token {token} is older than {newest}: this node is no longer the leader"
    )))
}
