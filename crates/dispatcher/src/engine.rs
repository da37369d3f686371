//! The dispatch engine: claims READY tasks for streams with free slots and
//! pushes them; ends attempts (results, rejects, lost streams, reaped
//! deadlines) and frees their slots.
//!
//! Architecture invariant: a task is pushed only after the store has moved it
//! READY → DISPATCHING for that stream (the claim); every path that ends an
//! attempt goes through the store first and frees the registry slot after.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_coord::Coordinator;
use taskmesh_core::breaker::Breakers;
use taskmesh_core::{Clock, Event, TaskRecord, TaskState, id};
use taskmesh_scheduler::{Reaped, SchedulerHandle, meters};
use taskmesh_store::{Claim, Store};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, debug_span, info, warn};

use crate::{
    DispatcherOptions,
    batcher::Batcher,
    convert::{duration, timestamp},
    registry::{After, Registry, Reserved},
    submitter::Submitter,
};

/// Everything the services and the engine share.
#[derive(Clone)]
pub struct Shared {
    /// Options.
    pub opts: DispatcherOptions,
    /// The store.
    pub store: Arc<dyn Store>,
    /// Coordination.
    pub coord: Arc<dyn Coordinator>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Live streams.
    pub registry: Registry,
    /// Wakes the engine: a task became READY or a slot was freed.
    pub wake: Arc<Notify>,
    /// Wakes the scheduler: a task with a near deadline was written.
    pub scheduler: SchedulerHandle,
    /// Circuit breakers per handler: results are recorded here.
    pub breakers: Breakers,
    /// Group commit of ACKs and results.
    pub batcher: Batcher,
    /// Task log lines, written in batches off the hot path.
    pub logs: crate::logs::LogWriter,
    /// Group commit of single submits.
    pub submitter: Submitter,
    /// Counters of the engine's work.
    pub stats: Arc<DispatchStats>,
    /// Push-mode sessions (workers this node calls with `Worker.Execute`).
    pub push: crate::push::PushWorkers,
    /// Who is calling: tokens, checked and cached.
    pub auth: Arc<crate::auth::Authenticator>,
    /// The cluster's key (from the store, read before serving), from which
    /// assignment secrets are derived.
    pub cluster_key: Arc<std::sync::OnceLock<Vec<u8>>>,
    /// Quotas and rates per namespace.
    pub quotas: Arc<crate::quota::Quotas>,
    /// Handlers known to have nothing READY (shared by the engine's claims
    /// and dispatch at a write: the submitter's, and schedule fires').
    pub(crate) drained: Arc<std::sync::Mutex<Drained>>,
    /// Set while this node cannot reach its store and has handed its
    /// worker streams to nodes that can (`health.rs`): `Connect` refuses.
    pub(crate) shedding: Arc<std::sync::atomic::AtomicBool>,
}

impl Shared {
    /// The secret of assignment `execution_id` (see
    /// `taskmesh_core::auth::assignment_secret`); empty before the cluster
    /// key is loaded, which no served request can see.
    pub fn assignment_secret(&self, execution_id: &str) -> String {
        match self.cluster_key.get() {
            Some(key) => taskmesh_core::auth::assignment_secret(key, execution_id),
            None => String::new(),
        }
    }

    /// Whether `presented` is the secret of assignment `execution_id`.
    pub fn is_assignment_secret(&self, execution_id: &str, presented: &str) -> bool {
        self.cluster_key.get().is_some_and(|key| {
            let want = taskmesh_core::auth::assignment_secret(key, execution_id);
            taskmesh_core::auth::same_secret(&want, presented)
        })
    }
}

/// Counters of the engine's work, for tests and benchmarks: they show the
/// engine does not spin while no stream has room.
#[derive(Debug, Default)]
pub struct DispatchStats {
    /// Dispatch rounds run (each wake-up that looked for work).
    pub rounds: AtomicU64,
    /// Claim transactions opened on the store.
    pub claim_calls: AtomicU64,
    /// Tasks claimed for a stream.
    pub claimed: AtomicU64,
    /// Pushes that could not be sent and were taken back.
    pub unsent: AtomicU64,
}

