//! Group commit for the hot path: ACKs and results from every worker stream
//! are written in batches, one store transaction (one fsync) per batch
//! instead of one per event. A caller's future resolves only after its
//! batch committed, so a worker is told "recorded" only once it is durable.
//!
//! Batches form by themselves: while one transaction commits, new events
//! queue up and go together in the next. Under light load a batch is one
//! event and nothing waits for a timer.

use std::sync::Arc;

use taskmesh_core::{Clock, Event, TaskRecord};
use taskmesh_store::{Error, Store};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

struct Job {
    task_id: String,
    event: Event,
    reply: oneshot::Sender<Result<TaskRecord, Error>>,
}

/// A handle to the batch writer (cheap to clone).
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the writer task; at most `max_batch` events per transaction.
    pub fn start(store: Arc<dyn Store>, clock: Arc<dyn Clock>, max_batch: usize) -> Self {
        let max_batch = max_batch.max(1);
        // Bounded: past this many queued events callers wait (back-pressure
        // on the worker streams), nothing is dropped.
        let (tx, mut rx) = mpsc::channel::<Job>(max_batch * 4);
        tokio::spawn(async move {
            let mut jobs = Vec::with_capacity(max_batch);
            let mut events: Vec<(String, Event)> = Vec::with_capacity(max_batch);
            let mut replies = Vec::with_capacity(max_batch);
            while rx.recv_many(&mut jobs, max_batch).await > 0 {
                // Moved, not cloned: an event may carry a result's output.
                for job in jobs.drain(..) {
                    events.push((job.task_id, job.event));
                    replies.push(job.reply);
                }
                let now = clock.now_millis();
                match store.transition_many(&events, now, None).await {
                    Ok(results) => {
                        for (reply, result) in replies.drain(..).zip(results) {
                            let _ = reply.send(result);
                        }
                    }
                    Err(err) => {
                        // Every caller gets the batch's error with its kind,
                        // so only a transient one is retried.
                        warn!(error = %err, batch = events.len(), "batched write failed");
                        for reply in replies.drain(..) {
                            let _ = reply.send(Err(err.duplicate()));
                        }
                    }
                }
                events.clear();
            }
        });
        Self { tx }
    }

    /// Applies `event` to the task in the next batch; resolves once that
    /// batch is durable.
    pub async fn apply(&self, task_id: &str, event: Event) -> Result<TaskRecord, Error> {
        self.enqueue(task_id, event).await.await
    }

    /// Queues `event` for the next batch (waiting only while the queue is
    /// full) and returns a future that resolves once its batch is durable.
    /// Events queued by one caller are applied in the order queued, so a
    /// stream can queue an ACK and then its result without waiting for the
    /// ACK's commit in between.
    pub async fn enqueue(&self, task_id: &str, event: Event) -> Pending {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            task_id: task_id.to_string(),
            event,
            reply,
        };
        Pending {
            rx: self.tx.send(job).await.ok().map(|()| rx),
        }
    }
}

/// An event queued on the [`Batcher`]: resolves with the store's answer once
/// its batch committed.
pub struct Pending {
    rx: Option<oneshot::Receiver<Result<TaskRecord, Error>>>,
}

impl std::future::IntoFuture for Pending {
    type Output = Result<TaskRecord, Error>;
    type IntoFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let stopped = || Error::Unavailable("the batch writer has stopped".into());
            match self.rx {
                Some(rx) => rx.await.unwrap_or_else(|_| Err(stopped())),
                None => Err(stopped()),
            }
        })
    }
}
