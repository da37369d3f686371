//! Durable state of taskmesh: the [`Store`] trait and its SQL backends,
//! SQLite (one node), Postgres and MySQL/MariaDB (a cluster of replicas).
//!
//! The store's algorithms are written once, in [`sql`], over the
//! [`sql::Backend`] seam; each backend module (`sqlite`, `postgres`,
//! `mysql`) supplies only what truly differs: its SQL dialect, its bulk
//! write form, its locking, the database clock, its wake-up transport and
//! its error-code table.
//!
//! Architecture invariant: every change of a task is computed by
//! `taskmesh_core::apply` and written as one conditional statement keyed on
//! the task's id and version (compare-and-set), together with its attempts
//! row in the same transaction. A write computed from a stale read changes
//! nothing. This crate knows nothing of gRPC or HTTP.
//!
//! Time: due-ness is judged by the store's clock ([`Store::db_now`]);
//! [`StoreClock`] follows it from a replica whose host clock may be off.

pub mod clock;
pub mod conformance;
mod decode;
mod error;
pub mod metered;
pub mod mysql;
pub mod postgres;
pub mod sql;
pub mod sqlite;
mod types;
pub mod urls;
mod wake;

use async_trait::async_trait;
use taskmesh_core::logs::{AttemptLogs, LogBatch, LogCap, LogEntry, LogQuery};
use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::workflow::{WorkflowRecord, WorkflowState};
use taskmesh_core::{
    CallbackJob, CallbackOutcome, Clock, Event, NewTask, SystemClock, TaskRecord, TaskState,
    UnixMillis,
};
use tokio::sync::broadcast;

pub use clock::StoreClock;
pub use error::Error;
pub use metered::Metered;
pub use mysql::{MysqlOptions, MysqlStore};
pub use postgres::{PostgresOptions, PostgresStore};
pub use sql::CreatedWorkflow;
pub use sqlite::{SqliteOptions, SqliteStore};
pub(crate) use types::existing_or_taken;
pub use types::{
    ChangeInterest, Chooser, Claim, Created, FireCommit, FireCommitted, LIST_SCAN, LogsAppended,
    ScheduleChange, TaskChange, TaskFilter, TaskPage, TaskStats, claim_scan,
};

/// Result of store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The server backend a database URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseKind {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`.
    Mysql,
}

impl DatabaseKind {
    /// The backend of `url`, by its scheme; `None` for any other.
    pub fn of_url(url: &str) -> Option<Self> {
        let scheme = url.split_once("://")?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Some(Self::Postgres),
            "mysql" | "mariadb" => Some(Self::Mysql),
            _ => None,
        }
    }

    /// The server's process name (for measuring its CPU).
    pub fn server_process(self) -> &'static [&'static str] {
        match self {
            Self::Postgres => &["postgres"],
            Self::Mysql => &["mariadbd", "mysqld"],
        }
    }
}

