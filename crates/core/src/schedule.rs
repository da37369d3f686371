//! Schedules: a timetable plus a task template (or a workflow, started by
//! a run task each fire), and the pure decision of
//! what a due schedule does now — which fire times create a task, which are
//! skipped as misfires, and when it fires next.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    UnixMillis,
    task::{NewTask, RetryPolicy, Strategy},
    timetable::{Timetable, cached_cron, parse_zone},
    workflow::WorkflowSpec,
};

/// Most fire times one plan looks at; a schedule further behind than this
/// catches up over several rounds.
pub const MAX_FIRES_PER_PLAN: usize = 10_000;
/// Default bound of CATCH_UP.
pub const DEFAULT_MAX_CATCH_UP: u32 = 10;

/// How fire times are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduleKind {
    /// A cron expression in a time zone.
    Cron,
    /// Every interval from the previous fire time.
    FixedRate,
    /// An interval after the previous run ended.
    FixedDelay,
}

/// What happens to fire times missed while nothing was scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MisfirePolicy {
    /// One task now for all the missed times.
    FireOnceNow,
    /// Drop the missed times.
    Skip,
    /// Each missed time, bounded by `max_catch_up`.
    CatchUp,
}

/// What happens when a fire comes while the previous run is not terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OverlapPolicy {
    /// Create the task anyway.
    Allow,
    /// Record the fire as skipped.
    Skip,
    /// Cancel the previous run, then create.
    CancelPrevious,
}

/// What became of one fire time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FireOutcome {
    /// A task was created.
    Created,
    /// Skipped: the previous run was still going.
    SkippedOverlap,
    /// Skipped: missed during downtime.
    SkippedMisfire,
    /// Created after cancelling the previous run.
    CreatedCancelledPrevious,
}

macro_rules! text_enum {
    ($t:ty { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            /// Stable text form used in the store.
            pub fn as_str(self) -> &'static str {
                match self { $(<$t>::$v => $s),+ }
            }
            /// Parses the text form.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($s => Some(<$t>::$v),)+ _ => None }
            }
        }
    };
}
text_enum!(ScheduleKind { Cron => "CRON", FixedRate => "FIXED_RATE", FixedDelay => "FIXED_DELAY" });
text_enum!(MisfirePolicy { FireOnceNow => "FIRE_ONCE_NOW", Skip => "SKIP", CatchUp => "CATCH_UP" });
text_enum!(OverlapPolicy { Allow => "ALLOW", Skip => "SKIP", CancelPrevious => "CANCEL_PREVIOUS" });
text_enum!(FireOutcome {
    Created => "CREATED",
    SkippedOverlap => "SKIPPED_OVERLAP",
    SkippedMisfire => "SKIPPED_MISFIRE",
    CreatedCancelledPrevious => "CREATED_CANCELLED_PREVIOUS",
});

/// The task each fire creates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskTemplate {
    /// Handler name.
    pub handler: String,
    /// Input bytes.
    pub payload: Vec<u8>,
    /// Media type of the payload.
    pub content_type: String,
    /// Priority.
    pub priority: i32,
    /// Labels a worker must carry.
    pub labels: BTreeMap<String, String>,
    /// Consistent-hash key.
    pub routing_key: String,
    /// Retry policy, defaults filled in.
    pub retry: RetryPolicy,
    /// Execution timeout.
    pub timeout_ms: i64,
    /// Callback URL.
    pub callback_url: String,
    /// Balancer override.
    pub balancer: Option<Strategy>,
    /// Concurrency key and limit of the created tasks (absent from
    /// templates stored before keys existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::task::Concurrency>,
    /// Each created task is a sharding broadcast (absent from templates
    /// stored before broadcasts existed, and left out when false so their
    /// fingerprints stay as they were).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broadcast: bool,
}

/// The handler name of a schedule's workflow run: it names no worker's
/// handler (a run is never dispatched), only what the run is in listings.
pub const WORKFLOW_RUN_HANDLER: &str = "workflow";

