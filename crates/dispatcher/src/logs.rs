//! Task logs on the node: lines arriving from worker streams and push-mode
//! `ReportLogs` calls are queued here and written by one task in batches
//! (one store transaction per flush), off the hot path: a stream hands its
//! lines over without waiting for any write.
//!
//! Lines are not tasks: when the queue is full (the store is slower than
//! the lines arrive) new lines are shed and counted
//! (`taskmesh_log_lines_total{outcome="shed"}`), never waited for, so a
//! chatty handler cannot hold up results on its stream. Followers
//! (`WatchTaskLogs`) on this node hear of each flush at once; lines written
//! by other replicas reach them by polling.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_core::UnixMillis;
use taskmesh_core::logs::{LogBatch, LogCap, LogLevel, LogLine};
use taskmesh_store::Store;
use tokio::sync::{broadcast, mpsc};
use tracing::warn;

/// Counts lines by what became of them (`outcome`: stored, truncated by
/// the cap, unknown execution, shed by a full queue, lost to a store
/// error).
pub const LOG_LINES_TOTAL: &str = "taskmesh_log_lines_total";

/// Longest line stored, in bytes (the contract's limit); longer ones are
/// cut at a character boundary.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Most lines one `TaskLogs` message may carry (the contract's limit);
/// lines beyond are counted as dropped.
pub const MAX_LINES_PER_MESSAGE: usize = 1_000;

/// Lines one store transaction takes at most.
const FLUSH_LINES: usize = 5_000;
/// Writes of a flush the store refused as transient are tried this often.
const WRITE_TRIES: u32 = 3;

/// How the node keeps task logs.
#[derive(Debug, Clone, Copy)]
pub struct LogOptions {
    /// What one attempt keeps.
    pub cap: LogCap,
    /// Lines queued on this node for writing; past it new lines are shed.
    pub queue_lines: usize,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            cap: LogCap::default(),
            queue_lines: 100_000,
        }
    }
}

/// A handle to the node's log writer (cheap to clone).
#[derive(Clone)]
pub struct LogWriter {
    tx: mpsc::UnboundedSender<LogBatch>,
    queued: Arc<AtomicUsize>,
    limit: usize,
    written: broadcast::Sender<Arc<str>>,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish()
    }
}

impl LogWriter {
    /// Starts the writer task over `store`.
    pub fn start(store: Arc<dyn Store>, opts: LogOptions) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<LogBatch>();
        let queued = Arc::new(AtomicUsize::new(0));
        let (written, _) = broadcast::channel(1_024);
        let handle = LogWriter {
            tx,
            queued: queued.clone(),
            limit: opts.queue_lines.max(1),
            written: written.clone(),
        };
        tokio::spawn(async move {
            let mut batches: Vec<LogBatch> = Vec::new();
            while let Some(first) = rx.recv().await {
                let mut lines = first.lines.len();
                batches.push(first);
                while lines < FLUSH_LINES {
                    match rx.try_recv() {
                        Ok(b) => {
                            lines += b.lines.len();
                            batches.push(b);
                        }
                        Err(_) => break,
                    }
                }
                flush(&*store, opts.cap, &batches).await;
                queued.fetch_sub(lines, Ordering::Relaxed);
                for b in batches.drain(..) {
                    let _ = written.send(Arc::from(b.task_id.as_str()));
                }
            }
        });
        handle
    }

    /// Queues `batch` for the next flush; false (and the lines counted as
    /// shed) when the queue is full.
    pub fn offer(&self, batch: LogBatch) -> bool {
        let n = batch.lines.len();
        let before = self.queued.fetch_add(n, Ordering::Relaxed);
        if before + n > self.limit && before > 0 {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            metrics::counter!(LOG_LINES_TOTAL, "outcome" => "shed").increment(n as u64);
            return false;
        }
        if self.tx.send(batch).is_err() {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Hears the id of every task whose lines this node wrote, after the
    /// write.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.written.subscribe()
    }
}

