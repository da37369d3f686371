//! The schedule half of `TaskApi`: validation, wire conversions and the
//! compare-and-set writes behind create, update, pause, resume, delete and
//! trigger. Fire times themselves are the scheduler's business.

use taskmesh::v1 as pb;
use taskmesh_core::breaker::BreakerState;
use taskmesh_core::schedule::{
    FireOutcome, FireRecord, MisfirePolicy, OverlapPolicy, ScheduleKind, ScheduleRecord,
    TaskTemplate,
};
use taskmesh_core::{Concurrency, id, task, validate};
use taskmesh_store::FireCommit;

use crate::convert::{
    concurrency_to_pb, duration, duration_millis, strategy_from_pb, strategy_to_pb, timestamp,
};
use crate::engine::Shared;
use crate::{Error, task_api::retry_policy};

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// How many times an API write re-reads after losing a compare-and-set.
const CAS_TRIES: usize = 5;

/// Parses a schedule id given by a caller.
pub(crate) fn schedule_id_of(text: &str) -> Result<String, Error> {
    if text.is_empty() {
        return Err(invalid("schedule_id must not be empty"));
    }
    id::parse_task_id(text).ok_or_else(|| {
        invalid(format!(
            "schedule_id {text:?} is not a valid schedule id (a UUID)"
        ))
    })
}

/// Reads a schedule of `namespace` or fails with NOT_FOUND (also when it
/// belongs to another namespace: never confirm it exists).
pub(crate) async fn load(
    shared: &Shared,
    namespace: &str,
    id: &str,
) -> Result<ScheduleRecord, Error> {
    shared
        .store
        .get_schedule(id)
        .await?
        .filter(|s| s.namespace == namespace)
        .ok_or_else(|| Error::NotFound(format!("schedule {id} not found")))
}

/// The definition part of a wire schedule, validated, applied onto `base`
/// (whose identity, counters and times are kept).
pub(crate) fn apply_definition(
    shared: &Shared,
    base: &mut ScheduleRecord,
    def: pb::Schedule,
) -> Result<(), Error> {
    validate::short_text("schedule.name", &def.name).map_err(invalid)?;
    let kind = match pb::ScheduleKind::try_from(def.kind) {
        Ok(pb::ScheduleKind::Cron) => ScheduleKind::Cron,
        Ok(pb::ScheduleKind::FixedRate) => ScheduleKind::FixedRate,
        Ok(pb::ScheduleKind::FixedDelay) => ScheduleKind::FixedDelay,
        _ => {
            return Err(invalid(
                "schedule.kind must be SCHEDULE_KIND_CRON, SCHEDULE_KIND_FIXED_RATE or SCHEDULE_KIND_FIXED_DELAY",
            ));
        }
    };
    let interval_ms = match (&def.interval, kind) {
        (_, ScheduleKind::Cron) => 0,
        (Some(d), _) => {
            duration_millis(d).ok_or_else(|| invalid("schedule.interval must not be negative"))?
        }
        (None, _) => {
            return Err(invalid(
                "schedule.interval is required for fixed-rate and fixed-delay schedules",
            ));
        }
    };
    if kind != ScheduleKind::Cron && !(1_000..=366 * 24 * 3_600_000).contains(&interval_ms) {
        return Err(invalid(
            "schedule.interval must be between 1 s and 366 days",
        ));
    }
    if kind == ScheduleKind::Cron && def.cron_expression.len() > 256 {
        return Err(invalid("schedule.cron_expression is longer than 256 bytes"));
    }
    let misfire = match pb::MisfirePolicy::try_from(def.misfire_policy) {
        Ok(pb::MisfirePolicy::Unspecified | pb::MisfirePolicy::FireOnceNow) => {
            MisfirePolicy::FireOnceNow
        }
        Ok(pb::MisfirePolicy::Skip) => MisfirePolicy::Skip,
        Ok(pb::MisfirePolicy::CatchUp) => MisfirePolicy::CatchUp,
        Err(_) => {
            return Err(invalid(format!(
                "schedule.misfire_policy {} is unknown",
                def.misfire_policy
            )));
        }
    };
    let overlap = match pb::OverlapPolicy::try_from(def.overlap_policy) {
        Ok(pb::OverlapPolicy::Unspecified | pb::OverlapPolicy::Allow) => OverlapPolicy::Allow,
        Ok(pb::OverlapPolicy::Skip) => OverlapPolicy::Skip,
        Ok(pb::OverlapPolicy::CancelPrevious) => OverlapPolicy::CancelPrevious,
        Err(_) => {
            return Err(invalid(format!(
                "schedule.overlap_policy {} is unknown",
                def.overlap_policy
            )));
        }
    };
    if def.max_catch_up > 1_000 {
        return Err(invalid("schedule.max_catch_up must be at most 1000"));
    }
    let (template, workflow) = match (def.template, def.workflow) {
        (Some(t), None) => (template(shared, Some(t))?, None),
        (None, Some(w)) => (
            TaskTemplate::workflow_run(),
            Some(crate::workflow_api::spec_from_pb(
                shared,
                w.failure_policy,
                w.steps,
                w.on_failure,
                "schedule.workflow.",
            )?),
        ),
        (Some(_), Some(_)) => {
            return Err(invalid(
                "a schedule has a template (a task per fire) or a workflow (a workflow per fire), not both",
            ));
        }
        (None, None) => {
            return Err(invalid(
                "schedule.template is required (or schedule.workflow, for a workflow per fire)",
            ));
        }
    };
    base.name = def.name;
    base.kind = kind;
    base.cron_expression = if kind == ScheduleKind::Cron {
        def.cron_expression.trim().to_string()
    } else {
        String::new()
    };
    base.interval_ms = interval_ms;
    base.time_zone = def.time_zone;
    base.template = template;
    base.workflow = workflow;
    base.misfire = misfire;
    base.max_catch_up = def.max_catch_up;
    base.overlap = overlap;
    // Parses the expression and the zone: refuse what could never fire.
    let timetable = base.timetable().map_err(invalid)?;
    shared.quotas.schedule_interval(shortest_interval(
        &timetable,
        kind,
        interval_ms,
        shared.clock.now_millis(),
    ))?;
    Ok(())
}

