//! A push session's link to its worker: the task that reads the session's
//! queue and calls the worker (`Worker.Execute`, `Worker.Cancel`), probes
//! it every heartbeat interval, and ends the session when it is lost.

use taskmesh::v1::{self as pb, connect_response::Message as Out};
use taskmesh_coord::WorkerLoad;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{Instrument, debug, info, warn};

use super::{PROBE_FAILURES, end_session};
use crate::engine::Shared;
use crate::registry::{After, Heartbeat, StreamTx};
use crate::{lost, stream};

/// One push session's link to its worker.
pub(super) struct Link {
    pub(super) shared: Shared,
    pub(super) session_id: String,
    pub(super) worker_id: String,
    pub(super) client: super::PushClient,
    pub(super) tx: StreamTx,
    pub(super) ended: CancellationToken,
}

impl Link {
    pub(super) async fn run(self, mut rx: mpsc::Receiver<crate::registry::StreamItem>) {
        let every = self.shared.opts.heartbeat_interval;
        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (probe_tx, mut probe_rx) = mpsc::channel::<Result<pb::ProbeResponse, Status>>(1);
        let mut probing = false;
        let mut failures = 0u32;
        let stop = self.shared.push.stop.clone();
        let lost = loop {
            tokio::select! {
                biased;
                _ = self.ended.cancelled() => break None,
                _ = stop.cancelled() => break Some("server shutting down".to_string()),
                Some(answer) = probe_rx.recv() => {
                    probing = false;
                    match answer {
                        Ok(p) => {
                            failures = 0;
                            self.on_probe(p).await;
                        }
                        Err(status) => {
                            failures += 1;
                            warn!(failures, error = %status.message(), code = ?status.code(), "push worker probe failed");
                            if failures >= PROBE_FAILURES {
                                break Some(format!(
                                    "{failures} probes failed in a row: {}",
                                    status.message()
                                ));
                            }
                        }
                    }
                }
                Some(msg) = rx.recv() => self.on_queued(msg),
                _ = tick.tick() => {
                    match self.standing() {
                        Standing::Gone => break None,
                        Standing::Done => break Some("deregistered".to_string()),
                        Standing::Lapsed(ms) => break Some(format!(
                            "no registration refresh for {ms} ms (missed heartbeats)"
                        )),
                        Standing::Live => {}
                    }
                    if !probing {
                        probing = true;
                        let (mut client, probe_tx) = (self.client.clone(), probe_tx.clone());
                        tokio::spawn(async move {
                            let answer = match tokio::time::timeout(every, client.probe(pb::ProbeRequest {})).await {
                                Ok(r) => r.map(|r| r.into_inner()),
                                Err(_) => Err(Status::deadline_exceeded("no probe answer within a heartbeat interval")),
                            };
                            let _ = probe_tx.send(answer).await;
                        });
                    }
                }
            }
        };
        if let Some(reason) = lost {
            end_session(&self.shared, &self.session_id, &reason).await;
        }
        debug!(worker_id = %self.worker_id, "push link ended");
    }

    /// Where the session stands at a tick.
    fn standing(&self) -> Standing {
        let sessions = self.shared.push.lock();
        let Some(s) = sessions.get(&self.session_id) else {
            return Standing::Gone;
        };
        if s.leaving {
            if self.shared.registry.in_flight_of(&self.session_id) == Some(0) {
                return Standing::Done;
            }
            // A leaving worker no longer refreshes; the probes watch it.
            return Standing::Live;
        }
        let silent = s.refreshed.elapsed();
        if silent > self.shared.opts.heartbeat_interval * 3 {
            return Standing::Lapsed(silent.as_millis() as u64);
        }
        Standing::Live
    }

    async fn on_probe(&self, p: pb::ProbeResponse) {
        let shared = &self.shared;
        shared.registry.heartbeat(
            &self.session_id,
            Heartbeat {
                active: p.active,
                cpu_idle_percent: p.cpu_idle_percent,
                avg_cost_ms: p.avg_cost_ms,
            },
        );
        if p.draining {
            shared.registry.set_draining(&self.session_id);
        }
        let entry = {
            let mut sessions = shared.push.lock();
            let Some(s) = sessions.get_mut(&self.session_id) else {
                return;
            };
            s.entry.load = WorkerLoad {
                active: p.active,
                cpu_idle_percent: p.cpu_idle_percent,
                avg_cost_ms: p.avg_cost_ms,
            };
            s.entry.last_seen = shared.clock.now_millis();
            s.entry.draining |= p.draining;
            s.entry.clone()
        };
        shared.wake.notify_one();
        if let Err(err) = shared.coord.put_worker(entry).await {
            warn!(error = %err, "cannot refresh the push worker's cluster-wide entry");
        }
    }

