-- Task logs: the lines handlers log, per attempt, within a cap.
--
-- task_log_attempts holds one row per attempt that sent lines: what was
-- kept and what was refused (the cap) or lost (the worker's buffer). Lines
-- are numbered within their attempt from 1, so (task_id, attempt, seq) is
-- both the key and the reading order. No foreign key to tasks: an insert
-- would lock the task row, and a writer cut off mid-flush would keep that
-- lock and stall the leader's reaper on the task until the database
-- noticed; retention deletes a task's logs with it instead.

CREATE TABLE task_log_attempts (
    task_id          VARCHAR(64) NOT NULL,
    attempt          BIGINT      NOT NULL CHECK (attempt >= 1),
    kept_lines       BIGINT      NOT NULL,
    kept_bytes       BIGINT      NOT NULL,
    truncated_lines  BIGINT      NOT NULL,
    dropped          BIGINT      NOT NULL,
    PRIMARY KEY (task_id, attempt)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE task_logs (
    task_id  VARCHAR(64) NOT NULL,
    attempt  BIGINT      NOT NULL,
    seq      BIGINT      NOT NULL,
    at       BIGINT      NOT NULL,
    level    VARCHAR(8)  NOT NULL,
    message  MEDIUMTEXT  NOT NULL,
    PRIMARY KEY (task_id, attempt, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
