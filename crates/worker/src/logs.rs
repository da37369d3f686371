//! Task logs on the worker: each handler gets a [`TaskLog`] (in
//! [`TaskContext::log`](crate::TaskContext)), and [`capture_layer`] turns
//! `tracing` events emitted inside a handler into lines of its attempt.
//!
//! Logging never blocks a handler: a line goes into one bounded buffer per
//! worker; when it is full the oldest line goes and is counted as dropped
//! for its attempt (the count reaches the server with the attempt's next
//! lines). Sessions send the buffered lines of the attempts they hold every
//! [`FLUSH_EVERY`], at once when [`SEND_AT`] lines wait, and always before
//! an attempt's result, so the server has every line sent before the task
//! ended.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use taskmesh::v1::{LogLevel, LogLine, TaskLogs};
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use crate::worker::lock;

/// How often sessions send the lines of running attempts.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// Lines waiting that make sessions send at once.
pub(crate) const SEND_AT: usize = 256;
/// Lines per message (the contract's limit).
const LINES_PER_MESSAGE: usize = 1_000;
/// Longest line sent, in bytes (the contract's limit); longer ones are cut.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
const CUT_MARK: &str = " …[cut]";

tokio::task_local! {
    /// The log of the attempt whose handler is running on this task.
    static CURRENT: TaskLog;
}

/// One buffered line.
struct Pending {
    task_id: Arc<str>,
    execution_id: Arc<str>,
    line: LogLine,
}

#[derive(Default)]
struct Lines {
    queue: VecDeque<Pending>,
    /// Lines dropped for a full buffer, by execution id, not yet reported.
    dropped: HashMap<Arc<str>, (Arc<str>, u64)>,
}

/// The worker's buffer of lines not yet sent.
pub(crate) struct LogBuffer {
    lines: Mutex<Lines>,
    capacity: usize,
    /// Signalled when [`SEND_AT`] lines wait.
    pub(crate) ready: Notify,
}

impl std::fmt::Debug for LogBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogBuffer")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl LogBuffer {
    /// A buffer of at most `capacity` lines.
    pub(crate) fn new(capacity: usize) -> Self {
        LogBuffer {
            lines: Mutex::default(),
            capacity: capacity.max(1),
            ready: Notify::new(),
        }
    }

    fn push(&self, p: Pending) {
        let mut l = lock(&self.lines);
        if l.queue.len() >= self.capacity
            && let Some(old) = l.queue.pop_front()
        {
            l.dropped
                .entry(old.execution_id)
                .or_insert_with(|| (old.task_id, 0))
                .1 += 1;
        }
        l.queue.push_back(p);
        if l.queue.len() == SEND_AT {
            self.ready.notify_one();
        }
    }

    /// Takes the lines of the executions `held` names, as messages of at
    /// most 1,000 lines each, oldest first per execution; lines of
    /// executions neither held nor `alive` (ended, nobody will send them)
    /// are discarded; the rest stay.
    pub(crate) fn take(
        &self,
        held: impl Fn(&str) -> bool,
        alive: impl Fn(&str) -> bool,
    ) -> Vec<TaskLogs> {
        let mut l = lock(&self.lines);
        let mut out: Vec<TaskLogs> = Vec::new();
        let mut index: HashMap<Arc<str>, usize> = HashMap::new();
        let mut rest = VecDeque::with_capacity(l.queue.len());
        for p in l.queue.drain(..) {
            if held(&p.execution_id) {
                let i = match index.get(&p.execution_id) {
                    Some(&i) if out[i].lines.len() < LINES_PER_MESSAGE => i,
                    _ => {
                        out.push(TaskLogs {
                            task_id: p.task_id.to_string(),
                            execution_id: p.execution_id.to_string(),
                            lines: Vec::new(),
                            dropped: 0,
                        });
                        index.insert(p.execution_id.clone(), out.len() - 1);
                        out.len() - 1
                    }
                };
                out[i].lines.push(p.line);
            } else if alive(&p.execution_id) {
                rest.push_back(p);
            }
        }
        l.queue = rest;
        // Dropped counts go with the attempt's first message (or alone).
        let dropped: Vec<Arc<str>> = l
            .dropped
            .keys()
            .filter(|e| held(e) || !alive(e))
            .cloned()
            .collect();
        for e in dropped {
            let Some((task_id, n)) = l.dropped.remove(&e) else {
                continue;
            };
            if !held(&e) {
                continue;
            }
            match out.iter_mut().find(|m| *m.execution_id == *e) {
                Some(m) => m.dropped += n,
                None => out.push(TaskLogs {
                    task_id: task_id.to_string(),
                    execution_id: e.to_string(),
                    lines: Vec::new(),
                    dropped: n,
                }),
            }
        }
        out
    }
}

/// The log of one attempt: what a handler writes its lines to. Cheap to
/// clone; lines are buffered and sent by the worker, never blocking.
#[derive(Clone)]
pub struct TaskLog {
    to: Option<Arc<LogBuffer>>,
    task_id: Arc<str>,
    execution_id: Arc<str>,
}

impl std::fmt::Debug for TaskLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskLog")
            .field("execution_id", &self.execution_id)
            .finish()
    }
}

