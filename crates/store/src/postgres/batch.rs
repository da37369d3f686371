//! The batch writer: many transitions computed in memory, written by ONE
//! statement (task rows, attempts opened and closed, callbacks queued), so a
//! claim of 500 tasks or a group commit of 500 results costs one round trip
//! for the writes instead of a thousand.
//!
//! The statement joins `UNNEST`ed column arrays against `tasks` with the
//! usual compare-and-set (`WHERE id = v.id AND version = v.expected`);
//! attempts and callbacks change only for the tasks whose row was written,
//! and the ids of the tasks whose row had moved come back, for the caller
//! to redo row by row. If the statement fails (a constraint), the caller
//! rolls back and writes the batch again row by row with a savepoint per
//! event.
//!
//! Only the columns a transition changes are sent (state, times, attempt
//! fields, output, version): a payload is never sent back to the database.
//! [`Batch::push`] checks that the transition left the task's definition
//! alone; if a future transition changes it, [`Batch::needs_full_rows`]
//! sends the caller to the row-by-row path, which rewrites whole rows.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Row};
use taskmesh_core::{
    AttemptChange, AttemptRecord, CallbackDelivery, TaskRecord, Transition, UnixMillis,
};

use crate::TaskChange;

/// The batch statement; see the module comment.
const WRITE: &str = "WITH upd AS ( \
    UPDATE tasks AS t SET state = v.state, updated_at = v.updated_at, \
        pending_at = v.pending_at, ready_at = v.ready_at, dispatching_at = v.dispatching_at, \
        running_at = v.running_at, retrying_at = v.retrying_at, ended_at = v.ended_at, \
        attempt = v.attempt, run_count = v.run_count, execution_id = v.execution_id, \
        worker_id = v.worker_id, next_at = v.next_at, output = v.output, \
        output_content_type = v.output_content_type, error_message = v.error_message, \
        version = v.version \
    FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], \
        $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], \
        $12::bigint[], $13::text[], $14::text[], $15::bigint[], $16::bytea[], $17::text[], \
        $18::text[], $19::bigint[]) \
      AS v(id, expected, state, updated_at, pending_at, ready_at, dispatching_at, running_at, \
        retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, output, \
        output_content_type, error_message, version) \
    WHERE t.id = v.id AND t.version = v.expected \
    RETURNING t.id), \
  ins AS ( \
    INSERT INTO attempts (task_id, number, execution_id, worker_id, started_at, ended_at, \
        outcome, message) \
    SELECT * FROM UNNEST($20::text[], $21::bigint[], $22::text[], $23::text[], $24::bigint[], \
        $25::bigint[], $26::text[], $27::text[]) \
      AS o(task_id, number, execution_id, worker_id, started_at, ended_at, outcome, message) \
    WHERE o.task_id IN (SELECT id FROM upd) \
    RETURNING 1), \
  cls AS ( \
    UPDATE attempts AS a SET ended_at = c.ended_at, outcome = c.outcome, message = c.message \
    FROM UNNEST($28::text[], $29::text[], $30::bigint[], $31::text[], $32::text[]) \
      AS c(task_id, execution_id, ended_at, outcome, message) \
    WHERE a.task_id = c.task_id AND a.execution_id = c.execution_id \
      AND c.task_id IN (SELECT id FROM upd) \
    RETURNING 1), \
  cbs AS ( \
    INSERT INTO callbacks (delivery_id, task_id, url, state, attempts, last_error, \
        next_attempt_at, delivered_at, created_at) \
    SELECT * FROM UNNEST($33::text[], $34::text[], $35::text[], $36::text[], $37::bigint[], \
        $38::text[], $39::bigint[], $40::bigint[], $41::bigint[]) \
      AS k(delivery_id, task_id, url, state, attempts, last_error, next_attempt_at, \
        delivered_at, created_at) \
    WHERE k.task_id IN (SELECT id FROM upd) \
    RETURNING 1) \
  SELECT ARRAY(SELECT id FROM upd), (SELECT count(*) FROM ins), (SELECT count(*) FROM cls), \
    (SELECT count(*) FROM cbs)";

