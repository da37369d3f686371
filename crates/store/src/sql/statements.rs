//! Every statement the store runs, written once as a template (see
//! `dialect`) and rendered per backend into [`Statements`]. A backend keeps
//! its rendering in a `static`, so statements are `&'static str`, built once
//! per process.

use super::dialect::{BulkForm, Dialect, Ladder, marks, value_rows};
use super::logs::LOG_COLUMNS;
use super::rows::{
    ATTEMPT_COLUMNS, CALLBACK_COLUMNS, SCHEDULE_BODY, SCHEDULE_READ, TASK_BODY, TASK_KEYS,
    TASK_MUTABLE, TASK_READ, TASK_READ_SUMMARY, TOKEN_COLUMNS, assignments, names, row_marks,
};
use super::workflows::WORKFLOW_COLUMNS;

/// The rendered statements of one dialect. Field names say what each does;
/// the templates below say how.
#[derive(Debug)]
pub struct Statements {
    /// The dialect's bulk compare-and-set form.
    pub bulk: BulkForm,
    pub ping: String,
    pub get_task: String,
    pub lock_task: String,
    pub attempts_of: String,
    pub callback_of: String,
    /// Listings (without bodies, with their sizes), indexed by
    /// [`list_index`].
    pub list: [String; LISTS],
    /// The task of an idempotency key, in a namespace or in any.
    pub by_request_id: String,
    pub by_request_id_any: String,
    /// A parent's children newest first: index bit 1 = before an id, bit
    /// 2 = in a namespace (a caller's listing never reads another
    /// namespace's rows, even to skip them).
    pub by_parent: [String; 4],
    pub stats_counts: String,
    pub stats_queues: String,
    pub stats_ended: String,
    pub stats_reruns_live: String,
    pub stats_reruns_ended: String,
    pub due: String,
    pub in_flight: String,
    pub in_flight_of: String,
    pub next_due: String,
    pub ready_counts: String,
    pub update_task: String,
    pub close_attempt: String,
    pub raise_fence: String,
    pub fence_token: String,
    pub claim_first: String,
    pub claim_after: String,
    pub claim_after_except: Ladder,
    pub claim_callbacks: String,
    pub finish_callback: String,
    pub callback_exists: String,
    pub delete_callback: String,
    pub next_callback: String,
    pub insert_schedule: String,
    pub update_schedule: String,
    pub get_schedule: String,
    pub list_schedules: String,
    pub list_schedules_in: String,
    pub count_schedules: String,
    pub insert_token: String,
    pub get_token: String,
    pub list_tokens: String,
    pub list_tokens_in: String,
    pub revoke_token: String,
    pub token_exists: String,
    pub get_cluster_key: String,
    pub insert_cluster_key: String,
    pub insert_concurrency_keys: Ladder,
    pub lock_concurrency_key: String,
    pub concurrency_key_exists: String,
    pub in_flight_of_key: String,
    pub schedule_exists: String,
    pub delete_fires: String,
    pub delete_schedule: String,
    pub due_schedules: String,
    pub next_schedule_due: String,
    pub awaiting_run_end: String,
    pub insert_fire: String,
    pub recent_fires: String,
    /// Retention: the oldest tasks of a terminal state that ended longer
    /// ago than their horizon (the handler's, else the namespace's, else
    /// the one bound), without a callback still to deliver. The first
    /// time bound (now less the shortest horizon that applies) makes it a
    /// range scan of `tasks_ended`, so tasks kept are never visited.
    /// Never a workflow's step: those go with their workflow
    /// (`ended_workflows`). Written as an anti-join on `workflows`, not as
    /// `workflow_id IS NULL`: before `tasks` is analysed Postgres takes
    /// `IS NULL` as 0.5 % of the rows, plans a bitmap scan and a sort of
    /// every ended task of the state instead of reading `tasks_ended` in
    /// order, and the pass takes seconds (measured beside 10^7 ended
    /// tasks: ~17 removed/s, where this form removes ~6,500/s).
    pub ended_ids: String,
    /// Retention: ended workflows (the oldest end first) whose end is
    /// older than their namespace's horizon for their end state, else the
    /// one bound, with no step still live or with a callback to deliver;
    /// a range scan of `workflows_ended`.
    pub ended_workflows: String,
    /// A bounded page of a workflow's step ids (by `tasks_workflow`).
    pub workflow_step_ids: String,
    /// Deletes a workflow's row unless it is running.
    pub delete_workflow: String,
    /// The shortest horizon set through the API for a state (none: NULL).
    pub shortest_horizon: String,
    /// Retention horizons set through the API.
    pub delete_retention: String,
    pub insert_retention: String,
    pub retention_rules: String,
    pub retention_rules_in: String,
    /// The first-created task kept in a namespace and terminal state.
    pub oldest_ended: String,
    /// Retention: deletes terminal tasks by id (attempts and callbacks go
    /// with them: `ON DELETE CASCADE`). The caller chose them: tasks of no
    /// workflow, or steps of a workflow whose row it holds, not running.
    pub delete_ended: Ladder,
    /// Fire retention: the fire time `OFFSET` places from the newest (the
    /// oldest to keep), and the one `OFFSET` places from the oldest before
    /// a time (the last of a bounded batch).
    pub nth_newest_fire: String,
    pub nth_oldest_fire_before: String,
    /// Fire retention: deletes a schedule's fires in `[.., ?]` before `?`.
    pub delete_fires_through: String,
    /// Task logs: an attempt's number by its execution id, and when it
    /// ended (lines too long after are refused as late).
    pub attempt_of_execution: String,
    /// Task logs: an attempt's counter row, made if missing, then locked.
    pub open_log_attempt: String,
    pub lock_log_attempt: String,
    /// Task logs: adds kept lines and bytes, refused and dropped lines.
    pub count_log_attempt: String,
    pub log_attempts: String,
    /// Task logs: lines after an (attempt, seq), of all attempts or one.
    pub logs_after: String,
    pub logs_of_attempt: String,
    pub insert_logs: Ladder,
    /// Retention: the attempts of some tasks whose logs hold more than
    /// `?` lines, and one bounded range of an attempt's lines.
    pub long_logs: Ladder,
    /// Retention: the logs of tasks by id (no foreign key takes them).
    pub delete_logs_of: Ladder,
    pub delete_log_attempts_of: Ladder,
    pub delete_log_range: String,
    /// `SELECT` tasks by id, for `IN` lists of ladder sizes.
    pub tasks_by_id: Ladder,
    /// The same, locking the rows in id order.
    pub lock_tasks: Ladder,
    pub tasks_by_request_id: Ladder,
    pub attempts_of_many: Ladder,
    pub callbacks_of_many: Ladder,
    pub lease_callbacks: Ladder,
    pub insert_tasks: Ladder,
    pub insert_attempts: Ladder,
    pub insert_callbacks: Ladder,
    /// The bulk compare-and-set of [`TASK_MUTABLE`] (see [`BulkForm`]).
    pub update_tasks: Ladder,
    pub close_attempts: Ladder,
    /// Workflows: the row, read, locked (waiting or `SKIP LOCKED`), by
    /// idempotency key, and its state written.
    pub insert_workflow: String,
    pub get_workflow: String,
    pub lock_workflow: String,
    pub try_lock_workflow: String,
    /// A task's row, locked only if no other transaction holds it.
    pub try_lock_task: String,
    pub workflow_by_request_id: String,
    pub update_workflow: String,
    /// Workflows: the steps' tasks, locked or not, and the outputs of some
    /// steps by name (the caller keeps those that succeeded; a condition
    /// on the state could lead a planner to the state index).
    pub steps_of: String,
    pub lock_steps: String,
    pub step_outputs: Ladder,
    /// Workflows newest first in a namespace; index: 1 = by state, 2 =
    /// before an id.
    pub list_workflows: [String; 4],
}