async fn flush(store: &dyn Store, cap: LogCap, batches: &[LogBatch]) {
    let lines: u64 = batches.iter().map(|b| b.lines.len() as u64).sum();
    let mut tries = 0;
    let mut backoff = Duration::from_millis(100);
    loop {
        tries += 1;
        match store.append_logs(batches, cap).await {
            Ok(got) => {
                for (outcome, n) in [
                    ("stored", got.stored),
                    ("truncated", got.truncated),
                    ("unknown", got.unknown),
                ] {
                    if n > 0 {
                        metrics::counter!(LOG_LINES_TOTAL, "outcome" => outcome).increment(n);
                    }
                }
                return;
            }
            Err(err) if err.is_transient() && tries < WRITE_TRIES => {
                tokio::time::sleep(backoff).await;
                backoff *= 4;
            }
            Err(err) => {
                warn!(error = %err, lines, batches = batches.len(), "task log lines lost: the store refused them");
                metrics::counter!(LOG_LINES_TOTAL, "outcome" => "store_error").increment(lines);
                return;
            }
        }
    }
}

/// The batch of a worker's `TaskLogs` message received at `now`: lines cut
/// to the contract's limits (over-long text cut at a character boundary,
/// lines past the per-message limit counted as dropped), unset times read
/// as `now`.
pub fn batch_of(logs: pb::TaskLogs, now: UnixMillis) -> LogBatch {
    let extra = logs.lines.len().saturating_sub(MAX_LINES_PER_MESSAGE) as u64;
    let lines = logs
        .lines
        .into_iter()
        .take(MAX_LINES_PER_MESSAGE)
        .map(|l| LogLine {
            at: l.time.map_or(now, |t| {
                t.seconds.saturating_mul(1_000)
                    + i64::from(t.nanos.clamp(0, 999_999_999) / 1_000_000)
            }),
            level: level_of(l.level),
            message: cut(l.message, MAX_LINE_BYTES),
        })
        .collect();
    LogBatch {
        task_id: logs.task_id,
        execution_id: logs.execution_id,
        lines,
        dropped: logs.dropped.saturating_add(extra),
    }
}

/// The contract's level as stored (unspecified and unknown read as INFO).
pub fn level_of(level: i32) -> LogLevel {
    match pb::LogLevel::try_from(level) {
        Ok(pb::LogLevel::Trace) => LogLevel::Trace,
        Ok(pb::LogLevel::Debug) => LogLevel::Debug,
        Ok(pb::LogLevel::Warn) => LogLevel::Warn,
        Ok(pb::LogLevel::Error) => LogLevel::Error,
        _ => LogLevel::Info,
    }
}

/// The stored level as the contract's.
pub fn level_to_pb(level: LogLevel) -> pb::LogLevel {
    match level {
        LogLevel::Trace => pb::LogLevel::Trace,
        LogLevel::Debug => pb::LogLevel::Debug,
        LogLevel::Info => pb::LogLevel::Info,
        LogLevel::Warn => pb::LogLevel::Warn,
        LogLevel::Error => pb::LogLevel::Error,
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_to_the_contract() {
        let long = "é".repeat(MAX_LINE_BYTES); // two bytes each
        let line = pb::LogLine {
            time: None,
            level: 99,
            message: long,
        };
        let logs = pb::TaskLogs {
            task_id: "t".into(),
            execution_id: "e".into(),
            lines: vec![line; MAX_LINES_PER_MESSAGE + 3],
            dropped: 4,
        };
        let b = batch_of(logs, 42);
        assert_eq!(b.lines.len(), MAX_LINES_PER_MESSAGE);
        assert_eq!(
            b.dropped, 7,
            "the worker's count plus the lines past the limit"
        );
        assert_eq!(b.lines[0].message.len(), MAX_LINE_BYTES);
        assert_eq!((b.lines[0].at, b.lines[0].level), (42, LogLevel::Info));
    }
}
