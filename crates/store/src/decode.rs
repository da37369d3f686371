//! Rows → domain records, shared by the SQL backends so no two of them can
//! ever read a column differently.
//!
//! Each backend exposes its rows through [`Columns`] (one typed getter per
//! column kind); the decoders here do the rest: enum parsing, JSON, range
//! checks. Bad data in a row is an [`Error::Internal`] naming the record,
//! never a panic.

use std::collections::BTreeMap;
use std::fmt::Display;

use serde::{Deserialize, Serialize};
use taskmesh_core::schedule::{
    FireOutcome, FireRecord, MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord,
    TaskTemplate,
};
use taskmesh_core::workflow::{
    FailurePolicy, StepLink, WorkflowRecord, WorkflowSpec, WorkflowState,
};
use taskmesh_core::{
    AttemptOutcome, AttemptRecord, CallbackDelivery, CallbackState, Concurrency, RetryPolicy,
    StateTimes, Strategy, TaskRecord, TaskState,
};

use crate::{Error, Result};

/// Typed access to the columns of one row, by name. `labels` and `template`
/// are read as JSON text whatever the column type (Postgres selects them
/// with `::text`).
pub trait Columns {
    fn text(&self, col: &str) -> Result<String, String>;
    fn opt_text(&self, col: &str) -> Result<Option<String>, String>;
    fn int(&self, col: &str) -> Result<i64, String>;
    fn opt_int(&self, col: &str) -> Result<Option<i64>, String>;
    fn int32(&self, col: &str) -> Result<i32, String>;
    fn float(&self, col: &str) -> Result<f64, String>;
    fn bytes(&self, col: &str) -> Result<Vec<u8>, String>;
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, String>;
    /// A boolean: an INTEGER 0/1 on SQLite, a BOOLEAN on Postgres and
    /// MySQL.
    fn flag(&self, col: &str) -> Result<bool, String>;
}

/// Implements [`Columns`] for a sqlx row type; `$flag` reads a boolean.
macro_rules! impl_columns {
    ($row:ty, |$r:ident, $c:ident| $flag:expr) => {
        impl $crate::decode::Columns for $row {
            fn text(&self, col: &str) -> Result<String, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn opt_text(&self, col: &str) -> Result<Option<String>, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn int(&self, col: &str) -> Result<i64, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn opt_int(&self, col: &str) -> Result<Option<i64>, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn int32(&self, col: &str) -> Result<i32, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn float(&self, col: &str) -> Result<f64, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn bytes(&self, col: &str) -> Result<Vec<u8>, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, String> {
                sqlx::Row::try_get(self, col).map_err(|e| e.to_string())
            }
            fn flag(&self, col: &str) -> Result<bool, String> {
                let ($r, $c) = (self, col);
                $flag
            }
        }
    };
}

impl_columns!(sqlx::sqlite::SqliteRow, |r, c| {
    sqlx::Row::try_get::<i64, _>(r, c)
        .map(|v| v != 0)
        .map_err(|e| e.to_string())
});
impl_columns!(sqlx::postgres::PgRow, |r, c| sqlx::Row::try_get::<bool, _>(
    r, c
)
.map_err(|e| e.to_string()));
impl_columns!(sqlx::mysql::MySqlRow, |r, c| sqlx::Row::try_get::<bool, _>(
    r, c
)
.map_err(|e| e.to_string()));

/// Reads a task (attempts left empty) from a row of the backend's task
/// columns.
pub(crate) fn task(row: &impl Columns) -> Result<TaskRecord> {
    let id = row
        .text("id")
        .map_err(|e| Error::Internal(format!("task row without a readable id: {e}")))?;
    decode_task(row, &id).map_err(|e| bad_task(&id, e))
}

/// The stored request fingerprint of a task row.
pub(crate) fn fingerprint(row: &impl Columns) -> Result<String> {
    row.text("request_fingerprint")
        .map_err(|e| Error::Internal(format!("bad request_fingerprint: {e}")))
}

