//! Writing events: `transition_many` (and `transition`, a batch of one) in
//! one transaction that locks the batch's rows in id order, applies the
//! events in memory with `taskmesh_core::apply` and writes them as one
//! [`Batch`]. A row whose compare-and-set missed is redone row by row; a
//! batch the database refuses (a constraint) is written again in a new
//! transaction with a savepoint per event, so each event still succeeds or
//! fails on its own. The leader fence is checked first in both.

use std::collections::HashMap;

use taskmesh_core::{AttemptChange, Event, TaskRecord, Transition, UnixMillis};

use super::backend::{Backend, in_savepoint};
use super::batch::Batch;
use super::dialect::in_lists;
use super::rows::{attempt_args, body_args, callback_args, new_callback};
use super::tasks::lock_task;
use super::workflows::{
    Advanced, advance, lock_workflows, may_end, try_lock_workflows, workflows_of,
};
use super::{SqlStore, args};
use crate::{Error, Result, TaskChange, decode};

/// Re-reads and re-applies this many times after a lost compare-and-set
/// before giving up with [`Error::Conflict`].
const MAX_CAS_TRIES: usize = 5;

/// Raises the leader fence to `token` inside `tx`, or refuses with
/// [`Error::Fenced`] when a newer leader has written already. Where rows are
/// locked, the fence row's lock queues concurrent leader writes until `tx`
/// ends.
pub(super) async fn check_fence<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    fence: Option<u64>,
) -> Result<()> {
    let Some(token) = fence else { return Ok(()) };
    let token = i64::try_from(token)
        .map_err(|_| Error::InvalidArgument(format!("fencing token {token} out of range")))?;
    let raised = b
        .exec(tx, &b.sql().raise_fence, args![token, token])
        .await?;
    if raised == 1 {
        return Ok(());
    }
    let rows = b.fetch(tx, &b.sql().fence_token, Vec::new()).await?;
    let newest = rows
        .first()
        .map(|r| decode::Columns::int(r, "token"))
        .transpose()
        .map_err(|e| Error::Internal(format!("bad fence row: {e}")))?
        .unwrap_or_default();
    Err(Error::Fenced(format!(
        "fencing token {token} is older than {newest}: this node is no longer the leader"
    )))
}

/// Writes `transition` if the row still has `expected_version`, with its
/// attempts change and, when the task has just ended with a callback URL,
/// its callback outbox entry (set on `transition.task`). False when the
/// compare-and-set missed (nothing written).
pub(super) async fn write_transition<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    expected_version: i64,
    transition: &mut Transition,
) -> Result<bool> {
    let sql = b.sql();
    let task = &transition.task;
    let mut values = Vec::with_capacity(38);
    body_args(task, &mut values)?;
    values.extend(args![&task.id, expected_version]);
    if b.exec(tx, &sql.update_task, values).await? == 0 {
        return Ok(false);
    }
    match &transition.attempt {
        AttemptChange::None => {}
        AttemptChange::Open(attempt) => {
            let mut values = Vec::with_capacity(8);
            attempt_args(&task.id, attempt, &mut values);
            b.exec(tx, sql.insert_attempts.get(1), values).await?;
        }
        AttemptChange::Close {
            execution_id,
            outcome,
            message,
            ended_at,
        } => {
            let values = args![*ended_at, outcome.as_str(), message, &task.id, execution_id];
            if b.exec(tx, &sql.close_attempt, values).await? == 0 {
                // The task row is authoritative; a missing attempts row must
                // not block the task's life, but it is worth a look.
                tracing::warn!(task_id = %task.id, execution_id = %execution_id, "no attempts row to close");
            }
        }
    }
    if transition.reopened {
        // Its earlier end's delivery (the caller checked it is no longer
        // PENDING) makes way for the one its next end queues.
        b.exec(tx, &sql.delete_callback, args![&task.id]).await?;
    }
    if task.wants_callback() {
        let entry = new_callback(task);
        let mut values = Vec::with_capacity(9);
        callback_args(&task.id, &entry, &mut values);
        b.exec(tx, sql.insert_callbacks.get(1), values).await?;
        transition.task.callback = Some(entry);
    }
    Ok(true)
}

/// Applies `event` to task `id` at `now` and writes the result, re-reading
/// and re-applying when the compare-and-set misses (it cannot where the row
/// is locked; the loop keeps the invariant for every write). Returns the
/// task as written (attempts empty).
pub(super) async fn transition_one<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
    event: &Event,
    now: UnixMillis,
) -> Result<TaskRecord> {
    for _ in 0..MAX_CAS_TRIES {
        let task = lock_task(b, tx, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_string()))?;
        let mut transition = taskmesh_core::apply(&task, event, now)?;
        if write_transition(b, tx, task.version, &mut transition).await? {
            return Ok(transition.task);
        }
        tracing::debug!(task_id = %id, version = task.version, "lost compare-and-set; re-reading");
    }
    Err(Error::Conflict(format!("task {id}")))
}

/// [`transition_one`] in a savepoint: an event failing half-way (say, on its
/// attempts row) leaves nothing behind, and the transaction goes on.
async fn transition_alone<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
    event: &Event,
    now: UnixMillis,
) -> Result<Result<TaskRecord>> {
    Ok(in_savepoint!(b, tx, "event", {
        transition_one(b, tx, id, event, now).await
    }))
}