impl DispatchStats {
    /// (rounds, claim calls, claimed, unsent) now.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.rounds.load(Ordering::Relaxed),
            self.claim_calls.load(Ordering::Relaxed),
            self.claimed.load(Ordering::Relaxed),
            self.unsent.load(Ordering::Relaxed),
        )
    }
}

impl Shared {
    /// Ends an attempt in the store and frees its slot. `Ok(task)` when the
    /// store accepted the event.
    pub async fn end_attempt(
        &self,
        task_id: &str,
        execution_id: &str,
        event: Event,
    ) -> Result<TaskRecord, taskmesh_store::Error> {
        self.end_attempt_with(task_id, execution_id, event, After::Free)
            .await
    }

    /// [`Shared::end_attempt`], leaving the stream in the standing `after`
    /// (BUSY, unsendable) in the same step that frees its slot.
    pub async fn end_attempt_with(
        &self,
        task_id: &str,
        execution_id: &str,
        event: Event,
        after: After,
    ) -> Result<TaskRecord, taskmesh_store::Error> {
        let outcome = outcome_of(&event);
        let result = self.batcher.apply(task_id, event).await;
        self.attempt_ended(execution_id, outcome, after, &result);
        result
    }

    /// What follows the store's answer to an event that ends an attempt:
    /// the breaker records the outcome, the slot is freed (whatever the
    /// store said: a refused event means the attempt had already ended by
    /// another path), and a task now waiting for a retry wakes the
    /// scheduler. `outcome` is [`outcome_of`] the event.
    pub fn attempt_ended(
        &self,
        execution_id: &str,
        outcome: Option<bool>,
        after: After,
        result: &Result<TaskRecord, taskmesh_store::Error>,
    ) {
        if let (Some(success), Ok(task)) = (outcome, result) {
            let now = self.clock.now_millis();
            self.breakers
                .record(&task.namespace, &task.handler, success, now);
            meters::attempt_ended(task, now);
        }
        if self.registry.finish_with(execution_id, after).is_some() {
            self.wake.notify_one();
        }
        if let Ok(task) = result
            && matches!(task.state, TaskState::Retrying)
        {
            self.scheduler.wake();
        }
    }

    /// Ends an attempt on this node (frees its slot) and tells the stream
    /// that held it, if any, to cancel it.
    pub fn take_back_attempt(&self, task_id: &str, execution_id: &str, reason: &str) {
        let ended = self.registry.finish(execution_id);
        self.send_cancel(ended.map(|e| e.tx), task_id, execution_id, reason);
    }

    /// Sends a cancel for an attempt to the stream holding it, if any.
    pub fn send_cancel(
        &self,
        tx: Option<crate::registry::StreamTx>,
        task_id: &str,
        execution_id: &str,
        reason: &str,
    ) {
        if let Some(tx) = tx {
            let msg = pb::ConnectResponse {
                message: Some(pb::connect_response::Message::Cancel(pb::TaskCancel {
                    task_id: task_id.to_string(),
                    execution_id: execution_id.to_string(),
                    reason: reason.to_string(),
                })),
            };
            // A full or closed stream: the worker is gone or stuck, and its
            // attempt has already ended in the store.
            let _ = tx.try_send(Ok(Box::new(msg)));
        }
    }
}

/// Whether `event` reports a success (`Some(true)`), a failure
/// (`Some(false)`) or neither, for the circuit breakers.
pub fn outcome_of(event: &Event) -> Option<bool> {
    match event {
        Event::Succeed { .. } => Some(true),
        Event::Fail { .. } => Some(false),
        _ => None,
    }
}

/// Which handlers are known to have nothing READY: a claim that took every
/// candidate it saw and still came back short found the handler empty, and
/// nothing can be READY for it again until a change makes a task READY.
/// So a round skips such a handler until the next READY change (of any
/// handler: [`Drained::ready_changed`]), a change that may free room in a
/// concurrency key (`TaskChange::frees_key`), a lagging feed, or the
/// safety tick:
/// a slot freed by a result (once per task) no longer costs a claim
/// transaction that finds nothing.
///
/// Why this is safe: a change is published after its commit, and every
/// change received before a claim starts bumps the epoch first, so a task
/// the claim could not see arrives as a change after it, and bumps the
/// epoch past the mark.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    epoch: u64,
    /// namespace → handler → the epoch its claim found it empty.
    empty_at: HashMap<String, HashMap<String, u64>>,
}