/// How a listing filters on the state. The index of the states
/// (`tasks_namespace_state_id_unheld`) leaves out the tasks in flight, so
/// that a claim and an ACK do not rewrite it; a list of those states reads
/// the in-flight index (`tasks_in_flight`, by `{in_flight_from}`) instead.
/// Either way the statement repeats the index's condition word for word
/// (`{unheld}` for the first), as SQLite uses a partial index only for a
/// query that does, and Postgres only for one that implies it whatever the
/// bound state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListState {
    /// No filter on the state.
    Any = 0,
    /// One state out of flight (not DISPATCHING or RUNNING).
    Unheld = 1,
    /// DISPATCHING or RUNNING.
    InFlight = 2,
}

impl ListState {
    /// In discriminant order.
    const ALL: [Self; 3] = [Self::Any, Self::Unheld, Self::InFlight];

    /// The filter's class for an optional state.
    pub fn of(state: Option<taskmesh_core::TaskState>) -> Self {
        match state {
            None => Self::Any,
            Some(s) if s.is_in_flight() => Self::InFlight,
            Some(_) => Self::Unheld,
        }
    }
}

/// How many listing statements there are: three kinds of state filter
/// times the five other filters' 32 combinations.
pub const LISTS: usize = ListState::ALL.len() * 32;

