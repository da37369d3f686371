-- Lists by state within a namespace read a partial index that leaves out
-- the tasks in flight (DISPATCHING, RUNNING), instead of
-- `tasks_namespace_state_id` (namespace, state, id) over every task. A
-- task's update changes its state, so it is never HOT: it inserted a new
-- entry in that index at its claim, its ACK and its end alike. With this
-- one, a claim and an ACK insert none (`tasks_in_flight` holds those
-- tasks). Lists of the states in flight read `tasks_in_flight`; the others
-- repeat this index's condition (`store::sql::statements::ListState`), so
-- that the planner can prove it whatever state is bound. Built in the
-- migration's transaction, as 0014 explains; the old index is dropped
-- last.
CREATE INDEX tasks_namespace_state_id_unheld ON tasks (namespace, state, id)
    WHERE state NOT IN ('DISPATCHING', 'RUNNING');
DROP INDEX tasks_namespace_state_id;
