-- Child tasks: a task a running handler (or a caller) submitted under
-- another, its parent. Cancelling the parent cancels its children, and
-- ListTasks finds them by parent, newest first. InnoDB has no partial
-- index: a task without a parent is one NULL entry no lookup visits.
-- Column and index in two statements, both in place.
ALTER TABLE tasks ADD COLUMN parent_task_id VARCHAR(64) NULL;
ALTER TABLE tasks ADD KEY tasks_parent (parent_task_id, id);
-- A workflow submitted under a task (its steps are that task's children).
ALTER TABLE workflows ADD COLUMN parent_task_id VARCHAR(64) NULL;