/// The index into [`Statements::list`] for a filter on namespace, state,
/// handler, a `before_id` cursor and a creation-time range.
pub fn list_index(
    namespace: bool,
    state: ListState,
    handler: bool,
    before: bool,
    created_after: bool,
    created_before: bool,
) -> usize {
    let rest = usize::from(handler)
        | usize::from(before) << 1
        | usize::from(namespace) << 2
        | usize::from(created_after) << 3
        | usize::from(created_before) << 4;
    rest * ListState::ALL.len() + state as usize
}

/// Arguments bind in this order: namespace, state, handler, before id,
/// created after, created before, limit.
fn list_template(i: usize) -> String {
    let n = ListState::ALL.len();
    let (rest, state) = (i / n, ListState::ALL[i % n]);
    let mut conditions = Vec::new();
    // Word for word the partial indexes' conditions (see [`ListState`]).
    let from = if state == ListState::InFlight {
        conditions.push("state IN ('DISPATCHING', 'RUNNING')");
        "{in_flight_from}"
    } else {
        "tasks"
    };
    if rest & 4 != 0 {
        conditions.push("namespace = ?");
    }
    match state {
        ListState::Unheld => conditions.push("state = ?{unheld}"),
        ListState::InFlight => conditions.push("state = ?"),
        ListState::Any => {}
    }
    if rest & 1 != 0 {
        conditions.push("handler = ?");
    }
    if rest & 2 != 0 {
        conditions.push("id < ?");
    }
    if rest & 8 != 0 {
        conditions.push("created_at >= ?");
    }
    if rest & 16 != 0 {
        conditions.push("created_at < ?");
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!("SELECT {TASK_READ_SUMMARY} FROM {from}{filter} ORDER BY id DESC LIMIT ?")
}

impl Statements {
    /// Renders every statement for `d`.
    pub fn render(d: &'static Dialect) -> Self {
        let r = |t: &str| d.render(t);
        let schedule_cols = format!("id, namespace, {}", names(&SCHEDULE_BODY));
        Self {
            bulk: d.bulk,
            ping: r("SELECT 1 AS one"),
            get_task: r(&format!("SELECT {TASK_READ} FROM tasks WHERE id = ?")),
            lock_task: r(&format!(
                "SELECT {TASK_READ} FROM tasks WHERE id = ?{{lock}}"
            )),
            attempts_of: r(&format!(
                "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE task_id = ? ORDER BY number"
            )),
            callback_of: r(&format!(
                "SELECT {CALLBACK_COLUMNS} FROM callbacks WHERE task_id = ?"
            )),
            list: std::array::from_fn(|i| r(&list_template(i))),
            by_request_id: r(&format!(
                "SELECT {TASK_READ_SUMMARY} FROM tasks WHERE namespace = ? AND client_request_id = ?"
            )),
            by_request_id_any: r(&format!(
                "SELECT {TASK_READ_SUMMARY} FROM tasks WHERE client_request_id = ? ORDER BY id DESC"
            )),
            by_parent: std::array::from_fn(|i| {
                let before = if i & 1 != 0 { " AND id < ?" } else { "" };
                let namespace = if i & 2 != 0 { " AND namespace = ?" } else { "" };
                r(&format!(
                    "SELECT {TASK_READ_SUMMARY} FROM tasks WHERE parent_task_id = ?{before}\
                     {namespace} ORDER BY id DESC LIMIT ?"
                ))
            }),
            stats_counts: r("SELECT state, handler, COUNT(*) AS n FROM tasks \
                 WHERE namespace = ? GROUP BY state, handler"),
            stats_queues: r(
                "SELECT handler, COUNT(*) AS n, MIN(ready_at) AS v FROM {ready_from} \
                 WHERE namespace = ? AND state = 'READY' GROUP BY handler",
            ),
            // Grouped by minute (a hash or a sort of the window's rows):
            // out of the index checks, which refuse any sort.
            stats_ended: r(
                "SELECT t.state AS state, t.ended_at - t.ended_at % 60000 AS m, \
                 COUNT(*) AS n FROM {ended_from} \
                 WHERE t.state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT') \
                 AND t.ended_at >= ? AND t.namespace = ? \
                 GROUP BY t.state, t.ended_at - t.ended_at % 60000",
            ),
            // An attempt started since the window's start belongs to a task
            // that is live now or ended since: two indexed reads, no scan
            // of the attempts' history.
            stats_reruns_live: r("SELECT a.started_at - a.started_at % 60000 AS m, \
                 COUNT(*) AS n FROM tasks t JOIN attempts a ON a.task_id = t.id \
                 WHERE t.namespace = ? \
                 AND t.state IN ('READY', 'DISPATCHING', 'RUNNING', 'RETRYING') \
                 AND a.number > 1 AND a.started_at >= ? \
                 GROUP BY a.started_at - a.started_at % 60000"),
            stats_reruns_ended: r("SELECT a.started_at - a.started_at % 60000 AS m, \
                 COUNT(*) AS n FROM {ended_from} JOIN attempts a ON a.task_id = t.id \
                 WHERE t.state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED') \
                 AND t.ended_at >= ? AND t.namespace = ? \
                 AND a.number > 1 AND a.started_at >= ? \
                 GROUP BY a.started_at - a.started_at % 60000"),
            due: r(&format!(
                "SELECT {TASK_READ} FROM tasks WHERE next_at IS NOT NULL AND next_at <= ? \
                 AND {{due_state}} IN ('PENDING', 'RETRYING', 'DISPATCHING', 'RUNNING') \
                 ORDER BY next_at, id LIMIT ?"
            )),
            // In no order: a sort would cost more than the callers' use of
            // one. The condition is `tasks_in_flight`'s own, word for word
            // (SQLite uses a partial index only for a query that repeats its
            // WHERE term); InnoDB reads them by its claim index, which leads
            // with the state.
            in_flight: r(&format!(
                "SELECT {TASK_READ} FROM {{in_flight_from}} \
                 WHERE state IN ('DISPATCHING', 'RUNNING')"
            )),
            in_flight_of: r(&format!(
                "SELECT {TASK_READ} FROM {{in_flight_from}} \
                 WHERE state IN ('DISPATCHING', 'RUNNING') AND worker_id = ?"
            )),
            next_due: r("SELECT MIN(next_at) AS v FROM tasks WHERE next_at IS NOT NULL"),
            ready_counts: r(
                "SELECT namespace, handler, COUNT(*) AS n FROM {ready_from} \
                 WHERE state = 'READY' GROUP BY namespace, handler ORDER BY namespace, handler",
            ),
            update_task: r(&format!(
                "UPDATE tasks SET {} WHERE id = ? AND version = ?",
                assignments(&TASK_BODY)
            )),
            close_attempt: r(
                "UPDATE attempts SET ended_at = ?, outcome = ?, message = ? \
                 WHERE task_id = ? AND execution_id = ?",
            ),
            raise_fence: r("UPDATE fences SET token = ? WHERE name = 'leader' AND token <= ?"),
            fence_token: r("SELECT token FROM fences WHERE name = 'leader'"),
            claim_first: r(&format!(
                "SELECT {TASK_READ} FROM tasks WHERE state = 'READY' AND namespace = ? \
                 AND handler = ? ORDER BY priority DESC, id LIMIT ?{{skip_locked}}"
            )),
            claim_after: r(&format!(
                "SELECT {TASK_READ} FROM tasks WHERE state = 'READY' AND namespace = ? \
                 AND handler = ? AND priority <= ? AND (priority < ? OR id > ?) \
                 ORDER BY priority DESC, id LIMIT ?{{skip_locked}}"
            )),
            claim_callbacks: r(&format!(
                "SELECT {CALLBACK_COLUMNS} FROM callbacks WHERE state = 'PENDING' \
                 AND next_attempt_at <= ? ORDER BY next_attempt_at, delivery_id \
                 LIMIT ?{{skip_locked}}"
            )),
            finish_callback: r("UPDATE callbacks SET state = ?, attempts = attempts + 1, \
                 last_error = ?, next_attempt_at = ?, delivered_at = ? \
                 WHERE delivery_id = ? AND state = 'PENDING'"),
            callback_exists: r("SELECT 1 AS one FROM callbacks WHERE delivery_id = ?"),
            delete_callback: r("DELETE FROM callbacks WHERE task_id = ?"),
            next_callback: r("SELECT MIN(next_attempt_at) AS v FROM callbacks \
                 WHERE state = 'PENDING'"),
            insert_schedule: r(&format!(
                "INSERT INTO schedules ({schedule_cols}) VALUES (?, ?, {})",
                row_marks(&SCHEDULE_BODY)
            )),
            update_schedule: r(&format!(
                "UPDATE schedules SET {} WHERE id = ? AND version = ?",
                assignments(&SCHEDULE_BODY)
            )),
            get_schedule: r(&format!(
                "SELECT {SCHEDULE_READ} FROM schedules WHERE id = ?"
            )),
            list_schedules: r(&format!(
                "SELECT {SCHEDULE_READ} FROM schedules WHERE id > ? ORDER BY id LIMIT ?"
            )),
            list_schedules_in: r(&format!(
                "SELECT {SCHEDULE_READ} FROM schedules WHERE namespace = ? AND id > ? \
                 ORDER BY id LIMIT ?"
            )),
            count_schedules: r("SELECT COUNT(*) AS n FROM schedules WHERE namespace = ?"),
            insert_token: r(&format!(
                "INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            )),
            get_token: r(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?")),
            list_tokens: r(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY namespace, id"
            )),
            list_tokens_in: r(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE namespace = ? ORDER BY id"
            )),
            revoke_token: r("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"),
            token_exists: r("SELECT 1 AS one FROM tokens WHERE id = ?"),
            get_cluster_key: r("SELECT value FROM cluster_keys WHERE name = 'assignments'"),
            insert_cluster_key: r(&format!(
                "INSERT INTO cluster_keys (name, value) VALUES ('assignments', ?){}",
                d.ignoring_duplicates(&["name"])
            )),
            lock_concurrency_key: r("SELECT 1 AS one FROM concurrency_keys \
                 WHERE namespace = ? AND concurrency_key = ?{skip_locked}"),
            concurrency_key_exists: r("SELECT 1 AS one FROM concurrency_keys \
                 WHERE namespace = ? AND concurrency_key = ?"),
            // A spread broadcast is RUNNING but runs nothing: its shards,
            // which carry its key, are what count.
            in_flight_of_key: r(
                "SELECT COUNT(*) AS n FROM {concurrency_from} WHERE namespace = ? \
                 AND concurrency_key = ? AND state IN ('DISPATCHING', 'RUNNING') AND broadcast = 0",
            ),
            schedule_exists: r("SELECT 1 AS one FROM schedules WHERE id = ?"),
            delete_fires: r("DELETE FROM schedule_fires WHERE schedule_id = ?"),
            delete_schedule: r("DELETE FROM schedules WHERE id = ?"),
            due_schedules: r(&format!(
                "SELECT {SCHEDULE_READ} FROM schedules WHERE next_fire_at IS NOT NULL \
                 AND paused = {{false}} AND next_fire_at <= ? ORDER BY next_fire_at, id LIMIT ?"
            )),
            next_schedule_due: r("SELECT MIN(next_fire_at) AS v FROM schedules \
                 WHERE next_fire_at IS NOT NULL AND paused = {false}"),
            awaiting_run_end: r(&format!(
                "SELECT {SCHEDULE_READ} FROM schedules WHERE kind = 'FIXED_DELAY' \
                 AND next_fire_at IS NULL AND paused = {{false}} AND last_task_id IS NOT NULL \
                 ORDER BY id LIMIT ?"
            )),
            insert_fire: r(&format!(
                "INSERT INTO schedule_fires (schedule_id, fire_at, handled_at, outcome, task_id) \
                 VALUES (?, ?, ?, ?, ?){}",
                d.ignoring_duplicates(&["schedule_id", "fire_at"])
            )),
            recent_fires: r(
                "SELECT fire_at, handled_at, outcome, task_id FROM schedule_fires \
                 WHERE schedule_id = ? ORDER BY fire_at DESC LIMIT ?",
            ),
            ended_ids: r("SELECT t.id AS id FROM {ended_from} \
                 LEFT JOIN retention_policies h ON h.namespace = t.namespace \
                 AND h.handler = t.handler AND h.state = t.state \
                 LEFT JOIN retention_policies n ON n.namespace = t.namespace \
                 AND n.handler = '' AND n.state = t.state \
                 WHERE t.state = ? AND t.ended_at IS NOT NULL AND t.ended_at < ? \
                 AND t.ended_at < ? - COALESCE(h.horizon_ms, n.horizon_ms, ?) \
                 AND NOT EXISTS (SELECT 1 FROM callbacks c \
                 WHERE c.task_id = t.id AND c.state = 'PENDING') \
                 AND NOT EXISTS (SELECT 1 FROM workflows w WHERE w.id = t.workflow_id) \
                 ORDER BY t.ended_at LIMIT ?"),
            ended_workflows: r(
                "SELECT w.id AS id, w.ended_at AS ended_at FROM {ended_workflows_from} \
                 LEFT JOIN retention_policies n ON n.namespace = w.namespace \
                 AND n.handler = '' AND n.state = w.state \
                 WHERE w.state = ? AND w.ended_at IS NOT NULL AND w.ended_at < ? \
                 AND w.ended_at < ? - COALESCE(n.horizon_ms, ?) \
                 AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.workflow_id = w.id \
                 AND t.ended_at IS NULL) \
                 AND NOT EXISTS (SELECT 1 FROM tasks t JOIN callbacks c ON c.task_id = t.id \
                 WHERE t.workflow_id = w.id AND c.state = 'PENDING') \
                 ORDER BY w.ended_at LIMIT ?",
            ),
            workflow_step_ids: r("SELECT id FROM tasks WHERE workflow_id = ? LIMIT ?"),
            delete_workflow: r("DELETE FROM workflows WHERE id = ? AND state <> 'RUNNING'"),
            shortest_horizon: r(
                "SELECT MIN(horizon_ms) AS h FROM retention_policies WHERE state = ?",
            ),
            delete_retention: r(
                "DELETE FROM retention_policies WHERE namespace = ? AND handler = ?",
            ),
            insert_retention: r("INSERT INTO retention_policies \
                 (namespace, handler, state, horizon_ms) VALUES (?, ?, ?, ?)"),
            retention_rules: r("SELECT namespace, handler, state, horizon_ms \
                 FROM retention_policies ORDER BY namespace, handler, state"),
            retention_rules_in: r("SELECT namespace, handler, state, horizon_ms \
                 FROM retention_policies WHERE namespace = ? ORDER BY handler, state"),
            oldest_ended: r(
                "SELECT id, ended_at FROM tasks WHERE namespace = ? AND state = ?{unheld} \
                 ORDER BY id LIMIT 1",
            ),
            nth_newest_fire: r(
                "SELECT fire_at AS v FROM schedule_fires WHERE schedule_id = ? \
                 ORDER BY fire_at DESC LIMIT 1 OFFSET ?",
            ),
            nth_oldest_fire_before: r("SELECT fire_at AS v FROM schedule_fires \
                 WHERE schedule_id = ? AND fire_at < ? ORDER BY fire_at LIMIT 1 OFFSET ?"),
            delete_fires_through: r("DELETE FROM schedule_fires WHERE schedule_id = ? \
                 AND fire_at < ? AND fire_at <= ?"),
            attempt_of_execution: r(
                "SELECT number AS v, ended_at FROM attempts WHERE task_id = ? AND execution_id = ?",
            ),
            open_log_attempt: r(&format!(
                "INSERT INTO task_log_attempts \
                 (task_id, attempt, kept_lines, kept_bytes, truncated_lines, dropped) \
                 VALUES (?, ?, 0, 0, 0, 0){}",
                d.ignoring_duplicates(&["task_id", "attempt"])
            )),
            lock_log_attempt: r("SELECT kept_lines, kept_bytes FROM task_log_attempts \
                 WHERE task_id = ? AND attempt = ?{lock}"),
            count_log_attempt: r("UPDATE task_log_attempts SET kept_lines = kept_lines + ?, \
                 kept_bytes = kept_bytes + ?, truncated_lines = truncated_lines + ?, \
                 dropped = dropped + ? WHERE task_id = ? AND attempt = ?"),
            log_attempts: r(
                "SELECT attempt, kept_lines, kept_bytes, truncated_lines, dropped \
                 FROM task_log_attempts WHERE task_id = ? ORDER BY attempt",
            ),
            logs_after: r(&format!(
                "SELECT {LOG_COLUMNS} FROM task_logs WHERE task_id = ? \
                 AND (attempt > ? OR (attempt = ? AND seq > ?)) ORDER BY attempt, seq LIMIT ?"
            )),
            logs_of_attempt: r(&format!(
                "SELECT {LOG_COLUMNS} FROM task_logs WHERE task_id = ? AND attempt = ? \
                 AND seq > ? ORDER BY seq LIMIT ?"
            )),
            delete_log_range: r("DELETE FROM task_logs WHERE task_id = ? AND attempt = ? \
                 AND seq > ? AND seq <= ?"),
            delete_logs_of: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "DELETE FROM task_logs WHERE task_id IN ({})",
                    marks(n)
                ))
            }),
            delete_log_attempts_of: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "DELETE FROM task_log_attempts WHERE task_id IN ({})",
                    marks(n)
                ))
            }),
            long_logs: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT task_id, attempt, kept_lines FROM task_log_attempts \
                     WHERE kept_lines > ? AND task_id IN ({})",
                    marks(n)
                ))
            }),
            insert_logs: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "INSERT INTO task_logs ({LOG_COLUMNS}) VALUES {}",
                    value_rows(n, 6)
                ))
            }),
            delete_ended: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "DELETE FROM tasks WHERE state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', \
                     'CANCELLED') AND id IN ({})",
                    marks(n)
                ))
            }),
            tasks_by_id: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT {TASK_READ} FROM tasks WHERE id IN ({})",
                    marks(n)
                ))
            }),
            lock_tasks: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT {TASK_READ} FROM tasks WHERE id IN ({}) ORDER BY id{{lock}}",
                    marks(n)
                ))
            }),
            tasks_by_request_id: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT {TASK_READ} FROM tasks WHERE namespace = ? \
                     AND client_request_id IN ({})",
                    marks(n)
                ))
            }),
            attempts_of_many: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE task_id IN ({}) \
                     ORDER BY task_id, number",
                    marks(n)
                ))
            }),
            callbacks_of_many: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT {CALLBACK_COLUMNS} FROM callbacks WHERE task_id IN ({})",
                    marks(n)
                ))
            }),
            lease_callbacks: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "UPDATE callbacks SET next_attempt_at = ? WHERE delivery_id IN ({})",
                    marks(n)
                ))
            }),
            insert_concurrency_keys: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "INSERT INTO concurrency_keys (namespace, concurrency_key) VALUES {}{}",
                    value_rows(n, 2),
                    d.ignoring_duplicates(&["namespace", "concurrency_key"])
                ))
            }),
            claim_after_except: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT {TASK_READ} FROM tasks WHERE state = 'READY' AND namespace = ? \
                     AND handler = ? AND priority <= ? AND (priority < ? OR id > ?) \
                     AND (concurrency_key IS NULL OR concurrency_key NOT IN ({})) \
                     ORDER BY priority DESC, id LIMIT ?{{skip_locked}}",
                    marks(n)
                ))
            }),
            insert_tasks: Ladder::new(d, |d, n| {
                let row = format!("({}, {})", marks(TASK_KEYS.len()), row_marks(&TASK_BODY));
                let cols = format!("{}, {}", TASK_KEYS.join(", "), names(&TASK_BODY));
                d.render(&format!(
                    "INSERT INTO tasks ({cols}) VALUES {}",
                    vec![row; n].join(", ")
                ))
            }),
            insert_attempts: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES {}",
                    value_rows(n, 8)
                ))
            }),
            insert_callbacks: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "INSERT INTO callbacks ({CALLBACK_COLUMNS}) VALUES {}",
                    value_rows(n, 9)
                ))
            }),
            update_tasks: Ladder::new(d, update_tasks_sql),
            close_attempts: Ladder::new(d, close_attempts_sql),
            insert_workflow: r(&format!(
                "INSERT INTO workflows ({WORKFLOW_COLUMNS}) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            )),
            get_workflow: r(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE id = ?"
            )),
            lock_workflow: r(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE id = ?{{lock}}"
            )),
            try_lock_workflow: r("SELECT id FROM workflows WHERE id = ?{skip_locked}"),
            try_lock_task: r("SELECT id FROM tasks WHERE id = ?{skip_locked}"),
            workflow_by_request_id: r(&format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows \
                 WHERE namespace = ? AND client_request_id = ?"
            )),
            update_workflow: r(
                "UPDATE workflows SET state = ?, message = ?, updated_at = ?, ended_at = ? \
                 WHERE id = ?",
            ),
            // No ORDER BY (the caller sorts): ordered by id, a planner may
            // walk the primary key and filter, a scan of every task.
            steps_of: r(&format!(
                "SELECT {TASK_READ} FROM tasks WHERE workflow_id = ?"
            )),
            lock_steps: r(&format!(
                "SELECT {TASK_READ} FROM tasks WHERE workflow_id = ?{{lock}}"
            )),
            step_outputs: Ladder::new(d, |d, n| {
                d.render(&format!(
                    "SELECT workflow_step, state, output, output_content_type, error_message FROM tasks \
                     WHERE workflow_id = ? AND workflow_step IN ({})",
                    marks(n)
                ))
            }),
            list_workflows: std::array::from_fn(|i| {
                let mut sql =
                    format!("SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE namespace = ?");
                if i & 1 != 0 {
                    sql.push_str(" AND state = ?");
                }
                if i & 2 != 0 {
                    sql.push_str(" AND id < ?");
                }
                sql.push_str(" ORDER BY id DESC LIMIT ?");
                r(&sql)
            }),
        }
    }
}

