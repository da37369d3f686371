//! Group commit for `SubmitTask` and `SubmitTasks`: concurrent submits are
//! written together with one `Store::create_tasks` (one transaction, one
//! fsync) instead of one transaction each. A caller's future resolves only after
//! its batch committed, so a submit is answered only once it is durable.
//!
//! Batches form by themselves, as in the [`Batcher`](crate::Batcher): while
//! one transaction commits, new submits queue up and go together in the
//! next; under light load a batch is one task and nothing waits for a timer.
//! At 1,000 single submits a second on SQLite this is what keeps the single
//! writer from spending itself on a thousand commits a second while the
//! claims and the workers' ACKs queue behind them.
//!
//! **Dispatch at submit** ([`AtWrite`]): when a handler has nothing READY
//! (its last claim found it empty, `engine::Drained`) and one of this
//! node's streams has a free slot, a new task is written already claimed
//! for that stream, in the submit's own transaction
//! (`Store::create_tasks_dispatching`), and pushed after the commit: one
//! durable write between submit and start instead of two (the create, then
//! the engine's claim). A handler with a backlog is left to the engine, so
//! a new task never overtakes older READY ones.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskmesh_core::{Clock, NewTask, TaskRecord, TaskState, UnixMillis};
use taskmesh_store::{Claim, Created, Error, FireCommit, FireCommitted, Store};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use crate::engine::{Drained, Reservations, lock};
use crate::registry::Registry;

/// What dispatching at a write needs (a submit's, or a schedule fire's:
/// [`taskmesh_scheduler::FireDispatch`]): the streams, what the engine
/// knows of READY backlogs, the ACK timeout, and where claimed tasks go to
/// be pushed (the engine's loop, after the commit).
pub(crate) struct AtWrite {
    pub(crate) registry: Registry,
    pub(crate) drained: Arc<Mutex<Drained>>,
    pub(crate) ack_timeout: Duration,
    pub(crate) pushes: mpsc::UnboundedSender<TaskRecord>,
    /// Read again when a fire commits: a round's `now` was read before the
    /// round's other work, and an ACK deadline counted from it would be
    /// shortened by all of it.
    pub(crate) clock: Arc<dyn Clock>,
}

impl AtWrite {
    /// Reservations for a write at `now`.
    fn reservations(&self, now: UnixMillis) -> Reservations<'_> {
        let ack_deadline = now.saturating_add(self.ack_timeout.as_millis() as i64);
        Reservations::new(&self.registry, ack_deadline)
    }

    /// The chooser's answer for a new READY `task`: a free stream of this
    /// node, unless its handler has a backlog (the engine's: a new task
    /// never overtakes older READY ones).
    fn choose(&self, reservations: &mut Reservations<'_>, task: &TaskRecord) -> Option<Claim> {
        if !lock(&self.drained).is_empty(&task.namespace, &task.handler) {
            return None;
        }
        reservations.choose(task)
    }

    /// After the write: hands the tasks it wrote DISPATCHING for one of its
    /// reservations (among `written`, the tasks it answered with) to the
    /// engine to push, and gives back the reservations it did not write.
    fn settle<'t>(
        &self,
        reservations: &Reservations<'_>,
        written: impl Iterator<Item = &'t TaskRecord> + Clone,
    ) {
        if reservations.chosen.is_empty() {
            return;
        }
        // Only a task claimed for an execution id reserved here: one the
        // write found stored (an idempotent repeat, a fire key a racing
        // writer holds) may be DISPATCHING for another's claim.
        let chosen: std::collections::HashSet<&str> =
            reservations.chosen.iter().map(String::as_str).collect();
        let dispatched = written.filter(move |t| {
            t.state == TaskState::Dispatching
                && t.execution_id
                    .as_deref()
                    .is_some_and(|e| chosen.contains(e))
        });
        for task in dispatched.clone() {
            // The engine outlives the writers; if it has stopped, the ACK
            // timeout takes the task back.
            let _ = self.pushes.send(task.clone());
        }
        // Claims the store did not write (a refused batch goes row by row
        // without them; a failed one writes nothing).
        reservations.release_unwritten(dispatched);
    }

    /// Writes `tasks`, each new READY task of a handler without a backlog
    /// claimed for a free stream of this node.
    async fn create(
        &self,
        store: &dyn Store,
        tasks: Vec<(NewTask, String)>,
        now: UnixMillis,
    ) -> Result<Vec<Result<Created, Error>>, Error> {
        let mut reservations = self.reservations(now);
        let mut chooser = |task: &TaskRecord| self.choose(&mut reservations, task);
        let result = store
            .create_tasks_dispatching(tasks, now, &mut chooser)
            .await;
        let new = result
            .iter()
            .flatten()
            .flatten()
            .filter(|c| !c.existing)
            .map(|c| &c.task);
        self.settle(&reservations, new);
        result
    }
}

