//! `impl Store for SqliteStore`: writes in `BEGIN IMMEDIATE` transactions on
//! the single writer connection, reads on the reader pool, and a
//! [`TaskChange`] published for every task row written once it committed.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Sqlite, SqliteConnection, Transaction};
use taskmesh_core::{
    CallbackJob, CallbackOutcome, Event, NewTask, TaskRecord, Transition, UnixMillis,
};
use tokio::sync::broadcast;

use super::SqliteStore;
use super::rows::{callback_from_row, task_from_row};
use super::{batch, tx};
use crate::error::is_unique_violation;
use crate::existing_or_taken;
use crate::{
    Chooser, Created, Error, FireCommit, FireCommitted, Result, ScheduleChange, Store, TaskChange,
    TaskFilter, TaskPage,
};
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};

/// Largest page [`Store::list_tasks`] returns.
const MAX_PAGE: u32 = 1000;

// The fixed queries, named so `tests.rs` can check their plans use the
// indexes of the migration. `state = 'READY'` is spelled literally: SQLite
// uses a partial index only when the query's WHERE visibly implies its own.

/// Claim candidates of one handler: `tasks_ready_claim`, no sort.
pub(super) const CLAIM_SQL: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE state = 'READY' AND handler = ? \
     ORDER BY priority DESC, id ASC LIMIT ? OFFSET ?"
);
/// Tasks whose `next_at` has passed: `tasks_next_at`, in its order. The
/// state filter is only a guard (core clears `next_at` in other states); its
/// unary `+` keeps the planner from preferring `tasks_state_id` for it.
pub(super) const DUE_SQL: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE next_at IS NOT NULL AND next_at <= ? \
     AND +state IN ('PENDING', 'RETRYING', 'DISPATCHING', 'RUNNING') \
     ORDER BY next_at, id LIMIT ?"
);
/// The earliest `next_at`: one step down `tasks_next_at`.
pub(super) const NEXT_DUE_SQL: &str = "SELECT MIN(next_at) FROM tasks WHERE next_at IS NOT NULL";
/// READY tasks per handler, counted on `tasks_ready_claim` alone (it covers
/// `handler`, in order). Named with `INDEXED BY` because without statistics
/// the planner prefers `tasks_state_id`, which needs a table lookup per row
/// and a sort.
pub(super) const READY_COUNTS_SQL: &str = "SELECT handler, COUNT(*) \
     FROM tasks INDEXED BY tasks_ready_claim \
     WHERE state = 'READY' GROUP BY handler ORDER BY handler";

/// Due callbacks: `callbacks_due`, in its order.
pub(super) const CLAIM_CALLBACKS_SQL: &str = "SELECT delivery_id, task_id, url, state, attempts, \
     last_error, next_attempt_at, delivered_at, created_at FROM callbacks \
     WHERE state = 'PENDING' AND next_attempt_at <= ? \
     ORDER BY next_attempt_at, delivery_id LIMIT ?";
/// The earliest due callback: one step down `callbacks_due`.
pub(super) const NEXT_CALLBACK_SQL: &str =
    "SELECT MIN(next_attempt_at) FROM callbacks WHERE state = 'PENDING'";

/// A task as read and its transitions in a batch, each with its event's index.
type Planned = (TaskRecord, Vec<(usize, Transition)>);

pub(super) fn change_of(task: &TaskRecord) -> TaskChange {
    TaskChange::of(task)
}

/// A `usize` limit as an SQL `LIMIT` value.
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The listing query for `filter`: its conditions, newest first, and a
/// `LIMIT ?`. Binds, in order: state, handler, before_id (each if set),
/// limit.
pub(super) fn list_sql(filter: &TaskFilter) -> String {
    let mut conditions = Vec::new();
    if filter.state.is_some() {
        conditions.push("state = ?");
    }
    if filter.handler.is_some() {
        conditions.push("handler = ?");
    }
    if filter.before_id.is_some() {
        conditions.push("id < ?");
    }
    let mut sql = String::from(concat!("SELECT ", task_columns!(), " FROM tasks"));
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?");
    sql
}

