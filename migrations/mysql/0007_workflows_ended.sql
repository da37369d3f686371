-- Retention finds ended workflows by when they ended (a workflow's
-- history ages out as one unit: its row and every step together), a range
-- scan past the shortest horizon, never a visit of those kept. InnoDB has
-- no partial index: a running workflow's entry is (RUNNING, NULL), which
-- no scan of an ended state visits.
CREATE INDEX workflows_ended ON workflows (state, ended_at);
