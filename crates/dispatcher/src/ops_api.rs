//! The operators' calls of `TaskApi` (what the web console needs, open to
//! any client): run an ended task again, cancel by filter, the store's
//! figures, a schedule's next fires before saving it, and drain a worker.
//! Each validates before it changes anything, like every other call.

use taskmesh::v1 as pb;
use taskmesh_core::callback::CallbackState;
use taskmesh_core::{Event, TaskRecord, TaskState, UnixMillis, validate};
use taskmesh_store::TaskFilter;
use tracing::{info, warn};

use crate::auth::Identity;
use crate::convert::{millis_of, state_from_pb, state_to_pb, timestamp};
use crate::{Error, engine::Shared, schedule_api, task_api};

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// Tasks cancelled in one store transaction by CancelTasks.
const CANCEL_CHUNK: usize = 500;

/// The states a task can still be cancelled in.
const LIVE: [TaskState; 5] = [
    TaskState::Pending,
    TaskState::Ready,
    TaskState::Dispatching,
    TaskState::Running,
    TaskState::Retrying,
];

/// Cancels `before` (a task that had not ended when read) and tells the
/// worker running it. Returns the task as it is after: CANCELLED, or as it
/// ended if it ended first.
pub(crate) async fn cancel_one(
    shared: &Shared,
    before: &TaskRecord,
    reason: &str,
) -> Result<TaskRecord, Error> {
    let store = &shared.store;
    let id = &before.id;
    let event = Event::Cancel {
        reason: reason.to_string(),
    };
    let task = match store
        .transition(id, &event, shared.clock.now_millis())
        .await
    {
        Ok(task) => task,
        // It ended between our read and our write: report how it ended.
        Err(taskmesh_store::Error::Transition(_)) => store
            .get_task(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("task {id} not found")))?,
        Err(err) => return Err(err.into()),
    };
    if let Some(exec) = before.execution_id.as_deref()
        && task.state == TaskState::Cancelled
    {
        shared.take_back_attempt(id, exec, reason);
        shared.wake.notify_one();
    }
    info!(task_id = %id, state = %task.state, "task cancel requested");
    Ok(task)
}

/// RetryTask: FAILED, TIMED_OUT or CANCELLED → READY; a live task is
/// answered unchanged.
pub(crate) async fn retry(
    shared: &Shared,
    namespace: &str,
    req: pb::RetryTaskRequest,
) -> Result<(TaskRecord, bool), Error> {
    let id = task_api::task_id_of(&req.task_id)?;
    let before = task_api::load_in(shared, namespace, &id).await?;
    if !before.state.is_terminal() {
        return Ok((before, false));
    }
    if let Some(w) = &before.workflow {
        return Err(Error::FailedPrecondition(format!(
            "task {id} is step {:?} of workflow {}: retry it with RetryWorkflow, which runs again what depends on it too",
            w.step, w.workflow_id
        )));
    }
    if before.state == TaskState::Succeeded {
        return Err(Error::FailedPrecondition(format!(
            "task {id} SUCCEEDED: only a task that failed, timed out or was cancelled is retried"
        )));
    }
    if before
        .callback
        .as_ref()
        .is_some_and(|c| c.state == CallbackState::Pending)
    {
        return Err(Error::FailedPrecondition(format!(
            "task {id}'s callback for its last end is still being delivered; retry once it is delivered or has failed"
        )));
    }
    let now = shared.clock.now_millis();
    match shared.store.transition(&id, &Event::Rerun, now).await {
        Ok(task) => {
            shared.wake.notify_one();
            info!(task_id = %id, "task retried");
            Ok((task, true))
        }
        // Another call retried it first: the same answer as a live task.
        Err(taskmesh_store::Error::Transition(_)) => {
            let now = task_api::load_in(shared, namespace, &id).await?;
            Ok((now, false))
        }
        Err(err) => Err(err.into()),
    }
}