/// Locks the rows of `ids` in id order (so two batches sharing rows never
/// take their locks in opposite orders) and reads them; a row that cannot
/// be decoded is kept as its error text, for each event naming it.
async fn lock_rows<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    ids: &[&str],
) -> Result<HashMap<String, Result<TaskRecord, String>>> {
    let mut out = HashMap::with_capacity(ids.len());
    for list in in_lists(ids) {
        let n = list.len();
        let values = list.into_iter().map(Into::into).collect();
        for row in b.fetch(tx, b.sql().lock_tasks.get(n), values).await? {
            let id = decode::Columns::text(&row, "id")
                .map_err(|e| Error::Internal(format!("task row without a readable id: {e}")))?;
            let task = decode::task(&row).map_err(|err| match err {
                Error::Internal(text) => text,
                other => other.to_string(),
            });
            out.insert(id, task);
        }
    }
    Ok(out)
}

fn sorted_ids(events: &[(String, Event)]) -> Vec<&str> {
    let mut ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl<B: Backend> SqlStore<B> {
    /// `Store::transition_many`; see the module comment.
    pub(super) async fn transition_batch(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        if events.is_empty() && fence.is_none() {
            return Ok(Vec::new());
        }
        self.transition_batch_in(events, now, fence, None).await
    }

    /// [`Self::transition_batch`]; with `held`, the workflow rows of its
    /// steps are locked first, waiting for them (the second try of a batch
    /// whose first found one held by another transaction).
    async fn transition_batch_in(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
        held: Option<&[String]>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        check_fence(b, &mut tx, fence).await?;
        if let Some(workflows) = held {
            lock_workflows(b, &mut tx, workflows).await?;
        }
        let read = lock_rows(b, &mut tx, &sorted_ids(events)).await?;
        // Steps that may end need their workflows: taken SKIP LOCKED here
        // (this transaction holds task rows, so it must not wait), and on a
        // miss the batch starts again holding them first.
        let workflows = workflows_of(
            events
                .iter()
                .filter(|(_, e)| may_end(e))
                .filter_map(|(id, _)| read.get(id.as_str())?.as_ref().ok()),
        );
        let all_held = held.is_some_and(|h| workflows.iter().all(|w| h.contains(w)));
        if !workflows.is_empty() && !all_held && !try_lock_workflows(b, &mut tx, &workflows).await?
        {
            drop(tx);
            if held.is_some() {
                return self.transition_rows(events, now, fence, &workflows).await;
            }
            return Box::pin(self.transition_batch_in(events, now, fence, Some(&workflows))).await;
        }
        let mut batch = Batch::default();
        let mut results = Vec::with_capacity(events.len());
        for (id, event) in events {
            results.push(match read.get(id.as_str()) {
                None => Err(Error::NotFound(id.clone())),
                Some(Err(text)) => Err(Error::Internal(text.clone())),
                Some(Ok(task)) => match batch.apply(task, event, now) {
                    Ok(written) => Ok(written.clone()),
                    Err(err) => Err(err.into()),
                },
            });
        }
        if batch.is_empty() {
            b.commit(tx).await?;
            return Ok(results);
        }
        if batch.needs_full_rows() {
            drop(tx);
            return self.transition_rows(events, now, fence, &workflows).await;
        }
        let missed = match b.write_batch(&mut tx, &batch).await {
            Ok(missed) => missed,
            Err(err @ (Error::Internal(_) | Error::AlreadyExists(_))) => {
                drop(tx);
                tracing::debug!(error = %err, "batch write failed; writing row by row");
                return self.transition_rows(events, now, fence, &workflows).await;
            }
            Err(err) => return Err(err),
        };
        // Every event of a task whose row moved since it was read is
        // applied again to the task as it is now, a savepoint each.
        for ((id, event), result) in events.iter().zip(results.iter_mut()) {
            if missed.contains(id) {
                tracing::debug!(task_id = %id, "lost compare-and-set in a batch; re-reading");
                *result = transition_alone(b, &mut tx, id, event, now).await?;
            }
        }
        let advanced = advance(b, &mut tx, &workflows, now).await?;
        b.commit(tx).await?;
        self.after_commit(&results, advanced, now).await;
        Ok(results)
    }

    /// `transition_many` row by row, a savepoint per event, the rows locked
    /// up front in id order as on the batch path, after the rows of
    /// `workflows` (the workflows of its steps that may end), which are
    /// advanced before the commit.
    async fn transition_rows(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
        workflows: &[String],
    ) -> Result<Vec<Result<TaskRecord>>> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        check_fence(b, &mut tx, fence).await?;
        lock_workflows(b, &mut tx, workflows).await?;
        lock_rows(b, &mut tx, &sorted_ids(events)).await?;
        let mut results = Vec::with_capacity(events.len());
        for (id, event) in events {
            results.push(transition_alone(b, &mut tx, id, event, now).await?);
        }
        let advanced = advance(b, &mut tx, workflows, now).await?;
        b.commit(tx).await?;
        self.after_commit(&results, advanced, now).await;
        Ok(results)
    }

    /// Publishes what a committed `transition_many` changed (its tasks and
    /// the workflow steps it advanced), then finishes the cancels it left.
    async fn after_commit(
        &self,
        results: &[Result<TaskRecord>],
        advanced: Advanced,
        now: UnixMillis,
    ) {
        let changes: Vec<TaskChange> = results
            .iter()
            .flatten()
            .chain(&advanced.changed)
            .map(TaskChange::of)
            .collect();
        self.publish(&changes, &[]);
        if !advanced.deferred.is_empty() {
            self.finish_cancels(&advanced.deferred, now).await;
        }
    }
}