impl TaskTemplate {
    /// The template of a workflow run: handler [`WORKFLOW_RUN_HANDLER`],
    /// nothing else (the run has no payload, attempt or deadline).
    pub fn workflow_run() -> Self {
        TaskTemplate {
            handler: WORKFLOW_RUN_HANDLER.to_string(),
            payload: Vec::new(),
            content_type: String::new(),
            priority: 0,
            labels: BTreeMap::new(),
            routing_key: String::new(),
            retry: RetryPolicy::default(),
            timeout_ms: crate::task::DEFAULT_TIMEOUT_MS,
            callback_url: String::new(),
            balancer: None,
            concurrency: None,
            broadcast: false,
        }
    }
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    /// Id.
    pub id: String,
    /// The namespace it and the tasks it fires belong to.
    pub namespace: String,
    /// Human-readable name.
    pub name: String,
    /// Kind.
    pub kind: ScheduleKind,
    /// Cron expression (CRON only).
    pub cron_expression: String,
    /// Interval (FIXED_RATE, FIXED_DELAY).
    pub interval_ms: i64,
    /// IANA zone; empty means UTC.
    pub time_zone: String,
    /// The task each fire creates; for a schedule that starts a workflow
    /// ([`Self::workflow`]), the run's (handler [`WORKFLOW_RUN_HANDLER`]).
    pub template: TaskTemplate,
    /// The workflow each fire starts, if it starts one: the fire's task is
    /// its run ([`crate::TaskRecord::runs_workflow`]), spread into it by
    /// the leader when due.
    pub workflow: Option<WorkflowSpec>,
    /// Misfire policy.
    pub misfire: MisfirePolicy,
    /// Bound of CATCH_UP.
    pub max_catch_up: u32,
    /// Overlap policy.
    pub overlap: OverlapPolicy,
    /// Paused schedules do not fire.
    pub paused: bool,
    /// Next fire time; `None` while paused, when none is left, or while a
    /// fixed-delay schedule waits for its run to end.
    pub next_fire_at: Option<UnixMillis>,
    /// Last fire time handled.
    pub last_fire_at: Option<UnixMillis>,
    /// Task created by the last fire.
    pub last_task_id: Option<String>,
    /// Fires that created a task.
    pub fire_count: u64,
    /// Fires skipped.
    pub skipped_count: u64,
    /// When created.
    pub created_at: UnixMillis,
    /// When last changed.
    pub updated_at: UnixMillis,
    /// Compare-and-set key.
    pub version: i64,
}

impl ScheduleRecord {
    /// Checks the definition; returns its timetable.
    pub fn timetable(&self) -> Result<Timetable, String> {
        let tz = parse_zone(&self.time_zone)?;
        match self.kind {
            ScheduleKind::Cron => Ok(Timetable::Cron {
                cron: cached_cron(&self.cron_expression)?,
                tz,
            }),
            ScheduleKind::FixedRate | ScheduleKind::FixedDelay => {
                if self.interval_ms < 1_000 {
                    return Err("interval must be at least 1 s".into());
                }
                Ok(if self.kind == ScheduleKind::FixedRate {
                    Timetable::FixedRate {
                        anchor: self.created_at,
                        interval_ms: self.interval_ms,
                    }
                } else {
                    Timetable::FixedDelay {
                        interval_ms: self.interval_ms,
                    }
                })
            }
        }
    }

    /// The first fire time after `now` for a new or resumed schedule.
    pub fn first_fire_after(&self, now: UnixMillis) -> Result<Option<UnixMillis>, String> {
        let tt = self.timetable()?;
        Ok(match tt {
            // A fixed-delay schedule's first run is one interval after it starts.
            Timetable::FixedDelay { interval_ms } => Some(now + interval_ms),
            tt => tt.next_after(now),
        })
    }

    /// The idempotency key of the task for fire time `fire_at`: one fire can
    /// never create two tasks.
    pub fn fire_key(&self, fire_at: UnixMillis) -> String {
        format!("schedule:{}:{}", self.id, fire_at)
    }

    /// The task for fire time `fire_at` (the workflow's run, for a
    /// schedule that starts one).
    pub fn new_task(&self, id: String, fire_at: UnixMillis, now: UnixMillis) -> NewTask {
        NewTask {
            client_request_id: Some(self.fire_key(fire_at)),
            schedule_id: Some(self.id.clone()),
            runs_workflow: self.workflow.is_some(),
            // Never before its fire time, never before now.
            ..self.template.to_task(id, &self.namespace, fire_at.max(now))
        }
    }
}

