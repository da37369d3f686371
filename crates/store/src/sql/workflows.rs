//! Workflows: created whole (the workflow's row and every step's task in
//! one transaction), advanced in the transaction that ends one of their
//! steps, cancelled whole.
//!
//! Locking: a transaction that may end, release or cancel a step holds the
//! step's workflow row first. The batch path of `transition_many` reads
//! (and locks) its tasks before it knows their workflows, so it takes the
//! workflow rows `SKIP LOCKED`; on a miss it starts again on the row path,
//! which locks the workflows (in id order) before any task. Nothing waits
//! for a workflow row while holding a task row, so there is no deadlock;
//! and two steps ending at once are serialised on their workflow, so the
//! one that commits second sees the first's end and a child whose parents
//! both succeeded is released exactly once. [`advance`] then reads every
//! step (locking them; claims hold a step only briefly and never wait for
//! a workflow) and writes what `taskmesh_core::workflow::advance` decides:
//! steps released to READY, steps cancelled, the workflow's new state.
//!
//! A step's parents' outputs are read when it is claimed
//! ([`fill_parent_outputs`]), not copied at release: a retried parent's
//! new output is the one its child sees.

use std::collections::HashMap;

use taskmesh_core::workflow::{self as wf, ParentOutput, WorkflowRecord, WorkflowState};
use taskmesh_core::{CallbackState, Event, NewTask, TaskRecord, TaskState, UnixMillis, broadcast};

use super::backend::Backend;
use super::dialect::in_lists;
use super::tasks::{complete, insert_rows, lock_task, read_task, sql_limit};
use super::transitions::{check_fence, transition_one, write_transition};
use super::{SqlStore, Val, args};
use crate::error::is_unique_violation;
use crate::{Error, Result, TaskChange, decode};

/// `workflows` columns, as `decode::workflow_row` reads them and an insert
/// writes them.
pub const WORKFLOW_COLUMNS: &str = "id, namespace, client_request_id, request_fingerprint, \
    failure_policy, state, message, step_count, created_at, updated_at, ended_at, \
    parent_task_id";

/// Whether `event` may end a task, or open an ended one again: what makes
/// a transition of a step need its workflow.
pub(super) fn may_end(event: &Event) -> bool {
    !matches!(
        event,
        Event::Ack { .. } | Event::Due | Event::Defer { .. } | Event::Dispatch { .. }
    )
}

/// The workflows of `tasks` (those that are steps), sorted, once each.
pub(super) fn workflows_of<'a>(tasks: impl Iterator<Item = &'a TaskRecord>) -> Vec<String> {
    let mut ids: Vec<String> = tasks
        .filter_map(|t| Some(t.workflow.as_ref()?.workflow_id.clone()))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Locks the rows of workflows `ids` (sorted) `SKIP LOCKED`: false when
/// another transaction holds one (the caller starts again with
/// [`lock_workflows`] before any task).
pub(super) async fn try_lock_workflows<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    ids: &[String],
) -> Result<bool> {
    for id in ids {
        let rows = b.fetch(tx, &b.sql().try_lock_workflow, args![id]).await?;
        if rows.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Locks the rows of workflows `ids` (sorted), waiting for them.
pub(super) async fn lock_workflows<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    ids: &[String],
) -> Result<()> {
    for id in ids {
        b.fetch(tx, &b.sql().lock_workflow, args![id]).await?;
    }
    Ok(())
}

/// Workflow `id`'s row, locked; [`Error::NotFound`] when there is none.
async fn lock_workflow_row<B: Backend>(b: &B, tx: &mut B::Tx, id: &str) -> Result<WorkflowRecord> {
    let rows = b.fetch(tx, &b.sql().lock_workflow, args![id]).await?;
    let row = rows
        .first()
        .ok_or_else(|| Error::NotFound(format!("workflow {id}")))?;
    decode::workflow_row(row)
}

/// The steps of workflow `id`, in the order created (= defined).
async fn steps_of<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
    lock: bool,
) -> Result<Vec<TaskRecord>> {
    let sql = if lock {
        &b.sql().lock_steps
    } else {
        &b.sql().steps_of
    };
    let rows = b.fetch(tx, sql, args![id]).await?;
    let mut steps = rows.iter().map(decode::task).collect::<Result<Vec<_>>>()?;
    steps.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    Ok(steps)
}