impl TaskLog {
    pub(crate) fn new(to: Arc<LogBuffer>, task_id: &str, execution_id: &str) -> Self {
        TaskLog {
            to: Some(to),
            task_id: Arc::from(task_id),
            execution_id: Arc::from(execution_id),
        }
    }

    /// A log that keeps nothing (for calling handlers outside a worker,
    /// in tests).
    pub fn discard() -> Self {
        TaskLog {
            to: None,
            task_id: Arc::from(""),
            execution_id: Arc::from(""),
        }
    }

    /// Logs `message` at `level` (text past 16 KiB is cut, and says so).
    pub fn line(&self, level: Level, message: impl Into<String>) {
        let Some(to) = &self.to else { return };
        to.push(Pending {
            task_id: self.task_id.clone(),
            execution_id: self.execution_id.clone(),
            line: LogLine {
                time: Some(SystemTime::now().into()),
                level: level_of(level) as i32,
                message: cut(message.into()),
            },
        });
    }

    /// Logs at INFO.
    pub fn info(&self, message: impl Into<String>) {
        self.line(Level::INFO, message);
    }

    /// Logs at WARN.
    pub fn warn(&self, message: impl Into<String>) {
        self.line(Level::WARN, message);
    }

    /// Logs at ERROR.
    pub fn error(&self, message: impl Into<String>) {
        self.line(Level::ERROR, message);
    }

    /// Logs at DEBUG.
    pub fn debug(&self, message: impl Into<String>) {
        self.line(Level::DEBUG, message);
    }

    /// Runs `fut` with this log as the one [`capture_layer`] writes to.
    pub(crate) async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }
}

fn level_of(level: Level) -> LogLevel {
    match level {
        Level::TRACE => LogLevel::Trace,
        Level::DEBUG => LogLevel::Debug,
        Level::INFO => LogLevel::Info,
        Level::WARN => LogLevel::Warn,
        Level::ERROR => LogLevel::Error,
    }
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_LINE_BYTES {
        let mut end = MAX_LINE_BYTES - CUT_MARK.len();
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str(CUT_MARK);
    }
    s
}

/// A `tracing` layer that copies every event emitted inside a handler (on
/// the handler's own task: work it spawns elsewhere is not followed) into
/// that attempt's log, as `message key=value ...`. Add it to the
/// subscriber; filter it like any layer (`.with_filter(LevelFilter::INFO)`).
pub fn capture_layer() -> CaptureLayer {
    CaptureLayer
}

/// See [`capture_layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureLayer;

impl<S: Subscriber> Layer<S> for CaptureLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let _ = CURRENT.try_with(|log| {
            let mut text = Text::default();
            event.record(&mut text);
            log.line(*event.metadata().level(), text.finish());
        });
    }
}

/// An event's fields as one line.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Text {
    fn finish(mut self) -> String {
        if self.message.is_empty() {
            return self.fields.trim_start().to_string();
        }
        self.message.push_str(&self.fields);
        self.message
    }
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    fn log(buffer: &Arc<LogBuffer>, exec: &str) -> TaskLog {
        TaskLog::new(buffer.clone(), "task", exec)
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_counts_them() {
        let buffer = Arc::new(LogBuffer::new(3));
        let (a, b) = (log(&buffer, "a"), log(&buffer, "b"));
        a.info("a1");
        a.info("a2");
        b.info("b1");
        b.info("b2");
        a.info("a3");
        // Only b's are held: a's stay (still running).
        let sent = buffer.take(|e| e == "b", |_| true);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            sent[0]
                .lines
                .iter()
                .map(|l| l.message.as_str())
                .collect::<Vec<_>>(),
            ["b1", "b2"]
        );
        assert_eq!(sent[0].dropped, 0);
        let sent = buffer.take(|e| e == "a", |_| true);
        let messages: Vec<&str> = sent[0].lines.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(messages, ["a3"]);
        assert_eq!(sent[0].dropped, 2, "a1 and a2 made room");
        assert!(buffer.take(|_| true, |_| true).is_empty());
    }

    #[test]
    fn lines_of_ended_attempts_nobody_holds_are_discarded() {
        let buffer = Arc::new(LogBuffer::new(10));
        log(&buffer, "gone").info("late");
        assert!(buffer.take(|_| false, |_| false).is_empty());
        assert!(
            buffer.take(|_| true, |_| true).is_empty(),
            "discarded, not kept"
        );
    }

    #[test]
    fn long_lines_are_cut_and_say_so() {
        let long = cut("x".repeat(MAX_LINE_BYTES * 2));
        assert!(long.len() <= MAX_LINE_BYTES && long.ends_with(CUT_MARK));
        assert_eq!(cut("short".into()), "short");
    }

    #[tokio::test]
    async fn events_inside_a_handler_become_its_lines() {
        let buffer = Arc::new(LogBuffer::new(10));
        let subscriber = tracing_subscriber::registry().with(capture_layer());
        let _guard = tracing::subscriber::set_default(subscriber);
        tracing::info!("outside");
        log(&buffer, "e")
            .scope(async {
                tracing::warn!(rows = 3, "copied");
            })
            .await;
        let sent = buffer.take(|_| true, |_| true);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].lines.len(), 1, "the event outside is not a line");
        assert_eq!(sent[0].lines[0].message, "copied rows=3");
        assert_eq!(sent[0].lines[0].level, LogLevel::Warn as i32);
    }
}
