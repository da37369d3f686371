//! `impl Store for SqlStore<B>`: each method is one of the algorithms of
//! the sibling modules, so every backend behaves the same by construction.

use async_trait::async_trait;
use taskmesh_core::auth::TokenRecord;
use taskmesh_core::logs::{AttemptLogs, LogBatch, LogCap, LogEntry, LogQuery};
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::workflow::{WorkflowRecord, WorkflowState};
use taskmesh_core::{
    CallbackJob, CallbackOutcome, Event, NewTask, TaskRecord, TaskState, UnixMillis,
};
use tokio::sync::broadcast;

use super::backend::Backend;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::{
    ChangeInterest, Chooser, Created, CreatedWorkflow, Error, FireCommit, FireCommitted, Result,
    ScheduleChange, Store, TaskChange, TaskFilter, TaskPage, TaskStats, decode,
};

#[async_trait]
impl<B: Backend> Store for SqlStore<B> {
    async fn create_task(
        &self,
        task: NewTask,
        fingerprint: &str,
        now: UnixMillis,
    ) -> Result<Created> {
        self.create_many(vec![(task, fingerprint.to_string())], now, None)
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a create of one gave no result".into())))
    }

    async fn create_tasks(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created>>> {
        self.create_many(tasks, now, None).await
    }

    async fn create_tasks_dispatching(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<Result<Created>>> {
        self.create_many(tasks, now, Some(chooser)).await
    }

    async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>> {
        self.get(id).await
    }

    async fn trim_fires(&self, schedule_id: &str, keep: u32, limit: usize) -> Result<u64> {
        self.trim_schedule_fires(schedule_id, keep, limit).await
    }

    async fn append_logs(
        &self,
        batches: &[LogBatch],
        cap: LogCap,
        now: UnixMillis,
    ) -> Result<crate::LogsAppended> {
        self.logs_append(batches, cap, now).await
    }

    async fn task_logs(
        &self,
        id: &str,
        query: &LogQuery,
    ) -> Result<(Vec<AttemptLogs>, Vec<LogEntry>)> {
        self.logs_read(id, query).await
    }

    async fn remove_ended(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<u64> {
        self.remove_ended_tasks(state, now, default_horizon_ms, limit)
            .await
    }

    async fn remove_ended_workflows(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<(u64, u64)> {
        self.remove_ended_workflows_sql(state, now, default_horizon_ms, limit)
            .await
    }

    async fn set_retention(
        &self,
        namespace: &str,
        handler: &str,
        horizons: &taskmesh_core::retention::Horizons,
    ) -> Result<()> {
        self.retention_set(namespace, handler, horizons).await
    }

    async fn retention_rules(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<taskmesh_core::retention::RetentionRule>> {
        self.retention_list(namespace).await
    }

    async fn oldest_ended(
        &self,
        namespace: &str,
        state: TaskState,
    ) -> Result<Option<(String, Option<UnixMillis>)>> {
        self.oldest_ended_task(namespace, state).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<TaskPage> {
        self.list(filter).await
    }

    async fn task_stats(&self, namespace: &str, since: UnixMillis) -> Result<TaskStats> {
        self.stats(namespace, since).await
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
        namespace: &str,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>> {
        self.claim(namespace, handler, limit, now, chooser).await
    }

    async fn due_tasks(&self, now: UnixMillis, limit: usize) -> Result<Vec<TaskRecord>> {
        self.read_tasks(&self.sql().due, args![now, sql_limit(limit)])
            .await
    }

    async fn in_flight(&self, worker_id: Option<&str>) -> Result<Vec<TaskRecord>> {
        match worker_id {
            None => self.read_tasks(&self.sql().in_flight, Vec::new()).await,
            Some(w) => self.read_tasks(&self.sql().in_flight_of, args![w]).await,
        }
    }

    async fn next_due_at(&self) -> Result<Option<UnixMillis>> {
        self.read_instant(&self.sql().next_due).await
    }

    async fn ready_counts(&self) -> Result<Vec<(String, String, u64)>> {
        let rows = self
            .backend()
            .read(&self.sql().ready_counts, Vec::new())
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<(String, String, u64), String> {
                    let n = decode::Columns::int(row, "n")?;
                    Ok((
                        decode::Columns::text(row, "namespace")?,
                        decode::Columns::text(row, "handler")?,
                        u64::try_from(n).unwrap_or(0),
                    ))
                };
                read().map_err(|e| Error::Internal(format!("bad READY count row: {e}")))
            })
            .collect()
    }

    fn subscribe_to(&self, interest: ChangeInterest) -> broadcast::Receiver<TaskChange> {
        self.channels().subscribe(interest)
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

    async fn postpone_callbacks(&self, delivery_ids: &[&str], at: UnixMillis) -> Result<()> {
        self.cb_postpone(delivery_ids, at).await
    }

    async fn next_callback_at(&self) -> Result<Option<UnixMillis>> {
        self.read_instant(&self.sql().next_callback).await
    }

    async fn ping(&self) -> Result<()> {
        self.backend().read(&self.sql().ping, Vec::new()).await?;
        Ok(())
    }

    async fn db_now(&self) -> Result<UnixMillis> {
        self.backend().db_now().await
    }

    async fn create_schedule(&self, schedule: &ScheduleRecord) -> Result<()> {
        self.sched_create(schedule).await
    }

    async fn count_schedules(&self, namespace: &str) -> Result<u64> {
        let rows = self
            .backend()
            .read(&self.sql().count_schedules, args![namespace])
            .await?;
        let n = match rows.first() {
            Some(row) => crate::decode::Columns::int(row, "n")
                .map_err(|e| Error::Internal(format!("bad count: {e}")))?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>> {
        self.sched_get(id).await
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)> {
        self.sched_list(namespace, after_id, limit).await
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
        self.read_instant(&self.sql().next_schedule_due).await
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
        self.sched_commit_many(commits, now, fence, None).await
    }

    async fn commit_fires_dispatching(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        self.sched_commit_many(commits, now, fence, Some(chooser))
            .await
    }

    async fn fence_token(&self) -> Result<u64> {
        self.fence().await
    }

    async fn recent_fires(&self, schedule_id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        self.sched_recent_fires(schedule_id, limit).await
    }

    async fn create_token(&self, token: &TokenRecord) -> Result<()> {
        self.token_create(token).await
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
        self.token_get(id).await
    }

    async fn list_tokens(&self, namespace: Option<&str>) -> Result<Vec<TokenRecord>> {
        self.token_list(namespace).await
    }

    async fn revoke_token(&self, id: &str, now: UnixMillis) -> Result<bool> {
        self.token_revoke(id, now).await
    }

    async fn create_workflow(
        &self,
        workflow: WorkflowRecord,
        fingerprint: &str,
        steps: Vec<NewTask>,
        now: UnixMillis,
    ) -> Result<CreatedWorkflow> {
        self.create_workflow_sql(workflow, fingerprint, steps, now)
            .await
    }

    async fn spread_broadcast(
        &self,
        id: &str,
        shards: u32,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<(TaskRecord, WorkflowRecord)> {
        self.spread_broadcast_sql(id, shards, now, fence).await
    }

    async fn get_workflow(&self, id: &str) -> Result<Option<WorkflowRecord>> {
        self.get_workflow_sql(id).await
    }

    async fn list_workflows(
        &self,
        namespace: &str,
        state: Option<WorkflowState>,
        before_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<WorkflowRecord>> {
        self.list_workflows_sql(namespace, state, before_id, limit)
            .await
    }

    async fn retry_workflow(&self, id: &str, now: UnixMillis) -> Result<(WorkflowRecord, u32)> {
        self.retry_workflow_sql(id, now).await
    }

    async fn cancel_workflow(
        &self,
        id: &str,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(WorkflowRecord, Vec<(TaskRecord, String)>)> {
        self.cancel_workflow_sql(id, reason, now).await
    }

    async fn cluster_key(&self) -> Result<Vec<u8>> {
        self.key().await
    }

    fn subscribe_schedules(&self) -> broadcast::Receiver<ScheduleChange> {
        self.channels().schedules.subscribe()
    }
}
