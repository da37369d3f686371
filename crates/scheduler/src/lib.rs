//! Turning time into due work: PENDING and RETRYING tasks become READY when
//! their instant passes (retries held while their handler's circuit breaker
//! is open), schedules fire by their timetable and misfire/overlap policies,
//! pushes not ACKed in time are taken back, attempts past their execution
//! deadline are timed out. Only the holder of the leader lease does this.
//!
//! Architecture invariant: the scheduler decides *when*, never *where*: it
//! changes state through the store, which judges due-ness against its own
//! clock (`next_at <= now`), so nothing fires early whatever the engine. It
//! tells the dispatcher about attempts it ended through the [`Reaped`]
//! channel, so the dispatcher frees the slot and cancels the worker's
//! handler. It knows nothing of tonic. Where the dispatcher offers it a
//! [`FireDispatch`], a round's fires are committed through it, so a fired
//! task can be claimed for a free stream in the fire's own commit: the
//! dispatcher still decides where.

mod broadcast;
pub mod engine;
pub mod fault;
mod fire;
pub mod meters;
mod orphans;
pub mod retention;
mod round;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use taskmesh_coord::Coordinator;
use taskmesh_core::Clock;
use taskmesh_core::breaker::Breakers;
use taskmesh_store::Store;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use engine::{EngineKind, PollEngine, TriggerEngine, WheelEngine};

/// Commits a round's fires, claiming the new tasks it can for this node's
/// streams in the same transaction (`Store::commit_fires_dispatching`) and
/// pushing them after the commit: one durable write between a fire and its
/// task's start instead of two (the fire, then the dispatcher's claim).
/// The dispatcher gives one ([`Scheduler::dispatch_fires_with`]); without
/// it, fired tasks are READY and the dispatcher claims them.
#[async_trait::async_trait]
pub trait FireDispatch: Send + Sync {
    /// `Store::commit_fires_many` on `store`, claiming as it can.
    async fn commit_fires(
        &self,
        store: &dyn Store,
        commits: Vec<taskmesh_store::FireCommit>,
        now: taskmesh_core::UnixMillis,
        fence: u64,
    ) -> taskmesh_store::Result<Vec<taskmesh_store::Result<Option<taskmesh_store::FireCommitted>>>>;
}

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Which trigger engine decides when rounds run.
    pub engine: EngineKind,
    /// The polling engine's interval.
    pub poll_interval: Duration,
    /// How far ahead the timing wheel holds items.
    pub wheel_horizon: Duration,
    /// Most tasks or schedules handled per round.
    pub batch: usize,
    /// A fire time further behind than this when handled counts as missed
    /// (the misfire policy applies).
    pub misfire_threshold: Duration,
    /// Test-only fault hook ([`fault`]): while this file exists, a round
    /// about to commit schedule fires waits after its lease check.
    pub fault_hold_round: Option<PathBuf>,
    /// After coordination failed, how long it must answer again before the
    /// orphan sweep trusts the worker registry: a coordination service that
    /// came back may have lost it (a restarted Redis is empty), and a live
    /// worker's entry returns only with its next heartbeat. The registry's
    /// worker TTL is enough: every live stream re-puts its entry within it.
    pub registry_grace: Duration,
    /// How long ended tasks are kept ([`retention`]).
    pub retention: retention::Retention,
    /// Pauses retention and counts what it removed (shared with the
    /// caller: a clone of the options shares the same control).
    pub retention_control: Arc<retention::RetentionControl>,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            engine: EngineKind::Wheel,
            poll_interval: Duration::from_millis(500),
            wheel_horizon: Duration::from_secs(60),
            batch: 512,
            misfire_threshold: Duration::from_secs(5),
            fault_hold_round: None,
            registry_grace: Duration::from_secs(15),
            retention: retention::Retention::default(),
            retention_control: Arc::default(),
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
    /// A schedule cancelled its previous run (overlap CANCEL_PREVIOUS).
    Cancelled {
        /// The task.
        task_id: String,
        /// The ended attempt.
        execution_id: String,
    },
}

/// Turns a store error of a leader write into the round's error. A write
/// refused by the fencing token means this node was deposed while it still
/// wrote: counted ([`meters::FENCED_WRITES`]) and logged as such, not as an
/// ordinary failure.
pub(crate) fn leader_write_error(
    write: &'static str,
    fence: u64,
) -> impl Fn(taskmesh_store::Error) -> String {
    move |err| {
        if let taskmesh_store::Error::Fenced(_) = &err {
            meters::fenced_write(write);
            warn!(write, fence, error = %err, "leader write refused by the fencing token: a newer leader has written");
        }
        err.to_string()
    }
}

