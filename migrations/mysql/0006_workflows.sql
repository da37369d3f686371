-- Workflows: a DAG of named steps, each a task. A step's task carries its
-- workflow, its name and the names it depends on (a JSON array of text);
-- a step waiting for its parents is PENDING with no next_at, so the
-- scheduler never finds it due. The workflow's row holds its policy and
-- state; every transaction that ends, releases or cancels a step of a
-- workflow locks that row first (one taken after its task rows is taken
-- SKIP LOCKED, and on a miss the transaction starts again locking the
-- workflow first), so two steps ending at once are serialised and a child
-- is released exactly once. Columns and index in two statements: both
-- in place, without copying the table.
ALTER TABLE tasks
    ADD COLUMN workflow_id VARCHAR(64) NULL,
    ADD COLUMN workflow_step VARCHAR(128) NULL,
    ADD COLUMN depends_on LONGTEXT NULL;
ALTER TABLE tasks ADD KEY tasks_workflow (workflow_id, workflow_step);
CREATE TABLE workflows (
    id                  VARCHAR(64)  NOT NULL PRIMARY KEY,   -- UUIDv7 text
    namespace           VARCHAR(64)  NOT NULL,
    client_request_id   VARCHAR(256) NULL,
    request_fingerprint VARCHAR(64)  NOT NULL,
    failure_policy      VARCHAR(32)  NOT NULL CHECK (failure_policy IN
                            ('CANCEL_REMAINING', 'CONTINUE_INDEPENDENT')),
    state               VARCHAR(16)  NOT NULL CHECK (state IN
                            ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    message             TEXT         NOT NULL,
    step_count          BIGINT       NOT NULL,
    created_at          BIGINT       NOT NULL,
    updated_at          BIGINT       NOT NULL,
    ended_at            BIGINT       NULL,
    UNIQUE KEY workflows_client_request_id (namespace, client_request_id),
    KEY workflows_namespace (namespace, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
