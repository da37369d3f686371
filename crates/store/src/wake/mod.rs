//! Wake-ups: committed changes told to this process's subscribers at once,
//! and to the other processes sharing the database by the backend's
//! transport (Postgres: `pg_notify` and LISTEN; MySQL: a `changes` table
//! that replicas poll; SQLite: none, one process owns the file).
//!
//! Notifications are wake-ups, never the record: consumers re-read the
//! store and keep their safety-net timers. A store that may have missed
//! changes (a lost connection, an overflowing queue) tells its subscribers
//! to re-read ([`Channels::lag`]).
//!
//! Layout: `payload` is the text format one process sends the others;
//! `outbox` queues this process's changes and sends them in batches after
//! the commits, through whatever [`Sink`] the backend gives it.

pub(crate) mod outbox;
pub(crate) mod payload;

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::{ChangeInterest, ScheduleChange, TaskChange};

pub(crate) use outbox::Outbox;

/// Capacity of the change channels; a receiver further behind gets `Lagged`.
pub(crate) const CHANGE_CAPACITY: usize = 4096;

/// The broadcast channels of one store, shared by every clone of it and by
/// its transport's receiving half.
#[derive(Debug)]
pub(crate) struct Channels {
    /// Committed task changes, this process's and (relayed) others', one
    /// channel per [`ChangeInterest`] (in the order of
    /// [`ChangeInterest::EVERY`]), each sent only what its interest wants.
    tasks: [broadcast::Sender<TaskChange>; ChangeInterest::EVERY.len()],
    /// Committed schedule changes, likewise.
    pub(crate) schedules: broadcast::Sender<ScheduleChange>,
}

impl Channels {
    pub(crate) fn new() -> Self {
        Self {
            tasks: ChangeInterest::EVERY.map(|_| broadcast::channel(CHANGE_CAPACITY).0),
            schedules: broadcast::channel(CHANGE_CAPACITY).0,
        }
    }

    /// A receiver of the task changes `interest` wants.
    pub(crate) fn subscribe(&self, interest: ChangeInterest) -> broadcast::Receiver<TaskChange> {
        self.tasks[interest.index()].subscribe()
    }

    /// Sends changes to this process's subscribers; nobody listening is fine.
    pub(crate) fn send(&self, tasks: &[TaskChange], schedules: &[ScheduleChange]) {
        for change in tasks {
            for (interest, tx) in ChangeInterest::EVERY.iter().zip(&self.tasks) {
                if interest.wants(change) {
                    let _ = tx.send(change.clone());
                }
            }
        }
        for change in schedules {
            let _ = self.schedules.send(change.clone());
        }
    }

    /// Tells every subscriber that changes may have been missed: a burst of
    /// resync markers one longer than the channel, so a receiver that is not
    /// reading at this very moment gets `Lagged` (the signal every consumer
    /// already re-reads on), and one that keeps up reads markers
    /// ([`TaskChange::is_resync`]) that say the same.
    pub(crate) fn lag(&self) {
        for tx in &self.tasks {
            burst(tx, TaskChange::resync());
        }
        burst(&self.schedules, ScheduleChange::resync());
    }

    /// Relays one payload another process sent (skipping this store's own,
    /// `origin`) to the subscribers.
    pub(crate) fn relay(&self, payload: &str, origin: &str) {
        let Some(decoded) = payload::decode(payload, origin) else {
            return;
        };
        if decoded.lag {
            self.lag();
        }
        self.send(&decoded.tasks, &decoded.schedules);
    }
}

fn burst<T: Clone>(tx: &broadcast::Sender<T>, marker: T) {
    if tx.receiver_count() == 0 {
        return;
    }
    for _ in 0..=CHANGE_CAPACITY {
        let _ = tx.send(marker.clone());
    }
}

/// Where a backend's outbox sends payloads for the other processes.
#[async_trait]
pub(crate) trait Sink: Send + Sync + 'static {
    /// Sends the payloads of one batch, all or none.
    async fn send(&self, payloads: Vec<String>) -> Result<(), sqlx::Error>;
}

/// A backend's wake-up transport between processes: the outbox and the
/// task sending it, and the task receiving the others' payloads. Stopped
/// when dropped; [`Transport::close`] first sends what is queued.
#[derive(Debug)]
pub(crate) struct Transport {
    outbox: std::sync::Arc<Outbox>,
    sender: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    receiver: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Transport {
    /// A fresh origin id for a store's payloads.
    pub(crate) fn new_origin() -> String {
        taskmesh_core::id::new_session_id()
    }

    /// Starts sending this process's changes through `sink`, each payload
    /// naming `origin` (so receivers skip their own store's changes,
    /// already published locally), with `receiver` the task already
    /// relaying the others'.
    pub(crate) fn start(
        origin: String,
        sink: impl Sink,
        receiver: tokio::task::AbortHandle,
    ) -> Self {
        let outbox = std::sync::Arc::new(Outbox::new());
        let sender = tokio::spawn(outbox::run(outbox.clone(), sink, origin));
        Self {
            outbox,
            sender: std::sync::Mutex::new(Some(sender)),
            receiver: std::sync::Mutex::new(Some(receiver)),
        }
    }

    /// Queues committed changes for the other processes.
    pub(crate) fn announce(&self, tasks: &[TaskChange], schedules: &[ScheduleChange]) {
        self.outbox.push(tasks.to_vec(), schedules.to_vec());
    }

    /// Sends the changes still queued (waiting up to 5 s), then stops both
    /// tasks.
    pub(crate) async fn close(&self) {
        self.outbox.close();
        let sender = self.sender.lock().ok().and_then(|mut s| s.take());
        if let Some(sender) = sender
            && tokio::time::timeout(std::time::Duration::from_secs(5), sender)
                .await
                .is_err()
        {
            tracing::warn!("gave up announcing the last changes to other processes");
        }
        self.stop_receiver();
    }

    fn stop_receiver(&self) {
        if let Some(task) = self.receiver.lock().ok().and_then(|mut r| r.take()) {
            task.abort();
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.stop_receiver();
        self.outbox.close();
    }
}
