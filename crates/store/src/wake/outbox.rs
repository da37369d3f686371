//! The outbox: changes this process committed, sent to the other processes
//! by one task, right after the commits, in batches, through the backend's
//! [`Sink`] (`pg_notify` on Postgres, a row of `changes` on MySQL).
//!
//! Why not inside each writing transaction? Postgres serializes the commits
//! of all transactions that sent a notification on one global lock, held
//! while the commit record is flushed: every create, claim and result would
//! queue behind every other, losing the group commit that makes many small
//! transactions fast. On MySQL a row per commit in one table would be a
//! hot spot every writer contends on. Sent from here, data commits touch
//! neither; one sending statement per batch does.
//!
//! The price is that a notification is no longer atomic with its commit:
//! a process that dies between the two loses the wake-up. Notifications are
//! wake-ups, not the record (consumers re-read the store and keep their
//! safety-net timers), and a batch that cannot be sent (the database is
//! unreachable) is retried, or, if it grows too large meanwhile, replaced by
//! a resync line that tells every listener to re-read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Sink, payload};
use crate::{ScheduleChange, TaskChange};

/// Changes kept while sending fails; beyond this a resync is sent instead.
const MAX_PENDING: usize = 100_000;

/// Changes waiting to be sent.
#[derive(Debug)]
pub(crate) struct Outbox {
    pending: std::sync::Mutex<Pending>,
    wake: Notify,
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct Pending {
    tasks: Vec<TaskChange>,
    schedules: Vec<ScheduleChange>,
    /// Some changes were dropped: send a resync line.
    overflow: bool,
}

impl Pending {
    fn len(&self) -> usize {
        self.tasks.len() + self.schedules.len()
    }
}

impl Outbox {
    pub(crate) fn new() -> Self {
        Self {
            pending: std::sync::Mutex::new(Pending::default()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Queues committed changes for the other processes.
    pub(crate) fn push(
        &self,
        tasks: impl IntoIterator<Item = TaskChange>,
        schedules: impl IntoIterator<Item = ScheduleChange>,
    ) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        pending.tasks.extend(tasks);
        pending.schedules.extend(schedules);
        if pending.len() > MAX_PENDING {
            *pending = Pending {
                overflow: true,
                ..Pending::default()
            };
        }
        drop(pending);
        self.wake.notify_one();
    }

    /// Asks the sending task to send what is queued and stop.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn take(&self) -> Pending {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// Puts back a batch that could not be sent, ahead of newer changes.
    fn put_back(&self, mut batch: Pending) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        batch.tasks.append(&mut pending.tasks);
        batch.schedules.append(&mut pending.schedules);
        batch.overflow |= pending.overflow;
        if batch.len() > MAX_PENDING {
            batch = Pending {
                overflow: true,
                ..Pending::default()
            };
        }
        *pending = batch;
    }
}

/// Sends queued changes until the outbox is closed and empty.
pub(crate) async fn run(outbox: Arc<Outbox>, sink: impl Sink, origin: String) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let batch = outbox.take();
        if batch.len() == 0 && !batch.overflow {
            if outbox.closed.load(Ordering::SeqCst) {
                return;
            }
            outbox.wake.notified().await;
            continue;
        }
        let mut payloads = payload::payloads(&origin, &batch.tasks, &batch.schedules);
        if batch.overflow {
            payloads.push(payload::resync_payload(&origin));
        }
        match sink.send(payloads).await {
            Ok(_) => backoff = Duration::from_millis(100),
            Err(err) => {
                if outbox.closed.load(Ordering::SeqCst) {
                    tracing::warn!(error = %err, "could not announce the last changes; closing anyway");
                    return;
                }
                tracing::warn!(error = %err, changes = batch.len(), "cannot announce changes yet; retrying");
                outbox.put_back(batch);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
