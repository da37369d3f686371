//! Records → statement arguments, and the column lists they follow, in one
//! place so the column order of reads and writes cannot drift apart (row →
//! record decoding is `crate::decode`).

use taskmesh_core::schedule::ScheduleRecord;
use taskmesh_core::{AttemptRecord, CallbackDelivery, CallbackState, TaskRecord};

use super::backend::{Args, Val, args};
use crate::{Result, decode};

/// Every `tasks` column as `decode::task` reads them (`{labels}` is the
/// dialect's JSON-as-text).
pub const TASK_READ: &str = "id, namespace, handler, payload, content_type, state, priority, {labels}, \
    routing_key, client_request_id, request_fingerprint, callback_url, max_attempts, \
    initial_backoff_ms, backoff_multiplier, max_backoff_ms, timeout_ms, run_at, created_at, \
    updated_at, pending_at, ready_at, dispatching_at, running_at, retrying_at, ended_at, \
    attempt, run_count, execution_id, worker_id, next_at, output, output_content_type, \
    error_message, version, traceparent, balancer, schedule_id, concurrency_key, \
    concurrency_limit, workflow_id, workflow_step, depends_on, parent_task_id, broadcast, \
    shard_index, shard_total";

/// [`TASK_READ`] without the bodies (empty `payload`, `output` only where
/// one exists) and with their sizes (`payload_len`, `output_len`): what a
/// list reads, so a page of large tasks costs no more than one of small.
pub const TASK_READ_SUMMARY: &str = "id, namespace, handler, SUBSTR(payload, 1, 0) AS payload, \
    LENGTH(payload) AS payload_len, content_type, state, priority, {labels}, \
    routing_key, client_request_id, request_fingerprint, callback_url, max_attempts, \
    initial_backoff_ms, backoff_multiplier, max_backoff_ms, timeout_ms, run_at, created_at, \
    updated_at, pending_at, ready_at, dispatching_at, running_at, retrying_at, ended_at, \
    attempt, run_count, execution_id, worker_id, next_at, SUBSTR(output, 1, 0) AS output, \
    COALESCE(LENGTH(output), 0) AS output_len, output_content_type, \
    error_message, version, traceparent, balancer, schedule_id, concurrency_key, \
    concurrency_limit, workflow_id, workflow_step, depends_on, parent_task_id, broadcast, \
    shard_index, shard_total";

/// The `tasks` columns an insert writes before [`TASK_BODY`]; they never
/// change afterwards.
pub const TASK_KEYS: [&str; 4] = [
    "id",
    "namespace",
    "client_request_id",
    "request_fingerprint",
];

/// Every other `tasks` column, in [`body_args`] order; `true` for JSON.
pub const TASK_BODY: [(&str, bool); 43] = [
    ("handler", false),
    ("payload", false),
    ("content_type", false),
    ("state", false),
    ("priority", false),
    ("labels", true),
    ("routing_key", false),
    ("callback_url", false),
    ("max_attempts", false),
    ("initial_backoff_ms", false),
    ("backoff_multiplier", false),
    ("max_backoff_ms", false),
    ("timeout_ms", false),
    ("run_at", false),
    ("created_at", false),
    ("updated_at", false),
    ("pending_at", false),
    ("ready_at", false),
    ("dispatching_at", false),
    ("running_at", false),
    ("retrying_at", false),
    ("ended_at", false),
    ("attempt", false),
    ("run_count", false),
    ("execution_id", false),
    ("worker_id", false),
    ("next_at", false),
    ("output", false),
    ("output_content_type", false),
    ("error_message", false),
    ("version", false),
    ("traceparent", false),
    ("balancer", false),
    ("schedule_id", false),
    ("concurrency_key", false),
    ("concurrency_limit", false),
    ("workflow_id", false),
    ("workflow_step", false),
    ("depends_on", false),
    ("parent_task_id", false),
    ("broadcast", false),
    ("shard_index", false),
    ("shard_total", false),
];

