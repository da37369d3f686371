-- The callback outbox (as migrations/sqlite/0002).
--
-- One row per task that ended with a callback_url, inserted in the same
-- transaction as the task's terminal transition, so a committed end always
-- has its callback queued and a rolled-back one never does. Delivery loops
-- (one per replica) claim due rows with `FOR UPDATE SKIP LOCKED`, pushing
-- next_attempt_at forward as a lease so a crashed deliverer's rows come
-- back, post them and record the outcome.

CREATE TABLE callbacks (
    delivery_id      TEXT COLLATE "C" NOT NULL PRIMARY KEY,  -- sent with every try; receivers de-duplicate on it
    task_id          TEXT COLLATE "C" NOT NULL UNIQUE        -- one delivery per task (a task ends once)
                              REFERENCES tasks (id) ON DELETE CASCADE,
    url              TEXT   NOT NULL,
    state            TEXT   NOT NULL CHECK (state IN ('PENDING', 'DELIVERED', 'FAILED')),
    attempts         BIGINT NOT NULL CHECK (attempts >= 0),
    last_error       TEXT   NOT NULL,
    next_attempt_at  BIGINT NULL,                          -- while PENDING: due time, or the lease end of a try under way
    delivered_at     BIGINT NULL,
    created_at       BIGINT NOT NULL
);

-- The delivery loop: "PENDING rows due by now, earliest first", and
-- MIN(next_attempt_at) for its sleep. Partial, so finished rows cost nothing.
CREATE INDEX callbacks_due ON callbacks (next_attempt_at, delivery_id) WHERE state = 'PENDING';
