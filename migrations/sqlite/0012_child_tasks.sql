-- Child tasks: a task a running handler (or a caller) submitted under
-- another, its parent. Cancelling the parent cancels its children, and
-- ListTasks finds them by parent, newest first: an index of (parent, id)
-- that holds children only.
ALTER TABLE tasks ADD COLUMN parent_task_id TEXT NULL;
CREATE INDEX tasks_parent ON tasks (parent_task_id, id) WHERE parent_task_id IS NOT NULL;
-- A workflow submitted under a task (its steps are that task's children).
ALTER TABLE workflows ADD COLUMN parent_task_id TEXT NULL;