async fn workflow_row<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    id: &str,
) -> Result<Option<WorkflowRecord>> {
    let rows = b.fetch(tx, &b.sql().get_workflow, args![id]).await?;
    rows.first().map(decode::workflow_row).transpose()
}

/// What [`advance`] changed, and what it left for after the commit.
#[derive(Debug, Default)]
pub(super) struct Advanced {
    /// Every step it changed.
    pub changed: Vec<TaskRecord>,
    /// Workflows with steps to cancel that another transaction held: the
    /// caller finishes them after its commit ([`SqlStore::finish_cancels`]).
    pub deferred: Vec<String>,
}

/// Advances each of workflows `ids` (their rows locked by the caller, who
/// may hold task rows too): releases the steps whose parents all
/// succeeded, cancels what its failure policy (or a cancel) says, and
/// writes its state. A waiting step is only ever locked by a holder of its
/// workflow, so it is locked here at once; a step to cancel that is not
/// waiting may be held by a transaction that never waits for a workflow
/// (a claim, an ACK batch holding it and waiting for a row this one
/// holds), so it is taken `SKIP LOCKED` and, when held, left to
/// [`SqlStore::finish_cancels`] after the commit: nothing here waits for a
/// row while holding others, so no deadlock.
pub(super) async fn advance<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    ids: &[String],
    now: UnixMillis,
) -> Result<Advanced> {
    let mut out = Advanced::default();
    for id in ids {
        let Some(workflow) = workflow_row(b, tx, id).await? else {
            continue;
        };
        let (_, complete) =
            advance_one(b, tx, workflow, false, false, now, &mut out.changed).await?;
        if !complete {
            out.deferred.push(id.clone());
        }
    }
    Ok(out)
}

/// [`advance`] of one workflow; `cancel` cancels it; `wait` lets it wait
/// for the rows of steps to cancel (the caller holds no task row). Returns
/// it as written, with its steps, and false when a cancel was left for
/// later.
async fn advance_one<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    mut workflow: WorkflowRecord,
    cancel: bool,
    wait: bool,
    now: UnixMillis,
    changed: &mut Vec<TaskRecord>,
) -> Result<(WorkflowRecord, bool)> {
    // Read, not locked: whether a step has ended or waits changes only
    // under the workflow's row, which this transaction holds; the rest
    // (READY, DISPATCHING, RUNNING) is read again under the row's lock by
    // the transition that changes it.
    let mut steps = steps_of(b, tx, &workflow.id, false).await?;
    let cancelled = cancel || workflow.state == WorkflowState::Cancelled;
    let index: HashMap<String, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.clone(), i))
        .collect();
    let mut complete = true;
    // While a step run after its parents end waits: a cancel written here
    // may end its last parent, which the next plan releases. Each round
    // moves steps on for good, so it ends. The first plan's message
    // (which step failed first) is kept.
    let mut rounds = 0;
    let mut first_message = String::new();
    let mut plan = loop {
        let plan = wf::advance(&steps, workflow.failure_policy, cancelled);
        rounds += 1;
        if first_message.is_empty() {
            first_message.clone_from(&plan.message);
        }
        let (written, done) =
            write_plan(b, tx, &plan, &mut steps, &index, wait, now, changed).await?;
        complete &= done;
        let joins_wait = steps.iter().any(|t| wf::after_end(t) && wf::is_waiting(t));
        if written == 0 || !joins_wait || rounds > steps.len() {
            break plan;
        }
    };
    if !first_message.is_empty() {
        plan.message = first_message;
    }
    // A cancelled workflow keeps its caller's reason.
    let message = if cancelled {
        if workflow.message.is_empty() {
            "workflow cancelled".to_string()
        } else {
            workflow.message.clone()
        }
    } else if plan.message.is_empty() {
        workflow.message.clone()
    } else {
        plan.message
    };
    if plan.state != workflow.state || message != workflow.message {
        let ends = plan.state.is_terminal() && !workflow.state.is_terminal();
        let ended_at = if plan.state.is_terminal() {
            workflow.ended_at.or(Some(now))
        } else {
            None
        };
        b.exec(
            tx,
            &b.sql().update_workflow,
            args![plan.state.as_str(), &message, now, ended_at, &workflow.id],
        )
        .await?;
        workflow.state = plan.state;
        workflow.message = message;
        workflow.updated_at = now;
        workflow.ended_at = ended_at;
        if ends {
            end_broadcast(b, tx, &workflow, &steps, now, changed).await?;
        }
    }
    workflow.steps = steps;
    Ok((workflow, complete))
}