#[async_trait::async_trait]
impl taskmesh_scheduler::FireDispatch for AtWrite {
    async fn commit_fires(
        &self,
        store: &dyn Store,
        commits: Vec<FireCommit>,
        now: UnixMillis,
        fence: u64,
    ) -> Result<Vec<Result<Option<FireCommitted>, Error>>, Error> {
        // The ACK deadline counts from now, not from the round's start.
        let mut reservations = self.reservations(now.max(self.clock.now_millis()));
        let mut chooser = |task: &TaskRecord| self.choose(&mut reservations, task);
        let result = store
            .commit_fires_dispatching(commits, now, Some(fence), &mut chooser)
            .await;
        let written = result
            .iter()
            .flatten()
            .flatten()
            .flatten()
            .flat_map(|done| &done.tasks);
        self.settle(&reservations, written);
        result
    }
}

struct Job {
    tasks: Vec<(NewTask, String)>,
    reply: oneshot::Sender<Result<Vec<Result<Created, Error>>, Error>>,
}

/// A handle to the submit writer (cheap to clone).
#[derive(Clone)]
pub struct Submitter {
    tx: mpsc::Sender<Job>,
}

impl Submitter {
    /// Starts the writer task; a transaction takes queued requests until it
    /// holds at least `max_batch` tasks (one request is never split).
    pub fn start(store: Arc<dyn Store>, clock: Arc<dyn Clock>, max_batch: usize) -> Self {
        Self::start_with(store, clock, max_batch, None)
    }

    /// [`Submitter::start`], dispatching at submit with `at_write`.
    pub(crate) fn start_with(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        max_batch: usize,
        at_write: Option<Arc<AtWrite>>,
    ) -> Self {
        let max_batch = max_batch.max(1);
        // Bounded: past this many queued requests callers wait (and the
        // shedding layer refuses new calls past its limit); nothing is dropped.
        let (tx, mut rx) = mpsc::channel::<Job>(1_024);
        tokio::spawn(async move {
            let mut jobs: Vec<Job> = Vec::new();
            while let Some(first) = rx.recv().await {
                let mut size = first.tasks.len();
                jobs.push(first);
                while size < max_batch {
                    match rx.try_recv() {
                        Ok(job) => {
                            size += job.tasks.len();
                            jobs.push(job);
                        }
                        Err(_) => break,
                    }
                }
                // A caller that gave up (cancelled, timed out) got no answer:
                // do not create its tasks behind its back.
                jobs.retain(|j| !j.reply.is_closed());
                if jobs.is_empty() {
                    continue;
                }
                let now = clock.now_millis();
                let create = |tasks: Vec<(NewTask, String)>| {
                    let store = store.as_ref();
                    let at_write = at_write.as_ref();
                    async move {
                        match at_write {
                            Some(at) => at.create(store, tasks, now).await,
                            None => store.create_tasks(tasks, now).await,
                        }
                    }
                };
                if jobs.len() == 1 {
                    let job = jobs.pop().expect("one job");
                    let _ = job.reply.send(create(job.tasks).await);
                    continue;
                }
                let batch: Vec<(NewTask, String)> =
                    jobs.iter().flat_map(|j| j.tasks.iter().cloned()).collect();
                match create(batch).await {
                    Ok(results) => {
                        let mut results = results.into_iter();
                        for job in jobs.drain(..) {
                            let mine: Vec<_> = results.by_ref().take(job.tasks.len()).collect();
                            let _ = job.reply.send(Ok(mine));
                        }
                    }
                    Err(err @ (Error::Unavailable(_) | Error::StorageFull(_))) => {
                        // The store cannot be reached (or the commit's fate
                        // is unknown), or is out of space: every caller is
                        // told so and may retry (with its client_request_id,
                        // safely). Writing each request again here could
                        // double a batch that did commit, and would hold the
                        // writer for one timeout (or one failed write) per
                        // request.
                        warn!(error = %err, requests = jobs.len(), "batched submit failed");
                        for job in jobs.drain(..) {
                            let _ = job.reply.send(Err(err.duplicate()));
                        }
                    }
                    Err(err) => {
                        // Refused as a whole for another reason (nothing was
                        // written): each request then goes alone, so every
                        // caller gets its own answer with its own error
                        // kind, and no request fails because of another's.
                        warn!(error = %err, requests = jobs.len(), "batched submit failed; writing each request alone");
                        for job in jobs.drain(..) {
                            let _ = job.reply.send(store.create_tasks(job.tasks, now).await);
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    /// Writes `tasks` (with their request fingerprints) in the next batch;
    /// resolves once that batch is durable, with what
    /// [`Store::create_tasks`] would have answered for them alone.
    pub async fn create_many(
        &self,
        tasks: Vec<(NewTask, String)>,
    ) -> Result<Vec<Result<Created, Error>>, Error> {
        let (reply, rx) = oneshot::channel();
        let stopped = || Error::Unavailable("the submit writer has stopped".into());
        self.tx
            .send(Job { tasks, reply })
            .await
            .map_err(|_| stopped())?;
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// One task: what [`Store::create_task`] would have answered.
    pub async fn create(&self, task: NewTask, fingerprint: String) -> Result<Created, Error> {
        self.create_many(vec![(task, fingerprint)])
            .await?
            .pop()
            .unwrap_or_else(|| {
                Err(Error::Unavailable(
                    "the submit writer lost an answer".into(),
                ))
            })
    }
}
