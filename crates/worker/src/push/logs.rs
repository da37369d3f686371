//! Push mode's log lines: sent with `ReportLogs` to the server that granted
//! the attempt's session — every `FLUSH_EVERY` (at once when many wait)
//! while attempts run, and an attempt's last lines just before its result.

use std::collections::HashMap;
use std::sync::Arc;

use taskmesh::v1::ReportLogsRequest;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{CALL_TIMEOUT, Push};
use crate::worker::lock;

/// What `ReportLogs` needs of a running attempt.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) session_id: String,
    pub(super) report_secret: String,
}

impl Push {
    /// Notes a pushed attempt whose lines this worker sends.
    pub(super) fn hold(&self, execution_id: &str, session_id: &str, report_secret: &str) {
        lock(&self.attempts).insert(
            execution_id.to_string(),
            Held {
                session_id: session_id.to_string(),
                report_secret: report_secret.to_string(),
            },
        );
    }

    /// Sends the buffered lines of running attempts (of `only`, if given),
    /// best effort: a line the server does not take is not sent again.
    pub(super) async fn send_logs(&self, only: Option<&str>) {
        let _one_sender = self.log_send.lock().await;
        let held: HashMap<String, Held> = lock(&self.attempts).clone();
        let messages = self.shared.logs.take(
            |e| held.contains_key(e) && only.is_none_or(|o| o == e),
            |e| held.contains_key(e) || lock(&self.shared.running).contains_key(e),
        );
        for logs in messages {
            let Some(h) = held.get(&logs.execution_id) else {
                continue;
            };
            let Some(server) = self.server_of(&h.session_id).await else {
                continue;
            };
            let Ok(mut client) = self.client(&server) else {
                continue;
            };
            let execution_id = logs.execution_id.clone();
            let req = ReportLogsRequest {
                session_id: h.session_id.clone(),
                logs: Some(logs),
                report_secret: h.report_secret.clone(),
            };
            let Ok(req) = crate::wire::request(&self.shared, req) else {
                continue;
            };
            match tokio::time::timeout(CALL_TIMEOUT, client.report_logs(req)).await {
                Ok(Ok(_)) => {}
                Ok(Err(status)) => {
                    debug!(execution_id, code = ?status.code(), error = status.message(), "log lines refused")
                }
                Err(_) => debug!(execution_id, "no answer to ReportLogs in time"),
            }
        }
    }

    /// The attempt has ended: its last lines, then it is forgotten.
    pub(super) async fn release(&self, execution_id: &str) {
        self.send_logs(Some(execution_id)).await;
        lock(&self.attempts).remove(execution_id);
    }
}

/// Sends running attempts' lines until `stop`.
pub(super) async fn flush_loop(push: Arc<Push>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(crate::logs::FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = push.shared.logs.ready.notified() => {}
        }
        push.send_logs(None).await;
    }
}