/// The bulk compare-and-set of `n` tasks: binds, per row, the id, the
/// expected version and the [`TASK_MUTABLE`] columns.
fn update_tasks_sql(d: &Dialect, n: usize) -> String {
    let mut cols = vec!["id", "expected"];
    cols.extend(TASK_MUTABLE);
    let sets = |prefix: &str, src: &dyn Fn(usize, &str) -> String| {
        TASK_MUTABLE
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{prefix}{c} = {}", src(i + 3, c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sql = match d.bulk {
        BulkForm::ValuesNumbered => format!(
            "UPDATE tasks SET {} FROM (VALUES {}) AS v \
             WHERE tasks.id = v.column1 AND tasks.version = v.column2 RETURNING tasks.id",
            sets("", &|i, _| format!("v.column{i}")),
            value_rows(n, cols.len())
        ),
        BulkForm::ValuesAliased => format!(
            "UPDATE tasks AS t SET {} FROM (VALUES {}) AS v({}) \
             WHERE t.id = v.id AND t.version = v.expected RETURNING t.id",
            sets("", &|_, c| format!("v.{c}")),
            value_rows(n, cols.len()),
            cols.join(", ")
        ),
        BulkForm::JoinUnion => format!(
            "UPDATE tasks t JOIN ({}) v ON t.id = v.id AND t.version = v.expected SET {}",
            union_rows(n, &cols),
            sets("t.", &|_, c| format!("v.{c}"))
        ),
    };
    d.render(&sql)
}

