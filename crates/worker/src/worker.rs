//! The [`Worker`] and its [`WorkerHandle`]: the reconnect/failover loop.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::cpu::CpuSampler;
use crate::session::{self, SessionEnd};
use crate::{Error, Handler, SlidingWindow, WorkerOptions};

/// State shared between the worker and its handles.
#[derive(Debug)]
pub(crate) struct HandleState {
    /// One permit per slot.
    pub(crate) slots: Arc<Semaphore>,
    capacity: u32,
    pub(crate) sessions: AtomicU64,
    pub(crate) connected: watch::Sender<bool>,
    /// Push mode: the address the `Worker` service is bound to.
    pub(crate) push_addr: OnceLock<SocketAddr>,
}

/// Everything a running worker's sessions and handler tasks share.
pub(crate) struct Shared {
    pub(crate) opts: WorkerOptions,
    pub(crate) handlers: BTreeMap<String, Arc<dyn Handler>>,
    pub(crate) state: Arc<HandleState>,
    /// Durations (ms) of recently completed tasks.
    pub(crate) stats: Mutex<SlidingWindow>,
    pub(crate) cpu: Mutex<CpuSampler>,
    /// Cancellation tokens of running handlers, by execution id.
    pub(crate) running: Mutex<HashMap<String, CancellationToken>>,
    /// Every spawned handler task, across sessions.
    pub(crate) tracker: TaskTracker,
    /// When a shutdown drain must end; set when shutdown is first seen.
    pub(crate) shutdown_deadline: OnceLock<Instant>,
    /// Handlers' log lines not yet sent.
    pub(crate) logs: Arc<crate::logs::LogBuffer>,
    /// Where handlers submit their children.
    pub(crate) api: Option<Arc<crate::children::ApiLink>>,
}

impl Shared {
    /// The drain deadline of the shutdown, fixed the first time it is asked for.
    pub(crate) fn shutdown_deadline(&self) -> Instant {
        *self
            .shutdown_deadline
            .get_or_init(|| Instant::now() + self.opts.drain_timeout)
    }
}

/// Locks a mutex, ignoring poisoning (the data stays consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A worker: options plus the handlers it serves. Build it, take a
/// [`handle`](Worker::handle) if needed, then [`run`](Worker::run) it.
pub struct Worker {
    opts: WorkerOptions,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    state: Arc<HandleState>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("opts", &self.opts)
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Worker {
    /// A worker with no handlers yet.
    pub fn new(opts: WorkerOptions) -> Worker {
        let state = Arc::new(HandleState {
            slots: Arc::new(Semaphore::new(opts.concurrency as usize)),
            capacity: opts.concurrency,
            sessions: AtomicU64::new(0),
            connected: watch::Sender::new(false),
            push_addr: OnceLock::new(),
        });
        Worker {
            opts,
            handlers: BTreeMap::new(),
            state,
        }
    }

    /// Serves `name` with `handler` (replacing an earlier one of that name).
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.add_handler(name, Arc::new(handler));
        self
    }

    /// Serves `name` with a shared handler (replacing an earlier one of that name).
    pub fn add_handler(&mut self, name: impl Into<String>, handler: Arc<dyn Handler>) {
        self.handlers.insert(name.into(), handler);
    }

    /// The worker's options.
    pub fn options(&self) -> &WorkerOptions {
        &self.opts
    }

