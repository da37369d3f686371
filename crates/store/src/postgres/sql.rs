//! The fixed statements of the Postgres backend, in one place so the column
//! lists of reads and writes cannot drift apart. sqlx prepares each one once
//! per connection and reuses it (its statement cache), so these strings
//! are parsed and planned once, not per call.

/// The `tasks` columns as `crate::decode::task` reads them; `labels` comes
/// back as JSON text.
macro_rules! task_columns {
    () => {
        "id, handler, payload, content_type, state, priority, labels::text AS labels, \
         routing_key, client_request_id, request_fingerprint, callback_url, max_attempts, \
         initial_backoff_ms, backoff_multiplier, max_backoff_ms, timeout_ms, run_at, \
         created_at, updated_at, pending_at, ready_at, dispatching_at, running_at, \
         retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, \
         output, output_content_type, error_message, version, traceparent, balancer, \
         schedule_id"
    };
}
pub(super) use task_columns;

/// The `schedules` columns as `crate::decode::schedule` reads them.
macro_rules! schedule_columns {
    () => {
        "id, name, kind, cron_expression, interval_ms, time_zone, template::text AS template, \
         misfire_policy, max_catch_up, overlap_policy, paused, next_fire_at, last_fire_at, \
         last_task_id, fire_count, skipped_count, created_at, updated_at, version"
    };
}
pub(super) use schedule_columns;

/// The attempts of the task row in scope (`t`) as one JSON array of
/// `[number, execution_id, worker_id, started_at, ended_at, outcome,
/// message]`, oldest first: a task and its attempts in one statement, so
/// in one snapshot.
macro_rules! attempts_json {
    () => {
        "(SELECT COALESCE(json_agg(json_build_array(a.number, a.execution_id, a.worker_id, \
         a.started_at, a.ended_at, a.outcome, a.message) ORDER BY a.number), '[]')::text \
         FROM attempts a WHERE a.task_id = t.id) AS attempts_json"
    };
}

/// The callback outbox entry of the task row in scope (`t`), if any, as a
/// JSON array of `[delivery_id, url, state, attempts, last_error,
/// next_attempt_at, delivered_at, created_at]`.
macro_rules! callback_json {
    () => {
        "(SELECT json_build_array(c.delivery_id, c.url, c.state, c.attempts, c.last_error, \
         c.next_attempt_at, c.delivered_at, c.created_at)::text \
         FROM callbacks c WHERE c.task_id = t.id) AS callback_json"
    };
}
pub(super) use callback_json;

/// A task with its attempts and callback.
pub(super) const GET_TASK: &str = concat!(
    "SELECT ",
    task_columns!(),
    ", ",
    attempts_json!(),
    ", ",
    callback_json!(),
    " FROM tasks t WHERE t.id = $1"
);

/// The task holding an idempotency key, with its attempts and callback.
pub(super) const GET_BY_REQUEST_ID: &str = concat!(
    "SELECT ",
    task_columns!(),
    ", ",
    attempts_json!(),
    ", ",
    callback_json!(),
    " FROM tasks t WHERE t.client_request_id = $1"
);

/// Queues a callback.
pub(super) const INSERT_CALLBACK: &str = "INSERT INTO callbacks (delivery_id, task_id, url, \
    state, attempts, last_error, next_attempt_at, delivered_at, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Claims due callbacks (skipping those another replica is claiming),
/// leases them until `$3`, and returns them with their tasks (attempts
/// included), earliest due first.
pub(super) const CLAIM_CALLBACKS: &str = concat!(
    "WITH due AS (SELECT delivery_id, next_attempt_at AS due_at FROM callbacks \
       WHERE state = 'PENDING' AND next_attempt_at <= $1 \
       ORDER BY next_attempt_at, delivery_id LIMIT $2 FOR UPDATE SKIP LOCKED), \
     leased AS (UPDATE callbacks c SET next_attempt_at = $3 FROM due \
       WHERE c.delivery_id = due.delivery_id \
       RETURNING c.task_id, due.due_at, c.delivery_id AS leased_id, \
         json_build_array(c.delivery_id, c.url, c.state, c.attempts, c.last_error, \
         c.next_attempt_at, c.delivered_at, c.created_at)::text AS callback_json) \
     SELECT ",
    task_columns!(),
    ", ",
    attempts_json!(),
    ", leased.callback_json FROM leased JOIN tasks t ON t.id = leased.task_id \
     ORDER BY leased.due_at, leased.leased_id"
);

/// Records the outcome of one try of a PENDING callback.
pub(super) const FINISH_CALLBACK: &str = "UPDATE callbacks SET state = $1, \
    attempts = attempts + 1, last_error = $2, next_attempt_at = $3, delivered_at = $4 \
    WHERE delivery_id = $5 AND state = 'PENDING'";

/// The earliest due callback, along `callbacks_due`.
pub(super) const NEXT_CALLBACK: &str =
    "SELECT MIN(next_attempt_at) FROM callbacks WHERE state = 'PENDING'";

/// Locks and reads the tasks of a batch, in id order so two batches lock
/// their common rows in the same order (no deadlock between them).
pub(super) const LOCK_TASKS: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE"
);

