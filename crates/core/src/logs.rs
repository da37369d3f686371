//! Task logs: the lines a handler logs, as the store keeps them (per
//! attempt, in order, within a cap) and as callers page through them.

use crate::UnixMillis;

/// How much a line matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum LogLevel {
    /// Finest detail.
    Trace,
    /// Detail for debugging.
    Debug,
    /// Normal progress.
    #[default]
    Info,
    /// Something unexpected the handler went on from.
    Warn,
    /// Something failed.
    Error,
}

impl LogLevel {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "TRACE",
            LogLevel::Debug => "DEBUG",
            LogLevel::Info => "INFO",
            LogLevel::Warn => "WARN",
            LogLevel::Error => "ERROR",
        }
    }

    /// The level of a stored name; unknown names read as INFO.
    pub fn parse(s: &str) -> Self {
        match s {
            "TRACE" => LogLevel::Trace,
            "DEBUG" => LogLevel::Debug,
            "WARN" => LogLevel::Warn,
            "ERROR" => LogLevel::Error,
            _ => LogLevel::Info,
        }
    }
}

/// One line as a worker sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the handler logged it.
    pub at: UnixMillis,
    /// How much it matters.
    pub level: LogLevel,
    /// The text.
    pub message: String,
}

/// Lines of one attempt to store, named by its execution id (the store
/// finds the attempt's number; lines of an execution it does not know are
/// not stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogBatch {
    /// Id of the task.
    pub task_id: String,
    /// The attempt's execution id.
    pub execution_id: String,
    /// The lines, oldest first.
    pub lines: Vec<LogLine>,
    /// Lines the worker dropped before sending.
    pub dropped: u64,
}

/// Lines for an attempt that ended longer ago than this are refused as
/// late. A worker sends its lines before its result, so only a backed-up
/// queue delays them this long; and since no retention horizon is shorter
/// than a minute ([`crate::retention::MIN_HORIZON_MS`]: `serve` and the
/// API refuse less; only the bench's own node may be given less), a flush
/// never writes lines for a task retention may be removing at that moment
/// (the two need no lock between them, and no line outlives its task). A
/// late batch is counted by the node (`outcome="late"`), not per attempt.
pub const LATE_LINES_MS: i64 = 30_000;

// Lines refused as late can never belong to a task retention removes: the
// shortest horizon leaves room for the write's own delays.
const _: () = assert!(2 * LATE_LINES_MS <= crate::retention::MIN_HORIZON_MS);

/// How much of one attempt's lines the store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCap {
    /// The most lines.
    pub lines: u64,
    /// The most bytes of text.
    pub bytes: u64,
}

impl Default for LogCap {
    /// 10,000 lines and 1 MiB per attempt.
    fn default() -> Self {
        LogCap {
            lines: 10_000,
            bytes: 1 << 20,
        }
    }
}

impl LogCap {
    /// How many of `lengths` (byte lengths of the next lines, in order) fit
    /// after `lines` lines and `bytes` bytes already kept: a prefix, so the
    /// lines kept are always the first ones.
    pub fn fitting(&self, lines: u64, bytes: u64, lengths: impl IntoIterator<Item = u64>) -> usize {
        let (mut n, mut total) = (0usize, bytes);
        for len in lengths {
            if lines + n as u64 >= self.lines || total + len > self.bytes {
                break;
            }
            total += len;
            n += 1;
        }
        n
    }
}

/// What was kept of one attempt's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttemptLogs {
    /// The attempt (1-based).
    pub attempt: u32,
    /// Lines stored.
    pub lines: u64,
    /// Bytes of text stored.
    pub bytes: u64,
    /// Lines refused by the cap.
    pub truncated_lines: u64,
    /// Lines the worker dropped before sending.
    pub dropped: u64,
}

impl AttemptLogs {
    /// True once the cap refused a line.
    pub fn truncated(&self) -> bool {
        self.truncated_lines > 0
    }
}

/// A place in a task's lines: after line `seq` of attempt `attempt`
/// (`0.0` is before the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct LogCursor {
    /// The attempt.
    pub attempt: u32,
    /// The line within it.
    pub seq: u64,
}

impl LogCursor {
    /// The cursor of a page token `attempt.seq`; `None` if it is not one.
    pub fn parse(token: &str) -> Option<Self> {
        let (a, s) = token.split_once('.')?;
        Some(LogCursor {
            attempt: a.parse().ok()?,
            seq: s.parse().ok()?,
        })
    }

    /// The page token of this place.
    pub fn token(&self) -> String {
        format!("{}.{}", self.attempt, self.seq)
    }
}

/// A stored line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The attempt that logged it.
    pub attempt: u32,
    /// Its place within the attempt, from 1.
    pub seq: u64,
    /// The line.
    pub line: LogLine,
}

impl LogEntry {
    /// The place just after this line.
    pub fn cursor(&self) -> LogCursor {
        LogCursor {
            attempt: self.attempt,
            seq: self.seq,
        }
    }
}

/// Which lines to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogQuery {
    /// Only this attempt's; `None` means every attempt's.
    pub attempt: Option<u32>,
    /// Lines after this place.
    pub after: LogCursor,
    /// The most lines.
    pub limit: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_a_prefix_within_lines_and_bytes() {
        let cap = LogCap {
            lines: 3,
            bytes: 10,
        };
        assert_eq!(cap.fitting(0, 0, [4, 4, 4]), 2, "bytes bind first");
        assert_eq!(cap.fitting(0, 0, [1, 1, 1, 1]), 3, "lines bind first");
        assert_eq!(cap.fitting(2, 9, [1, 1]), 1);
        assert_eq!(cap.fitting(3, 0, [1]), 0, "a full attempt takes nothing");
        assert_eq!(
            cap.fitting(0, 0, [11, 1]),
            0,
            "a prefix: a line past the cap stops it"
        );
    }

    #[test]
    fn cursors_round_trip_and_order_by_attempt_then_seq() {
        let c = LogCursor {
            attempt: 2,
            seq: 17,
        };
        assert_eq!(LogCursor::parse(&c.token()), Some(c));
        assert_eq!(LogCursor::parse("x.1"), None);
        assert_eq!(LogCursor::parse("1"), None);
        assert!(
            LogCursor {
                attempt: 1,
                seq: 99
            } < LogCursor { attempt: 2, seq: 1 }
        );
        for l in [
            LogLevel::Trace,
            LogLevel::Debug,
            LogLevel::Info,
            LogLevel::Warn,
            LogLevel::Error,
        ] {
            assert_eq!(LogLevel::parse(l.as_str()), l);
        }
    }
}
