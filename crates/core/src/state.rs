//! The task state machine as a pure function: `(task, event, now) ->
//! transition`. Nothing here touches storage; the store persists the result
//! with a compare-and-set on the task's version, so a transition computed
//! from a stale read can never be written.

use crate::{
    UnixMillis,
    retry::backoff_ms,
    task::{AttemptOutcome, AttemptRecord, TaskRecord},
};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskState {
    /// Waiting for its run_at.
    Pending,
    /// Due, waiting for a worker.
    Ready,
    /// Pushed, waiting for the ACK.
    Dispatching,
    /// ACKed, running.
    Running,
    /// Terminal: succeeded.
    Succeeded,
    /// Terminal: failed.
    Failed,
    /// Waiting for a retry backoff to end.
    Retrying,
    /// Terminal: the last attempt timed out.
    TimedOut,
    /// Terminal: cancelled.
    Cancelled,
}

impl TaskState {
    /// Every state, in wire order.
    pub const ALL: [TaskState; 9] = [
        TaskState::Pending,
        TaskState::Ready,
        TaskState::Dispatching,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Retrying,
        TaskState::TimedOut,
        TaskState::Cancelled,
    ];

    /// True for states a task never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::TimedOut | TaskState::Cancelled
        )
    }

    /// True while a worker owns the task.
    pub fn is_in_flight(self) -> bool {
        matches!(self, TaskState::Dispatching | TaskState::Running)
    }

    /// Stable text form used in the store and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "PENDING",
            TaskState::Ready => "READY",
            TaskState::Dispatching => "DISPATCHING",
            TaskState::Running => "RUNNING",
            TaskState::Succeeded => "SUCCEEDED",
            TaskState::Failed => "FAILED",
            TaskState::Retrying => "RETRYING",
            TaskState::TimedOut => "TIMED_OUT",
            TaskState::Cancelled => "CANCELLED",
        }
    }

    /// Parses [`TaskState::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        TaskState::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a worker gave a task back without a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseReason {
    /// No ACK within the ACK timeout.
    AckTimeout,
    /// The worker refused the push.
    Rejected,
    /// The worker's stream closed, or the server restarted, mid-attempt.
    WorkerLost,
}

impl ReleaseReason {
    fn outcome(self) -> AttemptOutcome {
        match self {
            ReleaseReason::AckTimeout => AttemptOutcome::AckTimeout,
            ReleaseReason::Rejected => AttemptOutcome::Rejected,
            ReleaseReason::WorkerLost => AttemptOutcome::WorkerLost,
        }
    }
}

/// Something that happens to a task.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Its run_at or backoff has passed.
    Due,
    /// Pushed to a worker.
    Dispatch {
        /// Id of the new attempt.
        execution_id: String,
        /// The worker chosen.
        worker_id: String,
        /// Take it back if no ACK comes by then.
        ack_deadline: UnixMillis,
    },
    /// The worker ACKed.
    Ack {
        /// Attempt being ACKed.
        execution_id: String,
        /// When the worker's ACK arrived, when it is written later (an ACK
        /// held to be written with the result): RUNNING is entered, and the
        /// execution deadline counts, from then (never after the write).
        at: Option<UnixMillis>,
    },
    /// The handler succeeded.
    Succeed {
        /// Attempt reporting.
        execution_id: String,
        /// Output bytes.
        output: Vec<u8>,
        /// Output media type.
        content_type: String,
    },
    /// The handler failed.
    Fail {
        /// Attempt reporting.
        execution_id: String,
        /// Error message.
        message: String,
        /// False ends the task at once.
        retryable: bool,
        /// Jitter draw in `[0, 1)` for the backoff.
        jitter: f64,
    },
    /// The worker gave the task back without a result.
    Release {
        /// Attempt given back.
        execution_id: String,
        /// Why.
        reason: ReleaseReason,
        /// Detail for the attempt row.
        message: String,
    },
    /// The attempt ran past its deadline.
    TimeOut {
        /// Attempt that timed out.
        execution_id: String,
        /// Jitter draw in `[0, 1)` for the backoff.
        jitter: f64,
    },
    /// A waiting task's time moves later (a retry held by an open circuit
    /// breaker). Never earlier: `until` before the current `next_at` is
    /// refused.
    Defer {
        /// The new instant.
        until: UnixMillis,
    },
    /// A caller cancelled the task.
    Cancel {
        /// Why.
        reason: String,
    },
    /// A caller asked a task that FAILED, TIMED_OUT or was CANCELLED to run
    /// again (RetryTask): it goes back to READY with a fresh run budget of
    /// its retry policy's `max_attempts`, keeping its earlier attempts.
    Rerun,
    /// A waiting workflow step's parents have all SUCCEEDED: it goes READY.
    /// Only for a waiting step (PENDING without a `next_at`, see
    /// [`crate::workflow::is_waiting`]), which [`Event::Due`] and
    /// [`Event::Defer`] refuse: a stale due-time can never release a step.
    Unblock,
    /// A due task that spreads ([`TaskRecord::spreads`], PENDING: a
    /// broadcast or a schedule's workflow run) is spread into `shards`
    /// children, the steps of a workflow written with it: it is RUNNING,
    /// with no attempt of its own and no deadline, until they have ended.
    Spread {
        /// How many shards (or steps) were made.
        shards: u32,
    },
    /// The workflow a RUNNING spread task was spread into (a broadcast's
    /// shards, a workflow run's steps) has ended: it ends in `state`
    /// (SUCCEEDED, FAILED or CANCELLED).
    ShardsEnded {
        /// Its end state.
        state: TaskState,
        /// Why, when it did not succeed.
        message: String,
        /// Its output when it succeeded.
        output: Vec<u8>,
    },
    /// [`Event::Rerun`] of a workflow step whose parents run again too
    /// (RetryWorkflow): it goes back to waiting for them (PENDING without
    /// a `next_at`, never due), not to READY.
    RerunAfterParents,
}

