//! Firing due schedules: plan the due fire times (misfire policy), apply the
//! overlap policy against the previous run, and write everything in one
//! store transaction keyed on the schedule's version. A fire time's task has
//! a deterministic idempotency key, so even two schedulers racing (a deposed
//! leader that has not noticed yet) cannot create two tasks for it.

use taskmesh_core::schedule::{FireOutcome, FireRecord, OverlapPolicy, ScheduleRecord, plan_fires};
use taskmesh_core::{Event, UnixMillis, id};
use taskmesh_store::FireCommit;
use tracing::{debug, warn};

use crate::{Reaped, Scheduler};

impl Scheduler {
    /// Fires due schedules; returns how many were due.
    pub(crate) async fn schedules_round(
        &self,
        now: UnixMillis,
        fence: u64,
    ) -> Result<usize, String> {
        let due = self
            .store
            .due_schedules(now, self.opts.batch)
            .await
            .map_err(|e| e.to_string())?;
        // Plan every due schedule, then write all of them in one
        // transaction: schedules due at the same instant cost one commit.
        let mut commits = Vec::with_capacity(due.len());
        let mut planned = Vec::with_capacity(due.len());
        for schedule in &due {
            match self.prepare(schedule, now).await {
                Ok(commit) => {
                    planned.push(schedule);
                    commits.push(commit);
                }
                Err(err) => warn!(schedule_id = %schedule.id, error = %err, "schedule cannot fire"),
            }
        }
        if !commits.is_empty() {
            let next: Vec<_> = commits.iter().map(|c| c.schedule.next_fire_at).collect();
            let fired: Vec<_> = commits.iter().map(|c| c.fires.len()).collect();
            if let Some(path) = &self.opts.fault_hold_round {
                crate::fault::hold_round(path, fence).await;
            }
            let results = match &self.fire_dispatch {
                Some(dispatch) => {
                    dispatch
                        .commit_fires(self.store.as_ref(), commits, now, fence)
                        .await
                }
                None => {
                    self.store
                        .commit_fires_many(commits, now, Some(fence))
                        .await
                }
            }
            .map_err(crate::leader_write_error("schedule_fires", fence))?;
            for (i, result) in results.into_iter().enumerate() {
                let schedule = planned[i];
                match result {
                    Ok(Some(done)) => self.fired(schedule, done, fired[i], next[i]).await,
                    Ok(None) => {
                        debug!(schedule_id = %schedule.id, "schedule changed meanwhile; its fire is left to the next round")
                    }
                    Err(err) => {
                        warn!(schedule_id = %schedule.id, error = %err, "schedule fire failed")
                    }
                }
            }
        }
        self.fixed_delay_round(now, fence).await?;
        Ok(due.len())
    }

