//! `impl Store for PostgresStore`: single statements where one suffices
//! (creates, reads); batches of events in `super::transitions`, claims in
//! `super::claims`, schedules and callbacks in their own files. After each
//! commit the changes go to local subscribers and to the outbox
//! (`super::outbox`) for the other processes.
//! After each commit the changes go to local subscribers and to the outbox
//! (`super::outbox`) for the other processes.

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::{CallbackJob, CallbackOutcome, Event, NewTask, TaskRecord, UnixMillis};
use tokio::sync::broadcast;

use super::{PostgresStore, sql, tx};
use crate::error::is_unique_violation;
use crate::{
    Chooser, Created, Error, FireCommit, FireCommitted, Result, ScheduleChange, Store, TaskChange,
    TaskFilter, TaskPage, decode,
};

/// Largest page [`Store::list_tasks`] returns.
const MAX_PAGE: u32 = 1000;

/// A `usize` limit as an SQL `LIMIT` value.
pub(super) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The listing query for `filter`, newest first. Binds, in order: state,
/// handler, before_id (each if set), limit.
pub(super) fn list_sql(filter: &TaskFilter) -> String {
    let mut conditions = Vec::new();
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    if filter.state.is_some() {
        conditions.push(format!("state = ${}", next()));
    }
    if filter.handler.is_some() {
        conditions.push(format!("handler = ${}", next()));
    }
    if filter.before_id.is_some() {
        conditions.push(format!("id < ${}", next()));
    }
    let mut sql = String::from(concat!(
        "SELECT ",
        sql::task_columns!(),
        ", ",
        sql::callback_json!(),
        " FROM tasks t"
    ));
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", next()));
    sql
}

impl PostgresStore {
    /// Runs a `task_columns!()` query on the pool.
    async fn read_tasks(&self, q: tx::PgQuery<'_>) -> Result<Vec<TaskRecord>> {
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(decode::task).collect()
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_task(
        &self,
        task: NewTask,
        fingerprint: &str,
        now: UnixMillis,
    ) -> Result<Created> {
        let record = task.into_record(now);
        // A taken key whose task then vanishes cannot happen today (tasks
        // are never deleted); the bound keeps a future purge from looping.
        for _ in 0..3 {
            let inserted = tx::bind_insert(sqlx::query(sql::INSERT_TASK), &record, fingerprint)?
                .fetch_optional(&self.pool)
                .await;
            match inserted {
                Ok(Some(_)) => {
                    tracing::debug!(task_id = %record.id, state = %record.state, "task created");
                    self.publish([TaskChange::of(&record)], []);
                    return Ok(Created {
                        task: record,
                        existing: false,
                    });
                }
                Ok(None) => {}
                Err(err) if is_unique_violation(&err) => {
                    return Err(Error::AlreadyExists(format!(
                        "task {} already exists",
                        record.id
                    )));
                }
                Err(err) => return Err(err.into()),
            }
            // The key is taken (ON CONFLICT waited for its writer to
            // commit): answer from what is stored.
            let Some(key) = &record.client_request_id else {
                return Err(Error::Internal(format!(
                    "task {} conflicted without an idempotency key",
                    record.id
                )));
            };
            let mut conn = self.pool.acquire().await?;
            if let Some((stored, stored_fp)) = tx::find_by_request_id(&mut conn, key).await? {
                return crate::existing_or_taken(stored, &stored_fp, fingerprint);
            }
        }
        Err(Error::Conflict(format!(
            "client_request_id {}",
            record.client_request_id.as_deref().unwrap_or_default()
        )))
    }

    async fn create_tasks(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created>>> {
        self.create_many(tasks, now).await
    }

    async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>> {
        // One statement, so the row and its attempts are one snapshot.
        let row = sqlx::query(sql::GET_TASK)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(tx::task_with_attempts).transpose()
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<TaskPage> {
        let limit = filter.limit.clamp(1, MAX_PAGE);
        // `list_sql` joins fixed fragments only; every value is bound.
        let sql = list_sql(filter);
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
        // One more than asked tells whether another page exists. Each row
        // comes with its callback, in the same statement (one snapshot).
        let rows = q.bind(i64::from(limit) + 1).fetch_all(&self.pool).await?;
        let mut tasks = rows
            .iter()
            .map(tx::task_with_callback)
            .collect::<Result<Vec<_>>>()?;
        let mut next_before_id = None;
        if tasks.len() > limit as usize {
            tasks.truncate(limit as usize);
            next_before_id = tasks.last().map(|t| t.id.clone());
        }
        Ok(TaskPage {
            tasks,
            next_before_id,
        })
    }

    async fn transition(&self, id: &str, event: &Event, now: UnixMillis) -> Result<TaskRecord> {
        let events = [(id.to_string(), event.clone())];
        self.transition_batch(&events, now, None)
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a batch of one gave no result".into())))
    }

    async fn transition_many(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        self.transition_batch(events, now, fence).await
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
        self.claim(handler, limit, now, chooser).await
    }

    async fn due_tasks(&self, now: UnixMillis, limit: usize) -> Result<Vec<TaskRecord>> {
        let q = sqlx::query(sql::DUE).bind(now).bind(sql_limit(limit));
        self.read_tasks(q).await
    }

    async fn in_flight(&self, worker_id: Option<&str>) -> Result<Vec<TaskRecord>> {
        let q = match worker_id {
            None => sqlx::query(sql::IN_FLIGHT),
            Some(worker) => sqlx::query(sql::IN_FLIGHT_OF).bind(worker.to_string()),
        };
        self.read_tasks(q).await
    }

    async fn next_due_at(&self) -> Result<Option<UnixMillis>> {
        Ok(sqlx::query_scalar(sql::NEXT_DUE)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn ready_counts(&self) -> Result<Vec<(String, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(sql::READY_COUNTS)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(handler, n)| (handler, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    fn subscribe(&self) -> broadcast::Receiver<TaskChange> {
        self.shared.changes.subscribe()
    }

    async fn claim_callbacks(
        &self,
        now: UnixMillis,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<CallbackJob>> {
        self.cb_claim(now, limit, lease_ms).await
    }

    async fn finish_callback(
        &self,
        delivery_id: &str,
        outcome: &CallbackOutcome,
        now: UnixMillis,
    ) -> Result<bool> {
        self.cb_finish(delivery_id, outcome, now).await
    }

    async fn next_callback_at(&self) -> Result<Option<UnixMillis>> {
        self.cb_next().await
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn db_now(&self) -> Result<UnixMillis> {
        Ok(sqlx::query_scalar(sql::DB_NOW)
            .fetch_one(&self.pool)
            .await?)
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
        let t: i64 = sqlx::query_scalar(sql::FENCE_TOKEN)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(t).unwrap_or(0))
    }

    async fn recent_fires(&self, schedule_id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        self.sched_recent_fires(schedule_id, limit).await
    }

    fn subscribe_schedules(&self) -> broadcast::Receiver<ScheduleChange> {
        self.shared.schedule_changes.subscribe()
    }
}
