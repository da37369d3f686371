//! The leader's orphan sweep: attempts in flight on a worker that no replica
//! holds a stream of any more (its replica died and it did not come back,
//! or it died itself) are taken back, so they run elsewhere without waiting
//! for their execution deadline. A worker's registry entry lives for a few
//! heartbeats after its last one, so a worker is declared gone only after it
//! has been silent that long, or after its stream closed cleanly. After
//! coordination failed, the sweep waits until it has answered again for
//! `SchedulerOptions::registry_grace`: a restarted Redis is empty, and the
//! live workers' entries return only with their next heartbeats.

use std::collections::HashSet;

use taskmesh_core::{Event, ReleaseReason, UnixMillis};
use tracing::info;

use crate::Scheduler;

impl Scheduler {
    /// Releases in-flight attempts of workers absent from the registry.
    pub(crate) async fn sweep_orphans(&self, now: UnixMillis, fence: u64) -> Result<(), String> {
        let live: HashSet<String> = self
            .coord
            .list_workers()
            .await
            .map_err(|e| {
                self.coord_failed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                e.to_string()
            })?
            .into_iter()
            .map(|w| w.worker_id)
            .collect();
        let in_flight = self
            .store
            .in_flight(None)
            .await
            .map_err(|e| e.to_string())?;
        let events: Vec<(String, Event)> = in_flight
            .into_iter()
            .filter(|t| t.worker_id.as_ref().is_some_and(|w| !live.contains(w)))
            // Claimed a moment ago by a replica whose registry write we may
            // not see yet: leave it to the next sweep.
            .filter(|t| t.times.dispatching.is_some_and(|d| now - d > 2_000))
            .filter_map(|t| {
                Some((
                    t.id,
                    Event::Release {
                        execution_id: t.execution_id?,
                        reason: ReleaseReason::WorkerLost,
                        message: "its worker is gone from the cluster".into(),
                    },
                ))
            })
            .collect();
        if events.is_empty() {
            return Ok(());
        }
        let results = self
            .store
            .transition_many(&events, now, Some(fence))
            .await
            .map_err(crate::leader_write_error("orphan_sweep", fence))?;
        let released = results.iter().filter(|r| r.is_ok()).count();
        if released > 0 {
            info!(released, "attempts of vanished workers taken back");
        }
        for ((task_id, _), r) in events.iter().zip(results) {
            if let Err(err) = r {
                tracing::debug!(task_id = %task_id, error = %err, "orphan already moved on");
            }
        }
        Ok(())
    }
}