/// Durable task storage. Implementations pass the conformance suite of
/// [`conformance`] (run with [`store_conformance_suite!`]).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates a task. With a `client_request_id` already stored: the same
    /// `fingerprint` returns the stored task with `existing = true`; another
    /// fingerprint is [`Error::AlreadyExists`]. Never two tasks for one id.
    async fn create_task(
        &self,
        task: NewTask,
        fingerprint: &str,
        now: UnixMillis,
    ) -> Result<Created>;

    /// Creates many tasks in one transaction (one commit for the batch).
    /// Each entry is answered as [`Store::create_task`] would answer it
    /// alone — the same idempotency rules, entries sharing a
    /// `client_request_id` included, in input order — and an entry that fails
    /// does not stop the others. The outer error is for the batch as a whole
    /// (the store is unavailable); nothing is written then.
    async fn create_tasks(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created>>>;

    /// [`Store::create_tasks`], offering each new task that is READY at once
    /// (not delayed, not an idempotent repeat) to `chooser` inside the same
    /// transaction: a task it gives a [`Claim`] is written already
    /// DISPATCHING for that claim, its attempt opened, exactly as
    /// [`Store::claim_ready`] would have written it a commit later — one
    /// durable write between submit and start. A store may offer none (the
    /// default, and on the row-by-row fallback after a refused batch): the
    /// caller learns which were claimed from the tasks it gets back.
    async fn create_tasks_dispatching(
        &self,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<Result<Created>>> {
        let _ = chooser;
        self.create_tasks(tasks, now).await
    }

    /// One task with its attempts, oldest first.
    async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>>;

    /// Task logs: stores each batch's lines under the attempt its
    /// execution id names, numbered after the lines the attempt already
    /// has, within `cap` per attempt (its first lines are kept, later ones
    /// only counted as truncated), and adds the worker's dropped count.
    /// Lines of an execution the store does not know, and of an attempt
    /// that ended more than [`LATE_LINES_MS`](taskmesh_core::logs::LATE_LINES_MS)
    /// before `now`, are counted, not stored. Every batch in one write.
    async fn append_logs(
        &self,
        batches: &[LogBatch],
        cap: LogCap,
        now: UnixMillis,
    ) -> Result<LogsAppended>;

    /// Task logs: what each attempt of task `id` kept (by attempt), and up
    /// to `query.limit` of its lines after `query.after`, by attempt then
    /// seq. A task that is not there has neither.
    async fn task_logs(
        &self,
        id: &str,
        query: &LogQuery,
    ) -> Result<(Vec<AttemptLogs>, Vec<LogEntry>)>;

    /// Retention: removes up to `limit` tasks in the terminal `state` that
    /// ended longer before `now` than their horizon — their handler's
    /// (`set_retention`), else their namespace's, else
    /// `default_horizon_ms` — the oldest first, with their attempts,
    /// callbacks and logs; never one whose callback is still to be
    /// delivered, never a task that is not terminal, never a workflow's step
    /// (see [`Store::remove_ended_workflows`]). Returns how many went.
    /// A non-terminal `state` is [`Error::InvalidArgument`].
    async fn remove_ended(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<u64>;

    /// Retention: removes ended workflows in the terminal `state`
    /// (SUCCEEDED, FAILED or CANCELLED; TIMED_OUT removes none) whose end
    /// is older than their namespace's horizon for it (handlers' horizons
    /// do not apply: a workflow has many), else `default_horizon_ms`, each
    /// with every step, its attempts, callbacks and logs — the history of
    /// a workflow ages out as one unit, the oldest end first; never one
    /// with a step still live or a callback still to be delivered. At most
    /// `limit` steps go per call (a larger workflow goes over several, its
    /// row last). Returns (workflows, steps) removed. A non-terminal
    /// `state` is [`Error::InvalidArgument`].
    async fn remove_ended_workflows(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
        limit: usize,
    ) -> Result<(u64, u64)>;

    /// Retention: replaces the horizons of `namespace`'s `handler` (`""`:
    /// the namespace's own); unset ones inherit.
    async fn set_retention(
        &self,
        namespace: &str,
        handler: &str,
        horizons: &taskmesh_core::retention::Horizons,
    ) -> Result<()>;

    /// Retention: the horizons set, of `namespace` or of all, by
    /// namespace, handler and state.
    async fn retention_rules(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<taskmesh_core::retention::RetentionRule>>;

    /// Retention: the first-created task kept in `namespace` and `state`,
    /// with when it ended.
    async fn oldest_ended(
        &self,
        namespace: &str,
        state: TaskState,
    ) -> Result<Option<(String, Option<UnixMillis>)>>;

    /// A page of tasks, newest first, attempts left empty.
    async fn list_tasks(&self, filter: &TaskFilter) -> Result<TaskPage>;

    /// The figures of `namespace` GetStats shows: counts by state and
    /// handler, READY queues, and what ended or re-ran per minute since
    /// `since` (a minute's start).
    async fn task_stats(&self, namespace: &str, since: UnixMillis) -> Result<TaskStats>;

    /// Applies `event` to the task with a compare-and-set on its version,
    /// re-reading and re-applying on a lost race. Returns the task as
    /// written. A transition into a terminal state of a task with a
    /// `callback_url` queues its callback in the same transaction (the
    /// returned task carries the new entry in `callback`).
    /// [`Error::NotFound`] if there is no such task, [`Error::Transition`] if
    /// the event does not apply.
    async fn transition(&self, id: &str, event: &Event, now: UnixMillis) -> Result<TaskRecord>;

    /// Applies many events in one transaction (one commit for the batch).
    /// Each event succeeds or fails on its own; the result is in input order.
    /// With `fence = Some(token)` (a write made as leader) the transaction
    /// first checks the token is not older than the newest leader token the
    /// store has seen, and records it; an older one is [`Error::Fenced`] and
    /// nothing is written.
    async fn transition_many(
        &self,
        events: &[(String, Event)],
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<TaskRecord>>>;

    /// Moves up to `limit` READY tasks of `handler` in `namespace` to
    /// DISPATCHING, highest
    /// priority first and FIFO within a priority, in one transaction. For
    /// each candidate `chooser` names the worker or leaves it READY; up to
    /// [`claim_scan`]`(limit)` candidates are looked at, so a task no stream
    /// can take (its labels match no worker) does not block those behind it.
    /// Returns the claimed tasks as written.
    async fn claim_ready(
        &self,
        namespace: &str,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>>;

    /// Tasks whose `next_at` has passed (PENDING/RETRYING due, DISPATCHING
    /// past the ACK deadline, RUNNING past the execution deadline), earliest
    /// first.
    async fn due_tasks(&self, now: UnixMillis, limit: usize) -> Result<Vec<TaskRecord>>;

    /// Every DISPATCHING or RUNNING task (for recovery after a restart or the
    /// loss of a worker), in no particular order; read through a partial
    /// index of the tasks in flight (MySQL: the claim index, which leads
    /// with the state).
    async fn in_flight(&self, worker_id: Option<&str>) -> Result<Vec<TaskRecord>>;

    /// The earliest `next_at` of any task, if any.
    async fn next_due_at(&self) -> Result<Option<UnixMillis>>;

    /// The namespaces and handlers that have READY tasks, with how many.
    async fn ready_counts(&self) -> Result<Vec<(String, String, u64)>>;

    /// Committed changes, for watchers and the dispatcher's wake-ups,
    /// including those other processes sharing the database commit (where
    /// the backend can tell: Postgres relays them by LISTEN/NOTIFY). A slow
    /// receiver may miss changes (`Lagged`) and must re-read. A store that
    /// may have missed changes itself (Postgres, after its notification
    /// connection was lost and re-established) says so the same way: it
    /// sends a burst of [`TaskChange::resync`] markers one longer than the
    /// channel, so receivers get `Lagged`, or, if they kept up with the
    /// burst, read markers that name no task; either means re-read.
    fn subscribe(&self) -> broadcast::Receiver<TaskChange> {
        self.subscribe_to(ChangeInterest::All)
    }

    /// [`Store::subscribe`], sent only the changes `interest` wants (and
    /// every resync marker): a subscriber that would skip most changes is
    /// not woken for them.
    fn subscribe_to(&self, interest: ChangeInterest) -> broadcast::Receiver<TaskChange>;

    /// Claims up to `limit` PENDING callbacks due by `now`, earliest first,
    /// in one transaction, each with its task (attempts included). A claimed
    /// entry's `next_attempt_at` moves to `now + lease_ms`: nobody claims it
    /// again while its try is under way, and it comes back by itself if the
    /// deliverer dies before recording an outcome.
    async fn claim_callbacks(
        &self,
        now: UnixMillis,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<CallbackJob>>;

    /// Records the outcome of one try of `delivery_id` (counting the try).
    /// Only a PENDING entry changes: returns false, writing nothing, when it
    /// had already been delivered or given up. [`Error::NotFound`] when there
    /// is no such delivery.
    async fn finish_callback(
        &self,
        delivery_id: &str,
        outcome: &CallbackOutcome,
        now: UnixMillis,
    ) -> Result<bool>;

    /// Moves claimed PENDING entries to be due at `at` without counting a
    /// try (the deliverer had no room for them now).
    async fn postpone_callbacks(&self, delivery_ids: &[&str], at: UnixMillis) -> Result<()>;

    /// The earliest `next_attempt_at` of any PENDING callback, if any.
    async fn next_callback_at(&self) -> Result<Option<UnixMillis>>;

    /// Checks the store answers.
    async fn ping(&self) -> Result<()>;

    /// The store's own clock: the instant against which due-ness is judged
    /// when several processes share the store. The default is the process
    /// clock (SQLite: one node, the process is the database); Postgres asks
    /// the server. [`StoreClock`] follows this clock without asking it for
    /// every reading.
    async fn db_now(&self) -> Result<UnixMillis> {
        Ok(SystemClock.now_millis())
    }

    /// Creates a schedule ([`Error::AlreadyExists`] for a taken id).
    async fn create_schedule(&self, schedule: &ScheduleRecord) -> Result<()>;

    /// How many schedules `namespace` has.
    async fn count_schedules(&self, namespace: &str) -> Result<u64>;

    /// One schedule.
    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>>;

    /// Retention of fire history: removes the oldest fire records of
    /// `schedule_id` beyond its newest `keep`, at most `limit` of them in
    /// one short write. Returns how many went. Fires only move forward (the
    /// schedule's row says where), so an old record is not needed to keep a
    /// fire time from being handled twice.
    async fn trim_fires(&self, schedule_id: &str, keep: u32, limit: usize) -> Result<u64>;

    /// Schedules (of `namespace`, or every namespace) in id order after
    /// `after_id`, at most `limit` (1..=1000), and the id to continue from
    /// when more exist.
    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after_id: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<ScheduleRecord>, Option<String>)>;

    /// Rewrites a schedule if it still has `expected_version`; false when
    /// it changed meanwhile (nothing written). [`Error::NotFound`] if gone.
    async fn update_schedule(
        &self,
        schedule: &ScheduleRecord,
        expected_version: i64,
    ) -> Result<bool>;

    /// Deletes a schedule and its fire records; false if there was none.
    async fn delete_schedule(&self, id: &str) -> Result<bool>;

    /// Active schedules whose next fire time has passed, earliest first.
    async fn due_schedules(&self, now: UnixMillis, limit: usize) -> Result<Vec<ScheduleRecord>>;

    /// The earliest next fire time of any active schedule.
    async fn next_schedule_due_at(&self) -> Result<Option<UnixMillis>>;

    /// Fixed-delay schedules waiting for their last run to end, with that
    /// run's task (`None` if it is gone).
    async fn schedules_awaiting_run_end(
        &self,
        limit: usize,
    ) -> Result<Vec<(ScheduleRecord, Option<TaskRecord>)>>;

    /// Writes one handling of a due schedule: the schedule (compare-and-set),
    /// its fire records, the cancel of the previous run and the new tasks,
    /// all or nothing. `Ok(None)` when the schedule changed meanwhile.
    async fn commit_fires(
        &self,
        commit: FireCommit,
        now: UnixMillis,
    ) -> Result<Option<FireCommitted>> {
        self.commit_fires_many(vec![commit], now, None)
            .await?
            .pop()
            .unwrap_or(Ok(None))
    }

    /// [`Store::commit_fires`] for many schedules in one transaction (one
    /// commit for every schedule due at the same instant); each commit
    /// succeeds or fails on its own, results in input order. `fence` as in
    /// [`Store::transition_many`].
    async fn commit_fires_many(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>>;

    /// [`Store::commit_fires_many`], offering each new task that is READY at
    /// once to `chooser` inside the same transaction, as
    /// [`Store::create_tasks_dispatching`] does: a task it gives a
    /// [`Claim`] is written already DISPATCHING, its attempt opened — one
    /// durable write between a schedule's fire and its task's start. A
    /// store may offer none (the default; the SQL stores offer none in a
    /// call where any commit cancels a previous run, nor on the
    /// schedule-by-schedule fallback after a failed batch): the caller
    /// learns which were claimed from the tasks it gets back.
    async fn commit_fires_dispatching(
        &self,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: Option<u64>,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<Result<Option<FireCommitted>>>> {
        let _ = chooser;
        self.commit_fires_many(commits, now, fence).await
    }

    /// The newest leader fencing token written so far (0 if none).
    async fn fence_token(&self) -> Result<u64>;

    /// The most recent fires of a schedule, newest first.
    async fn recent_fires(&self, schedule_id: &str, limit: u32) -> Result<Vec<FireRecord>>;

    /// Stores a new token ([`Error::AlreadyExists`] for a taken id).
    async fn create_token(&self, token: &taskmesh_core::auth::TokenRecord) -> Result<()>;

    /// One token by its public id.
    async fn get_token(&self, id: &str) -> Result<Option<taskmesh_core::auth::TokenRecord>>;

    /// The tokens of `namespace` (or of every namespace), by id.
    async fn list_tokens(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<taskmesh_core::auth::TokenRecord>>;

    /// Revokes a token at `now`; false when it was revoked already.
    /// [`Error::NotFound`] when there is no such token.
    async fn revoke_token(&self, id: &str, now: UnixMillis) -> Result<bool>;

    /// Workflows: creates `workflow` (its row) and its steps' tasks (each
    /// carrying its `workflow` link: those without parents READY, the
    /// others waiting) in one transaction. With a `client_request_id`
    /// already used in the namespace, the same `fingerprint` returns the
    /// stored workflow (`existing`); another is [`Error::AlreadyExists`].
    async fn create_workflow(
        &self,
        workflow: WorkflowRecord,
        fingerprint: &str,
        steps: Vec<NewTask>,
        now: UnixMillis,
    ) -> Result<CreatedWorkflow>;

    /// Sharding broadcast: spreads the due broadcast `id` (PENDING) into
    /// `shards` shards (at most `broadcast::MAX_SHARDS`), in one
    /// transaction fenced by `fence`: the task goes RUNNING and the shards
    /// are written READY as the steps of a workflow of their own (its
    /// `parent_task_id` the task), each a child of the task with its
    /// index. The workflow's end, written with its last shard's end, ends
    /// the task. Returns the task and the workflow with its shards;
    /// [`Error::Transition`] when the task is no broadcast due to spread.
    async fn spread_broadcast(
        &self,
        id: &str,
        shards: u32,
        now: UnixMillis,
        fence: Option<u64>,
    ) -> Result<(TaskRecord, WorkflowRecord)>;

    /// Workflows: one, with its steps' tasks (attempts left empty).
    async fn get_workflow(&self, id: &str) -> Result<Option<WorkflowRecord>>;

    /// Workflows: up to `limit` of `namespace`, newest first, of `state` if
    /// given, created before `before_id` if given; steps left empty.
    async fn list_workflows(
        &self,
        namespace: &str,
        state: Option<WorkflowState>,
        before_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<WorkflowRecord>>;

    /// Workflows: RetryWorkflow — runs again every step of workflow `id`
    /// that FAILED, TIMED_OUT or was CANCELLED (to READY when its parents
    /// all SUCCEEDED, else back to waiting), never a SUCCEEDED one, and
    /// makes the workflow RUNNING, in one transaction. Returns it with its
    /// steps and how many run again (0: nothing to re-run, nothing
    /// written). [`Error::NotFound`] for no such workflow.
    async fn retry_workflow(&self, id: &str, now: UnixMillis) -> Result<(WorkflowRecord, u32)>;

    /// Workflows: cancels workflow `id` (every step not ended is cancelled,
    /// the workflow CANCELLED with `reason`) in one transaction; one that
    /// has ended is returned as it is. Returns it with its steps, and the
    /// steps that were in flight with the execution id they ran (their
    /// workers are to be told). [`Error::NotFound`] for no such workflow.
    async fn cancel_workflow(
        &self,
        id: &str,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(WorkflowRecord, Vec<(TaskRecord, String)>)>;

    /// The cluster's secret key (made by the first replica that asks, the
    /// same for every replica afterwards), from which assignment secrets
    /// are derived (`taskmesh_core::auth::assignment_secret`).
    async fn cluster_key(&self) -> Result<Vec<u8>>;

    /// Committed schedule changes (for the timing-wheel trigger engine), as
    /// [`Store::subscribe`], [`ScheduleChange::resync`] included.
    fn subscribe_schedules(&self) -> broadcast::Receiver<ScheduleChange>;
}
