//! Helpers shared by the end-to-end tests: a node on ephemeral ports over a
//! temporary SQLite file, gRPC clients, scripted raw worker streams, counting
//! workers, the real binary, and waiting on conditions with deadlines.
#![allow(dead_code)]

pub mod cluster;
pub mod http;
pub mod services;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskmesh::v1::{
    self as pb, connect_request::Message as In, connect_response::Message as Out,
    dispatcher_client::DispatcherClient, task_api_client::TaskApiClient,
};
use taskmesh_cli::node::{NodeOptions, RunningNode};
use taskmesh_worker::{
    HandlerError, Output, TaskContext, Worker, WorkerHandle, WorkerOptions, handler_fn,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Node options on ephemeral loopback ports in `dir`.
pub fn node_options(dir: &Path) -> NodeOptions {
    let mut opts = NodeOptions::new();
    opts.data_dir = dir.to_path_buf();
    opts.grpc_addr = ([127, 0, 0, 1], 0).into();
    opts.http_addr = ([127, 0, 0, 1], 0).into();
    opts
}

/// Starts an in-process node.
pub async fn start_node(opts: NodeOptions) -> RunningNode {
    taskmesh_cli::node::start(opts).await.expect("node starts")
}

/// A `TaskApi` client for `addr`.
pub async fn api(addr: SocketAddr) -> TaskApiClient<Channel> {
    TaskApiClient::new(channel(addr).await)
}

/// A channel to `addr`.
pub async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// Polls `check` until it returns `Some`, failing the test after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        // Polling interval of a condition with a deadline, not a synchronisation sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits an echo-style task and returns its id.
pub async fn submit(api: &mut TaskApiClient<Channel>, handler: &str, payload: &[u8]) -> String {
    api.submit_task(pb::SubmitTaskRequest {
        handler: handler.into(),
        payload: Some(pb::Payload {
            data: payload.to_vec(),
            content_type: "application/json".into(),
        }),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
    .task_id
}

/// Reads a task.
pub async fn get(api: &mut TaskApiClient<Channel>, id: &str) -> pb::Task {
    api.get_task(pb::GetTaskRequest { task_id: id.into() })
        .await
        .expect("get")
        .into_inner()
        .task
        .expect("task")
}

/// The state of a task.
pub fn state(t: &pb::Task) -> pb::TaskState {
    pb::TaskState::try_from(t.state).unwrap_or(pb::TaskState::Unspecified)
}

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
    pub join: tokio::task::JoinHandle<()>,
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

/// [`counting_worker`], on a stream or (`push`) in push mode on a free port.
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
    let handle = worker.handle();
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let join = tokio::spawn(async move {
        let _ = worker.run(token).await;
    });
    TestWorker {
        handle,
        shutdown,
        join,
    }
}

/// A worker stream driven by the test itself, message by message.
pub struct RawWorker {
    pub tx: mpsc::Sender<pb::ConnectRequest>,
    pub rx: tonic::Streaming<pb::ConnectResponse>,
    pub session_id: String,
}

impl RawWorker {
    /// Connects and registers with `handlers` and `capacity`.
    pub async fn connect(
        addr: SocketAddr,
        worker_id: &str,
        handlers: &[&str],
        capacity: u32,
    ) -> Self {
        Self::connect_with(addr, worker_id, handlers, capacity, &[], 1).await
    }

    /// Connects and registers with labels and a weight too.
    pub async fn connect_with(
        addr: SocketAddr,
        worker_id: &str,
        handlers: &[&str],
        capacity: u32,
        labels: &[(&str, &str)],
        weight: u32,
    ) -> Self {
        let (tx, rx) = mpsc::channel(64);
        tx.send(pb::ConnectRequest {
            message: Some(In::Register(pb::WorkerRegistration {
                worker_id: worker_id.into(),
                name: worker_id.into(),
                handlers: handlers.iter().map(|h| h.to_string()).collect(),
                capacity,
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                weight,
            })),
        })
        .await
        .unwrap();
        let mut client = DispatcherClient::new(channel(addr).await);
        let mut rx = client
            .connect(ReceiverStream::new(rx))
            .await
            .expect("connect stream")
            .into_inner();
        let first = rx.message().await.expect("registered").expect("a message");
        let Some(Out::Registered(reg)) = first.message else {
            panic!("expected registered, got {first:?}");
        };
        Self {
            tx,
            rx,
            session_id: reg.session_id,
        }
    }

    /// The next server message, within `limit`.
    pub async fn next(&mut self, limit: Duration) -> Option<Out> {
        match tokio::time::timeout(limit, self.rx.message()).await {
            Ok(Ok(Some(m))) => m.message,
            _ => None,
        }
    }

    /// The next assignment, skipping receipts, within `limit`.
    pub async fn next_assign(&mut self, limit: Duration) -> Option<pb::TaskAssignment> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                Out::Assign(a) => return Some(a),
                _ => continue,
            }
        }
    }

    /// Sends an ACK.
    pub async fn ack(&self, a: &pb::TaskAssignment) {
        self.send(In::Ack(pb::TaskAck {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
        }))
        .await;
    }

    /// Sends a success.
    pub async fn succeed(&self, a: &pb::TaskAssignment) {
        self.send(In::Complete(pb::TaskComplete {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
            result: Some(pb::task_complete::Result::Success(pb::TaskSuccess {
                output: None,
            })),
        }))
        .await;
    }

    /// Rejects an assignment with BUSY.
    pub async fn reject_busy(&self, a: &pb::TaskAssignment) {
        self.send(In::Reject(pb::TaskReject {
            task_id: a.task_id.clone(),
            execution_id: a.execution_id.clone(),
            reason: pb::RejectReason::Busy as i32,
            message: "no free slot".into(),
        }))
        .await;
    }

    /// Sends a heartbeat claiming `active` tasks.
    pub async fn heartbeat(&self, active: u32) {
        self.send(In::Heartbeat(pb::WorkerHeartbeat {
            active,
            cpu_idle_percent: 90.0,
            avg_cost_ms: 10.0,
        }))
        .await;
    }

    /// Every assignment that arrives until none has for `quiet`.
    pub async fn drain_assigns(&mut self, quiet: Duration) -> Vec<pb::TaskAssignment> {
        let mut out = Vec::new();
        while let Some(a) = self.next_assign(quiet).await {
            out.push(a);
        }
        out
    }

    /// Sends one message.
    pub async fn send(&self, m: In) {
        self.tx
            .send(pb::ConnectRequest { message: Some(m) })
            .await
            .expect("stream open");
    }
}

