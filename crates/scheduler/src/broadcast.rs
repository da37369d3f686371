//! The leader spreads due sharding broadcasts: one shard per live worker
//! serving the broadcast's handler in its namespace (and carrying its
//! labels), as the cluster's worker registry lists them now. With no such
//! worker, or while the registry may still be refilling after
//! coordination failed, the broadcast waits a second
//! ([`RETRY_SPREAD_MS`]) and is looked at again: it runs on the workers
//! there are, never on none. A spread the store refuses for any other
//! reason than the database being busy or away ends the broadcast
//! CANCELLED, saying why, rather than trying again for ever.
//!
//! A schedule's workflow run is spread the same way, into the workflow its
//! schedule defines (the store reads it), whatever workers there are: its
//! steps are dispatched like any workflow's.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use taskmesh_core::{Event, TaskRecord, UnixMillis};
use tracing::{debug, info, warn};

use crate::Scheduler;

/// A broadcast with no worker to run on is looked at again this much later.
pub const RETRY_SPREAD_MS: i64 = 1_000;

impl Scheduler {
    /// Cancels the shards of broadcast `task` (the steps of workflow run
    /// `task`: the workflows of its live children), cancelled by its
    /// schedule's overlap policy (CANCEL_PREVIOUS), and has their workers
    /// told. A failure is logged: the shards then run to their end, which
    /// no longer ends the cancelled task (CancelTask on it sweeps them).
    /// Children a shard's handler submitted are not swept here (the
    /// dispatcher's sweep, which CancelTask runs, goes that deep).
    pub(crate) async fn cancel_shards(&self, task: &TaskRecord) {
        let mut filter = taskmesh_store::TaskFilter {
            namespace: Some(task.namespace.clone()),
            parent_task_id: Some(task.id.clone()),
            limit: 1_000,
            ..Default::default()
        };
        let mut shards = Vec::new();
        loop {
            match self.store.list_tasks(&filter).await {
                Ok(page) => {
                    shards.extend(page.tasks);
                    match page.next_before_id {
                        Some(next) => filter.before_id = Some(next),
                        None => break,
                    }
                }
                Err(err) => {
                    warn!(task_id = %task.id, error = %err, "the shards of a cancelled broadcast could not be listed");
                    return;
                }
            }
        }
        let workflows: BTreeSet<String> = shards
            .iter()
            .filter(|s| !s.state.is_terminal())
            .filter_map(|s| Some(s.workflow.as_ref()?.workflow_id.clone()))
            .collect();
        let reason = if task.runs_workflow {
            "its workflow run was cancelled by its schedule (overlap CANCEL_PREVIOUS)"
        } else {
            "its broadcast was cancelled by its schedule (overlap CANCEL_PREVIOUS)"
        };
        for id in workflows {
            let now = self.clock.now_millis();
            match self.store.cancel_workflow(&id, reason, now).await {
                Ok((_, stopped)) => {
                    for (t, execution_id) in stopped {
                        let _ = self
                            .reaped
                            .send(crate::Reaped::Cancelled {
                                task_id: t.id,
                                execution_id,
                            })
                            .await;
                    }
                }
                Err(err) => {
                    warn!(task_id = %task.id, workflow_id = %id, error = %err, "the shards of a cancelled broadcast could not be cancelled");
                }
            }
        }
    }

