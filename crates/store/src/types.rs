//! The values the [`Store`](crate::Store) trait takes and returns: created
//! tasks, filters and pages, claims, committed changes, schedule fire
//! commits.

use taskmesh_core::schedule::{FireRecord, ScheduleRecord};
use taskmesh_core::{Event, NewTask, TaskRecord, TaskState, UnixMillis};

use crate::{Error, Result};

/// The outcome of [`Store::create_task`].
#[derive(Debug, Clone)]
pub struct Created {
    /// The task as stored.
    pub task: TaskRecord,
    /// True when `client_request_id` matched an existing task with the same
    /// request fingerprint, and nothing new was written.
    pub existing: bool,
}

/// Which tasks [`Store::list_tasks`] returns.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Only this namespace (`None`: every namespace, for operators' tools;
    /// by a state out of flight too, such a list has no index made for it
    /// and may read the whole table; by DISPATCHING or RUNNING it reads the
    /// tasks in flight only).
    pub namespace: Option<String>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this handler.
    pub handler: Option<String>,
    /// Page size (1..=1000).
    pub limit: u32,
    /// Only tasks whose id sorts before this one (ids are time-ordered, so
    /// pages run newest first).
    pub before_id: Option<String>,
    /// `None`: payloads and outputs are left out (empty), so a page costs
    /// little whatever its tasks carry. `Some(budget)`: they are included
    /// for as many tasks as fit in `budget` bytes (at least one), the page
    /// ending early (with `next_before_id`) at the first that does not; the
    /// bodies are read only for those.
    pub bodies: Option<usize>,
    /// Only tasks carrying this label: its key, and its value when given.
    /// Checked as rows are read, so a page may come back short with
    /// `next_before_id` set (at most [`LIST_SCAN`] rows are read a call).
    pub label: Option<(String, Option<String>)>,
    /// Only tasks created at or after this instant.
    pub created_after: Option<UnixMillis>,
    /// Only tasks created before this instant.
    pub created_before: Option<UnixMillis>,
    /// Only the task submitted with this idempotency key (at most one).
    pub client_request_id: Option<String>,
    /// Only the children of this task (read by the parent's index, the
    /// other filters checked on read rows, as a label is).
    pub parent_task_id: Option<String>,
}

/// Rows a filtered listing reads at most per call before it answers a
/// short page with a cursor (label filters are checked on read rows).
pub const LIST_SCAN: usize = 5_000;

/// Figures of one namespace, read from the store for GetStats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskStats {
    /// Tasks per state and handler (pairs with tasks only).
    pub by_state_handler: Vec<(TaskState, String, u64)>,
    /// READY tasks per handler, with the earliest time one became READY.
    pub queues: Vec<(String, u64, Option<UnixMillis>)>,
    /// Tasks ended SUCCEEDED, FAILED or TIMED_OUT since the window's
    /// start: (minute start, state, count).
    pub ended_per_minute: Vec<(UnixMillis, TaskState, u64)>,
    /// Attempts other than their task's first started since the window's
    /// start: (minute start, count).
    pub reruns_per_minute: Vec<(UnixMillis, u64)>,
}

/// A page of tasks, newest first, without attempts.
#[derive(Debug, Clone, Default)]
pub struct TaskPage {
    /// The tasks.
    pub tasks: Vec<TaskRecord>,
    /// Id to pass as `before_id` for the next page; `None` on the last page.
    pub next_before_id: Option<String>,
}

/// The dispatcher's decision for one READY task in [`Store::claim_ready`].
#[derive(Debug, Clone)]
pub struct Claim {
    /// Id of the new attempt.
    pub execution_id: String,
    /// The worker chosen.
    pub worker_id: String,
    /// Take the task back if no ACK comes by then.
    pub ack_deadline: UnixMillis,
}

impl From<Claim> for Event {
    /// The `Dispatch` event that writes `claim`.
    fn from(claim: Claim) -> Self {
        Event::Dispatch {
            execution_id: claim.execution_id,
            worker_id: claim.worker_id,
            ack_deadline: claim.ack_deadline,
        }
    }
}

/// Chooses a worker for a READY task, or `None` to leave it READY.
pub type Chooser<'a> = dyn FnMut(&TaskRecord) -> Option<Claim> + Send + 'a;

/// A committed change of a task, published after the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskChange {
    /// The task.
    pub task_id: String,
    /// Its new state.
    pub state: TaskState,
    /// Its new version.
    pub version: i64,
    /// Its new `next_at` (the instant it next needs attention).
    pub next_at: Option<UnixMillis>,
    /// The change queued a callback (the task ended with a callback URL):
    /// what wakes the callback deliverer.
    pub callback: bool,
    /// The task has a concurrency key and is not in flight: its key may
    /// have room again, so a dispatcher that held tasks of the key back
    /// claims again.
    pub frees_key: bool,
}

impl TaskChange {
    /// The change that writing `task` makes.
    pub fn of(task: &TaskRecord) -> Self {
        Self {
            task_id: task.id.clone(),
            state: task.state,
            version: task.version,
            next_at: task.next_at,
            callback: task.wants_callback(),
            frees_key: task.concurrency.is_some()
                && !matches!(task.state, TaskState::Dispatching | TaskState::Running),
        }
    }

