-- The in-flight scans (every task a worker holds, at its loss; every task
-- in flight, after a restart) read a partial index of the tasks in flight
-- only, instead of `tasks_state_id` (state, id) over every task. A task's
-- update changes its state, so it is never HOT: it inserted a new entry in
-- every index of the table, this one included, at each of the three or
-- four writes of a task's life. Lists by state across namespaces, which
-- only operators' tools and the bench run, now read the table. Built in the
-- migration's transaction, as 0008 explains (CONCURRENTLY deadlocked two
-- nodes migrating at once); the scan on an upgrade is of every task.
DROP INDEX tasks_state_id;
CREATE INDEX tasks_in_flight ON tasks (worker_id, id)
    WHERE state IN ('DISPATCHING', 'RUNNING');
