-- Namespaces, tokens and the cluster key (as migrations/sqlite/0005).
--
-- Every task and schedule belongs to a namespace ('default' for what was
-- there before); idempotency keys are unique within one; lists and claims
-- read indexes that lead with it. Tokens are stored as a SHA-256 digest
-- only (taskmesh_core::auth); the cluster key derives the per-assignment
-- secrets workers present with results and out-of-band ACKs.

ALTER TABLE tasks ADD COLUMN namespace TEXT COLLATE "C" NOT NULL DEFAULT 'default';
ALTER TABLE schedules ADD COLUMN namespace TEXT COLLATE "C" NOT NULL DEFAULT 'default';

DROP INDEX tasks_client_request_id;
CREATE UNIQUE INDEX tasks_client_request_id ON tasks (namespace, client_request_id)
    WHERE client_request_id IS NOT NULL;

-- Claims: READY tasks of one namespace and handler, priority then FIFO.
DROP INDEX tasks_ready_claim;
CREATE INDEX tasks_ready_claim ON tasks (namespace, handler, priority DESC, id)
    WHERE state = 'READY';

-- Listing within a namespace: all, by state, by handler; newest first.
-- (tasks_state_id stays for the in-flight scan across namespaces.)
CREATE INDEX tasks_namespace_id ON tasks (namespace, id);
CREATE INDEX tasks_namespace_state_id ON tasks (namespace, state, id);
DROP INDEX tasks_handler_id;
CREATE INDEX tasks_handler_id ON tasks (namespace, handler, id);

CREATE INDEX schedules_namespace_id ON schedules (namespace, id);

CREATE TABLE tokens (
    id           TEXT COLLATE "C" NOT NULL PRIMARY KEY,   -- public: listed, logged, revoked by
    name         TEXT   NOT NULL,
    namespace    TEXT COLLATE "C" NOT NULL,
    role         TEXT   NOT NULL CHECK (role IN ('admin', 'submitter', 'reader', 'worker')),
    secret_hash  TEXT   NOT NULL,                         -- SHA-256 of the token text, hex
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NULL,
    revoked_at   BIGINT NULL
);
CREATE INDEX tokens_namespace ON tokens (namespace, id);

CREATE TABLE cluster_keys (
    name   TEXT  NOT NULL PRIMARY KEY,
    value  BYTEA NOT NULL
);
