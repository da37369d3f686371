//! Task logs: `Store::append_logs` (every batch of a flush in one write
//! transaction, each attempt within its cap) and `Store::task_logs`.

use std::collections::HashMap;

use taskmesh_core::UnixMillis;
use taskmesh_core::logs::{
    AttemptLogs, LATE_LINES_MS, LogBatch, LogCap, LogCursor, LogEntry, LogLevel, LogLine, LogQuery,
};

use super::backend::Backend;
use super::batch::insert_many;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::decode::Columns;
use crate::{Error, LogsAppended, Result};

/// The columns of a stored line, in insert order.
pub(super) const LOG_COLUMNS: &str = "task_id, attempt, seq, at, level, message";

impl<B: Backend> SqlStore<B> {
    /// Per batch: finds the attempt by its execution id (refusing it as
    /// late if it ended more than `LATE_LINES_MS` before `now`), opens its
    /// counter row if it has none, locks it, stores the prefix of lines the
    /// cap still takes (numbered after those kept) and counts the rest.
    pub(super) async fn logs_append(
        &self,
        batches: &[LogBatch],
        cap: LogCap,
        now: UnixMillis,
    ) -> Result<LogsAppended> {
        let mut out = LogsAppended::default();
        if batches.is_empty() {
            return Ok(out);
        }
        let b = self.backend();
        let sql = b.sql();
        let mut tx = b.begin_write().await?;
        // Lines of one attempt sent in several batches of this flush are
        // numbered after one another: the counter row is read once.
        let mut kept: HashMap<(&str, i64), (u64, u64)> = HashMap::new();
        let mut rows: Vec<(&str, i64, u64, &LogLine)> = Vec::new();
        for batch in batches {
            let attempt = b
                .fetch(
                    &mut tx,
                    &sql.attempt_of_execution,
                    args![batch.task_id.as_str(), batch.execution_id.as_str()],
                )
                .await?
                .first()
                .map(|row| Ok::<_, String>((row.int("v")?, row.opt_int("ended_at")?)))
                .transpose()
                .map_err(|e| Error::Internal(format!("bad attempts row: {e}")))?;
            let attempt = match attempt {
                None => {
                    out.unknown += batch.lines.len() as u64;
                    continue;
                }
                Some((_, Some(ended))) if ended < now.saturating_sub(LATE_LINES_MS) => {
                    out.late += batch.lines.len() as u64;
                    continue;
                }
                Some((number, _)) => number,
            };
            let key = (batch.task_id.as_str(), attempt);
            let (lines, bytes) = match kept.get(&key) {
                Some(k) => *k,
                None => {
                    b.exec(&mut tx, &sql.open_log_attempt, args![key.0, attempt])
                        .await?;
                    let row = b
                        .fetch(&mut tx, &sql.lock_log_attempt, args![key.0, attempt])
                        .await?;
                    let row = row.first().ok_or_else(|| {
                        Error::Internal(
                            "the log counter row vanished inside its transaction".into(),
                        )
                    })?;
                    let read = |c: &str| {
                        row.int(c)
                            .map(|v| v.max(0) as u64)
                            .map_err(|e| Error::Internal(format!("bad task_log_attempts row: {e}")))
                    };
                    (read("kept_lines")?, read("kept_bytes")?)
                }
            };
            let fit = cap.fitting(
                lines,
                bytes,
                batch.lines.iter().map(|l| l.message.len() as u64),
            );
            let taken = &batch.lines[..fit];
            let added: u64 = taken.iter().map(|l| l.message.len() as u64).sum();
            for (i, line) in taken.iter().enumerate() {
                rows.push((key.0, attempt, lines + i as u64 + 1, line));
            }
            let refused = (batch.lines.len() - fit) as u64;
            b.exec(
                &mut tx,
                &sql.count_log_attempt,
                args![
                    fit as i64,
                    added as i64,
                    refused as i64,
                    batch.dropped.min(i64::MAX as u64) as i64,
                    key.0,
                    attempt
                ],
            )
            .await?;
            kept.insert(key, (lines + fit as u64, bytes + added));
            out.stored += fit as u64;
            out.truncated += refused;
        }
        insert_many(
            b,
            &mut tx,
            &rows,
            6,
            |(task_id, attempt, seq, line), out| {
                out.extend(args![
                    *task_id,
                    *attempt,
                    *seq as i64,
                    line.at,
                    line.level.as_str(),
                    line.message.as_str()
                ])
            },
            |n| sql.insert_logs.get(n),
        )
        .await?;
        b.commit(tx).await?;
        Ok(out)
    }

    /// Every attempt's counters, then a page of lines after the cursor.
    pub(super) async fn logs_read(
        &self,
        task_id: &str,
        query: &LogQuery,
    ) -> Result<(Vec<AttemptLogs>, Vec<LogEntry>)> {
        let b = self.backend();
        let sql = b.sql();
        let bad = |e: String| Error::Internal(format!("bad task log row: {e}"));
        let mut attempts = Vec::new();
        for row in b.read(&sql.log_attempts, args![task_id]).await? {
            let n = |c: &str| row.int(c).map(|v| v.max(0) as u64).map_err(bad);
            attempts.push(AttemptLogs {
                attempt: row.int("attempt").map_err(bad)?.clamp(0, u32::MAX as i64) as u32,
                lines: n("kept_lines")?,
                bytes: n("kept_bytes")?,
                truncated_lines: n("truncated_lines")?,
                dropped: n("dropped")?,
            });
        }
        let LogCursor { attempt, seq } = query.after;
        let seq = seq.min(i64::MAX as u64) as i64;
        let limit = sql_limit(query.limit);
        let rows = match query.attempt {
            Some(only) => {
                let after = if only == attempt {
                    seq
                } else if only > attempt {
                    0
                } else {
                    i64::MAX
                };
                b.read(&sql.logs_of_attempt, args![task_id, only, after, limit])
                    .await?
            }
            None => {
                b.read(
                    &sql.logs_after,
                    args![task_id, attempt, attempt, seq, limit],
                )
                .await?
            }
        };
        let mut lines = Vec::with_capacity(rows.len());
        for row in rows {
            lines.push(LogEntry {
                attempt: row.int("attempt").map_err(bad)?.clamp(0, u32::MAX as i64) as u32,
                seq: row.int("seq").map_err(bad)?.max(0) as u64,
                line: LogLine {
                    at: row.int("at").map_err(bad)?,
                    level: LogLevel::parse(&row.text("level").map_err(bad)?),
                    message: row.text("message").map_err(bad)?,
                },
            });
        }
        Ok((attempts, lines))
    }
}
