-- Workflows: a DAG of named steps, each a task. A step's task carries its
-- workflow, its name and the names it depends on (a JSON array of text);
-- a step waiting for its parents is PENDING with no next_at, so the
-- scheduler never finds it due. The workflow's row holds its policy and
-- state; every transaction that ends, releases or cancels a step of a
-- workflow locks that row first (before any step's row it has not locked:
-- one taken after its task rows is taken SKIP LOCKED, and on a miss the
-- transaction starts again locking the workflow first), so two steps
-- ending at once are serialised and a child is released exactly once.
ALTER TABLE tasks ADD COLUMN workflow_id TEXT COLLATE "C" NULL;
ALTER TABLE tasks ADD COLUMN workflow_step TEXT COLLATE "C" NULL;
ALTER TABLE tasks ADD COLUMN depends_on TEXT NULL;
CREATE INDEX tasks_workflow ON tasks (workflow_id, workflow_step)
    WHERE workflow_id IS NOT NULL;
CREATE TABLE workflows (
    id                  TEXT COLLATE "C" NOT NULL PRIMARY KEY,  -- UUIDv7 text
    namespace           TEXT COLLATE "C" NOT NULL,
    client_request_id   TEXT COLLATE "C" NULL,
    request_fingerprint TEXT             NOT NULL,
    failure_policy      TEXT             NOT NULL CHECK (failure_policy IN
                            ('CANCEL_REMAINING', 'CONTINUE_INDEPENDENT')),
    state               TEXT             NOT NULL CHECK (state IN
                            ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    message             TEXT             NOT NULL,
    step_count          BIGINT           NOT NULL,
    created_at          BIGINT           NOT NULL,
    updated_at          BIGINT           NOT NULL,
    ended_at            BIGINT           NULL
);
CREATE UNIQUE INDEX workflows_client_request_id ON workflows (namespace, client_request_id)
    WHERE client_request_id IS NOT NULL;
CREATE INDEX workflows_namespace ON workflows (namespace, id);