fn decode_task(row: &impl Columns, id: &str) -> Result<TaskRecord, String> {
    let u32_col = |col: &str| -> Result<u32, String> {
        let v = row.int(col)?;
        u32::try_from(v).map_err(|_| format!("{col} = {v} is out of range"))
    };
    let state_text = row.text("state")?;
    let state =
        TaskState::parse(&state_text).ok_or_else(|| format!("unknown state {state_text:?}"))?;
    let labels: BTreeMap<String, String> =
        serde_json::from_str(&row.text("labels")?).map_err(|e| format!("bad labels JSON: {e}"))?;
    Ok(TaskRecord {
        id: id.to_string(),
        namespace: row.text("namespace")?,
        handler: row.text("handler")?,
        payload: row.bytes("payload")?,
        content_type: row.text("content_type")?,
        state,
        priority: row.int32("priority")?,
        labels,
        routing_key: row.text("routing_key")?,
        client_request_id: row.opt_text("client_request_id")?,
        callback_url: row.text("callback_url")?,
        retry: RetryPolicy {
            max_attempts: u32_col("max_attempts")?,
            initial_backoff_ms: row.int("initial_backoff_ms")?,
            multiplier: row.float("backoff_multiplier")?,
            max_backoff_ms: row.int("max_backoff_ms")?,
        },
        timeout_ms: row.int("timeout_ms")?,
        run_at: row.int("run_at")?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
        times: StateTimes {
            pending: row.opt_int("pending_at")?,
            ready: row.opt_int("ready_at")?,
            dispatching: row.opt_int("dispatching_at")?,
            running: row.opt_int("running_at")?,
            retrying: row.opt_int("retrying_at")?,
            end: row.opt_int("ended_at")?,
        },
        attempt: u32_col("attempt")?,
        run_count: u32_col("run_count")?,
        execution_id: row.opt_text("execution_id")?,
        worker_id: row.opt_text("worker_id")?,
        next_at: row.opt_int("next_at")?,
        output: row.opt_bytes("output")?,
        output_content_type: row.text("output_content_type")?,
        error_message: row.text("error_message")?,
        version: row.int("version")?,
        traceparent: row.text("traceparent")?,
        balancer: match row.opt_text("balancer")? {
            None => None,
            Some(b) => Some(Strategy::parse(&b).ok_or_else(|| format!("unknown balancer {b:?}"))?),
        },
        schedule_id: row.opt_text("schedule_id")?,
        concurrency: concurrency(row)?,
        workflow: workflow(row)?,
        parent_task_id: row.opt_text("parent_task_id")?,
        broadcast: row.int("broadcast")? == SPREAD_BROADCAST,
        runs_workflow: row.int("broadcast")? == SPREAD_WORKFLOW_RUN,
        shard: shard(row)?,
        attempts: Vec::new(),
        callback: None,
    })
}

/// The `shard_index` and `shard_total` columns: a total of 0 is no shard.
fn shard(row: &impl Columns) -> Result<Option<taskmesh_core::ShardOf>, String> {
    let total = row.int("shard_total")?;
    if total == 0 {
        return Ok(None);
    }
    let index = row.int("shard_index")?;
    match (u32::try_from(index), u32::try_from(total)) {
        (Ok(index), Ok(total)) if index < total => {
            Ok(Some(taskmesh_core::ShardOf { index, total }))
        }
        _ => Err(format!(
            "shard_index = {index} of shard_total = {total} is out of range"
        )),
    }
}

/// `depends_on` of a workflow's on_failure step: it depends on the
/// failure of any step (`*` is no step's name).
pub(crate) const ON_FAILURE_DEPENDS_ON: &str = r#"["*"]"#;

/// First in `depends_on` of a step run after its parents end, before its
/// parents' names (no step name starts with `*`).
pub(crate) const AFTER_END_MARK: &str = "*ended";

/// The `workflow_id`, `workflow_step` and `depends_on` columns: a step
/// has all three (its parents' outputs are read at claim time only).
fn workflow(row: &impl Columns) -> Result<Option<StepLink>, String> {
    let Some(workflow_id) = row.opt_text("workflow_id")? else {
        return Ok(None);
    };
    let step = row
        .opt_text("workflow_step")?
        .ok_or("workflow_step is NULL on a workflow's step")?;
    let (mut depends_on, on_failure) = match row.opt_text("depends_on")? {
        None => (Vec::new(), false),
        Some(text) if text == ON_FAILURE_DEPENDS_ON => (Vec::new(), true),
        Some(text) => (
            serde_json::from_str::<Vec<String>>(&text)
                .map_err(|e| format!("bad depends_on JSON: {e}"))?,
            false,
        ),
    };
    let after_parents_end = depends_on.first().is_some_and(|d| d == AFTER_END_MARK);
    if after_parents_end {
        depends_on.remove(0);
    }
    Ok(Some(StepLink {
        workflow_id,
        step,
        depends_on,
        on_failure,
        after_parents_end,
        parent_outputs: Vec::new(),
    }))
}

/// The `concurrency_key` and `concurrency_limit` columns: no key is none
/// (its limit is 0); a key's limit must be one a request may give.
fn concurrency(row: &impl Columns) -> Result<Option<Concurrency>, String> {
    let Some(key) = row.opt_text("concurrency_key")? else {
        return Ok(None);
    };
    let limit = row.int("concurrency_limit")?;
    match u32::try_from(limit) {
        Ok(limit) if (1..=taskmesh_core::task::MAX_CONCURRENCY_LIMIT).contains(&limit) => {
            Ok(Some(Concurrency { key, limit }))
        }
        _ => Err(format!(
            "concurrency_limit = {limit} is out of range for key {key:?}"
        )),
    }
}