impl Drained {
    /// Something may have become READY (or the feed cannot say).
    pub(crate) fn ready_changed(&mut self) {
        self.epoch += 1;
    }

    /// True when the handler's last claim found it empty and nothing has
    /// become READY since.
    pub(crate) fn is_empty(&self, namespace: &str, handler: &str) -> bool {
        self.empty_at
            .get(namespace)
            .and_then(|h| h.get(handler))
            .is_some_and(|&at| at == self.epoch)
    }

    fn found(&mut self, namespace: &str, handler: &str, empty: bool) {
        let known = self
            .empty_at
            .get_mut(namespace)
            .and_then(|h| h.get_mut(handler));
        match (empty, known) {
            // Names are copied only the first time a handler is found empty.
            (true, Some(at)) => *at = self.epoch,
            (true, None) => {
                self.empty_at
                    .entry(namespace.to_string())
                    .or_default()
                    .insert(handler.to_string(), self.epoch);
            }
            (false, _) => {
                if let Some(h) = self.empty_at.get_mut(namespace) {
                    h.remove(handler);
                }
            }
        }
    }
}

/// Runs the claim-and-push loop until `shutdown`; also pushes the tasks the
/// submitter claimed at submit (`pushes`).
pub async fn run(
    shared: Shared,
    mut reaped: mpsc::Receiver<Reaped>,
    mut pushes: mpsc::UnboundedReceiver<TaskRecord>,
    shutdown: CancellationToken,
) {
    // Only what a dispatcher acts on (READY, a freed key, CANCELLED): the
    // other changes, most of them, do not wake this loop.
    let mut changes = shared
        .store
        .subscribe_to(taskmesh_store::ChangeInterest::Dispatch);
    // A safety net: a wake-up lost to a lagging subscriber costs at most this.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ready_changed = || lock(&shared.drained).ready_changed();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(task) = pushes.recv() => {
                shared.stats.claimed.fetch_add(1, Ordering::Relaxed);
                push(&shared, task).await;
                continue;
            }
            _ = shared.wake.notified() => {}
            _ = tick.tick() => ready_changed(),
            change = changes.recv() => {
                if let Ok(c) = &change {
                    stop_if_cancelled(&shared, c);
                }
                match change {
                    Ok(c) if !may_be_claimable(&c) => continue,
                    _ => ready_changed(),
                }
            }
            Some(r) = reaped.recv() => {
                on_reaped(&shared, r);
                continue;
            }
        }
        // Coalesce: one round serves every change already queued (a burst
        // of new tasks from one commit costs one claim, not one each).
        loop {
            let change = changes.try_recv();
            if let Ok(c) = &change {
                stop_if_cancelled(&shared, c);
            }
            match change {
                Ok(c) if !may_be_claimable(&c) => {}
                Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {
                    ready_changed()
                }
                Err(_) => break,
            }
        }
        if let Err(err) = dispatch_round(&shared).await {
            warn!(error = %err, "dispatch round failed");
        }
    }
}

/// A task cancelled by a commit anywhere in the cluster (CancelTask on
/// another replica, a workflow's failure policy or cancel) whose attempt a
/// stream of this node still holds: the slot is freed and the worker told
/// to stop. A cancel this node made itself has already freed its slot, so
/// nothing is found and nothing is sent twice.
fn stop_if_cancelled(shared: &Shared, change: &taskmesh_store::TaskChange) {
    if change.state != TaskState::Cancelled {
        return;
    }
    if let Some(execution_id) = shared.registry.execution_of_task(&change.task_id) {
        shared.take_back_attempt(&change.task_id, &execution_id, "task cancelled");
        shared.wake.notify_one();
    }
}

/// Whether `change` may have made a task claimable: it is READY, or it
/// may have freed room in a concurrency key whose tasks a claim held back
/// (or it is a resync, which may stand for either).
fn may_be_claimable(change: &taskmesh_store::TaskChange) -> bool {
    change.state == TaskState::Ready || change.frees_key || change.is_resync()
}