/// The columns a transition may change (`core::apply` leaves the others
/// alone), in [`mutable_args`] order after the id and expected version.
pub const TASK_MUTABLE: [&str; 17] = [
    "state",
    "updated_at",
    "pending_at",
    "ready_at",
    "dispatching_at",
    "running_at",
    "retrying_at",
    "ended_at",
    "attempt",
    "run_count",
    "execution_id",
    "worker_id",
    "next_at",
    "output",
    "output_content_type",
    "error_message",
    "version",
];

/// `attempts` columns, as `decode::attempt` reads them (plus `task_id`).
pub const ATTEMPT_COLUMNS: &str =
    "task_id, number, execution_id, worker_id, started_at, ended_at, outcome, message";

/// `tokens` columns, as `decode::token` reads them and an insert writes
/// them.
pub const TOKEN_COLUMNS: &str =
    "id, name, namespace, role, secret_hash, created_at, expires_at, revoked_at";

/// A `tokens` row: [`TOKEN_COLUMNS`] order.
pub fn token_args(t: &taskmesh_core::auth::TokenRecord) -> Args {
    args![
        &t.id,
        &t.name,
        &t.namespace,
        t.role.as_str(),
        &t.secret_hash,
        t.created_at,
        t.expires_at,
        t.revoked_at,
    ]
}

/// `callbacks` columns, as `decode::callback` reads them.
pub const CALLBACK_COLUMNS: &str = "delivery_id, task_id, url, state, attempts, last_error, \
    next_attempt_at, delivered_at, created_at";

/// `schedules` columns after `id` and `namespace` (which never change), in
/// [`schedule_args`] order; `true` for JSON.
pub const SCHEDULE_BODY: [(&str, bool); 18] = [
    ("name", false),
    ("kind", false),
    ("cron_expression", false),
    ("interval_ms", false),
    ("time_zone", false),
    ("template", true),
    ("misfire_policy", false),
    ("max_catch_up", false),
    ("overlap_policy", false),
    ("paused", false),
    ("next_fire_at", false),
    ("last_fire_at", false),
    ("last_task_id", false),
    ("fire_count", false),
    ("skipped_count", false),
    ("created_at", false),
    ("updated_at", false),
    ("version", false),
];

/// Every `schedules` column as `decode::schedule` reads them.
pub const SCHEDULE_READ: &str = "id, namespace, name, kind, cron_expression, interval_ms, time_zone, \
    {template}, misfire_policy, max_catch_up, overlap_policy, paused, next_fire_at, \
    last_fire_at, last_task_id, fire_count, skipped_count, created_at, updated_at, version";

/// The arguments of an insert: [`TASK_KEYS`] then [`TASK_BODY`].
pub fn insert_args(task: &TaskRecord, fingerprint: &str, out: &mut Args) -> Result<()> {
    out.extend(args![
        &task.id,
        &task.namespace,
        task.client_request_id.clone(),
        fingerprint
    ]);
    body_args(task, out)
}

/// The [`TASK_BODY`] arguments of `task`.
pub fn body_args(task: &TaskRecord, out: &mut Args) -> Result<()> {
    let t = &task.times;
    let r = &task.retry;
    out.extend(args![
        &task.handler,
        task.payload.clone(),
        &task.content_type,
        task.state.as_str(),
        task.priority,
    ]);
    out.push(Val::Text(Some(decode::labels_json(task)?)));
    out.extend(args![
        &task.routing_key,
        &task.callback_url,
        r.max_attempts,
        r.initial_backoff_ms,
        r.multiplier,
        r.max_backoff_ms,
        task.timeout_ms,
        task.run_at,
        task.created_at,
        task.updated_at,
        t.pending,
        t.ready,
        t.dispatching,
        t.running,
        t.retrying,
        t.end,
        task.attempt,
        task.run_count,
        task.execution_id.clone(),
        task.worker_id.clone(),
        task.next_at,
        task.output.clone(),
        &task.output_content_type,
        &task.error_message,
        task.version,
        &task.traceparent,
        task.balancer.map(|b| b.as_str()),
        task.schedule_id.clone(),
        task.concurrency.as_ref().map(|c| c.key.clone()),
        task.concurrency.as_ref().map_or(0, |c| c.limit),
        task.workflow.as_ref().map(|w| w.workflow_id.clone()),
        task.workflow.as_ref().map(|w| w.step.clone()),
    ]);
    out.push(Val::Text(match &task.workflow {
        None => None,
        // The on_failure step depends on the failure of any step: `["*"]`
        // (no step may be named `*`).
        Some(w) if w.on_failure => Some(crate::decode::ON_FAILURE_DEPENDS_ON.to_string()),
        // A step run after its parents end: its parents behind `*ended`.
        Some(w) if w.after_parents_end => Some(
            serde_json::to_string(
                &std::iter::once(crate::decode::AFTER_END_MARK)
                    .chain(w.depends_on.iter().map(String::as_str))
                    .collect::<Vec<_>>(),
            )
            .map_err(|e| crate::Error::Internal(format!("depends_on as JSON: {e}")))?,
        ),
        Some(w) => Some(
            serde_json::to_string(&w.depends_on)
                .map_err(|e| crate::Error::Internal(format!("depends_on as JSON: {e}")))?,
        ),
    }));
    out.push(Val::Text(task.parent_task_id.clone()));
    out.extend(args![
        crate::decode::spread_kind(task),
        task.shard.map_or(0, |s| i64::from(s.index)),
        task.shard.map_or(0, |s| i64::from(s.total)),
    ]);
    Ok(())
}

