//! Turning time into due tasks: PENDING and RETRYING tasks become READY when
//! their instant passes; pushes not ACKed in time are taken back; attempts
//! past their execution deadline are timed out. Only the holder of the
//! leader lease does this.
//!
//! Architecture invariant: the scheduler decides *when*, never *where*: it
//! changes task states through the store and tells the dispatcher (through
//! the [`Reaped`] channel) about attempts it ended, so the dispatcher can free
//! the slot and cancel the worker's handler. It knows nothing of tonic.

use std::sync::Arc;
use std::time::Duration;

use taskmesh_coord::Coordinator;
use taskmesh_core::{Clock, Event, ReleaseReason, TaskState};
use taskmesh_store::Store;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Longest sleep between rounds; a round also runs as soon as the next
    /// known deadline passes or someone calls [`SchedulerHandle::wake`].
    pub poll_interval: Duration,
    /// Most tasks handled per round.
    pub batch: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(250),
            batch: 512,
        }
    }
}

/// An attempt the scheduler ended; the dispatcher frees its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reaped {
    /// No ACK in time: the task is READY again.
    AckTimeout {
        /// The task.
        task_id: String,
        /// The ended attempt.
        execution_id: String,
    },
    /// The attempt ran past its deadline: the worker must cancel it.
    TimedOut {
        /// The task.
        task_id: String,
        /// The ended attempt.
        execution_id: String,
    },
}

/// A cheap handle to a running scheduler.
#[derive(Debug, Clone, Default)]
pub struct SchedulerHandle {
    wake: Arc<Notify>,
}

impl SchedulerHandle {
    /// Runs a round now (e.g. a task with a near run_at was just created).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// The scheduler loop.
pub struct Scheduler {
    opts: SchedulerOptions,
    store: Arc<dyn Store>,
    coord: Arc<dyn Coordinator>,
    clock: Arc<dyn Clock>,
    reaped: mpsc::Sender<Reaped>,
    handle: SchedulerHandle,
}

impl Scheduler {
    /// Builds a scheduler; ended attempts are reported on `reaped`.
    pub fn build(
        opts: SchedulerOptions,
        store: Arc<dyn Store>,
        coord: Arc<dyn Coordinator>,
        clock: Arc<dyn Clock>,
        reaped: mpsc::Sender<Reaped>,
    ) -> Self {
        Self {
            opts,
            store,
            coord,
            clock,
            reaped,
            handle: SchedulerHandle::default(),
        }
    }

    /// The handle to wake this scheduler.
    pub fn handle(&self) -> SchedulerHandle {
        self.handle.clone()
    }

    /// Runs rounds until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        info!(node_id = self.coord.node_id(), "scheduler started");
        loop {
            let wait = match self.round().await {
                Ok(wait) => wait,
                Err(err) => {
                    warn!(error = %err, "scheduler round failed");
                    self.opts.poll_interval
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.handle.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        info!("scheduler stopped");
    }

    /// One round; returns how long to wait before the next.
    pub async fn round(&self) -> Result<Duration, String> {
        let Some(_lease) = self
            .coord
            .acquire_or_renew()
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(self.opts.poll_interval);
        };
        let now = self.clock.now_millis();
        let due = self
            .store
            .due_tasks(now, self.opts.batch)
            .await
            .map_err(|e| e.to_string())?;
        let full = due.len() == self.opts.batch;
        let mut events = Vec::with_capacity(due.len());
        for task in &due {
            let exec = task.execution_id.clone().unwrap_or_default();
            let event = match task.state {
                TaskState::Pending | TaskState::Retrying => Event::Due,
                TaskState::Dispatching => Event::Release {
                    execution_id: exec,
                    reason: ReleaseReason::AckTimeout,
                    message: "no ACK within the ACK timeout".into(),
                },
                TaskState::Running => Event::TimeOut {
                    execution_id: exec,
                    jitter: rand::random::<f64>(),
                },
                _ => continue,
            };
            events.push((task.id.clone(), event));
        }
        if !events.is_empty() {
            let results = self
                .store
                .transition_many(&events, now)
                .await
                .map_err(|e| e.to_string())?;
            for ((task_id, event), result) in events.into_iter().zip(results) {
                match (result, event) {
                    (Ok(_), Event::Release { execution_id, .. }) => {
                        info!(task_id = %task_id, execution_id = %execution_id, "ack timeout, task taken back");
                        let _ = self
                            .reaped
                            .send(Reaped::AckTimeout {
                                task_id,
                                execution_id,
                            })
                            .await;
                    }
                    (Ok(_), Event::TimeOut { execution_id, .. }) => {
                        info!(task_id = %task_id, execution_id = %execution_id, "attempt timed out");
                        let _ = self
                            .reaped
                            .send(Reaped::TimedOut {
                                task_id,
                                execution_id,
                            })
                            .await;
                    }
                    (Ok(_), _) => debug!(task_id = %task_id, "task due"),
                    // Lost a race with a worker's report: nothing to do.
                    (Err(err), _) => debug!(task_id = %task_id, error = %err, "due event skipped"),
                }
            }
        }
        if full {
            return Ok(Duration::ZERO);
        }
        let next = self.store.next_due_at().await.map_err(|e| e.to_string())?;
        let now = self.clock.now_millis();
        Ok(match next {
            Some(at) if at <= now => Duration::ZERO,
            Some(at) => Duration::from_millis((at - now) as u64).min(self.opts.poll_interval),
            None => self.opts.poll_interval,
        })
    }
}
