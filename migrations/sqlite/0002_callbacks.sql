-- taskmesh SQLite schema, version 2: the callback outbox.
--
-- One row per task that ended with a callback_url, inserted in the same
-- transaction as the task's terminal transition, so a committed end always
-- has its callback queued and a rolled-back one never does. The delivery
-- loop claims due rows (pushing next_attempt_at forward as a lease, so a
-- crashed deliverer's rows come back), posts them and records the outcome.

CREATE TABLE callbacks (
    delivery_id      TEXT    NOT NULL PRIMARY KEY,          -- sent with every try; receivers de-duplicate on it
    task_id          TEXT    NOT NULL UNIQUE                 -- one delivery per task (a task ends once)
                             REFERENCES tasks (id) ON DELETE CASCADE,
    url              TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('PENDING', 'DELIVERED', 'FAILED')),
    attempts         INTEGER NOT NULL CHECK (attempts >= 0),
    last_error       TEXT    NOT NULL,
    next_attempt_at  INTEGER NULL,                          -- while PENDING: due time, or the lease end of a try under way
    delivered_at     INTEGER NULL,
    created_at       INTEGER NOT NULL
) STRICT;

-- The delivery loop: "PENDING rows due by now, earliest first", and
-- MIN(next_attempt_at) for its sleep. Partial, so finished rows cost nothing.
CREATE INDEX callbacks_due ON callbacks (next_attempt_at, delivery_id) WHERE state = 'PENDING';
