-- Retention finds ended tasks by when they ended: a range scan of the
-- tasks past the shortest horizon, never a visit of those kept (ordered by
-- id, a pass read every ended task of a state when none was due yet).
-- Partial: a task enters it once, when it ends. Built in the migration's
-- transaction (CONCURRENTLY waits for every older transaction in the
-- database, and two nodes or tests migrating at once deadlocked on it):
-- on an upgrade over millions of ended tasks, writes to `tasks` wait for
-- the build (about 10 s per 10^7 rows here).
CREATE INDEX tasks_ended ON tasks (state, ended_at) WHERE ended_at IS NOT NULL;
