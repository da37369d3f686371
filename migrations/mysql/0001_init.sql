-- taskmesh MySQL / MariaDB schema, version 1: the tables of migrations/sqlite
-- and migrations/postgres (0001..0005 there), in MySQL types, plus the
-- `changes` table that carries wake-ups between replicas (MySQL has no
-- LISTEN/NOTIFY).
--
-- Every change of a task row is a compare-and-set on `version` computed by
-- taskmesh_core::apply; the store never edits a task field by hand. Times
-- are unix milliseconds (BIGINT). Text is utf8mb4 with the binary collation:
-- byte order, as on SQLite and Postgres's "C" (UUIDv7 ids sort by creation
-- time), and exact comparisons. MySQL has no partial indexes: each index
-- leads with the column the others' partial predicate tests.
-- Requires InnoDB (row locks, SKIP LOCKED): MySQL 8.0+, MariaDB 10.6+
-- (descending index keys from MariaDB 10.8; older ones sort the claim).

CREATE TABLE tasks (
    id                   VARCHAR(64)  NOT NULL PRIMARY KEY,   -- UUIDv7 text
    namespace            VARCHAR(64)  NOT NULL DEFAULT 'default',
    handler              VARCHAR(128) NOT NULL,
    payload              LONGBLOB     NOT NULL,
    content_type         TEXT         NOT NULL,
    state                VARCHAR(16)  NOT NULL CHECK (state IN (
                             'PENDING', 'READY', 'DISPATCHING', 'RUNNING', 'SUCCEEDED',
                             'FAILED', 'RETRYING', 'TIMED_OUT', 'CANCELLED')),
    priority             INT          NOT NULL,
    labels               LONGTEXT     NOT NULL CHECK (JSON_VALID(labels)),  -- object of string -> string
    routing_key          TEXT         NOT NULL,
    client_request_id    VARCHAR(256) NULL,                   -- idempotency key (unique; NULLs do not collide)
    request_fingerprint  VARCHAR(128) NOT NULL,
    callback_url         TEXT         NOT NULL,
    max_attempts         BIGINT       NOT NULL CHECK (max_attempts >= 0),
    initial_backoff_ms   BIGINT       NOT NULL,
    backoff_multiplier   DOUBLE       NOT NULL,
    max_backoff_ms       BIGINT       NOT NULL,
    timeout_ms           BIGINT       NOT NULL,
    run_at               BIGINT       NOT NULL,
    created_at           BIGINT       NOT NULL,
    updated_at           BIGINT       NOT NULL,
    pending_at           BIGINT       NULL,
    ready_at             BIGINT       NULL,
    dispatching_at       BIGINT       NULL,
    running_at           BIGINT       NULL,
    retrying_at          BIGINT       NULL,
    ended_at             BIGINT       NULL,
    attempt              BIGINT       NOT NULL CHECK (attempt >= 0),
    run_count            BIGINT       NOT NULL CHECK (run_count >= 0),
    execution_id         VARCHAR(64)  NULL,
    worker_id            TEXT         NULL,
    next_at              BIGINT       NULL,
    output               LONGBLOB     NULL,
    output_content_type  TEXT         NOT NULL,
    error_message        MEDIUMTEXT   NOT NULL,
    version              BIGINT       NOT NULL,               -- compare-and-set key
    traceparent          VARCHAR(256) NOT NULL,
    balancer             VARCHAR(32)  NULL,
    schedule_id          VARCHAR(64)  NULL,
    -- The idempotency key, unique within a namespace.
    UNIQUE KEY tasks_client_request_id (namespace, client_request_id),
    -- Claims: READY tasks of a namespace and handler, highest priority
    -- first, FIFO within a priority, read by `SELECT … FOR UPDATE SKIP LOCKED`.
    KEY tasks_ready_claim (state, namespace, handler, priority DESC, id),
    -- The promoter and both reapers: next_at has passed, earliest first.
    KEY tasks_next_at (next_at, id),
    -- The in-flight scan after a restart (all namespaces).
    KEY tasks_state_id (state, id),
    -- Listing within a namespace: all, by state, by handler.
    KEY tasks_namespace_id (namespace, id),
    KEY tasks_namespace_state_id (namespace, state, id),
    KEY tasks_handler_id (namespace, handler, id),
    KEY tasks_schedule (schedule_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE attempts (
    task_id      VARCHAR(64) NOT NULL,
    number       BIGINT      NOT NULL CHECK (number >= 1),
    execution_id VARCHAR(64) NOT NULL,
    worker_id    TEXT        NOT NULL,
    started_at   BIGINT      NOT NULL,
    ended_at     BIGINT      NULL,
    outcome      VARCHAR(16) NULL CHECK (outcome IS NULL OR outcome IN (
                     'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'ACK_TIMEOUT',
                     'REJECTED', 'WORKER_LOST')),
    message      MEDIUMTEXT  NOT NULL,
    PRIMARY KEY (task_id, number),
    UNIQUE KEY attempts_execution_id (execution_id),
    CONSTRAINT attempts_task FOREIGN KEY (task_id) REFERENCES tasks (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The callback outbox: one row per task that ended with a callback_url,
-- inserted in the same transaction as its terminal transition.
CREATE TABLE callbacks (
    delivery_id      VARCHAR(64) NOT NULL PRIMARY KEY,
    task_id          VARCHAR(64) NOT NULL,
    url              TEXT        NOT NULL,
    state            VARCHAR(16) NOT NULL CHECK (state IN ('PENDING', 'DELIVERED', 'FAILED')),
    attempts         BIGINT      NOT NULL CHECK (attempts >= 0),
    last_error       MEDIUMTEXT  NOT NULL,
    next_attempt_at  BIGINT      NULL,
    delivered_at     BIGINT      NULL,
    created_at       BIGINT      NOT NULL,
    UNIQUE KEY callbacks_task (task_id),
    KEY callbacks_due (state, next_attempt_at, delivery_id),
    CONSTRAINT callbacks_task FOREIGN KEY (task_id) REFERENCES tasks (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE schedules (
    id               VARCHAR(64) NOT NULL PRIMARY KEY,
    namespace        VARCHAR(64) NOT NULL DEFAULT 'default',
    name             TEXT        NOT NULL,
    kind             VARCHAR(16) NOT NULL CHECK (kind IN ('CRON', 'FIXED_RATE', 'FIXED_DELAY')),
    cron_expression  TEXT        NOT NULL,
    interval_ms      BIGINT      NOT NULL,
    time_zone        VARCHAR(64) NOT NULL,
    template         LONGTEXT    NOT NULL CHECK (JSON_VALID(template)),
    misfire_policy   VARCHAR(32) NOT NULL,
    max_catch_up     BIGINT      NOT NULL,
    overlap_policy   VARCHAR(32) NOT NULL,
    paused           BOOLEAN     NOT NULL,
    next_fire_at     BIGINT      NULL,
    last_fire_at     BIGINT      NULL,
    last_task_id     VARCHAR(64) NULL,
    fire_count       BIGINT      NOT NULL,
    skipped_count    BIGINT      NOT NULL,
    created_at       BIGINT      NOT NULL,
    updated_at       BIGINT      NOT NULL,
    version          BIGINT      NOT NULL,
    KEY schedules_due (paused, next_fire_at, id),
    KEY schedules_namespace_id (namespace, id),
    KEY schedules_awaiting_run (kind, paused, next_fire_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE schedule_fires (
    schedule_id  VARCHAR(64) NOT NULL,
    fire_at      BIGINT      NOT NULL,
    handled_at   BIGINT      NOT NULL,
    outcome      VARCHAR(32) NOT NULL,
    task_id      VARCHAR(64) NULL,
    PRIMARY KEY (schedule_id, fire_at),
    CONSTRAINT fires_schedule FOREIGN KEY (schedule_id) REFERENCES schedules (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The leader fencing token (as migrations/postgres/0004).
CREATE TABLE fences (
    name   VARCHAR(32) NOT NULL PRIMARY KEY,
    token  BIGINT      NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO fences (name, token) VALUES ('leader', 0);

-- API tokens, as a SHA-256 digest only (taskmesh_core::auth).
CREATE TABLE tokens (
    id           VARCHAR(32)  NOT NULL PRIMARY KEY,   -- public: listed, logged, revoked by
    name         VARCHAR(256) NOT NULL,
    namespace    VARCHAR(64)  NOT NULL,
    role         VARCHAR(16)  NOT NULL CHECK (role IN ('admin', 'submitter', 'reader', 'worker')),
    secret_hash  VARCHAR(64)  NOT NULL,
    created_at   BIGINT       NOT NULL,
    expires_at   BIGINT       NULL,
    revoked_at   BIGINT       NULL,
    KEY tokens_namespace (namespace, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The cluster key: derives the per-assignment secrets workers present.
CREATE TABLE cluster_keys (
    name   VARCHAR(32) NOT NULL PRIMARY KEY,
    value  BLOB        NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Wake-ups between replicas: each store's outbox appends one row per batch
-- of committed changes (the payload format of crate::wake::payload), and
-- every replica polls for rows past the last it read. Rows are wake-ups,
-- not the record; they are pruned a minute after they were written.
CREATE TABLE changes (
    seq         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    payload     MEDIUMTEXT  NOT NULL,
    created_at  TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY changes_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