/// The label filter `key` or `key=value`, validated.
pub(crate) fn label_filter(text: &str) -> Result<Option<(String, Option<String>)>, Error> {
    if text.is_empty() {
        return Ok(None);
    }
    if text.chars().any(char::is_control) || text.chars().count() > 513 {
        return Err(invalid(
            "label must be KEY or KEY=VALUE, at most 513 characters, without control characters",
        ));
    }
    let (key, value) = match text.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (text, None),
    };
    // The contract's rule (no control characters, 513 at most) is all: a
    // key or value longer than any label may be matches nothing.
    Ok(Some((key.to_string(), value)))
}

/// A creation-time bound, or `None` when unset.
pub(crate) fn instant(
    name: &str,
    ts: Option<&prost_types::Timestamp>,
) -> Result<Option<UnixMillis>, Error> {
    ts.map(|t| millis_of(t).ok_or_else(|| invalid(format!("{name} is not a valid instant"))))
        .transpose()
}

/// CancelTasks: the matching live tasks, newest first, up to the limit.
pub(crate) async fn cancel_matching(
    shared: &Shared,
    namespace: &str,
    req: pb::CancelTasksRequest,
) -> Result<pb::CancelTasksResponse, Error> {
    let state = pb::TaskState::try_from(req.state)
        .map_err(|_| invalid(format!("state {} is not a known TaskState", req.state)))?;
    let state = state_from_pb(state);
    if let Some(s) = state.filter(|s| s.is_terminal()) {
        return Err(invalid(format!(
            "state {s}: tasks in it have ended and cannot be cancelled"
        )));
    }
    if !req.handler.is_empty() {
        validate::handler_name(&req.handler).map_err(invalid)?;
    }
    validate::short_text("reason", &req.reason).map_err(invalid)?;
    let limit = match req.limit {
        0 => 1_000,
        n if n <= 10_000 => n as usize,
        _ => return Err(invalid("limit must be at most 10000")),
    };
    let filter = TaskFilter {
        namespace: Some(namespace.to_string()),
        handler: (!req.handler.is_empty()).then(|| req.handler.clone()),
        label: label_filter(&req.label)?,
        created_after: instant("created_after", req.created_after.as_ref())?,
        created_before: instant("created_before", req.created_before.as_ref())?,
        ..TaskFilter::default()
    };
    // Each live state by its own index, then the newest `limit` of all.
    let mut found: Vec<TaskRecord> = Vec::new();
    for s in LIVE
        .into_iter()
        .filter(|s| state.is_none_or(|want| want == *s))
    {
        let mut filter = TaskFilter {
            state: Some(s),
            ..filter.clone()
        };
        let mut taken = 0;
        loop {
            filter.limit = (limit - taken).min(1_000) as u32;
            let page = shared.store.list_tasks(&filter).await?;
            taken += page.tasks.len();
            found.extend(page.tasks);
            match page.next_before_id {
                Some(next) if taken < limit => filter.before_id = Some(next),
                _ => break,
            }
        }
    }
    found.sort_by(|a, b| b.id.cmp(&a.id));
    found.truncate(limit);
    let matched = found.len() as u32;
    // A child whose parent is cancelled here goes with the parent's sweep,
    // never in a batch beside it: a batch locks its rows in id order, the
    // parent's first, and the end of a broadcast's last shard locks the
    // shard before the broadcast (deadlock on Postgres and MySQL).
    let ids: std::collections::HashSet<String> = found.iter().map(|t| t.id.clone()).collect();
    let (with_parent, alone): (Vec<TaskRecord>, Vec<TaskRecord>) = found
        .into_iter()
        .partition(|t| t.parent_task_id.as_ref().is_some_and(|p| ids.contains(p)));
    let found = alone;
    if req.dry_run {
        return Ok(pb::CancelTasksResponse {
            matched,
            cancelled: 0,
        });
    }
    let reason = if req.reason.is_empty() {
        "cancelled by a caller (by filter)".to_string()
    } else {
        req.reason
    };
    // One transaction per chunk, not per task: thousands of matches must
    // not cost thousands of commits (nor outlive the call's deadline).
    let event = Event::Cancel {
        reason: reason.clone(),
    };
    let mut cancelled = 0u32;
    let mut parents = Vec::new();
    for chunk in found.chunks(CANCEL_CHUNK) {
        let events: Vec<(String, Event)> = chunk
            .iter()
            .map(|t| (t.id.clone(), event.clone()))
            .collect();
        let now = shared.clock.now_millis();
        let results = shared.store.transition_many(&events, now, None).await?;
        for (before, result) in chunk.iter().zip(results) {
            // A task that ended first (or is gone) is not counted.
            let Ok(task) = result else { continue };
            if task.state != TaskState::Cancelled {
                continue;
            }
            cancelled += 1;
            if let Some(exec) = before.execution_id.as_deref() {
                shared.take_back_attempt(&task.id, exec, &reason);
            }
            parents.push(task.id);
        }
    }
    // Their children (a broadcast's shards, a handler's fan-out) go with
    // them, as with CancelTask: one indexed read per task cancelled. Every
    // parent is swept even when one sweep fails (its parent is CANCELLED
    // and no longer matches: a second call could not resume it).
    for parent in &parents {
        if let Err(err) =
            crate::children::cancel_children(shared, namespace, parent, "parent task cancelled")
                .await
        {
            warn!(task_id = %parent, error = %err, "the children of a task cancelled by filter were not all cancelled; CancelTask on it sweeps them again");
        }
    }
    // The matched children left to their parent's sweep: counted when it
    // cancelled them, cancelled here when it did not (the parent had
    // ended meanwhile, or its sweep failed).
    for child in &with_parent {
        let now = match shared.store.get_task(&child.id).await? {
            Some(t) if t.state.is_terminal() => t,
            Some(t) => cancel_one(shared, &t, &reason).await?,
            None => continue,
        };
        // It was live when matched: CANCELLED now is this call's doing
        // (or a concurrent cancel's, as for the tasks above).
        cancelled += u32::from(now.state == TaskState::Cancelled);
    }
    shared.wake.notify_one();
    info!(namespace = %namespace, matched, cancelled, "tasks cancelled by filter");
    Ok(pb::CancelTasksResponse { matched, cancelled })
}