    /// Spreads `task` (into `shards` shards, for a broadcast); what is
    /// to be written instead (a defer, a cancel) goes into `deferred`.
    async fn spread_one(
        &self,
        task: &TaskRecord,
        shards: u32,
        fence: u64,
        deferred: &mut Vec<(String, Event)>,
    ) -> Result<(), String> {
        let now = self.clock.now_millis();
        match self
            .store
            .spread_broadcast(&task.id, shards, now, Some(fence))
            .await
        {
            Ok((_, workflow)) => {
                info!(task_id = %task.id, handler = %task.handler, steps = workflow.step_count, workflow_id = %workflow.id, "task spread");
            }
            Err(err @ taskmesh_store::Error::Fenced(_)) => {
                return Err(crate::leader_write_error("spread_broadcast", fence)(err));
            }
            // Cancelled or spread meanwhile: nothing to do.
            Err(taskmesh_store::Error::Transition(_) | taskmesh_store::Error::NotFound(_)) => {
                debug!(task_id = %task.id, "task moved on before its spread");
            }
            // The database busy or away: looked at again a second later
            // (from now, not the round's start), not every round.
            Err(
                err @ (taskmesh_store::Error::Unavailable(_)
                | taskmesh_store::Error::Conflict(_)
                | taskmesh_store::Error::StorageFull(_)),
            ) => {
                warn!(task_id = %task.id, error = %err, "task not spread; trying again in a second");
                deferred.push((
                    task.id.clone(),
                    Event::Defer {
                        until: self.clock.now_millis() + RETRY_SPREAD_MS,
                    },
                ));
            }
            // A spread the store refuses would be refused again (a
            // workflow run whose schedule was deleted, say): the task ends
            // CANCELLED saying why, not retried for ever.
            Err(err) => {
                warn!(task_id = %task.id, error = %err, "task cannot be spread; cancelling it");
                let what = if task.runs_workflow {
                    "the workflow run could not be started"
                } else {
                    "the broadcast could not be spread"
                };
                deferred.push((
                    task.id.clone(),
                    Event::Cancel {
                        reason: format!("{what}: {err}"),
                    },
                ));
            }
        }
        Ok(())
    }

    /// Spreads the due broadcasts and workflow runs among `due`, or defers
    /// them.
    pub(crate) async fn spread_broadcasts(
        &self,
        due: &[&TaskRecord],
        now: UnixMillis,
        fence: u64,
    ) -> Result<(), String> {
        if due.is_empty() {
            return Ok(());
        }
        let refilling = now < self.sweep_not_before.load(Ordering::Relaxed);
        let workers = if refilling || !due.iter().any(|t| t.broadcast) {
            Vec::new()
        } else {
            match self.coord.list_workers().await {
                Ok(w) => w,
                Err(err) => {
                    self.coord_failed.store(true, Ordering::Relaxed);
                    debug!(error = %err, "no worker registry: broadcasts wait");
                    Vec::new()
                }
            }
        };
        // (namespace, handler) → worker ids; a worker with several streams counts once.
        let mut serving: HashMap<(&str, &str), Vec<&taskmesh_coord::WorkerEntry>> = HashMap::new();
        for w in workers.iter().filter(|w| !w.draining) {
            for h in &w.handlers {
                serving
                    .entry((w.namespace.as_str(), h.as_str()))
                    .or_default()
                    .push(w);
            }
        }
        let mut deferred = Vec::new();
        for task in due {
            if task.runs_workflow {
                // A schedule's workflow run: started on no worker count.
                self.spread_one(task, 1, fence, &mut deferred).await?;
                continue;
            }
            let ids: BTreeSet<&str> = serving
                .get(&(task.namespace.as_str(), task.handler.as_str()))
                .into_iter()
                .flatten()
                .filter(|w| task.labels.iter().all(|(k, v)| w.labels.get(k) == Some(v)))
                .map(|w| w.worker_id.as_str())
                .collect();
            let shards = u32::try_from(ids.len()).unwrap_or(u32::MAX);
            if shards == 0 {
                deferred.push((
                    task.id.clone(),
                    Event::Defer {
                        until: now + RETRY_SPREAD_MS,
                    },
                ));
                continue;
            }
            self.spread_one(task, shards, fence, &mut deferred).await?;
        }
        if deferred.is_empty() {
            return Ok(());
        }
        let results = self
            .store
            .transition_many(&deferred, now, Some(fence))
            .await
            .map_err(crate::leader_write_error("defer_broadcast", fence))?;
        for ((task_id, _), r) in deferred.iter().zip(results) {
            match r {
                Ok(t) => {
                    debug!(task_id = %task_id, state = %t.state, "broadcast deferred or ended unspread")
                }
                Err(err) => debug!(task_id = %task_id, error = %err, "broadcast moved on"),
            }
        }
        Ok(())
    }
}