    /// The marker a store sends when its subscribers may have missed
    /// changes (see [`Store::subscribe`]): it names no task.
    pub fn resync() -> Self {
        Self {
            task_id: String::new(),
            state: TaskState::Pending,
            version: 0,
            next_at: None,
            callback: false,
            frees_key: false,
        }
    }

    /// True for [`TaskChange::resync`]: re-read instead of following it.
    pub fn is_resync(&self) -> bool {
        self.task_id.is_empty()
    }
}

/// Which committed task changes a subscriber is sent
/// ([`Store::subscribe_to`](crate::Store::subscribe_to)). The store sorts
/// each change when it publishes it, so a subscriber is not woken for a
/// change it would only skip: at light load every woken task may wake an
/// idle runtime thread as well. [`TaskChange::resync`] markers reach every
/// interest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeInterest {
    /// Every change (watchers, the timing wheel, the bench).
    All,
    /// What a dispatcher acts on: a task READY, a concurrency key that may
    /// have room again ([`TaskChange::frees_key`]), a task CANCELLED (its
    /// attempt in flight is stopped).
    Dispatch,
    /// Changes that queued a callback ([`TaskChange::callback`]).
    Callbacks,
}

impl ChangeInterest {
    /// Every interest, in the order a store keeps its channels: each at
    /// the index of its own discriminant (checked below at compile time).
    pub const EVERY: [ChangeInterest; 3] = [Self::All, Self::Dispatch, Self::Callbacks];

    /// Its index in [`ChangeInterest::EVERY`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether a subscriber of this interest is sent `change`.
    pub fn wants(self, change: &TaskChange) -> bool {
        change.is_resync()
            || match self {
                Self::All => true,
                Self::Dispatch => {
                    matches!(change.state, TaskState::Ready | TaskState::Cancelled)
                        || change.frees_key
                }
                Self::Callbacks => change.callback,
            }
    }
}

const _: () = {
    let mut i = 0;
    while i < ChangeInterest::EVERY.len() {
        assert!(ChangeInterest::EVERY[i].index() == i);
        i += 1;
    }
};

/// A committed change of a schedule, published after the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleChange {
    /// The schedule.
    pub schedule_id: String,
    /// Its next fire time while it is active (not paused, not deleted).
    pub next_fire_at: Option<UnixMillis>,
}

impl ScheduleChange {
    /// The change that writing `schedule` makes.
    pub fn of(schedule: &ScheduleRecord) -> Self {
        Self {
            schedule_id: schedule.id.clone(),
            next_fire_at: if schedule.paused {
                None
            } else {
                schedule.next_fire_at
            },
        }
    }

    /// The marker a store sends when its subscribers may have missed
    /// changes: it names no schedule.
    pub fn resync() -> Self {
        Self {
            schedule_id: String::new(),
            next_fire_at: None,
        }
    }

    /// True for [`ScheduleChange::resync`].
    pub fn is_resync(&self) -> bool {
        self.schedule_id.is_empty()
    }
}

/// Everything one handling of a due schedule writes, in one transaction.
#[derive(Debug, Clone)]
pub struct FireCommit {
    /// The schedule as it must be written (version bumped).
    pub schedule: ScheduleRecord,
    /// The version it must still have (compare-and-set).
    pub expected_version: i64,
    /// Handled fire times.
    pub fires: Vec<FireRecord>,
    /// Tasks to create, each with its request fingerprint. A task whose
    /// `client_request_id` exists already is not created again.
    pub tasks: Vec<(NewTask, String)>,
    /// A previous run to cancel first (overlap CANCEL_PREVIOUS).
    pub cancel: Option<(String, Event)>,
}

/// What [`Store::commit_fires`] wrote.
#[derive(Debug, Clone, Default)]
pub struct FireCommitted {
    /// Tasks created (or found, for a repeated fire key).
    pub tasks: Vec<TaskRecord>,
    /// The cancelled previous run as it was before the cancel, if any.
    pub cancelled: Option<TaskRecord>,
}

/// The answer to a create whose `client_request_id` is already stored with
/// fingerprint `stored_fp`.
pub(crate) fn existing_or_taken(
    stored: TaskRecord,
    stored_fp: &str,
    fingerprint: &str,
) -> Result<Created> {
    if stored_fp == fingerprint {
        return Ok(Created {
            task: stored,
            existing: true,
        });
    }
    Err(Error::AlreadyExists(format!(
        "client_request_id {} is already used by task {} with a different request",
        stored.client_request_id.as_deref().unwrap_or_default(),
        stored.id
    )))
}

/// How many READY candidates a claim for `limit` tasks looks at.
pub fn claim_scan(limit: usize) -> usize {
    limit.saturating_mul(4).saturating_add(32).min(4_096)
}

/// What `Store::append_logs` kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogsAppended {
    /// Lines stored.
    pub stored: u64,
    /// Lines refused by the cap.
    pub truncated: u64,
    /// Lines of executions the store does not know (no such attempt, or
    /// its task is gone).
    pub unknown: u64,
    /// Lines of an attempt that ended more than
    /// [`LATE_LINES_MS`](taskmesh_core::logs::LATE_LINES_MS) before the
    /// write.
    pub late: u64,
}
