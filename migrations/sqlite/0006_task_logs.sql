-- Task logs: the lines handlers log, per attempt, within a cap.
--
-- task_log_attempts holds one row per attempt that sent lines: what was
-- kept and what was refused (the cap) or lost (the worker's buffer). Lines
-- are numbered within their attempt from 1, so (task_id, attempt, seq) is
-- both the key and the reading order. No foreign key to tasks: an insert
-- would lock the task row (KEY SHARE), and a writer cut off mid-flush would
-- keep that lock and stall the leader's reaper on the task until the
-- database noticed; retention deletes a task's logs with it instead.

CREATE TABLE task_log_attempts (
    task_id          TEXT    NOT NULL,
    attempt          INTEGER NOT NULL CHECK (attempt >= 1),
    kept_lines       INTEGER NOT NULL,
    kept_bytes       INTEGER NOT NULL,
    truncated_lines  INTEGER NOT NULL,   -- refused by the cap
    dropped          INTEGER NOT NULL,   -- dropped by the worker before sending
    PRIMARY KEY (task_id, attempt)
) STRICT;

CREATE TABLE task_logs (
    task_id  TEXT    NOT NULL,
    attempt  INTEGER NOT NULL,
    seq      INTEGER NOT NULL,
    at       INTEGER NOT NULL,
    level    TEXT    NOT NULL,
    message  TEXT    NOT NULL,
    PRIMARY KEY (task_id, attempt, seq)
) STRICT, WITHOUT ROWID;
