//! A scripted `Dispatcher` server for the worker tests: it answers
//! `register` with `registered` and hands every stream to the test; push
//! registrations are answered with one session, except the calls the test
//! scripted to fail, and recorded.

#![allow(dead_code)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use taskmesh::v1::dispatcher_server::{Dispatcher, DispatcherServer};
use taskmesh::v1::{
    ConnectRequest, ConnectResponse, Payload, TaskAssignment, TaskCancel, WorkerHeartbeat,
    WorkerRegistered, WorkerRegistration, connect_request, connect_response,
};
use taskmesh_testkit::background::BackgroundServer;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// How long a test waits for anything before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A running scripted server.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub addr: String,
    conns: mpsc::UnboundedReceiver<Conn>,
    server: BackgroundServer,
    push: Arc<PushScript>,
}

/// How the server answers `RegisterPushWorker`.
#[derive(Default)]
struct PushScript {
    /// 1-based numbers of the calls answered UNAVAILABLE.
    fail: Vec<usize>,
    /// The session id each call carried, in order.
    calls: Mutex<Vec<String>>,
}

impl Server {
    /// Starts a server telling workers to heartbeat every `heartbeat`.
    pub async fn start(heartbeat: Duration) -> Server {
        Self::start_push(heartbeat, &[]).await
    }