/// A refused event: the task is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The event does not apply in this state.
    #[error("task is {state}: cannot {event}")]
    IllegalState {
        /// The task's state.
        state: TaskState,
        /// The event's name.
        event: &'static str,
    },
    /// The event names an attempt that is no longer current.
    #[error("stale execution id {given}: the current attempt is {current}")]
    StaleExecution {
        /// The id the event carried.
        given: String,
        /// The current id, or "none".
        current: String,
    },
}

/// What happens to the attempts table with a transition.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptChange {
    /// Nothing.
    None,
    /// A new attempt row.
    Open(AttemptRecord),
    /// The current attempt ends.
    Close {
        /// Its execution id.
        execution_id: String,
        /// How it ended.
        outcome: AttemptOutcome,
        /// Why.
        message: String,
        /// When.
        ended_at: UnixMillis,
    },
}

/// The result of a legal event: the task as it must be written (version
/// bumped) and the change to its attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The new task row; `version` is the old one plus one.
    pub task: TaskRecord,
    /// The attempts change.
    pub attempt: AttemptChange,
    /// True when an ended task was opened again ([`Event::Rerun`]): the
    /// store drops the callback of its earlier end, so its next end queues
    /// a new one.
    pub reopened: bool,
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Due => "become due",
            Event::Dispatch { .. } => "dispatch",
            Event::Ack { .. } => "ack",
            Event::Succeed { .. } => "succeed",
            Event::Fail { .. } => "fail",
            Event::Release { .. } => "release",
            Event::TimeOut { .. } => "time out",
            Event::Defer { .. } => "defer",
            Event::Cancel { .. } => "cancel",
            Event::Rerun => "run again",
            Event::RerunAfterParents => "run again after its parents",
            Event::Unblock => "be released by its parents",
            Event::Spread { .. } => "be spread into shards",
            Event::ShardsEnded { .. } => "end with its shards",
        }
    }
}

