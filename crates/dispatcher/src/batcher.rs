//! Group commit for the hot path: ACKs and results from every worker stream
//! are written in batches, one store transaction (one fsync) per batch
//! instead of one per event. A caller's future resolves only after its
//! batch committed, so a worker is told "recorded" only once it is durable.
//!
//! Batches form by themselves: while one transaction commits, new events
//! queue up and go together in the next. Under light load a batch is one
//! event and nothing waits for a timer.
//!
//! **Held ACKs.** An ACK from a worker stream is not a write of its own: it
//! is held here (in memory, on the node that holds the stream) for at most
//! the hold bound, and written in front of the next event of the same task
//! — its result, usually — in the same batch, so a short task costs one
//! write between its claim and its end instead of two. A task still running
//! when the bound passes has its ACK written alone, so it shows RUNNING
//! promptly. Nothing is lost by holding: an ACK that a crash loses leaves
//! the task DISPATCHING, and the ACK deadline takes it back exactly as it
//! takes back an attempt whose worker died after a durable ACK.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use taskmesh_core::{Clock, Event, TaskRecord};
use taskmesh_store::{Error, Store};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::warn;

type Reply = oneshot::Sender<Result<TaskRecord, Error>>;

struct Job {
    task_id: String,
    event: Event,
    reply: Reply,
    /// An ACK to hold rather than write at once.
    hold: bool,
}

/// ACKs held for folding, by task id, and the order their bounds pass in
/// (every ACK is held for the same time, so arrival order is deadline order).
#[derive(Default)]
struct Held {
    by_task: HashMap<String, (Event, Reply)>,
    order: VecDeque<(Instant, String)>,
}

impl Held {
    fn next_deadline(&self) -> Option<Instant> {
        self.order.front().map(|(at, _)| *at)
    }
}

/// A handle to the batch writer (cheap to clone).
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the writer task; at most `max_batch` events per transaction;
    /// an ACK queued with [`Batcher::hold_ack`] is written at the latest
    /// `ack_hold` after it arrived.
    pub fn start(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        max_batch: usize,
        ack_hold: Duration,
    ) -> Self {
        let max_batch = max_batch.max(1);
        // Bounded: past this many queued events callers wait (back-pressure
        // on the worker streams), nothing is dropped.
        let (tx, mut rx) = mpsc::channel::<Job>(max_batch * 4);
        tokio::spawn(async move {
            let mut jobs = Vec::with_capacity(max_batch);
            let mut events: Vec<(String, Event)> = Vec::with_capacity(max_batch);
            let mut replies = Vec::with_capacity(max_batch);
            let mut held = Held::default();
            loop {
                let due = held.next_deadline();
                tokio::select! {
                    n = rx.recv_many(&mut jobs, max_batch) => {
                        if n == 0 {
                            break;
                        }
                    }
                    () = sleep_until(due), if due.is_some() => {}
                }
                // Moved, not cloned: an event may carry a result's output.
                for job in jobs.drain(..) {
                    if job.hold {
                        held.order
                            .push_back((Instant::now() + ack_hold, job.task_id.clone()));
                        held.by_task.insert(job.task_id, (job.event, job.reply));
                        continue;
                    }
                    // A held ACK of this task goes first, in the same batch.
                    if let Some((ack, reply)) = held.by_task.remove(&job.task_id) {
                        events.push((job.task_id.clone(), ack));
                        replies.push(reply);
                    }
                    events.push((job.task_id, job.event));
                    replies.push(job.reply);
                }
                // ACKs whose bound passed go alone (their task still runs).
                let now_instant = Instant::now();
                while let Some((at, _)) = held.order.front()
                    && *at <= now_instant
                {
                    let (_, task_id) = held.order.pop_front().expect("front exists");
                    // Gone already when its task's next event took it along.
                    if let Some((ack, reply)) = held.by_task.remove(&task_id) {
                        events.push((task_id, ack));
                        replies.push(reply);
                    }
                }
                write(&*store, &*clock, &mut events, &mut replies).await;
            }
            // Every handle is gone: write what is still held.
            for (task_id, (ack, reply)) in held.by_task.drain() {
                events.push((task_id, ack));
                replies.push(reply);
            }
            write(&*store, &*clock, &mut events, &mut replies).await;
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
        self.send(task_id, event, false).await
    }

    /// Queues an ACK to be held (see the module comment): written in front
    /// of the task's next event, or alone once the hold bound passes. The
    /// future resolves once it is durable.
    pub async fn hold_ack(&self, task_id: &str, ack: Event) -> Pending {
        debug_assert!(matches!(ack, Event::Ack { .. }));
        self.send(task_id, ack, true).await
    }

    async fn send(&self, task_id: &str, event: Event, hold: bool) -> Pending {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            task_id: task_id.to_string(),
            event,
            reply,
            hold,
        };
        Pending {
            rx: self.tx.send(job).await.ok().map(|()| rx),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes `events` in one transaction and answers each caller; leaves both
/// vectors empty.
async fn write(
    store: &dyn Store,
    clock: &dyn Clock,
    events: &mut Vec<(String, Event)>,
    replies: &mut Vec<Reply>,
) {
    if events.is_empty() {
        return;
    }
    match store
        .transition_many(events, clock.now_millis(), None)
        .await
    {
        Ok(results) => {
            for (reply, result) in replies.drain(..).zip(results) {
                let _ = reply.send(result);
            }
        }
        Err(err) => {
            // Every caller gets the batch's error with its kind, so only a
            // transient one is retried.
            warn!(error = %err, batch = events.len(), "batched write failed");
            for reply in replies.drain(..) {
                let _ = reply.send(Err(err.duplicate()));
            }
        }
    }
    events.clear();
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
