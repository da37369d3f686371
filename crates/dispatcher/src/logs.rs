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
use taskmesh_core::logs::{LogBatch, LogCap, LogLevel, LogLine};
use taskmesh_core::{Clock, UnixMillis};
use taskmesh_store::Store;
use tokio::sync::{broadcast, mpsc};
use tracing::warn;

/// Counts lines by what became of them (`outcome`: stored, truncated by
/// the cap, unknown execution, late for an attempt that ended over 30 s
/// before, shed by a full queue, lost to a store error).
pub const LOG_LINES_TOTAL: &str = "taskmesh_log_lines_total";

/// Longest line stored, in bytes (the contract's limit); longer ones are
/// cut at a character boundary.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Most lines one `TaskLogs` message may carry (the contract's limit);
/// lines beyond are counted as dropped.
pub const MAX_LINES_PER_MESSAGE: usize = 1_000;

/// Latest line time kept as sent: 9999-12-31T23:59:59.999Z, the last
/// instant a protobuf Timestamp (and so REST's JSON) can show. A time
/// before 1970 or past this is read as the arrival time.
const LATEST_LINE_MS: UnixMillis = 253_402_300_799_999;
/// Most lines one message may say it dropped (the counters are 64-bit
/// sums: a sender cannot overflow them with any number of messages).
const MAX_DROPPED_PER_MESSAGE: u64 = 1 << 32;

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
    /// Bytes of line text queued on this node; past it new lines are shed
    /// (lines may be 16 KiB each: the line bound alone would let a chatty
    /// worker queue 1.6 GB).
    pub queue_bytes: usize,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            cap: LogCap::default(),
            queue_lines: 100_000,
            queue_bytes: 64 * 1024 * 1024,
        }
    }
}

/// A handle to the node's log writer (cheap to clone).
#[derive(Clone)]
pub struct LogWriter {
    tx: mpsc::UnboundedSender<LogBatch>,
    /// Lines and text bytes queued.
    queued: Arc<(AtomicUsize, AtomicUsize)>,
    limit: (usize, usize),
    written: broadcast::Sender<Arc<str>>,
    /// Told after every flush (what [`LogWriter::drain`] waits on).
    flushed: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("queued_lines", &self.queued.0.load(Ordering::Relaxed))
            .field("queued_bytes", &self.queued.1.load(Ordering::Relaxed))
            .finish()
    }
}

