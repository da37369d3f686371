-- The in-flight scans (every task a worker holds, at its loss; every task
-- in flight, after a restart and in the leader's orphan sweep) read a
-- partial index of the tasks in flight only, instead of `tasks_state_id`
-- (state, id) over every task. A task's update changes its state, so it is
-- never HOT: it inserted a new entry in every index of the table, this one
-- included, at each of the writes of a task's life. Lists by state across
-- namespaces, which only operators' tools ask for, have no index made for
-- them. Built in the migration's transaction, as 0008 explains
-- (CONCURRENTLY deadlocked two nodes migrating at once): the build takes a
-- SHARE lock (writes wait, reads go on) for a scan of every task; the old
-- index is dropped last, so its ACCESS EXCLUSIVE lock is held only until
-- the commit that follows.
CREATE INDEX tasks_in_flight ON tasks (worker_id, id)
    WHERE state IN ('DISPATCHING', 'RUNNING');
DROP INDEX tasks_state_id;