/// Reads an attempt of task `task_id` from a row of the `attempts` table.
pub(crate) fn attempt(row: &impl Columns, task_id: &str) -> Result<AttemptRecord> {
    let number = row.int("number");
    let outcome = row.opt_text("outcome");
    let decoded = (|| {
        let number = number?;
        Ok::<_, String>(AttemptRecord {
            number: u32::try_from(number)
                .map_err(|_| format!("number = {number} is out of range"))?,
            execution_id: row.text("execution_id")?,
            worker_id: row.text("worker_id")?,
            started_at: row.int("started_at")?,
            ended_at: row.opt_int("ended_at")?,
            outcome: parse_outcome(outcome?)?,
            message: row.text("message")?,
        })
    })();
    decoded.map_err(|e| bad_task(task_id, format_args!("bad attempts row: {e}")))
}

/// Reads a callback outbox entry from a row of the `callbacks` table.
pub(crate) fn callback(row: &impl Columns) -> Result<CallbackDelivery> {
    let task_id = row.text("task_id").unwrap_or_default();
    let decoded = (|| {
        let state = row.text("state")?;
        let attempts = row.int("attempts")?;
        Ok::<_, String>(CallbackDelivery {
            delivery_id: row.text("delivery_id")?,
            url: row.text("url")?,
            state: parse_callback_state(&state)?,
            attempts: u32::try_from(attempts)
                .map_err(|_| format!("attempts = {attempts} is out of range"))?,
            last_error: row.text("last_error")?,
            next_attempt_at: row.opt_int("next_attempt_at")?,
            delivered_at: row.opt_int("delivered_at")?,
            created_at: row.int("created_at")?,
        })
    })();
    decoded.map_err(|e| bad_task(&task_id, format_args!("bad callbacks row: {e}")))
}

/// A callback state column.
pub(crate) fn parse_callback_state(text: &str) -> Result<CallbackState, String> {
    CallbackState::parse(text).ok_or_else(|| format!("unknown state {text:?}"))
}

/// An attempt outcome column.
pub(crate) fn parse_outcome(text: Option<String>) -> Result<Option<AttemptOutcome>, String> {
    match text {
        None => Ok(None),
        Some(text) => AttemptOutcome::parse(&text)
            .map(Some)
            .ok_or_else(|| format!("unknown outcome {text:?}")),
    }
}

/// The error for a task row that cannot be read or written.
pub(crate) fn bad_task(task_id: &str, what: impl Display) -> Error {
    Error::Internal(format!("task {task_id}: bad row: {what}"))
}

/// The error for a schedule row that cannot be read or written.
pub(crate) fn bad_schedule(id: &str, what: impl Display) -> Error {
    Error::Internal(format!("schedule {id}: {what}"))
}

/// Reads a schedule from a row of the backend's schedule columns.
pub(crate) fn schedule(row: &impl Columns) -> Result<ScheduleRecord> {
    let id = row
        .text("id")
        .map_err(|e| Error::Internal(format!("schedule row without an id: {e}")))?;
    decode_schedule(row, &id).map_err(|e| bad_schedule(&id, e))
}

fn decode_schedule(row: &impl Columns, id: &str) -> Result<ScheduleRecord, String> {
    let text = row.text("kind")?;
    let kind = ScheduleKind::parse(&text).ok_or_else(|| format!("unknown kind {text}"))?;
    let text = row.text("misfire_policy")?;
    let misfire =
        MisfirePolicy::parse(&text).ok_or_else(|| format!("unknown misfire policy {text}"))?;
    let text = row.text("overlap_policy")?;
    let overlap =
        OverlapPolicy::parse(&text).ok_or_else(|| format!("unknown overlap policy {text}"))?;
    let StoredTemplate { template, workflow } = serde_json::from_str(&row.text("template")?)
        .map_err(|err| format!("bad template: {err}"))?;
    let count = |col: &str| -> Result<u64, String> {
        let v = row.int(col)?;
        u64::try_from(v).map_err(|_| format!("{col} = {v}"))
    };
    let max_catch_up = row.int("max_catch_up")?;
    Ok(ScheduleRecord {
        id: id.to_string(),
        namespace: row.text("namespace")?,
        name: row.text("name")?,
        kind,
        cron_expression: row.text("cron_expression")?,
        interval_ms: row.int("interval_ms")?,
        time_zone: row.text("time_zone")?,
        template,
        workflow,
        misfire,
        max_catch_up: u32::try_from(max_catch_up).map_err(|_| "max_catch_up".to_string())?,
        overlap,
        paused: row.flag("paused")?,
        next_fire_at: row.opt_int("next_fire_at")?,
        last_fire_at: row.opt_int("last_fire_at")?,
        last_task_id: row.opt_text("last_task_id")?,
        fire_count: count("fire_count")?,
        skipped_count: count("skipped_count")?,
        created_at: row.int("created_at")?,
        updated_at: row.int("updated_at")?,
        version: row.int("version")?,
    })
}