impl LogWriter {
    /// Starts the writer task over `store`; `clock` (the store's) judges
    /// which lines come too late for their attempt.
    pub fn start(store: Arc<dyn Store>, clock: Arc<dyn Clock>, opts: LogOptions) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<LogBatch>();
        let queued = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let (written, _) = broadcast::channel(1_024);
        let flushed = Arc::new(tokio::sync::Notify::new());
        let handle = LogWriter {
            tx,
            queued: queued.clone(),
            limit: (opts.queue_lines.max(1), opts.queue_bytes.max(1)),
            written: written.clone(),
            flushed: flushed.clone(),
        };
        tokio::spawn(async move {
            let mut batches: Vec<LogBatch> = Vec::new();
            while let Some(first) = rx.recv().await {
                let (mut lines, mut bytes) = (first.lines.len(), text_bytes(&first));
                batches.push(first);
                while lines < FLUSH_LINES {
                    match rx.try_recv() {
                        Ok(b) => {
                            lines += b.lines.len();
                            bytes += text_bytes(&b);
                            batches.push(b);
                        }
                        Err(_) => break,
                    }
                }
                flush(&*store, &*clock, opts.cap, &batches).await;
                queued.0.fetch_sub(lines, Ordering::Relaxed);
                queued.1.fetch_sub(bytes, Ordering::Relaxed);
                for b in batches.drain(..) {
                    let _ = written.send(Arc::from(b.task_id.as_str()));
                }
                flushed.notify_waiters();
            }
        });
        handle
    }

    /// Waits until every line queued so far is written (or refused by the
    /// store), for at most `within`; true when nothing is left queued. A
    /// node shutting down calls it after its streams closed, so the lines
    /// its workers sent last are not lost with the process.
    pub async fn drain(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let flushed = self.flushed.notified();
            if self.queued.0.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, flushed).await.is_err() {
                return self.queued.0.load(Ordering::Acquire) == 0;
            }
        }
    }

    /// Queues `batch` for the next flush; false (and the lines counted as
    /// shed) when the queue is full.
    pub fn offer(&self, batch: LogBatch) -> bool {
        let (n, bytes) = (batch.lines.len(), text_bytes(&batch));
        let lines_before = self.queued.0.fetch_add(n, Ordering::Relaxed);
        let bytes_before = self.queued.1.fetch_add(bytes, Ordering::Relaxed);
        let back = || {
            self.queued.0.fetch_sub(n, Ordering::Relaxed);
            self.queued.1.fetch_sub(bytes, Ordering::Relaxed);
        };
        let full = lines_before + n > self.limit.0 || bytes_before + bytes > self.limit.1;
        if full && lines_before > 0 {
            back();
            metrics::counter!(LOG_LINES_TOTAL, "outcome" => "shed").increment(n as u64);
            return false;
        }
        if self.tx.send(batch).is_err() {
            back();
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

/// The bytes of `batch`'s line text.
fn text_bytes(batch: &LogBatch) -> usize {
    batch.lines.iter().map(|l| l.message.len()).sum()
}

async fn flush(store: &dyn Store, clock: &dyn Clock, cap: LogCap, batches: &[LogBatch]) {
    let lines: u64 = batches.iter().map(|b| b.lines.len() as u64).sum();
    let mut tries = 0;
    let mut backoff = Duration::from_millis(100);
    loop {
        tries += 1;
        match store.append_logs(batches, cap, clock.now_millis()).await {
            Ok(got) => {
                for (outcome, n) in [
                    ("stored", got.stored),
                    ("truncated", got.truncated),
                    ("unknown", got.unknown),
                    ("late", got.late),
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
/// lines past the per-message limit counted as dropped, NUL characters —
/// which Postgres's text refuses — replaced), unset times and times no
/// Timestamp can show read as `now`.
pub fn batch_of(logs: pb::TaskLogs, now: UnixMillis) -> LogBatch {
    let extra = logs.lines.len().saturating_sub(MAX_LINES_PER_MESSAGE) as u64;
    let lines = logs
        .lines
        .into_iter()
        .take(MAX_LINES_PER_MESSAGE)
        .map(|l| LogLine {
            at: l
                .time
                .as_ref()
                .and_then(crate::convert::millis_of)
                .filter(|ms| (0..=LATEST_LINE_MS).contains(ms))
                .unwrap_or(now),
            level: level_of(l.level),
            message: cut(l.message, MAX_LINE_BYTES),
        })
        .collect();
    LogBatch {
        task_id: logs.task_id,
        execution_id: logs.execution_id,
        lines,
        dropped: logs
            .dropped
            .min(MAX_DROPPED_PER_MESSAGE)
            .saturating_add(extra),
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
    if s.contains('\0') {
        s = s.replace('\0', "\u{FFFD}");
    }
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

    #[test]
    fn times_no_timestamp_can_show_nul_and_huge_drop_counts_are_tamed() {
        let at = |seconds: i64, nanos: i32| pb::LogLine {
            time: Some(prost_types::Timestamp { seconds, nanos }),
            level: 0,
            message: "a\0b".into(),
        };
        let logs = pb::TaskLogs {
            task_id: "t".into(),
            execution_id: "e".into(),
            lines: vec![
                at(i64::MAX, 999_999_999),
                at(-5, 0),
                at(253_402_300_800, 0),
                at(1_700_000_000, 5_000_000),
                at(1, -1),
            ],
            dropped: u64::MAX,
        };
        let b = batch_of(logs, 42);
        let times: Vec<i64> = b.lines.iter().map(|l| l.at).collect();
        assert_eq!(times, [42, 42, 42, 1_700_000_000_005, 42]);
        assert!(b.lines.iter().all(|l| l.message == "a\u{FFFD}b"));
        assert_eq!(b.dropped, MAX_DROPPED_PER_MESSAGE);
    }

    /// A writer with no writer task: `queued` lines and bytes already
    /// counted, `limit` its bounds; keep the receiver for offers to succeed.
    fn idle_writer(
        queued: (usize, usize),
        limit: (usize, usize),
    ) -> (LogWriter, mpsc::UnboundedReceiver<LogBatch>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let w = LogWriter {
            tx,
            queued: Arc::new((AtomicUsize::new(queued.0), AtomicUsize::new(queued.1))),
            limit,
            written: broadcast::channel(1).0,
            flushed: Arc::new(tokio::sync::Notify::new()),
        };
        (w, rx)
    }

    #[test]
    fn the_queue_sheds_on_bytes_as_well_as_lines() {
        // A writer whose queue nobody takes from: what is offered stays.
        let (w, _rx) = idle_writer((0, 0), (3, 100));
        let batch = |bytes: usize| LogBatch {
            task_id: "t".into(),
            execution_id: "e".into(),
            lines: vec![LogLine {
                at: 0,
                level: LogLevel::Info,
                message: "x".repeat(bytes),
            }],
            dropped: 0,
        };
        assert!(w.offer(batch(60)));
        assert!(!w.offer(batch(50)), "60 + 50 bytes is past 100");
        assert!(w.offer(batch(40)), "60 + 40 fits");
        assert!(
            !w.offer(batch(1)),
            "3 lines are within 3, but 101 bytes are past 100"
        );
        w.queued.1.store(0, Ordering::Relaxed);
        assert!(w.offer(batch(0)), "3 lines, 0 bytes: within both");
        assert!(!w.offer(batch(0)), "a fourth line is past 3");
    }

    #[tokio::test]
    async fn drain_waits_for_the_queued_lines_within_its_bound() {
        let (w, _rx) = idle_writer((5, 50), (100, 1_000));
        assert!(
            !w.drain(Duration::from_millis(50)).await,
            "lines nobody writes are still queued when the bound passes"
        );
        // A flush of part of the queue, then of the rest, as the writer
        // task does: drain returns after the second.
        let writer = w.clone();
        let flusher = tokio::spawn(async move {
            for left in [2, 0] {
                tokio::task::yield_now().await;
                writer.queued.0.store(left, Ordering::Release);
                writer.flushed.notify_waiters();
            }
        });
        assert!(w.drain(Duration::from_secs(30)).await, "drained");
        assert_eq!(w.queued.0.load(Ordering::Acquire), 0);
        flusher.await.expect("flusher");
    }
}