/// Writes `plan`'s releases and cancels (a step to cancel that is not
/// waiting and another transaction holds is left, unless `wait`), each
/// step read again under its lock, into `steps` (at `index`) and
/// `changed`. Returns how many it wrote and false when a cancel was left.
#[allow(clippy::too_many_arguments)]
async fn write_plan<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    plan: &wf::Advance,
    steps: &mut [TaskRecord],
    index: &HashMap<String, usize>,
    wait: bool,
    now: UnixMillis,
    changed: &mut Vec<TaskRecord>,
) -> Result<(usize, bool)> {
    let mut complete = true;
    let mut events: Vec<(&String, Event)> =
        plan.release.iter().map(|id| (id, Event::Unblock)).collect();
    for (id, reason) in &plan.cancel {
        let waiting = index.get(id).is_some_and(|&i| wf::is_waiting(&steps[i]));
        if !wait && !waiting {
            let held = b.fetch(tx, &b.sql().try_lock_task, args![id]).await?;
            if held.is_empty() {
                complete = false;
                continue;
            }
        }
        let reason = reason.clone();
        events.push((id, Event::Cancel { reason }));
    }
    // Row by row, each read again under its lock (a step to cancel may
    // have moved since it was read). Not Postgres's bulk UNNEST write: a
    // few rows per call into a table whose statistics lag its growth got
    // a generic plan that scans the table (measured: 525 steps/s against
    // 1,301 row by row, `bench --scenario workflows`).
    let mut written = 0;
    for (id, event) in events {
        let task = match transition_one(b, tx, id, &event, now).await {
            Ok(task) => task,
            // It ended meanwhile (a result this transaction wrote first).
            Err(Error::Transition(_)) => continue,
            Err(err) => return Err(err),
        };
        if let Some(&i) = index.get(id) {
            steps[i] = task.clone();
        }
        changed.push(task);
        written += 1;
    }
    Ok((written, complete))
}

/// Inserts `workflow`'s row (not its steps).
async fn insert_workflow<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    workflow: &WorkflowRecord,
    fingerprint: &str,
) -> sqlx::Result<u64> {
    let values = args![
        &workflow.id,
        &workflow.namespace,
        workflow.client_request_id.clone(),
        fingerprint,
        workflow.failure_policy.as_str(),
        workflow.state.as_str(),
        &workflow.message,
        i64::from(workflow.step_count),
        workflow.created_at,
        workflow.updated_at,
        workflow.ended_at,
        workflow.parent_task_id.clone(),
    ];
    b.exec(tx, &b.sql().insert_workflow, values).await
}