/// An attempt closed in this batch that was opened before it.
struct Close {
    task_id: String,
    execution_id: String,
    ended_at: UnixMillis,
    outcome: &'static str,
    message: String,
}

/// Transitions to write together.
#[derive(Default)]
pub(super) struct Batch {
    /// The final record of each task and the version it had when read.
    rows: Vec<(i64, TaskRecord)>,
    by_id: HashMap<String, usize>,
    opens: Vec<(String, AttemptRecord)>,
    closes: Vec<Close>,
    /// Callbacks queued by tasks ending in this batch.
    callbacks: Vec<(String, CallbackDelivery)>,
    /// One change per transition, in order.
    pub(super) changes: Vec<TaskChange>,
    full_rows: bool,
}

impl Batch {
    /// Adds `transition`, computed from `before` (the task as read or as
    /// left by the batch's earlier transitions). A task that ends with a
    /// callback URL queues its callback, set on `transition.task`.
    pub(super) fn push(&mut self, before: &TaskRecord, transition: &mut Transition) {
        if transition.task.wants_callback() {
            let entry = super::tx::new_callback(&transition.task);
            self.callbacks
                .push((transition.task.id.clone(), entry.clone()));
            transition.task.callback = Some(entry);
        }
        let task = &transition.task;
        if !same_definition(before, task) {
            self.full_rows = true;
        }
        match self.by_id.get(&task.id) {
            Some(&i) => self.rows[i].1 = task.clone(),
            None => {
                self.by_id.insert(task.id.clone(), self.rows.len());
                self.rows.push((before.version, task.clone()));
            }
        }
        match &transition.attempt {
            AttemptChange::None => {}
            AttemptChange::Open(attempt) => self.opens.push((task.id.clone(), attempt.clone())),
            AttemptChange::Close {
                execution_id,
                outcome,
                message,
                ended_at,
            } => {
                // Opened in this very batch: the statement cannot update a
                // row it inserts, so the insert carries the close.
                let opened = self
                    .opens
                    .iter_mut()
                    .find(|(id, a)| *id == task.id && a.execution_id == *execution_id);
                match opened {
                    Some((_, a)) => {
                        a.ended_at = Some(*ended_at);
                        a.outcome = Some(*outcome);
                        a.message = message.clone();
                    }
                    None => self.closes.push(Close {
                        task_id: task.id.clone(),
                        execution_id: execution_id.clone(),
                        ended_at: *ended_at,
                        outcome: outcome.as_str(),
                        message: message.clone(),
                    }),
                }
            }
        }
        self.changes.push(TaskChange::of(task));
    }

    /// True when nothing is to be written.
    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// True when a transition changed more than the batch statement writes.
    pub(super) fn needs_full_rows(&self) -> bool {
        self.full_rows
    }

