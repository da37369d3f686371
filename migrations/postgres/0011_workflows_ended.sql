-- Retention finds ended workflows by when they ended (a workflow's
-- history ages out as one unit: its row and every step together), a range
-- scan past the shortest horizon, never a visit of those kept. Partial: a
-- workflow enters it when it ends (and leaves it if it is retried).
CREATE INDEX workflows_ended ON workflows (state, ended_at) WHERE ended_at IS NOT NULL;