/// Ends the broadcast whose shards `workflow` holds (or the schedule's
/// workflow run it was started by), once it has ended, in the transaction
/// that ended it (the caller holds the workflow's row and
/// has written the shard's end that decided it) — if the workflow is the
/// broadcast's current spread (a broadcast spread again by RetryTask is
/// ended by its new shards only). The broadcast's row is locked after the
/// workflow's and its shards' rows; no transaction holds a broadcast's row
/// while it waits for its shards' rows or workflow: a broadcast is never a
/// step, none of its events locks a workflow, its cancel sweeps the shards
/// in a transaction of its own, and the only batch that could hold both
/// (CancelTasks) leaves out the children of the tasks it cancels.
async fn end_broadcast<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    workflow: &WorkflowRecord,
    steps: &[TaskRecord],
    now: UnixMillis,
    changed: &mut Vec<TaskRecord>,
) -> Result<()> {
    let shards = broadcast::holds_shards(steps);
    let (Some(parent), Some(event)) =
        (&workflow.parent_task_id, broadcast::ended(workflow, shards))
    else {
        return Ok(());
    };
    // A broadcast is ended by the workflow of its shards, a workflow run
    // by the workflow it was spread into: either written at its spread,
    // when it went RUNNING. Which a parent is never changes, so it is read
    // first without a lock: any other parent (a handler running its
    // fan-out, whose row a lost-worker release may hold while it waits
    // for this workflow's steps) is never locked here.
    let spreads = |t: &TaskRecord| {
        (if shards { t.broadcast } else { t.runs_workflow })
            && t.times.running == Some(workflow.created_at)
    };
    if !read_task(b, tx, parent).await?.is_some_and(|t| spreads(&t)) {
        return Ok(());
    }
    let current = lock_task(b, tx, parent).await?.is_some_and(|t| spreads(&t));
    if !current {
        return Ok(());
    }
    match transition_one(b, tx, parent, &event, now).await {
        Ok(task) => changed.push(task),
        // Cancelled (or removed) before its shards ended.
        Err(Error::Transition(_) | Error::NotFound(_)) => {}
        Err(err) => return Err(err),
    }
    Ok(())
}

/// Fills in the parents' outputs of the claimed steps among `tasks`.
pub(super) async fn fill_parent_outputs<B: Backend>(
    b: &B,
    tx: &mut B::Tx,
    tasks: &mut [TaskRecord],
) -> Result<()> {
    for task in tasks {
        let Some(link) = task.workflow.as_mut() else {
            continue;
        };
        if link.on_failure {
            // The on_failure step's parents are the steps that failed or
            // timed out: it receives their errors (as text) by name.
            // As many as an assignment may carry (the first failures
            // first); errors are short, so only a huge workflow drops any.
            let mut steps = steps_of(b, tx, &link.workflow_id, false).await?;
            steps.retain(|t| matches!(t.state, TaskState::Failed | TaskState::TimedOut));
            steps.sort_by_key(|t| t.times.end);
            let mut room = wf::MAX_ASSIGNMENT_INPUT_BYTES.saturating_sub(task.payload.len());
            link.parent_outputs = steps
                .iter()
                .filter_map(|t| {
                    let step = t.workflow.as_ref()?.step.clone();
                    let size = step.len() + t.error_message.len();
                    room = room.checked_sub(size)?;
                    Some(ParentOutput {
                        step,
                        data: t.error_message.clone().into_bytes(),
                        content_type: wf::ERROR_CONTENT_TYPE.into(),
                        // Given as outputs, as before parent_errors existed.
                        failed: false,
                    })
                })
                .collect();
            continue;
        }
        if link.depends_on.is_empty() {
            continue;
        }
        let mut rows = Vec::new();
        for list in in_lists(&link.depends_on) {
            let n = list.len();
            let mut values = args![&link.workflow_id];
            values.extend(list.into_iter().map(Val::from));
            rows.extend(b.fetch(tx, b.sql().step_outputs.get(n), values).await?);
        }
        let bad = |e: String| Error::Internal(format!("bad step output row: {e}"));
        let mut outputs = Vec::with_capacity(link.depends_on.len());
        let mut errors = Vec::new();
        for row in &rows {
            let step = decode::Columns::text(row, "workflow_step").map_err(bad)?;
            let state = decode::Columns::text(row, "state").map_err(bad)?;
            if state != TaskState::Succeeded.as_str() {
                // A step run after its parents end gets the others' errors.
                if link.after_parents_end {
                    let error = decode::Columns::text(row, "error_message").map_err(bad)?;
                    errors.push((step, format!("{state}: {error}")));
                }
                continue;
            }
            outputs.push(ParentOutput {
                step,
                data: decode::Columns::opt_bytes(row, "output")
                    .map_err(bad)?
                    .unwrap_or_default(),
                content_type: decode::Columns::text(row, "output_content_type").map_err(bad)?,
                failed: false,
            });
        }
        // Errors within what an assignment may carry beside the payload
        // and the outputs (release checked those), each cut to 4 KiB.
        let mut room = wf::MAX_ASSIGNMENT_INPUT_BYTES
            .saturating_sub(task.payload.len())
            .saturating_sub(outputs.iter().map(|o| o.step.len() + o.data.len()).sum());
        for (step, mut text) in errors {
            cut(&mut text, MAX_ERROR_BYTES);
            let Some(left) = room.checked_sub(step.len() + text.len()) else {
                break;
            };
            room = left;
            outputs.push(ParentOutput {
                step,
                data: text.into_bytes(),
                content_type: wf::ERROR_CONTENT_TYPE.into(),
                failed: true,
            });
        }
        link.parent_outputs = outputs;
    }
    Ok(())
}

