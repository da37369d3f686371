//! [`Metered`]: a [`Store`] that times every call of the store it wraps,
//! as the histogram `taskmesh_store_call_duration_seconds{op, outcome}`
//! (through the `metrics` facade; the binary installs the exporter).
//!
//! A decorator rather than timing inside each backend, so every backend is
//! measured the same way and none carries metrics code. Every method is
//! forwarded, those with a default body included, so wrapping never changes
//! behaviour.

use std::time::Instant;

use async_trait::async_trait;
use taskmesh_core::auth::TokenRecord;
use taskmesh_core::logs::{AttemptLogs, LogBatch, LogCap, LogEntry, LogQuery};
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::workflow::{WorkflowRecord, WorkflowState};
use taskmesh_core::{
    CallbackJob, CallbackOutcome, Event, NewTask, TaskRecord, TaskState, UnixMillis,
};
use tokio::sync::broadcast;

use crate::{
    ChangeInterest, Chooser, Created, CreatedWorkflow, FireCommit, FireCommitted, Result,
    ScheduleChange, Store, TaskChange, TaskFilter, TaskPage,
};

/// Name of the store latency histogram.
pub const STORE_CALL_SECONDS: &str = "taskmesh_store_call_duration_seconds";

/// Times every call of the wrapped store.
pub struct Metered<S> {
    inner: S,
}

impl<S: Store> Metered<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

