-- Concurrency keys: a task may carry a key and a limit; across the
-- cluster at most `limit` tasks of a namespace's key are DISPATCHING or
-- RUNNING at once. A claim locks the key's row in `concurrency_keys` (made
-- when the first task of the key is created; SKIP LOCKED, so a claim never
-- waits for another) and then counts the key's in-flight tasks by
-- `tasks_concurrency` (partial: only keyed tasks are in it), so two claims
-- of one key never count at once. The columns are added without a CHECK
-- (the store reads a limit out of range as an error): a constant default
-- is only a catalogue change, where a CHECK would read every row under
-- the table's lock.
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT COLLATE "C" NULL;
ALTER TABLE tasks ADD COLUMN concurrency_limit BIGINT NOT NULL DEFAULT 0;
CREATE INDEX tasks_concurrency ON tasks (namespace, concurrency_key, state)
    WHERE concurrency_key IS NOT NULL;
CREATE TABLE concurrency_keys (
    namespace       TEXT COLLATE "C" NOT NULL,
    concurrency_key TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (namespace, concurrency_key)
);
