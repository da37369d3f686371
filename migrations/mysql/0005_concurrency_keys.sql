-- Concurrency keys: a task may carry a key and a limit; across the
-- cluster at most `limit` tasks of a namespace's key are DISPATCHING or
-- RUNNING at once. A claim locks the key's row in `concurrency_keys` (made
-- when the first task of the key is created, and only if it is missing:
-- on MySQL an insert that meets a duplicate locks it; SKIP LOCKED, so a
-- claim never waits for another) and then counts the key's in-flight tasks
-- by `tasks_concurrency`, so two claims of one key never count at once
-- (writers run READ COMMITTED: the count sees every commit before it).
-- Two statements, no CHECK: adding the columns is instant, adding the
-- index is done in place with writes going on; together, or with a CHECK,
-- the table would be copied.
ALTER TABLE tasks
    ADD COLUMN concurrency_key VARCHAR(256) NULL,
    ADD COLUMN concurrency_limit BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD KEY tasks_concurrency (namespace, concurrency_key, state);
CREATE TABLE concurrency_keys (
    namespace       VARCHAR(64)  NOT NULL,
    concurrency_key VARCHAR(256) NOT NULL,
    PRIMARY KEY (namespace, concurrency_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
