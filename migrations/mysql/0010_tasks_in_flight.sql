-- `tasks_state_id` (state, id) over every task was rewritten by every
-- transition for the in-flight scans and for lists by state across
-- namespaces (operators' tools only). InnoDB has no partial index: the
-- in-flight scans read `tasks_ready_claim`, which leads with the state;
-- the lists across namespaces have no index made for them.
ALTER TABLE tasks DROP INDEX tasks_state_id;