/// The most bytes of a failed parent's error a step run after its
/// parents end is given.
const MAX_ERROR_BYTES: usize = 4 * 1024;

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// What [`SqlStore::create_workflow`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedWorkflow {
    /// The workflow with its steps.
    pub workflow: WorkflowRecord,
    /// True when its idempotency key named one created before.
    pub existing: bool,
}

impl<B: Backend> SqlStore<B> {
    /// `Store::create_workflow`.
    pub(super) async fn create_workflow_sql(
        &self,
        workflow: WorkflowRecord,
        fingerprint: &str,
        steps: Vec<NewTask>,
        now: UnixMillis,
    ) -> Result<CreatedWorkflow> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        if let Some(found) = self.holder(&mut tx, &workflow, fingerprint).await? {
            b.commit(tx).await?;
            return Ok(found);
        }
        if let Err(err) = insert_workflow(b, &mut tx, &workflow, fingerprint).await {
            drop(tx);
            // Another submit of the same key committed first.
            if is_unique_violation(&err) {
                let mut tx = b.begin_write().await?;
                let found = self.holder(&mut tx, &workflow, fingerprint).await?;
                b.commit(tx).await?;
                if let Some(found) = found {
                    return Ok(found);
                }
            }
            return Err(err.into());
        }
        let records: Vec<TaskRecord> = steps.into_iter().map(|t| t.into_record(now)).collect();
        let rows: Vec<(&TaskRecord, &str)> = records.iter().map(|t| (t, "")).collect();
        match insert_rows(b, &mut tx, &rows).await? {
            Ok(()) => {}
            Err(err) if is_unique_violation(&err) => {
                return Err(Error::AlreadyExists(format!(
                    "a step id of workflow {} is taken",
                    workflow.id
                )));
            }
            Err(err) => return Err(err.into()),
        }
        b.commit(tx).await?;
        let changes: Vec<TaskChange> = records.iter().map(TaskChange::of).collect();
        self.publish(&changes, &[]);
        Ok(CreatedWorkflow {
            workflow: WorkflowRecord {
                steps: records,
                ..workflow
            },
            existing: false,
        })
    }

    /// `Store::spread_broadcast`: the broadcast `id` (PENDING) goes RUNNING
    /// and its `shards` shards are written as the steps of a workflow of
    /// their own, in one transaction fenced by `fence`; a schedule's
    /// workflow run likewise, into the workflow its schedule defines (read
    /// in the transaction; `shards` unused).
    pub(super) async fn spread_broadcast_sql(
        &self,
        id: &str,
        shards: u32,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<(TaskRecord, WorkflowRecord)> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        // Refused: the task's row is let go at once (the caller may write
        // its cancel next).
        let done = self.spread_in(&mut tx, id, shards, now, fence).await;
        self.settle(tx, done, |(task, workflow)| {
            std::iter::once(task).chain(&workflow.steps).collect()
        })
        .await
    }

    /// Commits `tx` and publishes the changes `changed` lists when `done`
    /// is its work done; rolls it back at once when it was refused, so the
    /// rows it locked are not held until the dropped transaction's rollback
    /// runs (a claim would skip them meanwhile).
    async fn settle<T>(
        &self,
        tx: B::Tx,
        done: Result<T>,
        changed: impl FnOnce(&T) -> Vec<&TaskRecord>,
    ) -> Result<T> {
        let b = self.backend();
        match done {
            Ok(out) => {
                b.commit(tx).await?;
                let changes: Vec<TaskChange> =
                    changed(&out).into_iter().map(TaskChange::of).collect();
                self.publish(&changes, &[]);
                Ok(out)
            }
            Err(err) => {
                b.rollback(tx).await;
                Err(err)
            }
        }
    }

    /// [`Self::spread_broadcast_sql`] inside `tx`.
    async fn spread_in(
        &self,
        tx: &mut B::Tx,
        id: &str,
        shards: u32,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<(TaskRecord, WorkflowRecord)> {
        let b = self.backend();
        check_fence(b, tx, fence).await?;
        let task = lock_task(b, tx, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_string()))?;
        let workflow_id = taskmesh_core::id::new_task_id();
        let (workflow, steps) = if task.runs_workflow {
            // The workflow as its schedule defines it now.
            let spec = match &task.schedule_id {
                Some(id) => b
                    .fetch(tx, &b.sql().get_schedule, args![id])
                    .await?
                    .first()
                    .map(decode::schedule)
                    .transpose()?
                    .and_then(|s| s.workflow),
                None => None,
            };
            let spec = spec.ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "the schedule of workflow run {id} was deleted or no longer starts a workflow"
                ))
            })?;
            spec.start(
                &workflow_id,
                &task.namespace,
                Some(&task.id),
                now,
                taskmesh_core::id::new_task_id,
            )
        } else {
            broadcast::spread(
                &task,
                &workflow_id,
                shards,
                now,
                taskmesh_core::id::new_task_id,
            )
        };
        let event = Event::Spread {
            shards: workflow.step_count,
        };
        let mut transition = taskmesh_core::apply(&task, &event, now)?;
        // The row is locked: the compare-and-set cannot miss.
        if !write_transition(b, tx, task.version, &mut transition).await? {
            return Err(Error::Conflict(format!("task {id}")));
        }
        insert_workflow(b, tx, &workflow, "").await?;
        let records: Vec<TaskRecord> = steps.into_iter().map(|t| t.into_record(now)).collect();
        let rows: Vec<(&TaskRecord, &str)> = records.iter().map(|t| (t, "")).collect();
        insert_rows(b, tx, &rows).await??;
        Ok((
            transition.task,
            WorkflowRecord {
                steps: records,
                ..workflow
            },
        ))
    }

    /// The workflow holding `workflow`'s idempotency key, if one does: the
    /// same fingerprint answers with it, another is ALREADY_EXISTS.
    async fn holder(
        &self,
        tx: &mut B::Tx,
        workflow: &WorkflowRecord,
        fingerprint: &str,
    ) -> Result<Option<CreatedWorkflow>> {
        let b = self.backend();
        let Some(crid) = &workflow.client_request_id else {
            return Ok(None);
        };
        let rows = b
            .fetch(
                tx,
                &b.sql().workflow_by_request_id,
                args![&workflow.namespace, crid],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let stored_fp = decode::fingerprint(row)?;
        let mut stored = decode::workflow_row(row)?;
        if stored_fp != fingerprint {
            return Err(Error::AlreadyExists(format!(
                "client_request_id {crid:?} was used for a different workflow ({})",
                stored.id
            )));
        }
        stored.steps = steps_of(b, tx, &stored.id, false).await?;
        Ok(Some(CreatedWorkflow {
            workflow: stored,
            existing: true,
        }))
    }

    /// Finishes the cancels [`advance`] left for after a commit: a
    /// transaction of its own that locks the workflows first and then
    /// waits for their steps' rows. A failure is logged, not returned (the
    /// caller's own write is committed); the next step of the workflow to
    /// end advances it again.
    pub(super) async fn finish_cancels(&self, ids: &[String], now: UnixMillis) {
        let run = async {
            let b = self.backend();
            let mut tx = b.begin_write().await?;
            lock_workflows(b, &mut tx, ids).await?;
            let mut changed = Vec::new();
            for id in ids {
                if let Some(w) = workflow_row(b, &mut tx, id).await? {
                    advance_one(b, &mut tx, w, false, true, now, &mut changed).await?;
                }
            }
            b.commit(tx).await?;
            let changes: Vec<TaskChange> = changed.iter().map(TaskChange::of).collect();
            self.publish(&changes, &[]);
            Ok::<_, Error>(())
        };
        if let Err(err) = run.await {
            tracing::warn!(workflows = ?ids, error = %err, "cancelling the rest of a failed workflow failed; its next step to end retries it");
        }
    }

    /// `Store::get_workflow`.
    pub(super) async fn get_workflow_sql(&self, id: &str) -> Result<Option<WorkflowRecord>> {
        let b = self.backend();
        let mut tx = b.begin_read().await?;
        let Some(mut workflow) = workflow_row(b, &mut tx, id).await? else {
            return Ok(None);
        };
        workflow.steps = steps_of(b, &mut tx, id, false).await?;
        b.commit(tx).await?;
        Ok(Some(workflow))
    }

    /// `Store::list_workflows`.
    pub(super) async fn list_workflows_sql(
        &self,
        namespace: &str,
        state: Option<WorkflowState>,
        before_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<WorkflowRecord>> {
        let b = self.backend();
        let sql = b.sql();
        let mut values = args![namespace];
        if let Some(s) = state {
            values.extend(args![s.as_str()]);
        }
        if let Some(before) = before_id {
            values.extend(args![before]);
        }
        values.extend(args![sql_limit(limit)]);
        let i = usize::from(state.is_some()) | usize::from(before_id.is_some()) << 1;
        let mut tx = b.begin_read().await?;
        let rows = b.fetch(&mut tx, &sql.list_workflows[i], values).await?;
        b.commit(tx).await?;
        rows.iter().map(decode::workflow_row).collect()
    }

    /// `Store::retry_workflow`. A refusal rolls back at once
    /// ([`Self::settle`]).
    pub(super) async fn retry_workflow_sql(
        &self,
        id: &str,
        now: UnixMillis,
    ) -> Result<(WorkflowRecord, u32)> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let done = self.retry_workflow_in(&mut tx, id, now).await;
        let (workflow, _, n) = self
            .settle(tx, done, |(_, changed, _)| changed.iter().collect())
            .await?;
        Ok((workflow, n))
    }

    /// [`Self::retry_workflow_sql`] inside `tx`: the workflow, the steps
    /// it changed and how many it re-ran.
    async fn retry_workflow_in(
        &self,
        tx: &mut B::Tx,
        id: &str,
        now: UnixMillis,
    ) -> Result<(WorkflowRecord, Vec<TaskRecord>, u32)> {
        let b = self.backend();
        let mut workflow = lock_workflow_row(b, tx, id).await?;
        // A schedule's workflow run ends with the workflow it was spread
        // into: the workflow is started again by retrying the run, which
        // retrying the workflow would leave ended. Read, not locked (what
        // a task is and when it was spread do not change under a retry).
        if let Some(parent) = &workflow.parent_task_id
            && read_task(b, tx, parent)
                .await?
                .is_some_and(|t| t.runs_workflow && t.times.running == Some(workflow.created_at))
        {
            return Err(Error::FailedPrecondition(format!(
                "this workflow is the run of a schedule (task {parent}); retry that task (RetryTask) to start the workflow again"
            )));
        }
        let steps = steps_of(b, tx, id, true).await?;
        if steps.len() != workflow.step_count as usize {
            return Err(Error::FailedPrecondition(format!(
                "workflow {id} keeps {} of its {} steps (retention removed the others): it cannot run again",
                steps.len(),
                workflow.step_count
            )));
        }
        if let Some(why) = wf::retry_blocked(&steps) {
            return Err(Error::FailedPrecondition(why));
        }
        let events = wf::retry(&steps);
        for (task_id, _) in &events {
            let Some(step) = steps.iter().find(|t| t.id == *task_id) else {
                continue;
            };
            let step = complete(b, tx, step.clone()).await?;
            if step
                .callback
                .as_ref()
                .is_some_and(|c| c.state == CallbackState::Pending)
            {
                let name = step.workflow.as_ref().map_or("", |w| w.step.as_str());
                return Err(Error::FailedPrecondition(format!(
                    "step {name:?}'s callback for its last end is still being delivered; retry once it is delivered or has failed"
                )));
            }
        }
        if events.is_empty() {
            workflow.steps = steps;
            return Ok((workflow, Vec::new(), 0));
        }
        let mut changed = Vec::with_capacity(events.len());
        for (task_id, event) in &events {
            changed.push(transition_one(b, tx, task_id, event, now).await?);
        }
        b.exec(
            tx,
            &b.sql().update_workflow,
            args![WorkflowState::Running.as_str(), "", now, None::<i64>, id],
        )
        .await?;
        workflow.state = WorkflowState::Running;
        workflow.message.clear();
        workflow.updated_at = now;
        workflow.ended_at = None;
        // What follows at once: a step put back to wait whose input is too
        // large to send is cancelled again (and the policy applies); every
        // step's row is held, so nothing here waits.
        let (workflow, _) = advance_one(b, tx, workflow, false, true, now, &mut changed).await?;
        Ok((
            workflow,
            changed,
            u32::try_from(events.len()).unwrap_or(u32::MAX),
        ))
    }

    /// `Store::cancel_workflow`.
    pub(super) async fn cancel_workflow_sql(
        &self,
        id: &str,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(WorkflowRecord, Vec<(TaskRecord, String)>)> {
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let mut workflow = lock_workflow_row(b, &mut tx, id).await?;
        if workflow.state.is_terminal() {
            workflow.steps = steps_of(b, &mut tx, id, false).await?;
            b.commit(tx).await?;
            return Ok((workflow, Vec::new()));
        }
        workflow.message = reason.to_string();
        // Which steps were in flight, and on which attempt.
        let before: HashMap<String, Option<String>> = steps_of(b, &mut tx, id, false)
            .await?
            .into_iter()
            .filter(|t| t.state.is_in_flight())
            .map(|t| (t.id, t.execution_id))
            .collect();
        let mut changed = Vec::new();
        let (workflow, _) =
            advance_one(b, &mut tx, workflow, true, true, now, &mut changed).await?;
        b.commit(tx).await?;
        let changes: Vec<TaskChange> = changed.iter().map(TaskChange::of).collect();
        self.publish(&changes, &[]);
        let stopped = changed
            .into_iter()
            .filter(|t| t.state == TaskState::Cancelled)
            .filter_map(|t| {
                let exec = before.get(&t.id)?.clone()?;
                Some((t, exec))
            })
            .collect();
        Ok((workflow, stopped))
    }
}
