-- Concurrency keys: a task may carry a key and a limit; across the
-- cluster at most `limit` tasks of a namespace's key are DISPATCHING or
-- RUNNING at once. A claim counts the key's in-flight tasks by
-- `tasks_concurrency` (partial: only keyed tasks are in it) while it holds
-- the key's row in `concurrency_keys` (made when the first task of the key
-- is created), so two claims of one key never count at once. SQLite has one
-- writer; the row is kept for the same code on every backend.
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT NULL;
ALTER TABLE tasks ADD COLUMN concurrency_limit INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_concurrency ON tasks (namespace, concurrency_key, state)
    WHERE concurrency_key IS NOT NULL;
CREATE TABLE concurrency_keys (
    namespace       TEXT NOT NULL,
    concurrency_key TEXT NOT NULL,
    PRIMARY KEY (namespace, concurrency_key)
);
