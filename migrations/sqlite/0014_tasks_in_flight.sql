-- The in-flight scans (every task a worker holds, at its loss; every task
-- in flight, after a restart) read a partial index of the tasks in flight
-- only, instead of `tasks_state_id` (state, id) over every task: that index
-- was rewritten by every transition (a delete and an insert each, four
-- times in a task's life) for those two scans and for lists by state across
-- namespaces, which only operators' tools ask for (they have no index made
-- for them). A task enters this one at its claim, is written again at its
-- ACK and leaves it at its end.
DROP INDEX tasks_state_id;
CREATE INDEX tasks_in_flight ON tasks (worker_id, id)
    WHERE state IN ('DISPATCHING', 'RUNNING');
