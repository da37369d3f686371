//! A batch of transitions computed in memory, written together: the task
//! rows with a compare-and-set each, the attempts opened and closed, the
//! callbacks queued by tasks that ended. A claim of 500 tasks or a group
//! commit of 500 results is then a few statements, not a thousand.
//!
//! Only the columns a transition changes are written (state, times,
//! attempt fields, output, version): a payload is never sent back.
//! [`Batch::push`] checks that a transition left the task's definition
//! alone; if one ever changes it, [`Batch::needs_full_rows`] sends the
//! caller to the row-by-row path, which rewrites whole rows.
//!
//! [`write_portable`] is the form every dialect can run; a backend may
//! write the same batch its own way (`Backend::write_batch`).

use std::collections::{HashMap, HashSet};

use taskmesh_core::{
    AttemptChange, AttemptRecord, CallbackDelivery, Event, TaskRecord, TransitionError, UnixMillis,
};

use super::backend::{Args, Backend};
use super::dialect::{BulkForm, chunks};
use super::rows::{attempt_args, callback_args, mutable_args, new_callback};
use crate::{Error, Result, TaskChange, decode};

/// An attempt closed in this batch that was opened before it.
#[derive(Debug, Clone)]
pub struct Close {
    pub task_id: String,
    pub execution_id: String,
    pub ended_at: UnixMillis,
    pub outcome: &'static str,
    pub message: String,
}

/// Transitions to write together.
#[derive(Debug, Default)]
pub struct Batch {
    /// The final record of each task and the version it had when read.
    pub rows: Vec<(i64, TaskRecord)>,
    by_id: HashMap<String, usize>,
    /// Attempts opened, each with its task id (closed too, if the batch
    /// also closed it).
    pub opens: Vec<(String, AttemptRecord)>,
    /// Attempts closed that were opened before the batch.
    pub closes: Vec<Close>,
    /// Callbacks queued by tasks ending in this batch, with their task ids.
    pub callbacks: Vec<(String, CallbackDelivery)>,
    /// One change per transition, in order.
    pub changes: Vec<TaskChange>,
    full_rows: bool,
}

impl Batch {
    /// Applies `event` to the task: to its latest record in this batch if
    /// an earlier event of the batch changed it, else to `read` (the task
    /// as read). The batch keeps the new record (no copy is made: read it
    /// back with [`Batch::current`], take them all with
    /// [`Batch::into_tasks`]); a task that ends with a callback URL queues
    /// its callback, set on the record.
    pub fn apply(
        &mut self,
        read: &TaskRecord,
        event: &Event,
        now: UnixMillis,
    ) -> Result<&TaskRecord, TransitionError> {
        let slot = self.by_id.get(&read.id).copied();
        let before = slot.map_or(read, |i| &self.rows[i].1);
        let mut transition = taskmesh_core::apply(before, event, now)?;
        // A reopened task's old callback row goes in the row-by-row write.
        if transition.reopened || !same_definition(before, &transition.task) {
            self.full_rows = true;
        }
        if transition.task.wants_callback() {
            let entry = new_callback(&transition.task);
            self.callbacks
                .push((transition.task.id.clone(), entry.clone()));
            transition.task.callback = Some(entry);
        }
        self.record_attempt(&transition.task.id, transition.attempt);
        self.changes.push(TaskChange::of(&transition.task));
        let i = match slot {
            Some(i) => {
                self.rows[i].1 = transition.task;
                i
            }
            None => {
                self.by_id.insert(read.id.clone(), self.rows.len());
                self.rows.push((read.version, transition.task));
                self.rows.len() - 1
            }
        };
        Ok(&self.rows[i].1)
    }

    /// The latest record of task `id` in this batch, if an event changed it.
    pub fn current(&self, id: &str) -> Option<&TaskRecord> {
        self.by_id.get(id).map(|&i| &self.rows[i].1)
    }

    /// The records the batch holds, one per task, in the order first
    /// changed.
    pub fn into_tasks(self) -> Vec<TaskRecord> {
        self.rows.into_iter().map(|(_, t)| t).collect()
    }

    fn record_attempt(&mut self, task_id: &str, change: AttemptChange) {
        match change {
            AttemptChange::None => {}
            AttemptChange::Open(attempt) => self.opens.push((task_id.to_string(), attempt)),
            AttemptChange::Close {
                execution_id,
                outcome,
                message,
                ended_at,
            } => {
                // Opened in this very batch: the insert carries the close.
                let opened = self
                    .opens
                    .iter_mut()
                    .find(|(id, a)| id == task_id && a.execution_id == execution_id);
                match opened {
                    Some((_, a)) => {
                        a.ended_at = Some(ended_at);
                        a.outcome = Some(outcome);
                        a.message = message;
                    }
                    None => self.closes.push(Close {
                        task_id: task_id.to_string(),
                        execution_id,
                        ended_at,
                        outcome: outcome.as_str(),
                        message,
                    }),
                }
            }
        }
    }

