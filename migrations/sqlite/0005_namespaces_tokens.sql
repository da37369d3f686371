-- no-transaction
-- Namespaces, tokens and the cluster key.
--
-- Every task and schedule belongs to a namespace ('default' for what was
-- there before); idempotency keys are unique within one; lists and claims
-- read indexes that lead with it. The tasks table is rebuilt (SQLite cannot
-- drop the column-level UNIQUE of client_request_id in place): outside
-- sqlx's transaction, so foreign keys can be switched off first — dropping
-- the old table with them on would cascade into attempts and callbacks —
-- and inside a transaction of its own, so a failure leaves the old schema.
-- Tokens are stored as a SHA-256 digest only (taskmesh_core::auth); the
-- cluster key derives the per-assignment secrets workers present.

PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE tasks_v5 (
    id                   TEXT    NOT NULL PRIMARY KEY,   -- UUIDv7 text: sorts by creation time
    namespace            TEXT    NOT NULL DEFAULT 'default',
    handler              TEXT    NOT NULL,
    payload              BLOB    NOT NULL,
    content_type         TEXT    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN (
                             'PENDING', 'READY', 'DISPATCHING', 'RUNNING', 'SUCCEEDED',
                             'FAILED', 'RETRYING', 'TIMED_OUT', 'CANCELLED')),
    priority             INTEGER NOT NULL,
    labels               TEXT    NOT NULL,               -- JSON object of string -> string
    routing_key          TEXT    NOT NULL,
    client_request_id    TEXT    NULL,                   -- idempotency key, unique within the namespace (below)
    request_fingerprint  TEXT    NOT NULL,               -- digest of the request that created the task
    callback_url         TEXT    NOT NULL,
    -- RetryPolicy, one column per field.
    max_attempts         INTEGER NOT NULL CHECK (max_attempts >= 0),
    initial_backoff_ms   INTEGER NOT NULL,
    backoff_multiplier   REAL    NOT NULL,
    max_backoff_ms       INTEGER NOT NULL,
    timeout_ms           INTEGER NOT NULL,
    run_at               INTEGER NOT NULL,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    -- StateTimes: when the task last entered each state.
    pending_at           INTEGER NULL,
    ready_at             INTEGER NULL,
    dispatching_at       INTEGER NULL,
    running_at           INTEGER NULL,
    retrying_at          INTEGER NULL,
    ended_at             INTEGER NULL,
    attempt              INTEGER NOT NULL CHECK (attempt >= 0),
    run_count            INTEGER NOT NULL CHECK (run_count >= 0),
    execution_id         TEXT    NULL,
    worker_id            TEXT    NULL,
    next_at              INTEGER NULL,
    output               BLOB    NULL,
    output_content_type  TEXT    NOT NULL,
    error_message        TEXT    NOT NULL,
    version              INTEGER NOT NULL,               -- compare-and-set key, bumped by every transition
    traceparent          TEXT    NOT NULL,
    balancer             TEXT    NULL,                   -- Strategy override; NULL = the server's choice
    schedule_id          TEXT    NULL                    -- the schedule that fired the task
) STRICT;

INSERT INTO tasks_v5 (id, handler, payload, content_type, state, priority, labels, routing_key, client_request_id, request_fingerprint, callback_url, max_attempts, initial_backoff_ms, backoff_multiplier, max_backoff_ms, timeout_ms, run_at, created_at, updated_at, pending_at, ready_at, dispatching_at, running_at, retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, output, output_content_type, error_message, version, traceparent, balancer, schedule_id)
    SELECT id, handler, payload, content_type, state, priority, labels, routing_key, client_request_id, request_fingerprint, callback_url, max_attempts, initial_backoff_ms, backoff_multiplier, max_backoff_ms, timeout_ms, run_at, created_at, updated_at, pending_at, ready_at, dispatching_at, running_at, retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, output, output_content_type, error_message, version, traceparent, balancer, schedule_id FROM tasks;
DROP TABLE tasks;
ALTER TABLE tasks_v5 RENAME TO tasks;

CREATE UNIQUE INDEX tasks_client_request_id ON tasks (namespace, client_request_id)
    WHERE client_request_id IS NOT NULL;
-- Claims: READY tasks of one namespace and handler, priority then FIFO.
-- Queries must spell `state = 'READY'` literally for SQLite to use it.
CREATE INDEX tasks_ready_claim ON tasks (namespace, handler, priority DESC, id)
    WHERE state = 'READY';
-- The promoter and both reapers (all namespaces).
CREATE INDEX tasks_next_at ON tasks (next_at, id) WHERE next_at IS NOT NULL;
-- The in-flight scan after a restart (all namespaces).
CREATE INDEX tasks_state_id ON tasks (state, id);
-- Listing within a namespace: all, by state, by handler; newest first.
CREATE INDEX tasks_namespace_id ON tasks (namespace, id);
CREATE INDEX tasks_namespace_state_id ON tasks (namespace, state, id);
CREATE INDEX tasks_handler_id ON tasks (namespace, handler, id);
-- Tasks of a schedule.
CREATE INDEX tasks_schedule ON tasks (schedule_id, id) WHERE schedule_id IS NOT NULL;

ALTER TABLE schedules ADD COLUMN namespace TEXT NOT NULL DEFAULT 'default';
CREATE INDEX schedules_namespace_id ON schedules (namespace, id);

CREATE TABLE tokens (
    id           TEXT    NOT NULL PRIMARY KEY,   -- public: listed, logged, revoked by
    name         TEXT    NOT NULL,
    namespace    TEXT    NOT NULL,
    role         TEXT    NOT NULL CHECK (role IN ('admin', 'submitter', 'reader', 'worker')),
    secret_hash  TEXT    NOT NULL,               -- SHA-256 of the token text, hex
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NULL,
    revoked_at   INTEGER NULL
) STRICT;
CREATE INDEX tokens_namespace ON tokens (namespace, id);

CREATE TABLE cluster_keys (
    name   TEXT NOT NULL PRIMARY KEY,
    value  BLOB NOT NULL
) STRICT;

PRAGMA foreign_key_check;
COMMIT;
PRAGMA foreign_keys = ON;