/// Applies `event` to `task` at `now`. Pure: the caller persists the result
/// with a compare-and-set on `task.version`.
pub fn apply(
    task: &TaskRecord,
    event: &Event,
    now: UnixMillis,
) -> Result<Transition, TransitionError> {
    use TaskState::*;
    let illegal = || TransitionError::IllegalState {
        state: task.state,
        event: event.name(),
    };
    let check_exec = |given: &str| -> Result<(), TransitionError> {
        if task.execution_id.as_deref() == Some(given) {
            Ok(())
        } else {
            Err(TransitionError::StaleExecution {
                given: given.to_string(),
                current: task.execution_id.clone().unwrap_or_else(|| "none".into()),
            })
        }
    };
    if let Event::Rerun = event {
        return rerun(task, now).ok_or_else(illegal);
    }
    if let Event::RerunAfterParents = event {
        // A workflow's on_failure step waits again whatever its end: it
        // handled one failure and is there for the next.
        let handler = crate::workflow::is_on_failure(task) && task.state == TaskState::Succeeded;
        let mut t = if handler {
            rerun_any(task, now)
        } else {
            rerun(task, now).ok_or_else(illegal)?
        };
        enter(&mut t.task, Pending, now);
        t.task.next_at = None;
        return Ok(t);
    }
    if task.state.is_terminal() {
        return Err(illegal());
    }

    let mut next = task.clone();
    next.version = task.version + 1;
    next.updated_at = now;
    next.attempts = Vec::new();
    // The callback outbox is the store's to fill, never the state machine's.
    next.callback = None;
    let mut change = AttemptChange::None;

    let waiting = crate::workflow::is_waiting(task);
    match event {
        Event::Unblock => {
            if !waiting {
                return Err(illegal());
            }
            enter(&mut next, Ready, now);
            next.next_at = None;
        }
        Event::Due => {
            // A broadcast or a workflow run is spread, never made READY.
            if !matches!(task.state, Pending | Retrying) || waiting || task.spreads() {
                return Err(illegal());
            }
            enter(&mut next, Ready, now);
            next.next_at = None;
        }
        Event::Spread { shards } => {
            if task.state != Pending || waiting || !task.spreads() || *shards == 0 {
                return Err(illegal());
            }
            enter(&mut next, Running, now);
            next.next_at = None;
        }
        Event::ShardsEnded {
            state,
            message,
            output,
        } => {
            let ends = matches!(state, Succeeded | Failed | Cancelled);
            if task.state != Running || !task.spreads() || !ends {
                return Err(illegal());
            }
            if *state == Succeeded {
                next.output = Some(output.clone());
                next.output_content_type = "application/json".into();
                next.error_message.clear();
            } else {
                next.error_message = message.clone();
            }
            enter(&mut next, *state, now);
        }
        Event::Dispatch {
            execution_id,
            worker_id,
            ack_deadline,
        } => {
            if task.state != Ready {
                return Err(illegal());
            }
            enter(&mut next, Dispatching, now);
            next.attempt = task.attempt + 1;
            next.execution_id = Some(execution_id.clone());
            next.worker_id = Some(worker_id.clone());
            next.next_at = Some(*ack_deadline);
            change = AttemptChange::Open(AttemptRecord {
                number: next.attempt,
                execution_id: execution_id.clone(),
                worker_id: worker_id.clone(),
                started_at: now,
                ended_at: None,
                outcome: None,
                message: String::new(),
            });
        }
        Event::Ack { execution_id, at } => {
            if task.state != Dispatching {
                return Err(illegal());
            }
            check_exec(execution_id)?;
            let acked = at.map_or(now, |at| at.min(now));
            enter(&mut next, Running, acked);
            next.run_count = task.run_count + 1;
            next.next_at = Some(acked.saturating_add(task.timeout_ms));
        }
        Event::Succeed {
            execution_id,
            output,
            content_type,
        } => {
            // A result without a prior ACK counts as ACK + result: the
            // handler evidently ran.
            if !task.state.is_in_flight() {
                return Err(illegal());
            }
            check_exec(execution_id)?;
            if task.state == Dispatching {
                next.run_count = task.run_count + 1;
            }
            next.output = Some(output.clone());
            next.output_content_type = content_type.clone();
            next.error_message.clear();
            change = close(&mut next, AttemptOutcome::Succeeded, String::new(), now);
            enter(&mut next, Succeeded, now);
        }
        Event::Fail {
            execution_id,
            message,
            retryable,
            jitter,
        } => {
            if !task.state.is_in_flight() {
                return Err(illegal());
            }
            check_exec(execution_id)?;
            if task.state == Dispatching {
                next.run_count = task.run_count + 1;
            }
            next.error_message = message.clone();
            change = close(&mut next, AttemptOutcome::Failed, message.clone(), now);
            if *retryable && next.run_count < task.retry.max_attempts {
                retry_later(&mut next, now, *jitter);
            } else {
                enter(&mut next, Failed, now);
            }
        }
        Event::Release {
            execution_id,
            reason,
            message,
        } => {
            if !task.state.is_in_flight() {
                return Err(illegal());
            }
            check_exec(execution_id)?;
            change = close(&mut next, reason.outcome(), message.clone(), now);
            // A task whose every allowed run started and was lost ends here,
            // so a task that kills its workers cannot loop for ever.
            if task.state == Running && task.run_count >= task.retry.max_attempts {
                next.error_message = format!("worker lost on the last attempt: {message}");
                enter(&mut next, Failed, now);
            } else {
                enter(&mut next, Ready, now);
            }
        }
        Event::TimeOut {
            execution_id,
            jitter,
        } => {
            if task.state != Running {
                return Err(illegal());
            }
            check_exec(execution_id)?;
            let message = format!("attempt ran past its timeout of {} ms", task.timeout_ms);
            next.error_message = message.clone();
            change = close(&mut next, AttemptOutcome::TimedOut, message, now);
            if task.run_count < task.retry.max_attempts {
                retry_later(&mut next, now, *jitter);
            } else {
                enter(&mut next, TimedOut, now);
            }
        }
        Event::Defer { until } => {
            if !matches!(task.state, Pending | Retrying)
                || waiting
                || task.next_at.is_some_and(|n| *until < n)
            {
                return Err(illegal());
            }
            next.next_at = Some(*until);
        }
        Event::Cancel { reason } => {
            // A spread task is RUNNING without an attempt of its own.
            if task.state.is_in_flight() && task.execution_id.is_some() {
                change = close(&mut next, AttemptOutcome::Cancelled, reason.clone(), now);
            }
            next.error_message = if reason.is_empty() {
                "cancelled".into()
            } else {
                reason.clone()
            };
            enter(&mut next, Cancelled, now);
        }
        Event::Rerun | Event::RerunAfterParents => {
            unreachable!("handled before the terminal check")
        }
    }
    Ok(Transition {
        task: next,
        attempt: change,
        reopened: false,
    })
}