/// The id, the expected version, then the [`TASK_MUTABLE`] columns.
pub fn mutable_args(task: &TaskRecord, expected: i64, out: &mut Args) {
    let t = &task.times;
    out.extend(args![
        &task.id,
        expected,
        task.state.as_str(),
        task.updated_at,
        t.pending,
        t.ready,
        t.dispatching,
        t.running,
        t.retrying,
        t.end,
        task.attempt,
        task.run_count,
        task.execution_id.clone(),
        task.worker_id.clone(),
        task.next_at,
        task.output.clone(),
        &task.output_content_type,
        &task.error_message,
        task.version,
    ]);
}

/// An `attempts` row: [`ATTEMPT_COLUMNS`] order.
pub fn attempt_args(task_id: &str, a: &AttemptRecord, out: &mut Args) {
    out.extend(args![
        task_id,
        a.number,
        &a.execution_id,
        &a.worker_id,
        a.started_at,
        a.ended_at,
        a.outcome.map(|o| o.as_str()),
        &a.message,
    ]);
}

/// A `callbacks` row: [`CALLBACK_COLUMNS`] order.
pub fn callback_args(task_id: &str, c: &CallbackDelivery, out: &mut Args) {
    out.extend(args![
        &c.delivery_id,
        task_id,
        &c.url,
        c.state.as_str(),
        c.attempts,
        &c.last_error,
        c.next_attempt_at,
        c.delivered_at,
        c.created_at,
    ]);
}

/// The [`SCHEDULE_BODY`] arguments of `s`.
pub fn schedule_args(s: &ScheduleRecord, out: &mut Args) -> Result<()> {
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    out.extend(args![
        &s.name,
        s.kind.as_str(),
        &s.cron_expression,
        s.interval_ms,
        &s.time_zone,
    ]);
    out.push(Val::Text(Some(decode::template_json(s)?)));
    out.extend(args![
        s.misfire.as_str(),
        s.max_catch_up,
        s.overlap.as_str(),
        s.paused,
        s.next_fire_at,
        s.last_fire_at,
        s.last_task_id.clone(),
        as_i64(s.fire_count),
        as_i64(s.skipped_count),
        s.created_at,
        s.updated_at,
        s.version,
    ]);
    Ok(())
}

/// The outbox entry a task that has just ended queues: due at once, the
/// same delivery id on every try.
pub fn new_callback(task: &TaskRecord) -> CallbackDelivery {
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

/// `name = ?` (or `name = ?J`) for each column, comma-separated.
pub fn assignments(cols: &[(&str, bool)]) -> String {
    cols.iter()
        .map(|(c, json)| format!("{c} = ?{}", if *json { "J" } else { "" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The placeholders of one row of `cols` (`?` or `?J`), comma-separated.
pub fn row_marks(cols: &[(&str, bool)]) -> String {
    cols.iter()
        .map(|(_, json)| if *json { "?J" } else { "?" })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names of `cols`, comma-separated.
pub fn names(cols: &[(&str, bool)]) -> String {
    cols.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", ")
}