/// GetStats: the store's figures for the window, every minute present.
pub(crate) async fn stats(
    shared: &Shared,
    namespace: &str,
    req: &pb::GetStatsRequest,
) -> Result<pb::GetStatsResponse, Error> {
    let minutes = match req.window_minutes {
        0 => 60,
        n if n <= 1_440 => i64::from(n),
        _ => return Err(invalid("window_minutes must be at most 1440")),
    };
    let now = shared.store.db_now().await?;
    let first = now - now.rem_euclid(60_000) - (minutes - 1) * 60_000;
    let figures = shared.store.task_stats(namespace, first).await?;
    let mut by_state: Vec<pb::StateCount> = TaskState::ALL
        .iter()
        .map(|s| pb::StateCount {
            state: state_to_pb(*s).into(),
            count: 0,
        })
        .collect();
    let mut by_handler = Vec::new();
    for (state, handler, count) in figures.by_state_handler {
        if let Some(slot) = TaskState::ALL.iter().position(|s| *s == state) {
            by_state[slot].count += count;
        }
        by_handler.push(pb::HandlerStateCount {
            handler,
            state: state_to_pb(state).into(),
            count,
        });
    }
    let mut per_minute: Vec<pb::MinuteStats> = (0..minutes)
        .map(|i| pb::MinuteStats {
            minute: Some(timestamp(first + i * 60_000)),
            ..Default::default()
        })
        .collect();
    let len = per_minute.len();
    let slot = |minute: UnixMillis| {
        usize::try_from((minute - first) / 60_000)
            .ok()
            .filter(|i| *i < len)
    };
    for (minute, state, count) in figures.ended_per_minute {
        if let Some(i) = slot(minute) {
            match state {
                TaskState::Succeeded => per_minute[i].completed += count,
                _ => per_minute[i].failed += count,
            }
        }
    }
    for (minute, count) in figures.reruns_per_minute {
        if let Some(i) = slot(minute) {
            per_minute[i].retried += count;
        }
    }
    // The leader is the coordinator's to say; without an answer the figures
    // still stand.
    let leader = shared.coord.leader().await.ok().flatten();
    Ok(pb::GetStatsResponse {
        by_state,
        by_handler,
        queues: figures
            .queues
            .into_iter()
            .map(|(handler, ready, oldest)| pb::QueueStats {
                handler,
                ready,
                oldest_ready_time: oldest.map(timestamp),
            })
            .collect(),
        per_minute,
        leader: Some(pb::LeaderInfo {
            node_id: leader.unwrap_or_default(),
        }),
        read_time: Some(timestamp(now)),
    })
}

