-- Schedules and the record of their fires (as migrations/sqlite/0003).
--
-- A schedule row changes only by a compare-and-set on `version`; a fire
-- writes the schedule, its fire rows and the tasks it creates in one
-- transaction. Task creation is idempotent on `client_request_id`
-- ("schedule:<id>:<fire time>"), so one fire can never create two tasks.

CREATE TABLE schedules (
    id               TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    name             TEXT    NOT NULL,
    kind             TEXT    NOT NULL CHECK (kind IN ('CRON', 'FIXED_RATE', 'FIXED_DELAY')),
    cron_expression  TEXT    NOT NULL,
    interval_ms      BIGINT  NOT NULL,
    time_zone        TEXT    NOT NULL,
    template         JSONB   NOT NULL,              -- taskmesh_core::schedule::TaskTemplate
    misfire_policy   TEXT    NOT NULL,
    max_catch_up     BIGINT  NOT NULL,
    overlap_policy   TEXT    NOT NULL,
    paused           BOOLEAN NOT NULL,
    next_fire_at     BIGINT  NULL,
    last_fire_at     BIGINT  NULL,
    last_task_id     TEXT    NULL,
    fire_count       BIGINT  NOT NULL,
    skipped_count    BIGINT  NOT NULL,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    version          BIGINT  NOT NULL
);

-- Due schedules, earliest first; partial so paused and waiting ones cost nothing.
CREATE INDEX schedules_due ON schedules (next_fire_at, id)
    WHERE next_fire_at IS NOT NULL AND NOT paused;

-- Fixed-delay schedules waiting for their run to end.
CREATE INDEX schedules_awaiting_run ON schedules (id)
    WHERE kind = 'FIXED_DELAY' AND next_fire_at IS NULL AND NOT paused AND last_task_id IS NOT NULL;

CREATE TABLE schedule_fires (
    schedule_id  TEXT COLLATE "C" NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    fire_at      BIGINT NOT NULL,
    handled_at   BIGINT NOT NULL,
    outcome      TEXT   NOT NULL,
    task_id      TEXT   NULL,
    PRIMARY KEY (schedule_id, fire_at)             -- a fire time is handled once
);