async fn timed<T>(
    op: &'static str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let started = Instant::now();
    let result = call.await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics::histogram!(STORE_CALL_SECONDS, "op" => op, "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
    result
}

#[async_trait]
impl<S: Store> Store for Metered<S> {
    async fn create_task(
        &self,
        task: NewTask,
        fingerprint: &str,
        now: UnixMillis,
    ) -> Result<Created> {
        timed(
            "create_task",
            self.inner.create_task(task, fingerprint, now),
        )
        .await
    }

    async fn create_tasks(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created>>> {
        timed("create_tasks", self.inner.create_tasks(tasks, now)).await
    }

    async fn create_tasks_dispatching(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<Result<Created>>> {
        timed(
            "create_tasks",
            self.inner.create_tasks_dispatching(tasks, now, chooser),
        )
        .await
    }

    async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>> {
        timed("get_task", self.inner.get_task(id)).await
    }

    async fn append_logs(
        &self,
        batches: &[LogBatch],
        cap: LogCap,
        now: UnixMillis,
    ) -> Result<crate::LogsAppended> {
        timed("append_logs", self.inner.append_logs(batches, cap, now)).await
    }

    async fn task_logs(
        &self,
        id: &str,
        query: &LogQuery,
    ) -> Result<(Vec<AttemptLogs>, Vec<LogEntry>)> {
        timed("task_logs", self.inner.task_logs(id, query)).await
    }

    async fn remove_ended(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<u64> {
        timed(
            "remove_ended",
            self.inner
                .remove_ended(state, now, default_horizon_ms, limit),
        )
        .await
    }

    async fn remove_ended_workflows(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<(u64, u64)> {
        timed(
            "remove_ended_workflows",
            self.inner
                .remove_ended_workflows(state, now, default_horizon_ms, limit),
        )
        .await
    }

    async fn set_retention(
        &self,
        namespace: &str,
        handler: &str,
        horizons: &taskmesh_core::retention::Horizons,
    ) -> Result<()> {
        timed(
            "set_retention",
            self.inner.set_retention(namespace, handler, horizons),
        )
        .await
    }

    async fn retention_rules(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<taskmesh_core::retention::RetentionRule>> {
        timed("retention_rules", self.inner.retention_rules(namespace)).await
    }

    async fn oldest_ended(
        &self,
        namespace: &str,
        state: TaskState,
    ) -> Result<Option<(String, Option<UnixMillis>)>> {
        timed("oldest_ended", self.inner.oldest_ended(namespace, state)).await
    }

    async fn trim_fires(&self, schedule_id: &str, keep: u32, limit: usize) -> Result<u64> {
        timed(
            "trim_fires",
            self.inner.trim_fires(schedule_id, keep, limit),
        )
        .await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<TaskPage> {
        timed("list_tasks", self.inner.list_tasks(filter)).await
    }

    async fn task_stats(&self, namespace: &str, since: UnixMillis) -> Result<crate::TaskStats> {
        timed("task_stats", self.inner.task_stats(namespace, since)).await
    }

    async fn transition(&self, id: &str, event: &Event, now: UnixMillis) -> Result<TaskRecord> {
        timed("transition", self.inner.transition(id, event, now)).await
    }

    async fn transition_many(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>> {
        timed(
            "transition_many",
            self.inner.transition_many(events, now, fence),
        )
        .await
    }

    async fn claim_ready(
        &self,
        namespace: &str,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>> {
        timed(
            "claim_ready",
            self.inner
                .claim_ready(namespace, handler, limit, now, chooser),
        )
        .await
    }

    async fn due_tasks(&self, now: UnixMillis, limit: usize) -> Result<Vec<TaskRecord>> {
        timed("due_tasks", self.inner.due_tasks(now, limit)).await
    }

    async fn in_flight(&self, worker_id: Option<&str>) -> Result<Vec<TaskRecord>> {
        timed("in_flight", self.inner.in_flight(worker_id)).await
    }

    async fn next_due_at(&self) -> Result<Option<UnixMillis>> {
        timed("next_due_at", self.inner.next_due_at()).await
    }

    async fn ready_counts(&self) -> Result<Vec<(String, String, u64)>> {
        timed("ready_counts", self.inner.ready_counts()).await
    }

    fn subscribe_to(&self, interest: ChangeInterest) -> broadcast::Receiver<TaskChange> {
        self.inner.subscribe_to(interest)
    }

    async fn claim_callbacks(
        &self,
        now: UnixMillis,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<CallbackJob>> {
        timed(
            "claim_callbacks",
            self.inner.claim_callbacks(now, limit, lease_ms),
        )
        .await
    }

    async fn finish_callback(
        &self,
        delivery_id: &str,
        outcome: &CallbackOutcome,
        now: UnixMillis,
    ) -> Result<bool> {
        timed(
            "finish_callback",
            self.inner.finish_callback(delivery_id, outcome, now),
        )
        .await
    }

    async fn postpone_callbacks(&self, delivery_ids: &[&str], at: UnixMillis) -> Result<()> {
        timed(
            "postpone_callbacks",
            self.inner.postpone_callbacks(delivery_ids, at),
        )
        .await
    }

    async fn next_callback_at(&self) -> Result<Option<UnixMillis>> {
        timed("next_callback_at", self.inner.next_callback_at()).await
    }

    async fn ping(&self) -> Result<()> {
        timed("ping", self.inner.ping()).await
    }

    async fn db_now(&self) -> Result<UnixMillis> {
        timed("db_now", self.inner.db_now()).await
    }

    async fn create_schedule(&self, schedule: &ScheduleRecord) -> Result<()> {
        timed("create_schedule", self.inner.create_schedule(schedule)).await
    }

    async fn count_schedules(&self, namespace: &str) -> Result<u64> {
        timed("count_schedules", self.inner.count_schedules(namespace)).await
    }

    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>> {
        timed("get_schedule", self.inner.get_schedule(id)).await
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)> {
        timed(
            "list_schedules",
            self.inner.list_schedules(namespace, after_id, limit),
        )
        .await
    }

    async fn update_schedule(
        &self,
        schedule: &ScheduleRecord,
        expected_version: i64,
    ) -> Result<bool> {
        timed(
            "update_schedule",
            self.inner.update_schedule(schedule, expected_version),
        )
        .await
    }

    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        timed("delete_schedule", self.inner.delete_schedule(id)).await
    }

    async fn due_schedules(&self, now: UnixMillis, limit: usize) -> Result<Vec<ScheduleRecord>> {
        timed("due_schedules", self.inner.due_schedules(now, limit)).await
    }

    async fn next_schedule_due_at(&self) -> Result<Option<UnixMillis>> {
        timed("next_schedule_due_at", self.inner.next_schedule_due_at()).await
    }

    async fn schedules_awaiting_run_end(
        &self,
        limit: usize,
    ) -> Result<Vec<(ScheduleRecord, Option<TaskRecord>)>> {
        timed(
            "schedules_awaiting_run_end",
            self.inner.schedules_awaiting_run_end(limit),
        )
        .await
    }

    async fn commit_fires(
        &self,
        commit: FireCommit,
        now: UnixMillis,
    ) -> Result<Option<FireCommitted>> {
        timed("commit_fires", self.inner.commit_fires(commit, now)).await
    }

    async fn commit_fires_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        timed(
            "commit_fires_many",
            self.inner.commit_fires_many(commits, now, fence),
        )
        .await
    }

    async fn commit_fires_dispatching(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        timed(
            "commit_fires_many",
            self.inner
                .commit_fires_dispatching(commits, now, fence, chooser),
        )
        .await
    }

    async fn fence_token(&self) -> Result<u64> {
        timed("fence_token", self.inner.fence_token()).await
    }

    async fn recent_fires(&self, schedule_id: &str, limit: u32) -> Result<Vec<FireRecord>> {
        timed("recent_fires", self.inner.recent_fires(schedule_id, limit)).await
    }

    async fn create_token(&self, token: &TokenRecord) -> Result<()> {
        timed("create_token", self.inner.create_token(token)).await
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>> {
        timed("get_token", self.inner.get_token(id)).await
    }

    async fn list_tokens(&self, namespace: Option<&str>) -> Result<Vec<TokenRecord>> {
        timed("list_tokens", self.inner.list_tokens(namespace)).await
    }

    async fn revoke_token(&self, id: &str, now: UnixMillis) -> Result<bool> {
        timed("revoke_token", self.inner.revoke_token(id, now)).await
    }

    async fn create_workflow(
        &self,
        workflow: WorkflowRecord,
        fingerprint: &str,
        steps: Vec<NewTask>,
        now: UnixMillis,
    ) -> Result<CreatedWorkflow> {
        timed(
            "create_workflow",
            self.inner
                .create_workflow(workflow, fingerprint, steps, now),
        )
        .await
    }

    async fn spread_broadcast(
        &self,
        id: &str,
        shards: u32,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<(TaskRecord, WorkflowRecord)> {
        timed(
            "spread_broadcast",
            self.inner.spread_broadcast(id, shards, now, fence),
        )
        .await
    }

    async fn get_workflow(&self, id: &str) -> Result<Option<WorkflowRecord>> {
        timed("get_workflow", self.inner.get_workflow(id)).await
    }

    async fn list_workflows(
        &self,
        namespace: &str,
        state: Option<WorkflowState>,
        before_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<WorkflowRecord>> {
        timed(
            "list_workflows",
            self.inner
                .list_workflows(namespace, state, before_id, limit),
        )
        .await
    }

    async fn retry_workflow(&self, id: &str, now: UnixMillis) -> Result<(WorkflowRecord, u32)> {
        timed("retry_workflow", self.inner.retry_workflow(id, now)).await
    }

    async fn cancel_workflow(
        &self,
        id: &str,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(WorkflowRecord, Vec<(TaskRecord, String)>)> {
        timed(
            "cancel_workflow",
            self.inner.cancel_workflow(id, reason, now),
        )
        .await
    }

    async fn cluster_key(&self) -> Result<Vec<u8>> {
        timed("cluster_key", self.inner.cluster_key()).await
    }

    fn subscribe_schedules(&self) -> broadcast::Receiver<ScheduleChange> {
        self.inner.subscribe_schedules()
    }
}