    /// Starts a server that also answers push registrations (session
    /// `push-session`), failing the calls numbered in `fail` (1-based) with
    /// UNAVAILABLE.
    pub async fn start_push(heartbeat: Duration, fail: &[usize]) -> Server {
        let push = Arc::new(PushScript {
            fail: fail.to_vec(),
            calls: Mutex::default(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let (conns_tx, conns) = mpsc::unbounded_channel();
        let svc = Svc {
            heartbeat,
            conns: conns_tx,
            push: push.clone(),
        };
        let server = BackgroundServer::spawn("the scripted dispatcher", |stop| {
            tonic::transport::Server::builder()
                .add_service(DispatcherServer::new(svc))
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop.cancelled_owned())
        });
        Server {
            addr,
            conns,
            server,
            push,
        }
    }

    /// Stops the server, failing the test if it failed or panicked.
    pub async fn stop(self) {
        self.server.stop().await;
    }

    /// The session id each push registration carried ("" = a first one).
    pub fn push_calls(&self) -> Vec<String> {
        self.push.calls.lock().unwrap().clone()
    }

    /// The next worker stream (after its first message arrived).
    pub async fn accept(&mut self) -> Conn {
        tokio::time::timeout(WAIT, self.conns.recv())
            .await
            .expect("no worker connected in time")
            .expect("server stopped")
    }
}

/// An address nothing listens on.
pub async fn dead_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    addr
}

struct Svc {
    heartbeat: Duration,
    conns: mpsc::UnboundedSender<Conn>,
    push: Arc<PushScript>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ConnectResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Dispatcher for Svc {
    type ConnectStream = ResponseStream;

    // Push mode is tested end to end against the real server (tests/push.rs);
    // this scripted server only answers registrations, for the SDK's
    // registration loop.
    async fn register_push_worker(
        &self,
        request: Request<taskmesh::v1::RegisterPushWorkerRequest>,
    ) -> Result<Response<taskmesh::v1::RegisterPushWorkerResponse>, Status> {
        let n = {
            let mut calls = self.push.calls.lock().unwrap();
            calls.push(request.into_inner().session_id);
            calls.len()
        };
        if self.push.fail.contains(&n) {
            return Err(Status::unavailable(format!("scripted failure of call {n}")));
        }
        Ok(Response::new(taskmesh::v1::RegisterPushWorkerResponse {
            registered: Some(WorkerRegistered {
                session_id: "push-session".into(),
                heartbeat_interval: Some(self.heartbeat.try_into().unwrap()),
                ack_timeout: Some(Duration::from_secs(10).try_into().unwrap()),
                accepts_batches: false,
            }),
        }))
    }

    async fn report_result(
        &self,
        _: Request<taskmesh::v1::ReportResultRequest>,
    ) -> Result<Response<taskmesh::v1::ReportResultResponse>, Status> {
        Err(Status::unimplemented("stream only"))
    }

    async fn report_logs(
        &self,
        _: Request<taskmesh::v1::ReportLogsRequest>,
    ) -> Result<Response<taskmesh::v1::ReportLogsResponse>, Status> {
        Err(Status::unimplemented("stream only"))
    }

    async fn deregister_push_worker(
        &self,
        _: Request<taskmesh::v1::DeregisterPushWorkerRequest>,
    ) -> Result<Response<taskmesh::v1::DeregisterPushWorkerResponse>, Status> {
        Err(Status::unimplemented("stream only"))
    }

    async fn connect(
        &self,
        request: Request<Streaming<ConnectRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let mut inbound = request.into_inner();
        let (to_worker, to_worker_rx) = mpsc::unbounded_channel();
        let (from_worker_tx, from_worker) = mpsc::unbounded_channel();
        let (closed_tx, closed_rx) = oneshot::channel::<()>();
        let heartbeat = self.heartbeat;
        let conns = self.conns.clone();
        tokio::spawn(async move {
            let Ok(Some(first)) = inbound.message().await else {
                return;
            };
            if let Some(connect_request::Message::Register(_)) = &first.message {
                let registered = WorkerRegistered {
                    session_id: "session".into(),
                    heartbeat_interval: Some(heartbeat.try_into().unwrap()),
                    ack_timeout: Some(Duration::from_secs(5).try_into().unwrap()),
                    // As a server from before batches: the worker must send
                    // every message alone (the tests read them one by one).
                    accepts_batches: false,
                };
                let _ = to_worker.send(Ok(ConnectResponse {
                    message: Some(connect_response::Message::Registered(registered)),
                }));
            }
            let _ = conns.send(Conn {
                first,
                tx: to_worker,
                rx: from_worker,
                heartbeats: Vec::new(),
                logs: Vec::new(),
            });
            while let Ok(Some(message)) = inbound.message().await {
                let _ = from_worker_tx.send(message);
            }
            drop(closed_tx);
        });
        // The response ends when the test drops its `Conn` or the worker
        // closes its half.
        let stream = UnboundedReceiverStream::new(to_worker_rx).take_until(closed_rx);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One worker stream as seen by the server.
pub struct Conn {
    /// The worker's first message.
    pub first: ConnectRequest,
    tx: mpsc::UnboundedSender<Result<ConnectResponse, Status>>,
    rx: mpsc::UnboundedReceiver<ConnectRequest>,
    /// Heartbeats skipped by [`Conn::next`].
    pub heartbeats: Vec<WorkerHeartbeat>,
    /// Log lines skipped by [`Conn::next`], in arrival order.
    pub logs: Vec<taskmesh::v1::TaskLogs>,
}

impl Conn {
    /// The registration the worker opened with.
    pub fn registration(&self) -> &WorkerRegistration {
        match &self.first.message {
            Some(connect_request::Message::Register(r)) => r,
            other => panic!("first message is not register: {other:?}"),
        }
    }

    /// Sends a message to the worker.
    pub fn send(&self, message: connect_response::Message) {
        self.tx
            .send(Ok(ConnectResponse {
                message: Some(message),
            }))
            .expect("stream closed");
    }

    /// Assigns `handler` with a JSON payload.
    pub fn assign(&self, execution_id: &str, handler: &str, attempt: u32, payload: &[u8]) {
        self.send(connect_response::Message::Assign(TaskAssignment {
            task_id: format!("task-{execution_id}"),
            attempt,
            execution_id: execution_id.into(),
            fencing_token: 1,
            handler: handler.into(),
            payload: Some(Payload {
                data: payload.to_vec(),
                content_type: "application/json".into(),
            }),
            ..Default::default()
        }));
    }

    /// Cancels an execution.
    pub fn cancel(&self, execution_id: &str) {
        self.send(connect_response::Message::Cancel(TaskCancel {
            task_id: format!("task-{execution_id}"),
            execution_id: execution_id.into(),
            reason: "test".into(),
        }));
    }

    /// The next message, heartbeats included.
    pub async fn next_any(&mut self) -> Option<connect_request::Message> {
        let message = tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("no message from the worker in time")?;
        Some(message.message.expect("empty message"))
    }

    /// The next message that is neither a heartbeat nor log lines (those
    /// are kept in `heartbeats` and `logs`).
    pub async fn next(&mut self) -> connect_request::Message {
        loop {
            match self.next_any().await.expect("worker closed the stream") {
                connect_request::Message::Heartbeat(h) => self.heartbeats.push(h),
                connect_request::Message::Logs(l) => self.logs.push(l),
                other => return other,
            }
        }
    }

    /// Waits until the worker closes its half, failing on anything but
    /// heartbeats and log lines.
    pub async fn closed(&mut self) {
        while let Some(message) = self.next_any().await {
            match message {
                connect_request::Message::Heartbeat(h) => self.heartbeats.push(h),
                connect_request::Message::Logs(l) => self.logs.push(l),
                other => panic!("unexpected message before close: {other:?}"),
            }
        }
    }
}