/// How often the leader looks for attempts whose worker is gone from the
/// cluster-wide registry.
const ORPHAN_SWEEP_EVERY_MS: i64 = 5_000;

/// A cheap handle to a running scheduler.
#[derive(Debug, Clone, Default)]
pub struct SchedulerHandle {
    wake: Arc<Notify>,
}

impl SchedulerHandle {
    /// Runs a round now instead of at the engine's next wake.
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// The scheduler.
pub struct Scheduler {
    opts: SchedulerOptions,
    store: Arc<dyn Store>,
    coord: Arc<dyn Coordinator>,
    clock: Arc<dyn Clock>,
    breakers: Breakers,
    reaped: mpsc::Sender<Reaped>,
    handle: SchedulerHandle,
    /// Set while fixed-delay schedules wait for runs to end, so a terminal
    /// task change wakes a round.
    awaiting_runs: AtomicBool,
    /// When the last orphan sweep ran (local millis).
    last_sweep: std::sync::atomic::AtomicI64,
    /// A coordination call failed since the last lease this node held.
    coord_failed: AtomicBool,
    /// No orphan sweep before this (clock millis): coordination answers
    /// again, but the registry may still be refilling
    /// ([`SchedulerOptions::registry_grace`]).
    sweep_not_before: std::sync::atomic::AtomicI64,
    /// The token of the last lease this node held (0: never led).
    last_token: std::sync::atomic::AtomicU64,
    /// No retention pass before this (clock millis).
    next_retention: std::sync::atomic::AtomicI64,
    /// What retention passes remember between them.
    retention_progress: tokio::sync::Mutex<retention::Progress>,
    /// Commits fires claiming their tasks at once (see [`FireDispatch`]).
    fire_dispatch: Option<Arc<dyn FireDispatch>>,
}

impl Scheduler {
    /// Builds a scheduler; ended attempts are reported on `reaped`.
    pub fn build(
        opts: SchedulerOptions,
        store: Arc<dyn Store>,
        coord: Arc<dyn Coordinator>,
        clock: Arc<dyn Clock>,
        breakers: Breakers,
        reaped: mpsc::Sender<Reaped>,
    ) -> Self {
        Self {
            opts,
            store,
            coord,
            clock,
            breakers,
            reaped,
            handle: SchedulerHandle::default(),
            awaiting_runs: AtomicBool::new(true),
            last_sweep: std::sync::atomic::AtomicI64::new(0),
            coord_failed: AtomicBool::new(false),
            sweep_not_before: std::sync::atomic::AtomicI64::new(0),
            last_token: std::sync::atomic::AtomicU64::new(0),
            next_retention: std::sync::atomic::AtomicI64::new(0),
            retention_progress: tokio::sync::Mutex::default(),
            fire_dispatch: None,
        }
    }

    /// Commits fires through `dispatch`, so a fired task may be claimed for
    /// a free stream in the fire's own commit.
    pub fn dispatch_fires_with(&mut self, dispatch: Arc<dyn FireDispatch>) {
        self.fire_dispatch = Some(dispatch);
    }

    /// The handle to wake this scheduler.
    pub fn handle(&self) -> SchedulerHandle {
        self.handle.clone()
    }

    /// The engine these options ask for.
    pub fn engine(&self) -> Box<dyn TriggerEngine> {
        match self.opts.engine {
            EngineKind::Poll => Box::new(PollEngine::new(self.opts.poll_interval)),
            EngineKind::Wheel => Box::new(WheelEngine::new(
                self.store.clone(),
                self.clock.clone(),
                self.opts.wheel_horizon,
            )),
        }
    }

    /// Runs rounds until `shutdown`, woken by the configured engine.
    pub async fn run(self, shutdown: CancellationToken) {
        let engine = self.engine();
        self.run_with(engine, shutdown).await;
    }