impl SqliteStore {
    /// Starts a write transaction on the writer, taking the write lock now.
    pub(super) async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Runs a `task_columns!()` query on the reader pool.
    async fn read_tasks(&self, q: super::rows::SqliteQuery<'_>) -> Result<Vec<TaskRecord>> {
        let rows = q.fetch_all(&self.reader).await?;
        rows.iter().map(task_from_row).collect()
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_task(
        &self,
        task: NewTask,
        fingerprint: &str,
        now: UnixMillis,
    ) -> Result<Created> {
        let client_request_id = task.client_request_id.clone();
        let mut tx = self.begin_write().await?;
        if let Some(crid) = &client_request_id
            && let Some((stored, stored_fp)) = tx::find_by_request_id(&mut tx, crid).await?
        {
            return crate::existing_or_taken(stored, &stored_fp, fingerprint);
        }
        let record = task.into_record(now);
        match tx::insert_task(&mut tx, &record, fingerprint).await? {
            Ok(()) => {}
            Err(err) if is_unique_violation(&err) => {
                // Another writer (another process on this file) got there
                // first: answer from what it committed.
                drop(tx);
                let mut conn = self.reader.acquire().await?;
                if let Some(crid) = &client_request_id
                    && let Some((stored, stored_fp)) =
                        tx::find_by_request_id(&mut conn, crid).await?
                {
                    return crate::existing_or_taken(stored, &stored_fp, fingerprint);
                }
                return Err(Error::AlreadyExists(format!(
                    "task {} already exists",
                    record.id
                )));
            }
            Err(err) => return Err(err.into()),
        }
        tx.commit().await?;
        tracing::debug!(task_id = %record.id, state = %record.state, "task created");
        self.publish([change_of(&record)]);
        Ok(Created {
            task: record,
            existing: false,
        })
    }

    async fn create_tasks(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created>>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        let results = create_in_tx(&mut tx, tasks, now).await?;
        tx.commit().await?;
        let created: Vec<&TaskRecord> = results
            .iter()
            .flatten()
            .filter(|c| !c.existing)
            .map(|c| &c.task)
            .collect();
        tracing::debug!(created = created.len(), "tasks created");
        self.publish(created.into_iter().map(change_of));
        Ok(results)
    }

    async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>> {
        // One read transaction, so the row and its attempts are one snapshot.
        let mut rtx = self.reader.begin().await?;
        let Some(mut task) = tx::load_task(&mut rtx, id).await? else {
            return Ok(None);
        };
        task.attempts = tx::load_attempts(&mut rtx, id).await?;
        task.callback = tx::load_callback(&mut rtx, id).await?;
        rtx.commit().await?;
        Ok(Some(task))
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<TaskPage> {
        let limit = filter.limit.clamp(1, MAX_PAGE);
        let sql = list_sql(filter);
        // `list_sql` joins fixed fragments only; every value is bound.
        let mut q = sqlx::query(AssertSqlSafe(sql));
        if let Some(state) = filter.state {
            q = q.bind(state.as_str());
        }
        if let Some(handler) = &filter.handler {
            q = q.bind(handler.clone());
        }
        if let Some(before) = &filter.before_id {
            q = q.bind(before.clone());
        }
        // One more than asked tells whether another page exists. Rows and
        // their callbacks are read in one read transaction (one snapshot).
        let mut rtx = self.reader.begin().await?;
        let rows = q.bind(i64::from(limit) + 1).fetch_all(&mut *rtx).await?;
        let mut tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        let mut next_before_id = None;
        if tasks.len() > limit as usize {
            tasks.truncate(limit as usize);
            next_before_id = tasks.last().map(|t| t.id.clone());
        }
        let ended: Vec<&str> = tasks
            .iter()
            .filter(|t| t.state.is_terminal() && !t.callback_url.is_empty())
            .map(|t| t.id.as_str())
            .collect();
        let mut callbacks = tx::load_callbacks(&mut rtx, &ended).await?;
        rtx.commit().await?;
        for task in &mut tasks {
            task.callback = callbacks.remove(&task.id);
        }
        Ok(TaskPage {
            tasks,
            next_before_id,
        })
    }

    async fn transition(&self, id: &str, event: &Event, now: UnixMillis) -> Result<TaskRecord> {
        let mut tx = self.begin_write().await?;
        let task = tx::transition_one(&mut tx, id, event, now).await?;
        tx.commit().await?;
        self.publish([change_of(&task)]);
        Ok(task)
    }

    async fn transition_many(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        let mut tx = self.begin_write().await?;
        tx::check_fence(&mut tx, fence).await?;
        // The batched path first, inside a savepoint; should any statement
        // of it fail, it leaves nothing and the events go one by one.
        let mut sp = sqlx::Connection::begin(&mut *tx).await?;
        let results = match transition_batch(&mut sp, events, now).await {
            Ok(results) => {
                sp.commit().await?;
                results
            }
            Err(err) => {
                sp.rollback().await?;
                tracing::debug!(error = %err, "batched transitions failed; one by one");
                transition_each(&mut tx, events, now).await?
            }
        };
        tx.commit().await?;
        self.publish(results.iter().flatten().map(change_of));
        Ok(results)
    }

    async fn claim_ready(
        &self,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        // First exactly `limit` candidates: usually every one of them finds
        // a stream. Only when some did not (their labels match no stream
        // with room) does the scan go on, up to `claim_scan(limit)` rows in
        // all. Reading the whole scan up front cost more than the claim
        // itself: every column of every row is copied out of SQLite.
        let mut transitions = Vec::new();
        let mut expected = Vec::new();
        let scan = crate::claim_scan(limit);
        let mut offset = 0usize;
        while offset < scan && transitions.len() < limit {
            let want = if offset == 0 { limit } else { scan - offset };
            let rows = sqlx::query(CLAIM_SQL)
                .bind(handler)
                .bind(sql_limit(want))
                .bind(sql_limit(offset))
                .fetch_all(&mut *tx)
                .await?;
            offset += want;
            let exhausted = rows.len() < want;
            for row in &rows {
                if transitions.len() == limit {
                    break;
                }
                let task = task_from_row(row)?;
                let Some(claim) = chooser(&task) else {
                    continue;
                };
                let event = Event::Dispatch {
                    execution_id: claim.execution_id,
                    worker_id: claim.worker_id,
                    ack_deadline: claim.ack_deadline,
                };
                match taskmesh_core::apply(&task, &event, now) {
                    Ok(t) => {
                        expected.push(task.version);
                        transitions.push(t);
                    }
                    Err(err) => {
                        tracing::warn!(task_id = %task.id, error = %err, "READY task refused dispatch");
                    }
                }
            }
            if exhausted {
                break;
            }
        }
        let writes: Vec<batch::Write<'_>> = transitions
            .iter()
            .zip(&expected)
            .map(|(t, v)| batch::Write::of(*v, t))
            .collect();
        // The single writer connection means the CAS cannot miss here; it
        // stays so the invariant holds for every write.
        let written = batch::write(&mut tx, &writes).await?;
        drop(writes);
        tx.commit().await?;
        let claimed: Vec<TaskRecord> = transitions
            .into_iter()
            .zip(written)
            .filter_map(|(t, ok)| ok.then_some(t.task))
            .collect();
        self.publish(claimed.iter().map(change_of));
        Ok(claimed)
    }

    async fn due_tasks(&self, now: UnixMillis, limit: usize) -> Result<Vec<TaskRecord>> {
        let q = sqlx::query(DUE_SQL).bind(now).bind(sql_limit(limit));
        self.read_tasks(q).await
    }

    async fn in_flight(&self, worker_id: Option<&str>) -> Result<Vec<TaskRecord>> {
        let q = match worker_id {
            None => sqlx::query(concat!(
                "SELECT ",
                task_columns!(),
                " FROM tasks WHERE state IN ('DISPATCHING', 'RUNNING') ORDER BY id"
            )),
            Some(worker) => sqlx::query(concat!(
                "SELECT ",
                task_columns!(),
                " FROM tasks WHERE state IN ('DISPATCHING', 'RUNNING') AND worker_id = ? \
                 ORDER BY id"
            ))
            .bind(worker.to_string()),
        };
        self.read_tasks(q).await
    }

    async fn next_due_at(&self) -> Result<Option<UnixMillis>> {
        let min: Option<i64> = sqlx::query_scalar(NEXT_DUE_SQL)
            .fetch_one(&self.reader)
            .await?;
        Ok(min)
    }

    async fn ready_counts(&self) -> Result<Vec<(String, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(READY_COUNTS_SQL)
            .fetch_all(&self.reader)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(handler, n)| (handler, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    async fn claim_callbacks(
        &self,
        now: UnixMillis,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<CallbackJob>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        let rows = sqlx::query(CLAIM_CALLBACKS_SQL)
            .bind(now)
            .bind(sql_limit(limit))
            .fetch_all(&mut *tx)
            .await?;
        let mut jobs = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut delivery = callback_from_row(row)?;
            let task_id: String = sqlx::Row::try_get(row, "task_id")?;
            let lease_end = now.saturating_add(lease_ms.max(1));
            sqlx::query("UPDATE callbacks SET next_attempt_at = ? WHERE delivery_id = ?")
                .bind(lease_end)
                .bind(delivery.delivery_id.clone())
                .execute(&mut *tx)
                .await?;
            delivery.next_attempt_at = Some(lease_end);
            let Some(mut task) = tx::load_task(&mut tx, &task_id).await? else {
                // The foreign key makes this impossible; say so if it happens.
                return Err(Error::Internal(format!(
                    "callback {} names missing task {task_id}",
                    delivery.delivery_id
                )));
            };
            task.attempts = tx::load_attempts(&mut tx, &task_id).await?;
            task.callback = Some(delivery.clone());
            jobs.push(CallbackJob { delivery, task });
        }
        tx.commit().await?;
        Ok(jobs)
    }

    async fn finish_callback(
        &self,
        delivery_id: &str,
        outcome: &CallbackOutcome,
        now: UnixMillis,
    ) -> Result<bool> {
        let (state, last_error, next_attempt_at, delivered_at) = match outcome {
            CallbackOutcome::Delivered => ("DELIVERED", String::new(), None, Some(now)),
            CallbackOutcome::Retry {
                error,
                next_attempt_at,
            } => ("PENDING", error.clone(), Some(*next_attempt_at), None),
            CallbackOutcome::Failed { error } => ("FAILED", error.clone(), None, None),
        };
        let mut tx = self.begin_write().await?;
        let changed = sqlx::query(
            "UPDATE callbacks SET state = ?, attempts = attempts + 1, last_error = ?, \
             next_attempt_at = ?, delivered_at = ? WHERE delivery_id = ? AND state = 'PENDING'",
        )
        .bind(state)
        .bind(last_error)
        .bind(next_attempt_at)
        .bind(delivered_at)
        .bind(delivery_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed == 0 {
            let exists: Option<i64> =
                sqlx::query_scalar("SELECT 1 FROM callbacks WHERE delivery_id = ?")
                    .bind(delivery_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if exists.is_none() {
                return Err(Error::NotFound(format!("callback delivery {delivery_id}")));
            }
        }
        tx.commit().await?;
        Ok(changed > 0)
    }

    async fn next_callback_at(&self) -> Result<Option<UnixMillis>> {
        let min: Option<i64> = sqlx::query_scalar(NEXT_CALLBACK_SQL)
            .fetch_one(&self.reader)
            .await?;
        Ok(min)
    }

    fn subscribe(&self) -> broadcast::Receiver<TaskChange> {
        self.changes.subscribe()
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn create_schedule(&self, schedule: &ScheduleRecord) -> Result<()> {
        self.sched_create(schedule).await
    }

    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>> {
        self.sched_get(id).await
    }

    async fn list_schedules(
        &self,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)> {
        self.sched_list(after_id, limit).await
    }

    async fn update_schedule(
        &self,
        schedule: &ScheduleRecord,
        expected_version: i64,
    ) -> Result<bool> {
        self.sched_update(schedule, expected_version).await
    }

    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        self.sched_delete(id).await
    }

    async fn due_schedules(&self, now: UnixMillis, limit: usize) -> Result<Vec<ScheduleRecord>> {
        self.sched_due(now, limit).await
    }

    async fn next_schedule_due_at(&self) -> Result<Option<UnixMillis>> {
        self.sched_next_due().await
    }

    async fn schedules_awaiting_run_end(
        &self,
        limit: usize,
    ) -> Result<Vec<(ScheduleRecord, Option<TaskRecord>)>> {
        self.sched_awaiting(limit).await
    }

    async fn commit_fires_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        self.sched_commit_many(commits, now, fence).await
    }

    async fn fence_token(&self) -> Result<u64> {
        let t: i64 = sqlx::query_scalar("SELECT token FROM fences WHERE name = 'leader'")
            .fetch_one(&self.reader)
            .await?;
        Ok(u64::try_from(t).unwrap_or(0))
    }

    async fn recent_fires(&self, schedule_id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        self.sched_recent_fires(schedule_id, limit).await
    }

    fn subscribe_schedules(&self) -> broadcast::Receiver<ScheduleChange> {
        self.schedule_changes.subscribe()
    }
}

/// [`Store::create_tasks`] inside the caller's write transaction.
async fn create_in_tx(
    conn: &mut SqliteConnection,
    tasks: Vec<(NewTask, String)>,
    now: UnixMillis,
) -> Result<Vec<Result<Created>>> {
    // Stored holders of the idempotency keys asked for, in one read.
    let crids: Vec<&str> = tasks
        .iter()
        .filter_map(|(t, _)| t.client_request_id.as_deref())
        .collect();
    let mut holders: HashMap<String, (TaskRecord, String)> = HashMap::new();
    for crid in crids {
        if holders.contains_key(crid) {
            continue;
        }
        if let Some(found) = tx::find_by_request_id(conn, crid).await? {
            holders.insert(crid.to_string(), found);
        }
    }
    // Decide every entry first; the new rows then go in a few statements.
    let mut answers: Vec<Option<Result<Created>>> = Vec::with_capacity(tasks.len());
    let mut fresh: Vec<(usize, TaskRecord, String)> = Vec::new();
    for (i, (task, fingerprint)) in tasks.into_iter().enumerate() {
        if let Some(crid) = &task.client_request_id
            && let Some((stored, stored_fp)) = holders.get(crid)
        {
            answers.push(Some(existing_or_taken(
                stored.clone(),
                stored_fp,
                &fingerprint,
            )));
            continue;
        }
        let record = task.into_record(now);
        if let Some(crid) = &record.client_request_id {
            // A later entry of this batch with the same key sees this one.
            holders.insert(crid.clone(), (record.clone(), fingerprint.clone()));
        }
        answers.push(None);
        fresh.push((i, record, fingerprint));
    }
    let rows: Vec<(&TaskRecord, &str)> = fresh.iter().map(|(_, t, f)| (t, f.as_str())).collect();
    let mut sp = sqlx::Connection::begin(&mut *conn).await?;
    match batch::insert_tasks(&mut sp, &rows).await? {
        Ok(()) => {
            sp.commit().await?;
            for (i, task, _) in fresh {
                answers[i] = Some(Ok(Created {
                    task,
                    existing: false,
                }));
            }
        }
        Err(err) => {
            // Some row is refused (an id already taken): insert one by one
            // so only that entry fails.
            sp.rollback().await?;
            tracing::debug!(error = %err, "batched insert failed; one by one");
            for (i, task, fingerprint) in fresh {
                answers[i] = Some(match tx::insert_task(conn, &task, &fingerprint).await? {
                    Ok(()) => Ok(Created {
                        task,
                        existing: false,
                    }),
                    Err(err) if is_unique_violation(&err) => Err(Error::AlreadyExists(format!(
                        "task {} already exists",
                        task.id
                    ))),
                    Err(err) => Err(err.into()),
                });
            }
        }
    }
    Ok(answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(Error::Internal("entry left unanswered".into()))))
        .collect())
}

/// [`Store::transition_many`] in a few statements: read every task once,
/// apply the events in order in memory, write each task once with a
/// compare-and-set on the version read. Tasks whose compare-and-set missed
/// (another process wrote meanwhile) go through [`tx::transition_one`].
async fn transition_batch(
    conn: &mut SqliteConnection,
    events: &[(String, Event)],
    now: UnixMillis,
) -> Result<Vec<Result<TaskRecord>>> {
    let ids: Vec<&str> = {
        let mut seen = HashSet::new();
        events
            .iter()
            .map(|(id, _)| id.as_str())
            .filter(|id| seen.insert(*id))
            .collect()
    };
    let mut loaded = batch::load_tasks(conn, &ids).await?;
    // Per task: the record as read and its transitions in order, each with
    // the index of its event (the last one is the task as the events leave
    // it).
    let mut state: HashMap<&str, Planned> = ids
        .iter()
        .filter_map(|id| Some((*id, (loaded.remove(*id)?, Vec::new()))))
        .collect();
    let mut results: Vec<Result<TaskRecord>> = Vec::with_capacity(events.len());
    for (i, (id, event)) in events.iter().enumerate() {
        let Some((read, done)) = state.get_mut(id.as_str()) else {
            results.push(Err(Error::NotFound(id.clone())));
            continue;
        };
        let current = done.last().map_or(&*read, |t| &t.1.task);
        match taskmesh_core::apply(current, event, now) {
            Ok(t) => {
                results.push(Ok(t.task.clone()));
                done.push((i, t));
            }
            Err(err) => results.push(Err(err.into())),
        }
    }
    let order: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| state.get(id).is_some_and(|s| !s.1.is_empty()))
        .collect();
    let writes: Vec<batch::Write<'_>> = order
        .iter()
        .filter_map(|id| {
            let (read, done) = &state[id];
            Some(batch::Write {
                expected_version: read.version,
                task: &done.last()?.1.task,
                attempts: done.iter().map(|t| &t.1.attempt).collect(),
            })
        })
        .collect();
    let written = batch::write(conn, &writes).await?;
    drop(writes);
    // A task that has just ended with a callback URL gets its outbox entry
    // in the same transaction; the event that ended it reports it.
    for (id, ok) in order.iter().zip(&written) {
        let Some((i, last)) = state.get(id).and_then(|s| s.1.last()).filter(|_| *ok) else {
            continue;
        };
        if last.task.wants_callback() {
            let entry = tx::insert_callback(conn, &last.task).await?;
            if let Some(Ok(task)) = results.get_mut(*i) {
                task.callback = Some(entry);
            }
        }
    }
    let missed: HashSet<&str> = order
        .iter()
        .zip(&written)
        .filter_map(|(id, ok)| (!ok).then_some(*id))
        .collect();
    if !missed.is_empty() {
        // Re-read and re-apply those tasks' events one by one.
        for (i, (id, event)) in events.iter().enumerate() {
            if missed.contains(id.as_str()) {
                results[i] = tx::transition_one(conn, id, event, now).await;
            }
        }
    }
    Ok(results)
}

/// [`Store::transition_many`] one event at a time, each in a savepoint: an
/// event failing half-way (say, on its attempts row) leaves nothing behind,
/// and the others go on.
async fn transition_each(
    conn: &mut SqliteConnection,
    events: &[(String, Event)],
    now: UnixMillis,
) -> Result<Vec<Result<TaskRecord>>> {
    let mut results = Vec::with_capacity(events.len());
    for (id, event) in events {
        let mut sp = sqlx::Connection::begin(&mut *conn).await?;
        let result = tx::transition_one(&mut sp, id, event, now).await;
        if result.is_ok() {
            sp.commit().await?;
        } else {
            sp.rollback().await?;
        }
        results.push(result);
    }
    Ok(results)
}