pub(crate) fn lock(drained: &std::sync::Mutex<Drained>) -> std::sync::MutexGuard<'_, Drained> {
    drained.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slots one store write may claim (a claim, or a create that
/// dispatches at submit): each task offered gets a new execution id and a
/// stream reserved by the balancer, or stays READY (`refused`); after the
/// write, reservations it did not write are given back.
pub(crate) struct Reservations<'r> {
    registry: &'r Registry,
    ack_deadline: taskmesh_core::UnixMillis,
    /// Execution ids reserved, in order.
    pub(crate) chosen: Vec<String>,
    /// Tasks offered that no stream could take.
    pub(crate) refused: usize,
}

impl<'r> Reservations<'r> {
    pub(crate) fn new(registry: &'r Registry, ack_deadline: taskmesh_core::UnixMillis) -> Self {
        Self {
            registry,
            ack_deadline,
            chosen: Vec::new(),
            refused: 0,
        }
    }

    /// The chooser's answer for `task`.
    pub(crate) fn choose(&mut self, task: &TaskRecord) -> Option<Claim> {
        let execution_id = id::new_execution_id();
        let Some(Reserved { worker_id, .. }) = self.registry.reserve(task, &execution_id) else {
            self.refused += 1;
            return None;
        };
        self.chosen.push(execution_id.clone());
        Some(Claim {
            execution_id,
            worker_id,
            ack_deadline: self.ack_deadline,
        })
    }

    /// Gives back every reservation whose task is not among `written`
    /// (all of them when the write failed).
    pub(crate) fn release_unwritten<'t>(&self, written: impl IntoIterator<Item = &'t TaskRecord>) {
        if self.chosen.is_empty() {
            return;
        }
        let written: std::collections::HashSet<&str> = written
            .into_iter()
            .filter_map(|t| t.execution_id.as_deref())
            .collect();
        for exec in self.chosen.iter().filter(|e| !written.contains(e.as_str())) {
            self.registry.finish(exec);
        }
    }
}

fn on_reaped(shared: &Shared, reaped: Reaped) {
    match reaped {
        Reaped::AckTimeout {
            task_id,
            execution_id,
        } => {
            // The worker may still start it late; tell it not to.
            shared.take_back_attempt(&task_id, &execution_id, "ack timeout");
        }
        Reaped::TimedOut {
            task_id,
            execution_id,
        } => {
            shared.take_back_attempt(&task_id, &execution_id, "execution timeout");
        }
        Reaped::Cancelled {
            task_id,
            execution_id,
        } => {
            shared.take_back_attempt(
                &task_id,
                &execution_id,
                "cancelled by its schedule (overlap)",
            );
        }
    }
    shared.wake.notify_one();
}

/// Claims and pushes until no stream has a free slot or nothing is READY.
async fn dispatch_round(shared: &Shared) -> Result<(), taskmesh_store::Error> {
    shared.stats.rounds.fetch_add(1, Ordering::Relaxed);
    loop {
        let free = shared.registry.free_slots_by_handler();
        if free.is_empty() {
            return Ok(());
        }
        let mut pushed = 0usize;
        for ((namespace, handler), slots) in free {
            if lock(&shared.drained).is_empty(&namespace, &handler) {
                continue;
            }
            let limit = (slots as usize).min(shared.opts.claim_batch);
            let now = shared.clock.now_millis();
            let ack_deadline = now + shared.opts.ack_timeout.as_millis() as i64;
            let mut reservations = Reservations::new(&shared.registry, ack_deadline);
            let mut chooser = |task: &TaskRecord| reservations.choose(task);
            shared.stats.claim_calls.fetch_add(1, Ordering::Relaxed);
            let result = shared
                .store
                .claim_ready(&namespace, &handler, limit, now, &mut chooser)
                .await;
            // Reserved slots whose task was not written: all of them when the
            // claim rolled back (otherwise it cannot happen with a single
            // writer, but never leak a slot).
            reservations.release_unwritten(result.iter().flatten());
            let claimed = result?;
            // Short with no candidate refused: the claim saw every READY
            // task of the handler and took them all.
            lock(&shared.drained).found(
                &namespace,
                &handler,
                claimed.len() < limit && reservations.refused == 0,
            );
            shared
                .stats
                .claimed
                .fetch_add(claimed.len() as u64, Ordering::Relaxed);
            for task in claimed {
                pushed += 1;
                push(shared, task).await;
            }
        }
        if pushed == 0 {
            return Ok(());
        }
    }
}