    /// Runs rounds until `shutdown`, woken by `engine`.
    pub async fn run_with(self, mut engine: Box<dyn TriggerEngine>, shutdown: CancellationToken) {
        info!(
            node_id = self.coord.node_id(),
            engine = engine.name(),
            "scheduler started"
        );
        let mut changes = self.store.subscribe();
        let mut retention_paused = self.opts.retention_control.watch();
        // The lease must be renewed well within its TTL even when nothing is
        // due, and a standby must notice a free lease soon: a round (which
        // starts with acquire-or-renew) at least every renew interval.
        let mut renew = tokio::time::interval(self.coord.renew_interval());
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let (again, failed) = match self.round().await {
                Ok(full) => (full, false),
                Err(err) => {
                    warn!(error = %err, "scheduler round failed");
                    (false, true)
                }
            };
            if again {
                continue;
            }
            // Wait for a reason to run the next round: retention's next
            // pass is one (a standby's is put off by IDLE_PAUSE each round).
            // A paused retention is no reason at all until it resumes.
            let retention_in = if *retention_paused.borrow_and_update() {
                Duration::from_secs(3_600)
            } else {
                Duration::from_millis(
                    (self.next_retention.load(Ordering::Relaxed) - self.clock.now_millis()).max(0)
                        as u64,
                )
            };
            let retention_due = tokio::time::sleep(retention_in);
            tokio::pin!(retention_due);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        info!("scheduler stopped");
                        return;
                    }
                    _ = self.handle.wake.notified() => break,
                    _ = engine.next_wake() => break,
                    _ = renew.tick() => break,
                    _ = &mut retention_due => break,
                    _ = retention_paused.changed() => break,
                    // After a failed round (store or coordination down), try
                    // again soon whatever the engine says.
                    _ = tokio::time::sleep(Duration::from_secs(1)), if failed => break,
                    change = changes.recv(), if self.awaiting_runs.load(Ordering::Relaxed) => {
                        // A run ended: a fixed-delay schedule may now have its next time.
                        match change {
                            Ok(c) if c.state.is_terminal() => break,
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                            _ => continue,
                        }
                    }
                }
            }
        }
    }

    /// One round at the clock's now, if this node holds the lease. Returns
    /// true when a batch was full (more is due: run again at once).
    pub async fn round(&self) -> Result<bool, String> {
        let lease = self.coord.acquire_or_renew().await;
        metrics::gauge!(meters::LEADER).set(if matches!(lease, Ok(Some(_))) {
            1.0
        } else {
            0.0
        });
        if lease.is_err() {
            self.coord_failed.store(true, Ordering::Relaxed);
        }
        if !matches!(lease, Ok(Some(_))) {
            // Not leading (or coordination is down): no retention pass is
            // due here for a while, so the wait for the next round does not
            // end at once for it.
            let later = self.clock.now_millis() + retention::IDLE_PAUSE.as_millis() as i64;
            self.next_retention.store(later, Ordering::Relaxed);
        }
        let Some(lease) = lease.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        let now = self.clock.now_millis();
        // A node that led before and now holds a *new* term without having
        // let go lost its lease without a failed call: Redis was restarted
        // (or lost the key) between two renewals, and its worker registry
        // may be empty until the live workers' next heartbeats. Both cases
        // wait the same grace before sweeping.
        let previous = self.last_token.swap(lease.token, Ordering::Relaxed);
        let new_term_of_ours = previous != 0 && previous != lease.token;
        if self.coord_failed.swap(false, Ordering::Relaxed) || new_term_of_ours {
            let grace = self.opts.registry_grace.as_millis() as i64;
            self.sweep_not_before.store(now + grace, Ordering::Relaxed);
        }
        // Every write of the round carries the lease's fencing token: if a
        // newer leader has written meanwhile, the store refuses it.
        let tasks = self.tasks_round(now, lease.token).await?;
        let schedules = self.schedules_round(now, lease.token).await?;
        if now - self.last_sweep.load(Ordering::Relaxed) >= ORPHAN_SWEEP_EVERY_MS
            && now >= self.sweep_not_before.load(Ordering::Relaxed)
        {
            self.last_sweep.store(now, Ordering::Relaxed);
            self.sweep_orphans(now, lease.token).await?;
        }
        if now >= self.next_retention.load(Ordering::Relaxed)
            && !self.opts.retention_control.is_paused()
        {
            let mut progress = self.retention_progress.lock().await;
            let started = std::time::Instant::now();
            let done = retention::pass(
                self.store.as_ref(),
                &self.opts.retention,
                now,
                &mut progress,
            )
            .await;
            let took = started.elapsed();
            drop(progress);
            let pause = match done {
                Ok((removed, more)) => {
                    self.opts.retention_control.count(removed, took);
                    if removed > 0 {
                        debug!(
                            removed,
                            took_ms = took.as_millis() as u64,
                            "retention removed ended tasks"
                        );
                    }
                    retention::Retention::pause_after(took, more)
                }
                Err(err) => {
                    warn!(error = %err, "retention pass failed");
                    retention::FAILED_PAUSE.max(took * retention::BUSY_PAUSE_FACTOR)
                }
            };
            // From the pass's end, not the round's start: the round's own
            // work before it (promotions, fires, the sweep) must not eat
            // into the pause.
            let after = self.clock.now_millis();
            self.next_retention
                .store(after + pause.as_millis() as i64, Ordering::Relaxed);
        }
        Ok(tasks >= self.opts.batch || schedules >= self.opts.batch)
    }
}