    /// What the engine (or a reaper, or an ACK check) queued for the worker.
    fn on_queued(&self, msg: crate::registry::StreamItem) {
        let Ok(pb::ConnectResponse { message: Some(msg) }) = msg.map(|m| *m) else {
            return;
        };
        match msg {
            Out::Assign(a) => {
                let call = Execute {
                    shared: self.shared.clone(),
                    session_id: self.session_id.clone(),
                    client: self.client.clone(),
                    tx: self.tx.clone(),
                };
                tokio::spawn(call.run(a).in_current_span());
            }
            Out::Cancel(c) => {
                let mut client = self.client.clone();
                let every = self.shared.opts.heartbeat_interval;
                tokio::spawn(
                    async move {
                        let req = pb::CancelRequest {
                            task_id: c.task_id.clone(),
                            execution_id: c.execution_id.clone(),
                            reason: c.reason,
                        };
                        match tokio::time::timeout(every, client.cancel(req)).await {
                            Ok(Ok(r)) => debug!(task_id = %c.task_id, execution_id = %c.execution_id, found = r.into_inner().found, "cancel sent to the push worker"),
                            Ok(Err(status)) => debug!(task_id = %c.task_id, execution_id = %c.execution_id, error = %status.message(), "cancel to the push worker failed"),
                            Err(_) => debug!(task_id = %c.task_id, execution_id = %c.execution_id, "cancel to the push worker timed out"),
                        }
                    }
                    .in_current_span(),
                );
            }
            // Never queued (batches form on a stream's way out), but
            // what one holds is each handled alone.
            Out::Batch(b) => {
                for m in b.messages {
                    self.on_queued(Ok(Box::new(m)));
                }
            }
            // Receipts of ACKs (the worker had its answer already), drains
            // (a push worker moves on when this node stops answering).
            Out::Recorded(_) | Out::Drain(_) | Out::Registered(_) => {}
        }
    }
}

enum Standing {
    Live,
    Gone,
    Done,
    Lapsed(u64),
}

/// One `Worker.Execute` call and what follows its answer.
struct Execute {
    shared: Shared,
    session_id: String,
    client: super::PushClient,
    tx: StreamTx,
}

impl Execute {
    async fn run(mut self, a: pb::TaskAssignment) {
        let (task_id, execution_id) = (a.task_id.clone(), a.execution_id.clone());
        let req = pb::ExecuteRequest {
            assignment: Some(a),
            session_id: self.session_id.clone(),
        };
        // The ACK timeout bounds the call: an answer later than that would
        // be refused anyway (the reaper takes the push back).
        let limit = self.shared.opts.ack_timeout;
        let answer = match tokio::time::timeout(limit, self.client.execute(req)).await {
            Ok(r) => r.map(|r| r.into_inner()),
            Err(_) => Err(Status::deadline_exceeded("no answer to Execute in time")),
        };
        let shared = &self.shared;
        match answer {
            Ok(r) if r.accepted => {
                let ack = pb::TaskAck {
                    task_id,
                    execution_id,
                };
                if let Some(after) = stream::on_ack(shared, &self.session_id, &self.tx, ack).await {
                    after.await;
                }
            }
            Ok(r) => {
                let rej = pb::TaskReject {
                    task_id,
                    execution_id,
                    reason: r.reject_reason,
                    message: r.message,
                };
                stream::on_reject(shared, &self.session_id, rej).await;
            }
            Err(status) => {
                // Like a push that could not be sent: taken back at once and
                // the worker offered nothing until a probe shows it well.
                info!(task_id = %task_id, execution_id = %execution_id, code = ?status.code(), error = %status.message(), "push to the worker failed, task taken back");
                shared
                    .stats
                    .unsent
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let why = format!("Worker.Execute failed: {}", status.message());
                let event = lost::lost_event(&execution_id, &why);
                let tx = shared.registry.sender_of(&execution_id);
                if let Err(err) = shared
                    .end_attempt_with(&task_id, &execution_id, event, After::Unsendable)
                    .await
                {
                    debug!(task_id = %task_id, error = %err, "failed push already ended");
                }
                // It may have arrived after all (a timeout, or a connection
                // that broke after the request went out, which is also
                // UNAVAILABLE): tell the worker not to run it. Best effort;
                // an unreachable worker does not get it either way.
                shared.send_cancel(tx, &task_id, &execution_id, "push failed");
            }
        }
    }
}