    /// A cheap, cloneable view of the worker's live state.
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            state: self.state.clone(),
        }
    }

    /// With [`WorkerOptions::push_listen`] set, runs in push mode instead:
    /// serves `taskmesh.v1.Worker` there, registers the address with the
    /// first server that answers and refreshes it every heartbeat interval.
    ///
    /// Connects, serves assignments and reconnects (with backoff and
    /// failover across `servers`) until `shutdown` is cancelled; then drains:
    /// sends `draining`, rejects new work with BUSY, waits up to
    /// `drain_timeout` for running handlers, reports them and returns.
    ///
    /// A server `drain` ends only the current session: the worker finishes
    /// its handlers, closes the stream, then reconnects after a backoff delay
    /// to the next server in the list (the drained one is likely going away).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        self.opts.validate()?;
        if self.handlers.is_empty() {
            return Err(Error::InvalidOptions(
                "at least one handler is required".into(),
            ));
        }
        let shared = Arc::new(Shared {
            handlers: self.handlers,
            state: self.state,
            stats: Mutex::new(SlidingWindow::default()),
            cpu: Mutex::new(CpuSampler::default()),
            running: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            shutdown_deadline: OnceLock::new(),
            logs: Arc::new(crate::logs::LogBuffer::new(self.opts.log_buffer_lines)),
            api: crate::children::ApiLink::of(&self.opts),
            opts: self.opts,
        });
        if let Some(listen) = shared.opts.push_listen {
            crate::push::run(&shared, listen, &shutdown).await?;
            info!(worker_id = shared.opts.worker_id.as_str(), "worker stopped");
            return Ok(());
        }
        let worker_id = shared.opts.worker_id.as_str();
        let servers = &shared.opts.servers;
        let mut backoff = Backoff::new(shared.opts.reconnect_initial, shared.opts.reconnect_max);
        let mut index = 0usize;
        loop {
            let server = servers[index % servers.len()].as_str();
            let before = shared.state.sessions.load(Ordering::SeqCst);
            let result = session::run(&shared, server, &shutdown).await;
            shared.state.connected.send_replace(false);
            if shared.state.sessions.load(Ordering::SeqCst) != before {
                backoff.reset();
            }
            match result {
                Ok(SessionEnd::Shutdown) => break,
                Ok(SessionEnd::ServerDrain) => {
                    info!(worker_id, server, "session drained by the server")
                }
                Ok(SessionEnd::Closed) => warn!(worker_id, server, "stream closed by the server"),
                Err(error) => warn!(worker_id, server, %error, "session failed"),
            }
            if shutdown.is_cancelled() {
                break;
            }
            index = index.wrapping_add(1);
            let delay = backoff.next_delay();
            debug!(
                worker_id,
                next_server = servers[index % servers.len()].as_str(),
                delay_ms = delay.as_millis() as u64,
                "reconnecting after a delay"
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        finish(&shared).await;
        info!(worker_id, "worker stopped");
        Ok(())
    }
}

/// Waits (until the shutdown deadline) for handlers still running, e.g.
/// those of dead sessions, then cancels any that remain.
pub(crate) async fn finish(shared: &Shared) {
    shared.tracker.close();
    let deadline = shared.shutdown_deadline();
    if tokio::time::timeout_at(deadline, shared.tracker.wait())
        .await
        .is_err()
    {
        let running = lock(&shared.running);
        warn!(
            worker_id = shared.opts.worker_id.as_str(),
            running = running.len(),
            "drain timed out; cancelling running handlers"
        );
        running.values().for_each(CancellationToken::cancel);
    }
}

impl HandleState {
    /// Slots taken now.
    pub(crate) fn capacity_used(&self) -> u32 {
        let free = u32::try_from(self.slots.available_permits()).unwrap_or(u32::MAX);
        self.capacity.saturating_sub(free)
    }
}

/// A cheap, cloneable view of a worker's live state.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    state: Arc<HandleState>,
}

impl WorkerHandle {
    /// Handlers running now (across sessions).
    pub fn active(&self) -> u32 {
        self.state.capacity_used()
    }

    /// Push mode: the address the `Worker` service is bound to, once bound.
    pub fn push_address(&self) -> Option<SocketAddr> {
        self.state.push_addr.get().copied()
    }

    /// True while a registered session is open (push mode: while the last
    /// registration or refresh succeeded).
    pub fn is_connected(&self) -> bool {
        *self.state.connected.borrow()
    }

    /// Number of successful registrations so far.
    pub fn sessions(&self) -> u64 {
        self.state.sessions.load(Ordering::SeqCst)
    }

    /// Waits until a session is registered; false if `timeout` passes first.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.state.connected.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|connected| *connected)).await,
            Ok(Ok(_))
        )
    }
}
