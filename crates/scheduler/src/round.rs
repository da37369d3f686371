//! One scheduling round for tasks: due PENDING/RETRYING tasks become READY
//! (retries held while their handler's circuit breaker is open), pushes
//! past their ACK deadline are taken back, attempts past their execution
//! deadline are timed out.

use taskmesh_core::{Event, ReleaseReason, TaskState};
use tracing::{debug, info};

use crate::{Reaped, Scheduler};

impl Scheduler {
    /// Handles due tasks; returns how many were due (for batching).
    pub(crate) async fn tasks_round(&self, now: i64, fence: u64) -> Result<usize, String> {
        let due = self
            .store
            .due_tasks(now, self.opts.batch)
            .await
            .map_err(|e| e.to_string())?;
        let mut events = Vec::with_capacity(due.len());
        let mut broadcasts = Vec::new();
        for task in &due {
            let exec = task.execution_id.clone().unwrap_or_default();
            let event = match task.state {
                // Spread, not made READY.
                TaskState::Pending if task.spreads() => {
                    broadcasts.push(task);
                    continue;
                }
                TaskState::Pending => Event::Due,
                TaskState::Retrying => {
                    match self
                        .breakers
                        .allow_retry(&task.namespace, &task.handler, now)
                    {
                        Ok(()) => Event::Due,
                        Err(until) => {
                            debug!(task_id = %task.id, handler = %task.handler, until, "retry held by the circuit breaker");
                            Event::Defer { until }
                        }
                    }
                }
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
        self.spread_broadcasts(&broadcasts, now, fence).await?;
        if events.is_empty() {
            return Ok(due.len());
        }
        let results = self
            .store
            .transition_many(&events, now, Some(fence))
            .await
            .map_err(crate::leader_write_error("due_tasks", fence))?;
        for (((task_id, event), result), task) in events.into_iter().zip(results).zip(&due) {
            match (result, event) {
                (Ok(_), Event::Release { execution_id, .. }) => {
                    info!(task_id = %task_id, attempt = task.attempt, execution_id = %execution_id, "ack timeout, task taken back");
                    let _ = self
                        .reaped
                        .send(Reaped::AckTimeout {
                            task_id,
                            execution_id,
                        })
                        .await;
                }
                (Ok(after), Event::TimeOut { execution_id, .. }) => {
                    info!(task_id = %task_id, attempt = task.attempt, execution_id = %execution_id, state = %after.state, "attempt timed out");
                    crate::meters::attempt_ended(&after, now);
                    self.breakers
                        .record(&task.namespace, &task.handler, false, now);
                    let _ = self
                        .reaped
                        .send(Reaped::TimedOut {
                            task_id,
                            execution_id,
                        })
                        .await;
                }
                (Ok(_), _) => debug!(task_id = %task_id, "task due"),
                // Lost a race with a worker's report or a cancel: nothing to do.
                (Err(err), _) => debug!(task_id = %task_id, error = %err, "due event skipped"),
            }
        }
        Ok(due.len())
    }
}
