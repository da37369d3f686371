//! A worker stream driven by the test itself, message by message: what a
//! real worker would send, and what the server answers, read in order.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use taskmesh::v1::{
    self as pb, connect_request::Message as In, connect_response::Message as Out,
    dispatcher_client::DispatcherClient,
};
use taskmesh_dispatcher::DispatchStats;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::node::channel;
use crate::wait_for;

/// How long a fence may take to come back.
const FENCE_LIMIT: Duration = Duration::from_secs(10);

/// A worker stream driven by the test itself, message by message.
pub struct RawWorker {
    pub tx: mpsc::Sender<pb::ConnectRequest>,
    pub rx: tonic::Streaming<pb::ConnectResponse>,
    pub session_id: String,
    pub worker_id: String,
    /// What `registered` said: the server reads `ConnectRequest.batch`.
    pub server_reads_batches: bool,
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
        let reg = pb::WorkerRegistration {
            worker_id: worker_id.into(),
            name: worker_id.into(),
            handlers: handlers.iter().map(|h| h.to_string()).collect(),
            capacity,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            weight,
            ..Default::default()
        };
        Self::open(addr, None, reg).await.expect("register")
    }

    /// Connects presenting `token` (`authorization: Bearer …`) and
    /// registers `reg`; the server's refusal if it refuses.
    pub async fn open(
        addr: SocketAddr,
        token: Option<&str>,
        reg: pb::WorkerRegistration,
    ) -> Result<Self, tonic::Status> {
        let worker_id = reg.worker_id.clone();
        let (tx, rx) = mpsc::channel(64);
        tx.send(pb::ConnectRequest {
            message: Some(In::Register(reg)),
        })
        .await
        .unwrap();
        let mut client = DispatcherClient::new(channel(addr).await);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().expect("a header value");
            request.metadata_mut().insert("authorization", value);
        }
        let mut rx = client.connect(request).await?.into_inner();
        let first = rx.message().await?.expect("a message");
        let Some(Out::Registered(reg)) = first.message else {
            panic!("expected registered, got {first:?}");
        };
        Ok(Self {
            tx,
            rx,
            session_id: reg.session_id,
            worker_id,
            server_reads_batches: reg.accepts_batches,
        })
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

    /// Every assignment the server sent on this stream before now, read
    /// without waiting for a quiet period: an ACK of an execution nobody
    /// holds is answered at once, in order, with a refused receipt and a
    /// cancel, so everything the server sent earlier arrives before them.
    pub async fn fence(&mut self) -> Vec<pb::TaskAssignment> {
        let fence = format!("fence-{}", uuid::Uuid::new_v4().simple());
        self.send(In::Ack(pb::TaskAck {
            task_id: "fence".into(),
            execution_id: fence.clone(),
        }))
        .await;
        let (mut receipt, mut cancel) = (false, false);
        let mut out = Vec::new();
        while !(receipt && cancel) {
            match self.next(FENCE_LIMIT).await {
                Some(Out::Assign(a)) => out.push(a),
                Some(Out::Recorded(r)) if r.execution_id == fence => receipt = true,
                Some(Out::Cancel(c)) if c.execution_id == fence => cancel = true,
                Some(_) => {}
                None => panic!(
                    "the stream of {} did not answer a fence within {FENCE_LIMIT:?}",
                    self.session_id
                ),
            }
        }
        out
    }

    /// Reads exactly `n` assignments (each within 10 s), failing the test
    /// if fewer arrive.
    pub async fn assigns(&mut self, n: usize) -> Vec<pb::TaskAssignment> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let a = self
                .next_assign(Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("{} of {n} assignments arrived", out.len()));
            out.push(a);
        }
        out
    }

    /// Closes the stream as a worker that leaves does (its request half
    /// ends) and waits until the server has ended its half too. A node
    /// stopping drains its streams and waits for them: a test closes its raw
    /// streams before it stops the node.
    pub async fn close(self) {
        let Self { tx, mut rx, .. } = self;
        drop(tx);
        tokio::time::timeout(FENCE_LIMIT, async {
            while let Ok(Some(_)) = rx.message().await {}
        })
        .await
        .expect("the server ends a stream its worker closed");
    }

    /// Sends one message.
    pub async fn send(&self, m: In) {
        self.tx
            .send(pb::ConnectRequest { message: Some(m) })
            .await
            .expect("stream open");
    }
}

/// Waits until the dispatch engine has run `n` more rounds than it had
/// when called (fails the test after 10 s). Rounds run at least every
/// 500 ms, so after three every change made before the call has been
/// looked at by at least two whole rounds: the negative checks of the tests
/// ("nothing was pushed", "nothing was claimed") wait on this instead of a
/// quiet period.
pub async fn rounds(stats: &DispatchStats, n: u64) {
    let from = stats.rounds.load(Ordering::Relaxed);
    wait_for(
        &format!("{n} more dispatch rounds"),
        Duration::from_secs(10),
        || async { (stats.rounds.load(Ordering::Relaxed) >= from + n).then_some(()) },
    )
    .await;
}