/// Sends one claimed task to its stream; a push that cannot be sent is taken
/// back at once so it goes elsewhere.
async fn push(shared: &Shared, task: TaskRecord) {
    let execution_id = task.execution_id.clone().unwrap_or_default();
    let worker_id = task.worker_id.clone().unwrap_or_default();
    let Some(tx) = shared.registry.sender_of(&execution_id) else {
        release_unsent(
            shared,
            &task,
            &execution_id,
            "stream closed before the push",
        )
        .await;
        return;
    };
    let deadline =
        shared.clock.now_millis() + shared.opts.ack_timeout.as_millis() as i64 + task.timeout_ms;
    // The push continues the task's trace: the worker's span becomes a
    // child of this one (or of the stored context when nothing exports).
    let span = debug_span!(
        "dispatch",
        otel.kind = "producer",
        task_id = %task.id,
        attempt = task.attempt,
        execution_id = %execution_id,
        worker_id = %worker_id,
    );
    crate::trace_context::continue_from(&span, &task.traceparent);
    let traceparent = crate::trace_context::traceparent_of(&span, &task.traceparent);
    let mut trace_context = std::collections::HashMap::new();
    if !traceparent.is_empty() {
        trace_context.insert("traceparent".to_string(), traceparent);
    }
    let msg = pb::ConnectResponse {
        message: Some(pb::connect_response::Message::Assign(pb::TaskAssignment {
            task_id: task.id.clone(),
            attempt: task.attempt,
            execution_id: execution_id.clone(),
            fencing_token: 0,
            handler: task.handler.clone(),
            payload: Some(pb::Payload {
                data: task.payload.clone(),
                content_type: task.content_type.clone(),
            }),
            deadline: Some(timestamp(deadline)),
            trace_context,
            labels: task
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            timeout: Some(duration(task.timeout_ms)),
            report_secret: shared.assignment_secret(&execution_id),
            parent_errors: task
                .workflow
                .iter()
                .flat_map(|w| &w.parent_outputs)
                .filter(|o| o.failed)
                .map(|o| {
                    (
                        o.step.clone(),
                        String::from_utf8_lossy(&o.data).into_owned(),
                    )
                })
                .collect(),
            parent_outputs: task
                .workflow
                .iter()
                .flat_map(|w| &w.parent_outputs)
                .filter(|o| !o.failed)
                .map(|o| {
                    let payload = pb::Payload {
                        data: o.data.clone(),
                        content_type: o.content_type.clone(),
                    };
                    (o.step.clone(), payload)
                })
                .collect(),
            workflow_id: task
                .workflow
                .as_ref()
                .map(|w| w.workflow_id.clone())
                .unwrap_or_default(),
            workflow_step: task
                .workflow
                .as_ref()
                .map(|w| w.step.clone())
                .unwrap_or_default(),
            shard_index: task.shard.map_or(0, |s| s.index),
            shard_total: task.shard.map_or(0, |s| s.total),
        })),
    };
    match tx.try_send(Ok(Box::new(msg))) {
        Ok(()) => {
            meters::dispatched(&task, shared.clock.now_millis());
            debug!(task_id = %task.id, attempt = task.attempt, execution_id = %execution_id, worker_id = %worker_id, "task pushed");
        }
        Err(_) => {
            release_unsent(shared, &task, &execution_id, "stream full or closed").await;
        }
    }
}

async fn release_unsent(shared: &Shared, task: &TaskRecord, execution_id: &str, why: &str) {
    info!(task_id = %task.id, execution_id = %execution_id, reason = why, "push failed, task taken back");
    shared.stats.unsent.fetch_add(1, Ordering::Relaxed);
    let event = crate::lost::lost_event(execution_id, why);
    // The stream is marked closed or busy as its slot frees, so the claim
    // that follows goes to the next candidate.
    if let Err(err) = shared
        .end_attempt_with(&task.id, execution_id, event, After::Unsendable)
        .await
    {
        warn!(task_id = %task.id, error = %err, "could not take back an unsent push");
    }
}