/// [`Event::Rerun`]: `None` unless the task ended without succeeding.
fn rerun(task: &TaskRecord, now: UnixMillis) -> Option<Transition> {
    use TaskState::*;
    if !matches!(task.state, Failed | TimedOut | Cancelled) {
        return None;
    }
    Some(rerun_any(task, now))
}

/// [`rerun`] of any ended task (the caller checked it may).
fn rerun_any(task: &TaskRecord, now: UnixMillis) -> Transition {
    use TaskState::*;
    let mut next = task.clone();
    next.version = task.version + 1;
    next.updated_at = now;
    next.attempts = Vec::new();
    next.callback = None;
    // The budget counts runs (run_count against max_attempts): a retry
    // starts a new round of them. Attempt numbers go on from the last.
    next.run_count = 0;
    next.error_message.clear();
    next.output = None;
    next.times.end = None;
    if task.spreads() {
        // Spread again when the leader next looks (now).
        enter(&mut next, Pending, now);
        next.next_at = Some(now);
    } else {
        enter(&mut next, Ready, now);
    }
    Transition {
        task: next,
        attempt: AttemptChange::None,
        reopened: true,
    }
}

fn enter(task: &mut TaskRecord, state: TaskState, now: UnixMillis) {
    task.state = state;
    let slot = match state {
        TaskState::Pending => &mut task.times.pending,
        TaskState::Ready => &mut task.times.ready,
        TaskState::Dispatching => &mut task.times.dispatching,
        TaskState::Running => &mut task.times.running,
        TaskState::Retrying => &mut task.times.retrying,
        _ => &mut task.times.end,
    };
    *slot = Some(now);
    if !state.is_in_flight() {
        task.execution_id = None;
        task.worker_id = None;
    }
    if state.is_terminal() || state == TaskState::Ready {
        task.next_at = None;
    }
}

fn close(
    task: &mut TaskRecord,
    outcome: AttemptOutcome,
    message: String,
    now: UnixMillis,
) -> AttemptChange {
    AttemptChange::Close {
        execution_id: task.execution_id.clone().unwrap_or_default(),
        outcome,
        message,
        ended_at: now,
    }
}

fn retry_later(task: &mut TaskRecord, now: UnixMillis, jitter: f64) {
    let wait = backoff_ms(&task.retry, task.run_count.max(1), jitter);
    enter(task, TaskState::Retrying, now);
    task.next_at = Some(now.saturating_add(wait));
}

#[cfg(test)]
mod tests;
