-- taskmesh Postgres schema, version 1: the same tables as migrations/sqlite,
-- in Postgres types.
--
-- One row per task in `tasks`, one row per push to a worker in `attempts`.
-- Every change of a task row is a compare-and-set on `version` computed by
-- taskmesh_core::apply; the store never edits a task field by hand.
-- Times are unix milliseconds (BIGINT), never `timestamptz`: the domain works
-- in millis and the due queries compare plain integers.
-- Ids and handler names use the "C" collation: byte order, as on SQLite
-- (UUIDv7 ids sort by creation time), whatever the database's locale, and
-- the fastest comparisons.

CREATE TABLE tasks (
    id                   TEXT COLLATE "C" NOT NULL PRIMARY KEY,  -- UUIDv7 text
    handler              TEXT COLLATE "C" NOT NULL,
    payload              BYTEA            NOT NULL,
    content_type         TEXT             NOT NULL,
    state                TEXT             NOT NULL CHECK (state IN (
                             'PENDING', 'READY', 'DISPATCHING', 'RUNNING', 'SUCCEEDED',
                             'FAILED', 'RETRYING', 'TIMED_OUT', 'CANCELLED')),
    priority             INTEGER          NOT NULL,
    labels               JSONB            NOT NULL,              -- object of string -> string
    routing_key          TEXT             NOT NULL,
    client_request_id    TEXT COLLATE "C" NULL,                  -- idempotency key (unique: see below)
    request_fingerprint  TEXT             NOT NULL,
    callback_url         TEXT             NOT NULL,
    -- RetryPolicy, one column per field.
    max_attempts         BIGINT           NOT NULL CHECK (max_attempts >= 0),
    initial_backoff_ms   BIGINT           NOT NULL,
    backoff_multiplier   DOUBLE PRECISION NOT NULL,
    max_backoff_ms       BIGINT           NOT NULL,
    timeout_ms           BIGINT           NOT NULL,
    run_at               BIGINT           NOT NULL,
    created_at           BIGINT           NOT NULL,
    updated_at           BIGINT           NOT NULL,
    -- StateTimes: when the task last entered each state.
    pending_at           BIGINT           NULL,
    ready_at             BIGINT           NULL,
    dispatching_at       BIGINT           NULL,
    running_at           BIGINT           NULL,
    retrying_at          BIGINT           NULL,
    ended_at             BIGINT           NULL,
    attempt              BIGINT           NOT NULL CHECK (attempt >= 0),
    run_count            BIGINT           NOT NULL CHECK (run_count >= 0),
    execution_id         TEXT             NULL,
    worker_id            TEXT             NULL,
    next_at              BIGINT           NULL,
    output               BYTEA            NULL,
    output_content_type  TEXT             NOT NULL,
    error_message        TEXT             NOT NULL,
    version              BIGINT           NOT NULL,              -- compare-and-set key
    traceparent          TEXT             NOT NULL,
    balancer             TEXT             NULL,                  -- Strategy override; NULL = the server's choice
    schedule_id          TEXT COLLATE "C" NULL                   -- the schedule that fired the task
);

-- The idempotency key: unique and its lookup. Partial, so the many tasks
-- without a key cost no index entry on each of their updates.
CREATE UNIQUE INDEX tasks_client_request_id ON tasks (client_request_id)
    WHERE client_request_id IS NOT NULL;

-- Claims: "READY tasks of handler H, highest priority first, FIFO within a
-- priority", read in index order by `SELECT … FOR UPDATE SKIP LOCKED`.
-- Partial, so it holds only the READY rows. Also serves ready_counts.
CREATE INDEX tasks_ready_claim ON tasks (handler, priority DESC, id) WHERE state = 'READY';

-- The promoter and both reapers: "tasks whose next_at has passed", earliest
-- first, and MIN(next_at) for the scheduler's sleep. Partial, so terminal
-- and READY tasks (next_at NULL) cost nothing.
CREATE INDEX tasks_next_at ON tasks (next_at, id) WHERE next_at IS NOT NULL;

-- Listing by state, newest first, and the in-flight scan after a restart.
CREATE INDEX tasks_state_id ON tasks (state, id);

-- Listing by handler, newest first.
CREATE INDEX tasks_handler_id ON tasks (handler, id);

-- Tasks of a schedule (overlap checks, listing).
CREATE INDEX tasks_schedule ON tasks (schedule_id, id) WHERE schedule_id IS NOT NULL;

CREATE TABLE attempts (
    task_id      TEXT COLLATE "C" NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number       BIGINT NOT NULL CHECK (number >= 1),     -- 1-based among the task's pushes
    execution_id TEXT   NOT NULL UNIQUE,                  -- also the lookup when an attempt closes
    worker_id    TEXT   NOT NULL,
    started_at   BIGINT NOT NULL,
    ended_at     BIGINT NULL,
    outcome      TEXT   NULL CHECK (outcome IS NULL OR outcome IN (
                     'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'ACK_TIMEOUT',
                     'REJECTED', 'WORKER_LOST')),
    message      TEXT   NOT NULL,
    PRIMARY KEY (task_id, number)                         -- also get_task's "attempts oldest first"
);