/// Closes `n` attempts: binds, per row, task id, execution id, end time,
/// outcome and message.
fn close_attempts_sql(d: &Dialect, n: usize) -> String {
    let cols = ["task_id", "execution_id", "ended_at", "outcome", "message"];
    let sql = match d.bulk {
        BulkForm::ValuesNumbered => format!(
            "UPDATE attempts SET ended_at = v.column3, outcome = v.column4, \
             message = v.column5 FROM (VALUES {}) AS v WHERE attempts.task_id = v.column1 \
             AND attempts.execution_id = v.column2",
            value_rows(n, cols.len())
        ),
        BulkForm::ValuesAliased => format!(
            "UPDATE attempts AS a SET ended_at = v.ended_at, outcome = v.outcome, \
             message = v.message FROM (VALUES {}) AS v({}) WHERE a.task_id = v.task_id \
             AND a.execution_id = v.execution_id",
            value_rows(n, cols.len()),
            cols.join(", ")
        ),
        BulkForm::JoinUnion => format!(
            "UPDATE attempts a JOIN ({}) v ON a.task_id = v.task_id \
             AND a.execution_id = v.execution_id SET a.ended_at = v.ended_at, \
             a.outcome = v.outcome, a.message = v.message",
            union_rows(n, &cols)
        ),
    };
    d.render(&sql)
}

/// `SELECT ? AS a, ? AS b UNION ALL SELECT ?, ? …`: `n` rows of `cols`.
fn union_rows(n: usize, cols: &[&str]) -> String {
    let first = cols
        .iter()
        .map(|c| format!("? AS {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let rest = marks(cols.len());
    let mut rows = vec![format!("SELECT {first}")];
    rows.extend((1..n).map(|_| format!("SELECT {rest}")));
    rows.join(" UNION ALL ")
}