/// The shortest time between two fires: the interval, or for a cron the
/// smallest gap among its next 64 fires (a cron fires at most every second).
fn shortest_interval(
    timetable: &taskmesh_core::timetable::Timetable,
    kind: ScheduleKind,
    interval_ms: i64,
    now: i64,
) -> std::time::Duration {
    let ms = if kind == ScheduleKind::Cron {
        let mut shortest = i64::MAX;
        let mut at = timetable.next_after(now);
        for _ in 0..64 {
            let Some(prev) = at else { break };
            at = timetable.next_after(prev);
            if let Some(next) = at {
                shortest = shortest.min(next - prev);
            }
        }
        shortest
    } else {
        interval_ms
    };
    std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

fn template(shared: &Shared, t: Option<pb::TaskTemplate>) -> Result<TaskTemplate, Error> {
    template_at(shared, t, "schedule.template")
}

/// A task template from the wire, checked; errors name it as `at`
/// (`schedule.template`, `steps[2].template`).
pub(crate) fn template_at(
    shared: &Shared,
    t: Option<pb::TaskTemplate>,
    at: &str,
) -> Result<TaskTemplate, Error> {
    let t = t.ok_or_else(|| invalid(format!("{at} is required")))?;
    validate::handler_name(&t.handler).map_err(|m| invalid(format!("{at}: {m}")))?;
    let payload = t.payload.unwrap_or_default();
    if payload.data.len() > shared.opts.max_payload_bytes {
        return Err(invalid(format!(
            "{at}.payload is {} bytes; the limit is {} bytes",
            payload.data.len(),
            shared.opts.max_payload_bytes
        )));
    }
    if t.broadcast {
        taskmesh_core::broadcast::check_payload(&payload.data)
            .map_err(|m| invalid(format!("{at}: {m}")))?;
    }
    validate::short_text(&format!("{at}.payload.content_type"), &payload.content_type)
        .map_err(invalid)?;
    validate::labels(&format!("{at}.labels"), t.labels.iter()).map_err(invalid)?;
    validate::short_text(&format!("{at}.routing_key"), &t.routing_key).map_err(invalid)?;
    crate::task_api::callback_url(&t.callback_url, &shared.opts.egress)?;
    let timeout_ms = match &t.timeout {
        None => task::DEFAULT_TIMEOUT_MS,
        Some(d) => match duration_millis(d) {
            Some(ms) if (1..=7 * 24 * 3_600_000).contains(&ms) => ms,
            _ => {
                return Err(invalid(format!(
                    "{at}.timeout must be between 1 ms and 7 days"
                )));
            }
        },
    };
    let balancer = pb::BalancerStrategy::try_from(t.balancer)
        .map_err(|_| invalid(format!("{at}.balancer {} is unknown", t.balancer)))?;
    Ok(TaskTemplate {
        handler: t.handler,
        payload: payload.data,
        content_type: payload.content_type,
        priority: t.priority,
        labels: t.labels.into_iter().collect(),
        routing_key: t.routing_key,
        retry: retry_policy(t.retry_policy)?,
        timeout_ms,
        callback_url: t.callback_url,
        balancer: strategy_from_pb(balancer),
        concurrency: Concurrency::from_parts(&t.concurrency_key, t.concurrency_limit)
            .map_err(|e| invalid(format!("{at}.{e}")))?,
        broadcast: t.broadcast,
    })
}

/// The wire form of a task template.
pub(crate) fn template_to_pb(t: &TaskTemplate) -> pb::TaskTemplate {
    let (concurrency_key, concurrency_limit) = concurrency_to_pb(t.concurrency.as_ref());
    pb::TaskTemplate {
        handler: t.handler.clone(),
        payload: Some(pb::Payload {
            data: t.payload.clone(),
            content_type: t.content_type.clone(),
        }),
        priority: t.priority,
        labels: t
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        routing_key: t.routing_key.clone(),
        retry_policy: Some(pb::RetryPolicy {
            max_attempts: t.retry.max_attempts,
            initial_backoff: Some(duration(t.retry.initial_backoff_ms)),
            multiplier: t.retry.multiplier,
            max_backoff: Some(duration(t.retry.max_backoff_ms)),
        }),
        timeout: Some(duration(t.timeout_ms)),
        callback_url: t.callback_url.clone(),
        balancer: strategy_to_pb(t.balancer) as i32,
        concurrency_key,
        concurrency_limit,
        broadcast: t.broadcast,
    }
}

/// The wire form of a schedule.
pub(crate) fn to_pb(s: &ScheduleRecord) -> pb::Schedule {
    pb::Schedule {
        schedule_id: s.id.clone(),
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        kind: match s.kind {
            ScheduleKind::Cron => pb::ScheduleKind::Cron,
            ScheduleKind::FixedRate => pb::ScheduleKind::FixedRate,
            ScheduleKind::FixedDelay => pb::ScheduleKind::FixedDelay,
        } as i32,
        cron_expression: s.cron_expression.clone(),
        interval: (s.kind != ScheduleKind::Cron).then(|| duration(s.interval_ms)),
        time_zone: s.time_zone.clone(),
        template: s.workflow.is_none().then(|| template_to_pb(&s.template)),
        workflow: s.workflow.as_ref().map(crate::workflow_api::spec_to_pb),
        misfire_policy: match s.misfire {
            MisfirePolicy::FireOnceNow => pb::MisfirePolicy::FireOnceNow,
            MisfirePolicy::Skip => pb::MisfirePolicy::Skip,
            MisfirePolicy::CatchUp => pb::MisfirePolicy::CatchUp,
        } as i32,
        max_catch_up: s.max_catch_up,
        overlap_policy: match s.overlap {
            OverlapPolicy::Allow => pb::OverlapPolicy::Allow,
            OverlapPolicy::Skip => pb::OverlapPolicy::Skip,
            OverlapPolicy::CancelPrevious => pb::OverlapPolicy::CancelPrevious,
        } as i32,
        paused: s.paused,
        next_fire_time: s.next_fire_at.map(timestamp),
        last_fire_time: s.last_fire_at.map(timestamp),
        last_task_id: s.last_task_id.clone().unwrap_or_default(),
        fire_count: s.fire_count,
        skipped_count: s.skipped_count,
        create_time: Some(timestamp(s.created_at)),
        update_time: Some(timestamp(s.updated_at)),
        version: s.version,
    }
}

/// The wire form of a fire record.
pub(crate) fn fire_to_pb(f: &FireRecord) -> pb::ScheduleFire {
    pb::ScheduleFire {
        fire_time: Some(timestamp(f.fire_at)),
        handled_time: Some(timestamp(f.handled_at)),
        outcome: match f.outcome {
            FireOutcome::Created => pb::FireOutcome::Created,
            FireOutcome::SkippedOverlap => pb::FireOutcome::SkippedOverlap,
            FireOutcome::SkippedMisfire => pb::FireOutcome::SkippedMisfire,
            FireOutcome::CreatedCancelledPrevious => pb::FireOutcome::CreatedCancelledPrevious,
        } as i32,
        task_id: f.task_id.clone().unwrap_or_default(),
    }
}

/// A schedule record made from `def` in `namespace` at `now`, validated
/// as CreateSchedule validates it, not yet stored (its next fire unset).
pub(crate) fn draft(
    shared: &Shared,
    namespace: String,
    def: pb::Schedule,
    now: i64,
) -> Result<ScheduleRecord, Error> {
    let mut s = ScheduleRecord {
        id: id::new_task_id(),
        namespace,
        name: String::new(),
        kind: ScheduleKind::Cron,
        cron_expression: String::new(),
        interval_ms: 0,
        time_zone: String::new(),
        template: TaskTemplate {
            handler: String::new(),
            payload: Vec::new(),
            content_type: String::new(),
            priority: 0,
            labels: Default::default(),
            routing_key: String::new(),
            retry: Default::default(),
            timeout_ms: task::DEFAULT_TIMEOUT_MS,
            callback_url: String::new(),
            balancer: None,
            concurrency: None,
            broadcast: false,
        },
        workflow: None,
        misfire: MisfirePolicy::FireOnceNow,
        max_catch_up: 0,
        overlap: OverlapPolicy::Allow,
        paused: def.paused,
        next_fire_at: None,
        last_fire_at: None,
        last_task_id: None,
        fire_count: 0,
        skipped_count: 0,
        created_at: now,
        updated_at: now,
        version: 1,
    };
    apply_definition(shared, &mut s, def)?;
    Ok(s)
}

/// Creates a schedule from a definition.
pub(crate) async fn create(
    shared: &Shared,
    namespace: String,
    def: pb::Schedule,
) -> Result<ScheduleRecord, Error> {
    let now = shared.clock.now_millis();
    let mut s = draft(shared, namespace, def, now)?;
    // Counting a namespace's schedules reads all of them: only when a
    // limit asks (100,000 schedules made each create read 100,000 rows).
    if shared.quotas.limits_schedules() {
        let existing = shared.store.count_schedules(&s.namespace).await?;
        shared.quotas.admit_schedule(&s.namespace, existing)?;
    }
    if !s.paused {
        s.next_fire_at = s.first_fire_after(now).map_err(invalid)?;
        if s.next_fire_at.is_none() {
            return Err(invalid(
                "the schedule would never fire (its cron expression matches no date)",
            ));
        }
    }
    shared.store.create_schedule(&s).await?;
    Ok(s)
}

/// Reads, changes and writes a schedule with compare-and-set, retrying a
/// lost race a few times.
pub(crate) async fn modify(
    shared: &Shared,
    namespace: &str,
    id: &str,
    mut change: impl FnMut(&mut ScheduleRecord, i64) -> Result<(), Error>,
) -> Result<ScheduleRecord, Error> {
    for _ in 0..CAS_TRIES {
        let old = load(shared, namespace, id).await?;
        let now = shared.clock.now_millis();
        let mut new = old.clone();
        change(&mut new, now)?;
        new.version = old.version + 1;
        new.updated_at = now;
        if shared.store.update_schedule(&new, old.version).await? {
            return Ok(new);
        }
    }
    Err(Error::Store(taskmesh_store::Error::Conflict(format!(
        "schedule {id}"
    ))))
}

/// Recomputes the next fire time of an active schedule from `now`.
pub(crate) fn restart_timetable(s: &mut ScheduleRecord, now: i64) -> Result<(), Error> {
    s.next_fire_at = if s.paused {
        None
    } else {
        s.first_fire_after(now).map_err(invalid)?
    };
    Ok(())
}

/// Creates a task from the schedule now (TriggerSchedule), recorded as a
/// fire at this instant.
pub(crate) async fn trigger(
    shared: &Shared,
    namespace: &str,
    id: &str,
) -> Result<taskmesh_core::TaskRecord, Error> {
    for _ in 0..CAS_TRIES {
        let s = load(shared, namespace, id).await?;
        let now = shared.clock.now_millis();
        let task_id = id::new_task_id();
        let task = s.new_task(task_id.clone(), now, now);
        let fingerprint = task.request_fingerprint(Some(now));
        let mut next = s.clone();
        next.version += 1;
        next.updated_at = now;
        next.last_task_id = Some(task_id.clone());
        next.fire_count += 1;
        let commit = FireCommit {
            schedule: next,
            expected_version: s.version,
            fires: vec![FireRecord {
                fire_at: now,
                handled_at: now,
                outcome: FireOutcome::Created,
                task_id: Some(task_id),
            }],
            tasks: vec![(task, fingerprint)],
            cancel: None,
        };
        if let Some(done) = shared.store.commit_fires(commit, now).await?
            && let Some(task) = done.tasks.into_iter().next()
        {
            shared.wake.notify_one();
            return Ok(task);
        }
    }
    Err(Error::Store(taskmesh_store::Error::Conflict(format!(
        "schedule {id}"
    ))))
}

/// The circuit breakers of `namespace` on the wire.
pub(crate) fn breakers(shared: &Shared, namespace: &str) -> Vec<pb::CircuitBreaker> {
    shared
        .breakers
        .snapshot()
        .into_iter()
        .filter(|((ns, _), _)| ns == namespace)
        .map(|((namespace, handler), b)| {
            let (failures, total) = b.counts();
            pb::CircuitBreaker {
                namespace,
                handler,
                state: match b.state() {
                    BreakerState::Closed => pb::BreakerState::Closed,
                    BreakerState::Open { .. } => pb::BreakerState::Open,
                    BreakerState::HalfOpen { .. } => pb::BreakerState::HalfOpen,
                } as i32,
                failures: failures as u32,
                total: total as u32,
                opened_time: b.opened_at().map(timestamp),
            }
        })
        .collect()
}