    /// Plans one due schedule's fires as a commit.
    async fn prepare(
        &self,
        schedule: &ScheduleRecord,
        now: UnixMillis,
    ) -> Result<FireCommit, String> {
        let plan = plan_fires(
            schedule,
            now,
            self.opts.misfire_threshold.as_millis() as i64,
        )?;
        let mut next = schedule.clone();
        next.version += 1;
        next.updated_at = now;
        next.next_fire_at = plan.next_fire_at;

        // Is the previous run still going?
        // Only SKIP and CANCEL_PREVIOUS need to know whether the previous run
        // is still going; ALLOW saves the read.
        let mut previous_live = match &schedule.last_task_id {
            Some(_) if schedule.overlap == OverlapPolicy::Allow => None,
            Some(id) => self
                .store
                .get_task(id)
                .await
                .map_err(|e| e.to_string())?
                .filter(|t| !t.state.is_terminal())
                .map(|t| t.id),
            None => None,
        };
        let mut commit = FireCommit {
            schedule: next,
            expected_version: schedule.version,
            fires: Vec::with_capacity(plan.fires.len()),
            tasks: Vec::new(),
            cancel: None,
        };
        for planned in &plan.fires {
            let mut record = FireRecord {
                fire_at: planned.fire_at,
                handled_at: now,
                outcome: planned.outcome,
                task_id: None,
            };
            if planned.outcome == FireOutcome::Created {
                match (&previous_live, schedule.overlap) {
                    (Some(_), OverlapPolicy::Skip) => record.outcome = FireOutcome::SkippedOverlap,
                    (Some(prev), OverlapPolicy::CancelPrevious) => {
                        // Only a run that existed before this round can be
                        // cancelled here; one created in this very commit
                        // is simply superseded by the next.
                        if commit.cancel.is_none() && Some(prev) == schedule.last_task_id.as_ref() {
                            commit.cancel = Some((
                                prev.clone(),
                                Event::Cancel {
                                    reason: format!(
                                        "cancelled by schedule {}: a new run started (overlap CANCEL_PREVIOUS)",
                                        schedule.id
                                    ),
                                },
                            ));
                        }
                        record.outcome = FireOutcome::CreatedCancelledPrevious;
                    }
                    _ => {}
                }
            }
            if matches!(
                record.outcome,
                FireOutcome::Created | FireOutcome::CreatedCancelledPrevious
            ) {
                let task_id = id::new_task_id();
                let task = schedule.new_task(task_id.clone(), planned.fire_at, now);
                let fingerprint = task.request_fingerprint(Some(planned.fire_at));
                commit.tasks.push((task, fingerprint));
                record.task_id = Some(task_id.clone());
                previous_live = Some(task_id.clone());
                commit.schedule.last_task_id = Some(task_id);
                commit.schedule.fire_count += 1;
            } else {
                commit.schedule.skipped_count += 1;
            }
            commit.schedule.last_fire_at = Some(planned.fire_at);
            commit.fires.push(record);
        }
        Ok(commit)
    }

    /// After a committed fire: tell the dispatcher about a cancelled run.
    async fn fired(
        &self,
        schedule: &ScheduleRecord,
        done: taskmesh_store::FireCommitted,
        fires: usize,
        next_fire_at: Option<UnixMillis>,
    ) {
        if let Some(prev) = done.cancelled.as_ref().filter(|p| p.spreads()) {
            self.cancel_shards(prev).await;
        }
        if let Some(prev) = done.cancelled
            && let Some(execution_id) = prev.execution_id
        {
            let _ = self
                .reaped
                .send(Reaped::Cancelled {
                    task_id: prev.id,
                    execution_id,
                })
                .await;
        }
        debug!(
            schedule_id = %schedule.id,
            fires,
            created = done.tasks.len(),
            next_fire_at = ?next_fire_at,
            "schedule fired"
        );
        if next_fire_at.is_none()
            && schedule.kind == taskmesh_core::schedule::ScheduleKind::FixedDelay
        {
            self.awaiting_runs
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Fixed-delay schedules whose last run ended get their next fire time.
    async fn fixed_delay_round(&self, now: UnixMillis, fence: u64) -> Result<(), String> {
        let waiting = self
            .store
            .schedules_awaiting_run_end(self.opts.batch)
            .await
            .map_err(|e| e.to_string())?;
        self.awaiting_runs
            .store(!waiting.is_empty(), std::sync::atomic::Ordering::Relaxed);
        let mut commits = Vec::new();
        for (schedule, task) in waiting {
            let ended_at = match &task {
                Some(t) if t.state.is_terminal() => t.times.end.unwrap_or(now),
                Some(_) => continue,
                // The run is gone (deleted): count from now.
                None => now,
            };
            let Ok(tt) = schedule.timetable() else {
                continue;
            };
            let mut next = schedule.clone();
            next.version += 1;
            next.updated_at = now;
            next.next_fire_at = tt.next_after_run(ended_at);
            // A commit with no fires: only the schedule moves, fenced like
            // every other leader write.
            commits.push(FireCommit {
                schedule: next,
                expected_version: schedule.version,
                fires: Vec::new(),
                tasks: Vec::new(),
                cancel: None,
            });
        }
        if commits.is_empty() {
            return Ok(());
        }
        let results = self
            .store
            .commit_fires_many(commits, now, Some(fence))
            .await
            .map_err(crate::leader_write_error("fixed_delay", fence))?;
        for r in results {
            if let Err(err) = r {
                warn!(error = %err, "fixed-delay update failed");
            }
        }
        Ok(())
    }
}