    /// Writes the batch in one statement. Returns the ids of the tasks
    /// whose compare-and-set missed (nothing of theirs was written).
    pub(super) async fn write(
        &self,
        conn: &mut PgConnection,
    ) -> Result<HashSet<String>, sqlx::Error> {
        let rows = &self.rows;
        let col = |f: fn(&(i64, TaskRecord)) -> Option<i64>| rows.iter().map(f).collect::<Vec<_>>();
        let text = |f: fn(&TaskRecord) -> Option<String>| {
            rows.iter().map(|(_, t)| f(t)).collect::<Vec<_>>()
        };
        let q = sqlx::query(WRITE)
            .bind(rows.iter().map(|(_, t)| t.id.clone()).collect::<Vec<_>>())
            .bind(rows.iter().map(|(v, _)| *v).collect::<Vec<_>>())
            .bind(text(|t| Some(t.state.as_str().to_string())))
            .bind(col(|(_, t)| Some(t.updated_at)))
            .bind(col(|(_, t)| t.times.pending))
            .bind(col(|(_, t)| t.times.ready))
            .bind(col(|(_, t)| t.times.dispatching))
            .bind(col(|(_, t)| t.times.running))
            .bind(col(|(_, t)| t.times.retrying))
            .bind(col(|(_, t)| t.times.end))
            .bind(col(|(_, t)| Some(i64::from(t.attempt))))
            .bind(col(|(_, t)| Some(i64::from(t.run_count))))
            .bind(text(|t| t.execution_id.clone()))
            .bind(text(|t| t.worker_id.clone()))
            .bind(col(|(_, t)| t.next_at))
            .bind(
                rows.iter()
                    .map(|(_, t)| t.output.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(text(|t| Some(t.output_content_type.clone())))
            .bind(text(|t| Some(t.error_message.clone())))
            .bind(col(|(_, t)| Some(t.version)));
        let opens = &self.opens;
        let q = q
            .bind(opens.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>())
            .bind(
                opens
                    .iter()
                    .map(|(_, a)| i64::from(a.number))
                    .collect::<Vec<_>>(),
            )
            .bind(
                opens
                    .iter()
                    .map(|(_, a)| a.execution_id.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                opens
                    .iter()
                    .map(|(_, a)| a.worker_id.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(opens.iter().map(|(_, a)| a.started_at).collect::<Vec<_>>())
            .bind(opens.iter().map(|(_, a)| a.ended_at).collect::<Vec<_>>())
            .bind(
                opens
                    .iter()
                    .map(|(_, a)| a.outcome.map(|o| o.as_str()))
                    .collect::<Vec<_>>(),
            )
            .bind(
                opens
                    .iter()
                    .map(|(_, a)| a.message.clone())
                    .collect::<Vec<_>>(),
            );
        let closes = &self.closes;
        let q = q
            .bind(closes.iter().map(|c| c.task_id.clone()).collect::<Vec<_>>())
            .bind(
                closes
                    .iter()
                    .map(|c| c.execution_id.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(closes.iter().map(|c| c.ended_at).collect::<Vec<_>>())
            .bind(closes.iter().map(|c| c.outcome).collect::<Vec<_>>())
            .bind(closes.iter().map(|c| c.message.clone()).collect::<Vec<_>>());
        let cbs = &self.callbacks;
        let q = q
            .bind(
                cbs.iter()
                    .map(|(_, c)| c.delivery_id.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(cbs.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>())
            .bind(cbs.iter().map(|(_, c)| c.url.clone()).collect::<Vec<_>>())
            .bind(
                cbs.iter()
                    .map(|(_, c)| c.state.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                cbs.iter()
                    .map(|(_, c)| i64::from(c.attempts))
                    .collect::<Vec<_>>(),
            )
            .bind(
                cbs.iter()
                    .map(|(_, c)| c.last_error.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                cbs.iter()
                    .map(|(_, c)| c.next_attempt_at)
                    .collect::<Vec<_>>(),
            )
            .bind(cbs.iter().map(|(_, c)| c.delivered_at).collect::<Vec<_>>())
            .bind(cbs.iter().map(|(_, c)| c.created_at).collect::<Vec<_>>());
        let row = q.fetch_one(&mut *conn).await?;
        let updated: Vec<String> = row.try_get(0)?;
        let closed: i64 = row.try_get(2)?;
        let updated: HashSet<String> = updated.into_iter().collect();
        let missed: HashSet<String> = rows
            .iter()
            .map(|(_, t)| &t.id)
            .filter(|id| !updated.contains(*id))
            .cloned()
            .collect();
        let expected_closes = closes
            .iter()
            .filter(|c| updated.contains(&c.task_id))
            .count();
        if usize::try_from(closed).ok() != Some(expected_closes) {
            // As on the row-by-row path: the task row is authoritative.
            tracing::warn!(
                expected = expected_closes,
                closed,
                "some attempts rows to close were missing"
            );
        }
        Ok(missed)
    }
}

/// True when `after` has the same definition (everything a transition must
/// not change) as `before`.
fn same_definition(before: &TaskRecord, after: &TaskRecord) -> bool {
    before.id == after.id
        && before.handler == after.handler
        && before.payload == after.payload
        && before.content_type == after.content_type
        && before.priority == after.priority
        && before.labels == after.labels
        && before.routing_key == after.routing_key
        && before.client_request_id == after.client_request_id
        && before.callback_url == after.callback_url
        && before.retry == after.retry
        && before.timeout_ms == after.timeout_ms
        && before.run_at == after.run_at
        && before.created_at == after.created_at
        && before.traceparent == after.traceparent
        && before.balancer == after.balancer
        && before.schedule_id == after.schedule_id
}
