-- Retention finds ended tasks by when they ended: a range scan of the
-- tasks past the shortest horizon, never a visit of those kept (ordered by
-- id, a pass read every ended task of a state when none was due yet).
-- InnoDB has no partial index (live tasks sit at NULL, before every
-- ended one); ended_at leads so the index serves no query on live states
-- (led by state, MariaDB took it as a rowid filter for the scheduler's
-- due scan). Adding it is an online operation.
CREATE INDEX tasks_ended ON tasks (ended_at, state);