impl TaskTemplate {
    /// A task of this template in `namespace`, due at `run_at`, with no
    /// idempotency key, schedule or workflow.
    pub fn to_task(&self, id: String, namespace: &str, run_at: UnixMillis) -> NewTask {
        let t = self;
        NewTask {
            id,
            namespace: namespace.to_string(),
            handler: t.handler.clone(),
            payload: t.payload.clone(),
            content_type: t.content_type.clone(),
            priority: t.priority,
            labels: t.labels.clone(),
            routing_key: t.routing_key.clone(),
            client_request_id: None,
            callback_url: t.callback_url.clone(),
            retry: t.retry.clone(),
            timeout_ms: t.timeout_ms,
            run_at,
            traceparent: String::new(),
            balancer: t.balancer,
            schedule_id: None,
            concurrency: t.concurrency.clone(),
            workflow: None,
            parent_task_id: None,
            broadcast: t.broadcast,
            runs_workflow: false,
            shard: None,
        }
    }
}

/// A handled fire time, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireRecord {
    /// The scheduled instant.
    pub fire_at: UnixMillis,
    /// When it was handled.
    pub handled_at: UnixMillis,
    /// What became of it.
    pub outcome: FireOutcome,
    /// The task created, if any.
    pub task_id: Option<String>,
}

/// One fire time and what the timetable says of it (before overlap rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedFire {
    /// The scheduled instant.
    pub fire_at: UnixMillis,
    /// Created, or skipped as a misfire.
    pub outcome: FireOutcome,
}

/// What a due schedule does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirePlan {
    /// Due fire times in order, each to create a task or be skipped.
    pub fires: Vec<PlannedFire>,
    /// The next fire time after this plan.
    pub next_fire_at: Option<UnixMillis>,
}

/// Plans the due fires of `schedule` at `now`. A fire time later than
/// `misfire_threshold_ms` behind `now` counts as missed (the scheduler was
/// down or paused), and the misfire policy decides its fate.
pub fn plan_fires(
    schedule: &ScheduleRecord,
    now: UnixMillis,
    misfire_threshold_ms: i64,
) -> Result<FirePlan, String> {
    let tt = schedule.timetable()?;
    let Some(first) = schedule.next_fire_at else {
        return Ok(FirePlan {
            fires: Vec::new(),
            next_fire_at: None,
        });
    };
    if first > now || schedule.paused {
        return Ok(FirePlan {
            fires: Vec::new(),
            next_fire_at: Some(first),
        });
    }
    // Every due fire time, oldest first.
    let mut due = vec![first];
    let mut next = tt.next_after(first);
    while let Some(t) = next {
        if t > now || due.len() >= MAX_FIRES_PER_PLAN {
            break;
        }
        due.push(t);
        next = tt.next_after(t);
    }
    let missed = |t: UnixMillis| now - t > misfire_threshold_ms;
    let created = |t| PlannedFire {
        fire_at: t,
        outcome: FireOutcome::Created,
    };
    let skipped = |t| PlannedFire {
        fire_at: t,
        outcome: FireOutcome::SkippedMisfire,
    };
    let fires: Vec<PlannedFire> = if !due.iter().copied().any(missed) {
        due.iter().map(|&t| created(t)).collect()
    } else {
        match schedule.misfire {
            MisfirePolicy::Skip => due
                .iter()
                .map(|&t| if missed(t) { skipped(t) } else { created(t) })
                .collect(),
            MisfirePolicy::FireOnceNow => {
                let last = due.len() - 1;
                due.iter()
                    .enumerate()
                    .map(|(i, &t)| if i == last { created(t) } else { skipped(t) })
                    .collect()
            }
            MisfirePolicy::CatchUp => {
                let bound = match schedule.max_catch_up {
                    0 => DEFAULT_MAX_CATCH_UP,
                    n => n,
                } as usize;
                let keep_from = due.len().saturating_sub(bound);
                due.iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        if i >= keep_from {
                            created(t)
                        } else {
                            skipped(t)
                        }
                    })
                    .collect()
            }
        }
    };
    let next_fire_at = match tt {
        // Waits for the run to end (see Timetable::next_after_run).
        Timetable::FixedDelay { .. } => None,
        _ => next,
    };
    Ok(FirePlan {
        fires,
        next_fire_at,
    })
}

#[cfg(test)]
mod tests;