/// PreviewSchedule: the definition validated as CreateSchedule would, then
/// its next fires and the DST changes among them.
pub(crate) fn preview(
    shared: &Shared,
    namespace: &str,
    req: pb::PreviewScheduleRequest,
) -> Result<pb::PreviewScheduleResponse, Error> {
    let count = match req.count {
        0 => 5,
        n if n <= 100 => n as usize,
        _ => return Err(invalid("count must be at most 100")),
    };
    let def = req
        .schedule
        .ok_or_else(|| invalid("schedule is required"))?;
    let now = shared.clock.now_millis();
    let s = schedule_api::draft(shared, namespace.to_string(), def, now)?;
    let timetable = s.timetable().map_err(invalid)?;
    let mut times = Vec::with_capacity(count);
    let mut next = s.first_fire_after(now).map_err(invalid)?;
    while let Some(at) = next {
        times.push(at);
        if times.len() == count {
            break;
        }
        next = timetable.next_after(at);
    }
    let mut warnings = Vec::new();
    if s.paused {
        warnings.push(
            "The schedule is paused: these are the fires it would have if it were resumed now."
                .to_string(),
        );
    }
    if times.is_empty() {
        warnings.push("The schedule would never fire: its cron expression matches no date.".into());
    }
    if let (taskmesh_core::timetable::Timetable::Cron { cron, tz }, Some(last)) =
        (&timetable, times.last())
    {
        // Up to the fire after the last shown: a change right after it
        // (the second pass of an hour it fired in) still concerns it.
        let to = timetable.next_after(*last).unwrap_or(*last);
        warnings.extend(taskmesh_core::timetable::dst_notes(cron, *tz, now, to));
    }
    Ok(pb::PreviewScheduleResponse {
        fire_times: times.into_iter().map(timestamp).collect(),
        warnings,
    })
}

/// DrainWorker: the worker's sessions on this replica get no new task and
/// finish those they have; a worker held by another replica is named, not
/// guessed at.
pub(crate) async fn drain(
    shared: &Shared,
    who: &Identity,
    namespace: &str,
    req: pb::DrainWorkerRequest,
) -> Result<pb::DrainWorkerResponse, Error> {
    validate::short_text("worker_id", &req.worker_id).map_err(invalid)?;
    if req.worker_id.is_empty() {
        return Err(invalid("worker_id must not be empty"));
    }
    let streams = shared.registry.drain_worker(namespace, &req.worker_id);
    if streams > 0 {
        info!(worker_id = %req.worker_id, streams, by = %who.principal, "worker drained by a caller");
        return Ok(pb::DrainWorkerResponse {
            streams: streams as u32,
        });
    }
    let elsewhere: Vec<String> = shared
        .coord
        .list_workers()
        .await?
        .into_iter()
        .filter(|e| e.namespace == namespace && e.worker_id == req.worker_id)
        .map(|e| e.node_id)
        .collect();
    match elsewhere.first() {
        Some(node) => Err(Error::FailedPrecondition(format!(
            "worker {} is connected to replica {node}, not to this one; send the drain to that replica",
            req.worker_id
        ))),
        None => Err(Error::NotFound(format!(
            "worker {} is not connected",
            req.worker_id
        ))),
    }
}