/// Locks and reads one task.
pub(super) const LOCK_TASK: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE id = $1 FOR UPDATE"
);

/// Claim candidates of one handler, read along `tasks_ready_claim`,
/// skipping rows other claimers hold and those this claim has seen.
pub(super) const CLAIM: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE state = 'READY' AND handler = $1 AND id <> ALL($2) \
     ORDER BY priority DESC, id LIMIT $3 FOR UPDATE SKIP LOCKED"
);

/// Tasks whose `next_at` has passed, along `tasks_next_at`.
pub(super) const DUE: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE next_at IS NOT NULL AND next_at <= $1 \
     AND state IN ('PENDING', 'RETRYING', 'DISPATCHING', 'RUNNING') \
     ORDER BY next_at, id LIMIT $2"
);

/// Every in-flight task.
pub(super) const IN_FLIGHT: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE state IN ('DISPATCHING', 'RUNNING') ORDER BY id"
);

/// The in-flight tasks of one worker.
pub(super) const IN_FLIGHT_OF: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE state IN ('DISPATCHING', 'RUNNING') AND worker_id = $1 ORDER BY id"
);

/// Tasks by id (the runs schedules wait for).
pub(super) const TASKS_BY_ID: &str =
    concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = ANY($1)");

/// The earliest `next_at`.
pub(super) const NEXT_DUE: &str = "SELECT MIN(next_at) FROM tasks WHERE next_at IS NOT NULL";

/// READY tasks per handler, counted on `tasks_ready_claim`.
pub(super) const READY_COUNTS: &str = "SELECT handler, COUNT(*) FROM tasks \
     WHERE state = 'READY' GROUP BY handler ORDER BY handler";

/// The database's clock in unix milliseconds: `clock_timestamp()` is the
/// time of the call, not of the transaction's start.
pub(super) const DB_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The `tasks` columns an insert writes, in [`super::tx::bind_insert`] order.
macro_rules! insert_columns {
    () => {
        "id, client_request_id, request_fingerprint, handler, payload, content_type, state, \
         priority, labels, routing_key, callback_url, max_attempts, initial_backoff_ms, \
         backoff_multiplier, max_backoff_ms, timeout_ms, run_at, created_at, updated_at, \
         pending_at, ready_at, dispatching_at, running_at, retrying_at, ended_at, attempt, \
         run_count, execution_id, worker_id, next_at, output, output_content_type, \
         error_message, version, traceparent, balancer, schedule_id"
    };
}

macro_rules! insert_values {
    () => {
        "$1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15, $16, $17, \
         $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, \
         $35, $36, $37"
    };
}

/// Inserts a task unless its idempotency key is taken; a row comes back
/// when it was inserted.
pub(super) const INSERT_TASK: &str = concat!(
    "INSERT INTO tasks (",
    insert_columns!(),
    ") VALUES (",
    insert_values!(),
    ") ON CONFLICT (client_request_id) WHERE client_request_id IS NOT NULL \
     DO NOTHING RETURNING id"
);

/// Rewrites every mutable column of a task (all but id, client_request_id
/// and request_fingerprint) if it still has version `$36`: the
/// compare-and-set of the one-row path.
pub(super) const UPDATE_TASK_CAS: &str = "UPDATE tasks SET handler = $1, payload = $2, \
    content_type = $3, state = $4, priority = $5, labels = $6::jsonb, routing_key = $7, \
    callback_url = $8, max_attempts = $9, initial_backoff_ms = $10, backoff_multiplier = $11, \
    max_backoff_ms = $12, timeout_ms = $13, run_at = $14, created_at = $15, updated_at = $16, \
    pending_at = $17, ready_at = $18, dispatching_at = $19, running_at = $20, \
    retrying_at = $21, ended_at = $22, attempt = $23, run_count = $24, execution_id = $25, \
    worker_id = $26, next_at = $27, output = $28, output_content_type = $29, \
    error_message = $30, version = $31, traceparent = $32, balancer = $33, schedule_id = $34 \
    WHERE id = $35 AND version = $36";

/// Opens an attempt.
pub(super) const INSERT_ATTEMPT: &str = "INSERT INTO attempts (task_id, number, execution_id, \
    worker_id, started_at, ended_at, outcome, message) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Closes an attempt.
pub(super) const CLOSE_ATTEMPT: &str = "UPDATE attempts SET ended_at = $1, outcome = $2, \
    message = $3 WHERE task_id = $4 AND execution_id = $5";

/// Raises the leader fence, or does nothing when a newer leader wrote.
pub(super) const RAISE_FENCE: &str =
    "UPDATE fences SET token = $1 WHERE name = 'leader' AND token <= $1";

/// The newest leader token.
pub(super) const FENCE_TOKEN: &str = "SELECT token FROM fences WHERE name = 'leader'";

/// Sends notification payloads (on their own, after the commits).
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, p) FROM UNNEST($2::text[]) AS p";

/// The `tasks` columns of an insert, in [`INSERT_TASK`]'s order (for
/// multi-row inserts built elsewhere).
pub(super) const INSERT_COLUMNS: &str = insert_columns!();