    /// True when nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// True when a transition changed more than the batch writes.
    pub fn needs_full_rows(&self) -> bool {
        self.full_rows
    }
}

/// Writes `batch` in multi-row statements of ladder sizes: the
/// compare-and-set of every row first (the dialect's [`BulkForm`]), then,
/// for the rows written, the attempts and callbacks. Returns the ids whose
/// compare-and-set missed. A dialect without `RETURNING` learns only how
/// many rows matched; a short count there fails the batch (the caller goes
/// row by row), since its rows are locked and cannot have moved.
pub async fn write_portable<B: Backend + ?Sized>(
    b: &B,
    tx: &mut B::Tx,
    batch: &Batch,
) -> Result<HashSet<String>> {
    let sql = b.sql();
    let mut written: HashSet<String> = HashSet::with_capacity(batch.rows.len());
    let mut rest = batch.rows.as_slice();
    for n in chunks(batch.rows.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut values = Vec::with_capacity(n * 19);
        for (expected, task) in chunk {
            mutable_args(task, *expected, &mut values);
        }
        let statement = sql.update_tasks.get(n);
        if sql.bulk.returns_rows() {
            for row in b.fetch(tx, statement, values).await? {
                let id = decode::Columns::text(&row, "id")
                    .map_err(|e| Error::Internal(format!("bulk update: {e}")))?;
                written.insert(id);
            }
        } else {
            let matched = b.exec(tx, statement, values).await?;
            if usize::try_from(matched).ok() != Some(n) {
                return Err(Error::Internal(format!(
                    "bulk compare-and-set matched {matched} of {n} locked rows"
                )));
            }
            written.extend(chunk.iter().map(|(_, t)| t.id.clone()));
        }
    }
    let missed: HashSet<String> = batch
        .rows
        .iter()
        .map(|(_, t)| &t.id)
        .filter(|id| !written.contains(*id))
        .cloned()
        .collect();

    let opens: Vec<_> = batch
        .opens
        .iter()
        .filter(|(id, _)| written.contains(id))
        .collect();
    insert_many(
        b,
        tx,
        &opens,
        8,
        |(id, a), out| attempt_args(id, a, out),
        |n| sql.insert_attempts.get(n),
    )
    .await?;
    let closes: Vec<&Close> = batch
        .closes
        .iter()
        .filter(|c| written.contains(&c.task_id))
        .collect();
    let mut closed = 0;
    let mut rest = closes.as_slice();
    for n in chunks(closes.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut values = Vec::with_capacity(n * 5);
        for c in chunk {
            values.extend(super::args![
                &c.task_id,
                &c.execution_id,
                c.ended_at,
                c.outcome,
                &c.message
            ]);
        }
        closed += b.exec(tx, sql.close_attempts.get(n), values).await?;
    }
    if usize::try_from(closed).ok() != Some(closes.len()) {
        // The task row is authoritative; a missing attempts row must not
        // block the task's life, but it is worth a look.
        tracing::warn!(
            expected = closes.len(),
            closed,
            "some attempts rows to close were missing"
        );
    }
    let callbacks: Vec<_> = batch
        .callbacks
        .iter()
        .filter(|(id, _)| written.contains(id))
        .collect();
    insert_many(
        b,
        tx,
        &callbacks,
        9,
        |(id, c), out| callback_args(id, c, out),
        |n| sql.insert_callbacks.get(n),
    )
    .await?;
    Ok(missed)
}

/// Inserts `items` in ladder-sized multi-row statements.
pub(super) async fn insert_many<B: Backend + ?Sized, T>(
    b: &B,
    tx: &mut B::Tx,
    items: &[T],
    cols: usize,
    bind: impl Fn(&T, &mut Args),
    statement: impl Fn(usize) -> &'static str,
) -> Result<()> {
    let mut rest = items;
    for n in chunks(items.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut values = Vec::with_capacity(n * cols);
        for item in chunk {
            bind(item, &mut values);
        }
        b.exec(tx, statement(n), values).await?;
    }
    Ok(())
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
        && before.concurrency == after.concurrency
}

impl BulkForm {
    /// True when the bulk compare-and-set returns the ids it wrote.
    pub fn returns_rows(self) -> bool {
        !matches!(self, BulkForm::JoinUnion)
    }
}
