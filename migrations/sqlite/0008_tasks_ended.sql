-- Retention finds ended tasks by when they ended: a range scan of the
-- tasks past the shortest horizon, never a visit of those kept (ordered by
-- id, a pass read every ended task of a state when none was due yet).
-- Partial: a task enters it once, when it ends.
CREATE INDEX tasks_ended ON tasks (state, ended_at) WHERE ended_at IS NOT NULL;
