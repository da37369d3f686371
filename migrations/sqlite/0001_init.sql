-- taskmesh SQLite schema, version 1.
--
-- One row per task in `tasks`, one row per push to a worker in `attempts`.
-- Every change of a task row is a compare-and-set on `version` computed by
-- taskmesh_core::apply; the store never edits a task field by hand.
-- Times are unix milliseconds (INTEGER). STRICT tables make SQLite refuse a
-- value of the wrong type instead of silently storing it.

CREATE TABLE tasks (
    id                   TEXT    NOT NULL PRIMARY KEY,   -- UUIDv7 text: sorts by creation time
    handler              TEXT    NOT NULL,
    payload              BLOB    NOT NULL,
    content_type         TEXT    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN (
                             'PENDING', 'READY', 'DISPATCHING', 'RUNNING', 'SUCCEEDED',
                             'FAILED', 'RETRYING', 'TIMED_OUT', 'CANCELLED')),
    priority             INTEGER NOT NULL,
    labels               TEXT    NOT NULL,               -- JSON object of string -> string
    routing_key          TEXT    NOT NULL,
    client_request_id    TEXT    NULL UNIQUE,            -- idempotency key; the UNIQUE index doubles as its lookup
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

-- Claims: "READY tasks of handler H, highest priority first, FIFO within a
-- priority". Partial, so it holds only the (usually few) READY rows and the
-- claim query reads it in order without sorting. Also serves ready_counts.
-- Queries must spell `state = 'READY'` literally for SQLite to use it.
CREATE INDEX tasks_ready_claim ON tasks (handler, priority DESC, id) WHERE state = 'READY';

-- The promoter and both reapers: "tasks whose next_at has passed", earliest
-- first (id breaks ties, so no sort), and MIN(next_at) for the scheduler's
-- sleep. Partial, so terminal and READY tasks (next_at NULL) cost nothing.
CREATE INDEX tasks_next_at ON tasks (next_at, id) WHERE next_at IS NOT NULL;

-- Listing by state, newest first (id DESC), and the in-flight scan after a
-- restart (state IN ('DISPATCHING', 'RUNNING')).
CREATE INDEX tasks_state_id ON tasks (state, id);

-- Listing by handler, newest first.
CREATE INDEX tasks_handler_id ON tasks (handler, id);

CREATE TABLE attempts (
    task_id      TEXT    NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number       INTEGER NOT NULL CHECK (number >= 1),   -- 1-based among the task's pushes
    execution_id TEXT    NOT NULL UNIQUE,                -- also the lookup when an attempt closes
    worker_id    TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    ended_at     INTEGER NULL,
    outcome      TEXT    NULL CHECK (outcome IS NULL OR outcome IN (
                     'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'ACK_TIMEOUT',
                     'REJECTED', 'WORKER_LOST')),
    message      TEXT    NOT NULL,
    PRIMARY KEY (task_id, number)                        -- also get_task's "attempts oldest first"
) STRICT;