/// The `taskmesh` binary built next to this test (`make test` builds it).
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("taskmesh");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p taskmesh-cli` first (`make test` does)",
        bin.display()
    );
    bin
}

/// A free loopback port (bound then released; the tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped.
pub struct Child(pub std::process::Child);

impl Child {
    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`), failing the test if it cannot.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.0.id()).expect("a pid");
        // SAFETY: kill(2) with a pid we spawned and have not reaped.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `taskmesh serve` as a process and waits until its gRPC port answers.
pub async fn spawn_server(data_dir: &Path, grpc: u16, http: u16, extra: &[&str]) -> Child {
    spawn_server_with(data_dir, grpc, http, extra, &[]).await
}

/// [`spawn_server`] with environment variables; its log (stderr) is
/// appended to `serve-{grpc}.log` in `data_dir`, so a server restarted on
/// the same port keeps its predecessor's log.
pub async fn spawn_server_with(
    data_dir: &Path,
    grpc: u16,
    http: u16,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join(format!("serve-{grpc}.log")))
        .unwrap();
    let child = std::process::Command::new(binary())
        .envs(envs.iter().copied())
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--grpc-addr")
        .arg(format!("127.0.0.1:{grpc}"))
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{http}"))
        .args(extra)
        .env_remove("TASKMESH_SERVER")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn taskmesh serve");
    let child = Child(child);
    let addr: SocketAddr = ([127, 0, 0, 1], grpc).into();
    wait_for(
        "the server to answer",
        Duration::from_secs(30),
        || async move {
            let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).ok()?;
            let ch = ep.connect().await.ok()?;
            TaskApiClient::new(ch)
                .list_tasks(pb::ListTasksRequest::default())
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    child
}

/// Starts an in-process push-mode worker (serving `taskmesh.v1.Worker` on a
/// free loopback port) whose `echo` handler records each execution in
/// `ledger`, and which also serves the built-in `sleep`.
pub fn counting_push_worker(
    addrs: &[SocketAddr],
    id: &str,
    concurrency: u32,
    ledger: Ledger,
) -> TestWorker {
    counting_worker_with(addrs, id, concurrency, ledger, true)
}
