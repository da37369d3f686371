//! In-process workers (the Rust SDK) whose failure or panic fails the test:
//! [`TestWorker`] keeps the worker's task and [`stop`](TestWorker::stop)
//! checks how it ended. Counting workers record every execution in a
//! [`Ledger`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskmesh_worker::{
    Error, HandlerError, Output, TaskContext, Worker, WorkerHandle, WorkerOptions, handler_fn,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a stopped worker may take to drain and return.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// Counts executions per task id.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<HashMap<String, u32>>>);

impl Ledger {
    /// Records one execution.
    pub fn record(&self, task_id: &str) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(task_id.to_string())
            .or_default() += 1;
    }
    /// Executions of one task.
    pub fn count(&self, task_id: &str) -> u32 {
        self.0.lock().unwrap().get(task_id).copied().unwrap_or(0)
    }
    /// Every task's execution count.
    pub fn all(&self) -> HashMap<String, u32> {
        self.0.lock().unwrap().clone()
    }
}

/// A running in-process worker.
pub struct TestWorker {
    pub handle: WorkerHandle,
    pub shutdown: CancellationToken,
    pub join: JoinHandle<Result<(), Error>>,
}

impl TestWorker {
    /// Runs `worker` on a task of the test's runtime.
    pub fn spawn(worker: Worker) -> Self {
        let handle = worker.handle();
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(worker.run(shutdown.clone()));
        Self {
            handle,
            shutdown,
            join,
        }
    }

    /// Cancels the worker and waits for `run` to return, failing the test
    /// if it does not within 10 s, panicked, or returned an error.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(STOP_LIMIT, self.join)
            .await
            .expect("the worker's run() did not return after its shutdown")
            .expect("the worker's task panicked")
            .expect("the worker's run() failed");
    }
}

/// Starts an in-process worker whose `echo` handler records each execution
/// in `ledger` (and which also serves the built-in `sleep`).
pub fn counting_worker(
    addrs: &[SocketAddr],
    id: &str,
    concurrency: u32,
    ledger: Ledger,
) -> TestWorker {
    counting_worker_with(addrs, id, concurrency, ledger, false)
}

/// [`counting_worker`] in push mode: it serves `taskmesh.v1.Worker` on a
/// free loopback port and registers that address.
pub fn counting_push_worker(
    addrs: &[SocketAddr],
    id: &str,
    concurrency: u32,
    ledger: Ledger,
) -> TestWorker {
    counting_worker_with(addrs, id, concurrency, ledger, true)
}

fn counting_worker_with(
    addrs: &[SocketAddr],
    id: &str,
    concurrency: u32,
    ledger: Ledger,
    push: bool,
) -> TestWorker {
    let mut opts = WorkerOptions::new(addrs.iter().map(|a| format!("http://{a}")).collect());
    opts.worker_id = id.into();
    opts.name = id.into();
    opts.concurrency = concurrency;
    opts.reconnect_initial = Duration::from_millis(50);
    opts.reconnect_max = Duration::from_millis(500);
    if push {
        opts.push_listen = Some(([127, 0, 0, 1], 0).into());
    }
    let echo = handler_fn(move |ctx: TaskContext| {
        let ledger = ledger.clone();
        async move {
            ledger.record(&ctx.task_id);
            Ok::<_, HandlerError>(Output::new(ctx.payload.clone(), ctx.content_type.clone()))
        }
    });
    let mut worker = Worker::new(opts).handler("echo", echo);
    worker.add_handler("sleep", taskmesh_worker::builtin("sleep").unwrap());
    TestWorker::spawn(worker)
}