/// Reads a row of `tokens`.
pub(crate) fn token(row: &impl Columns) -> Result<taskmesh_core::auth::TokenRecord> {
    let decoded = (|| {
        let role = row.text("role")?;
        Ok::<_, String>(taskmesh_core::auth::TokenRecord {
            id: row.text("id")?,
            name: row.text("name")?,
            namespace: row.text("namespace")?,
            role: taskmesh_core::auth::Role::parse(&role)
                .ok_or_else(|| format!("unknown role {role:?}"))?,
            secret_hash: row.text("secret_hash")?,
            created_at: row.int("created_at")?,
            expires_at: row.opt_int("expires_at")?,
            revoked_at: row.opt_int("revoked_at")?,
        })
    })();
    decoded.map_err(|e| Error::Internal(format!("bad tokens row: {e}")))
}

/// Reads a row of `schedule_fires`.
pub(crate) fn fire(row: &impl Columns) -> Result<FireRecord> {
    let decoded = (|| {
        let outcome = row.text("outcome")?;
        Ok::<_, String>(FireRecord {
            fire_at: row.int("fire_at")?,
            handled_at: row.int("handled_at")?,
            outcome: FireOutcome::parse(&outcome)
                .ok_or_else(|| format!("unknown fire outcome {outcome}"))?,
            task_id: row.opt_text("task_id")?,
        })
    })();
    decoded.map_err(|e| Error::Internal(format!("bad schedule_fires row: {e}")))
}

/// The `broadcast` column of a task that is a sharding broadcast.
const SPREAD_BROADCAST: i64 = 1;
/// The `broadcast` column of a schedule's workflow run: the column says
/// what a task the leader spreads is spread into (0 for a task it does not
/// spread), so a run costs no column of its own.
const SPREAD_WORKFLOW_RUN: i64 = 2;

/// The `broadcast` column's value for `task`.
pub(crate) fn spread_kind(task: &TaskRecord) -> i64 {
    if task.broadcast {
        SPREAD_BROADCAST
    } else if task.runs_workflow {
        SPREAD_WORKFLOW_RUN
    } else {
        0
    }
}

/// A schedule's `template` column: the task template, and beside its
/// fields the workflow it starts, if it starts one (left out otherwise, so
/// the column reads as it did before schedules started workflows).
#[derive(Serialize, Deserialize)]
struct StoredTemplate {
    #[serde(flatten)]
    template: TaskTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workflow: Option<WorkflowSpec>,
}

/// The JSON text of a schedule's template, as every backend stores it.
pub(crate) fn template_json(s: &ScheduleRecord) -> Result<String> {
    serde_json::to_string(&StoredTemplate {
        template: s.template.clone(),
        workflow: s.workflow.clone(),
    })
    .map_err(|err| bad_schedule(&s.id, format!("cannot encode template: {err}")))
}

/// The JSON text of a task's labels, as both backends store it.
pub(crate) fn labels_json(task: &TaskRecord) -> Result<String> {
    serde_json::to_string(&task.labels)
        .map_err(|e| bad_task(&task.id, format_args!("cannot encode labels: {e}")))
}

/// Reads a row of the `workflows` table (steps left empty).
pub(crate) fn workflow_row(row: &impl Columns) -> Result<WorkflowRecord> {
    let id = row.text("id");
    let decoded = (|| {
        let policy = row.text("failure_policy")?;
        let state = row.text("state")?;
        let steps = row.int("step_count")?;
        Ok::<_, String>(WorkflowRecord {
            id: row.text("id")?,
            namespace: row.text("namespace")?,
            client_request_id: row.opt_text("client_request_id")?,
            failure_policy: FailurePolicy::parse(&policy)
                .ok_or_else(|| format!("unknown failure_policy {policy:?}"))?,
            state: WorkflowState::parse(&state)
                .ok_or_else(|| format!("unknown state {state:?}"))?,
            message: row.text("message")?,
            step_count: u32::try_from(steps)
                .map_err(|_| format!("step_count = {steps} is out of range"))?,
            created_at: row.int("created_at")?,
            updated_at: row.int("updated_at")?,
            ended_at: row.opt_int("ended_at")?,
            parent_task_id: row.opt_text("parent_task_id")?,
            steps: Vec::new(),
        })
    })();
    decoded.map_err(|e| {
        Error::Internal(format!(
            "workflow {}: bad row: {e}",
            id.unwrap_or_else(|_| "?".into())
        ))
    })
}
