-- Lists by state within a namespace read `tasks_namespace_state_id`
-- (namespace, state, id) over every task. Every transition moved a task's
-- entry in it (a delete and an insert), at its claim, its ACK and its end
-- alike; measured, that index cost a drain a tenth of its rate. This
-- partial index leaves out the tasks in flight (DISPATCHING, RUNNING), which
-- `tasks_in_flight` holds already: a claim now only deletes a task's entry
-- (or, for a task created DISPATCHING, writes none), its ACK writes none
-- and its end inserts one. Lists of the states in flight read
-- `tasks_in_flight`; every list repeats the index's condition word for word
-- (`store::sql::statements::ListState`), as SQLite uses a partial index only
-- for a query that does.
DROP INDEX tasks_namespace_state_id;
CREATE INDEX tasks_namespace_state_id_unheld ON tasks (namespace, state, id)
    WHERE state NOT IN ('DISPATCHING', 'RUNNING');
