//! `TaskApi.GetTaskLogs` and `TaskApi.WatchTaskLogs`: a task's stored log
//! lines, a page at a time or followed as they land. Namespaced like every
//! task read: a task of another namespace is NOT_FOUND.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use taskmesh::v1 as pb;
use taskmesh_core::logs::{AttemptLogs, LogCursor, LogEntry, LogQuery};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::warn;

use crate::Error;
use crate::convert::timestamp;
use crate::engine::Shared;
use crate::logs::level_to_pb;
use crate::task_api::{load_in, page_budget, task_id_of};

/// Lines per page when the caller does not say.
const DEFAULT_PAGE: usize = 1_000;
/// Lines a follower reads per store call.
const FOLLOW_PAGE: usize = 1_000;
/// How often a follower looks for lines written by other replicas (lines
/// written on this node wake it at once).
const FOLLOW_POLL: Duration = Duration::from_millis(500);
/// A follower reads its task's state at least every this many polls, even
/// when no change was heard (a task ended on another replica of a store
/// without change notifications is heard of no other way).
const STATE_EVERY_POLLS: u32 = 4;
/// After its task ended, how long a follower still waits for lines the
/// worker sent before its result (they are written in their own batch).
const SETTLE: Duration = Duration::from_secs(1);

/// The server stream of `WatchTaskLogs`.
pub(crate) type LogStream =
    Pin<Box<dyn Stream<Item = Result<pb::WatchTaskLogsResponse, Status>> + Send>>;

/// `GetTaskLogs`.
pub(crate) async fn get(
    shared: &Shared,
    namespace: &str,
    req: pb::GetTaskLogsRequest,
) -> Result<pb::GetTaskLogsResponse, Error> {
    let id = task_id_of(&req.task_id)?;
    let after = cursor_of(&req.page_token)?;
    let limit = match req.page_size {
        0 => DEFAULT_PAGE,
        n if n > 10_000 => {
            return Err(Error::InvalidArgument(format!(
                "page_size must be at most 10000, got {n}"
            )));
        }
        n => n as usize,
    };
    load_in(shared, namespace, &id).await?;
    let query = LogQuery {
        attempt: (req.attempt > 0).then_some(req.attempt),
        after,
        limit,
    };
    let (attempts, lines) = shared.store.task_logs(&id, &query).await?;
    let read = lines.len();
    let lines = within_budget(lines, page_budget(shared.opts.max_message_bytes));
    let end = read < limit && lines.len() == read;
    let next = lines.last().map_or(after, LogEntry::cursor);
    Ok(pb::GetTaskLogsResponse {
        lines: lines.into_iter().map(entry_to_pb).collect(),
        attempts: attempts.into_iter().map(attempt_to_pb).collect(),
        next_page_token: if next == LogCursor::default() {
            String::new()
        } else {
            next.token()
        },
        end,
    })
}

/// `WatchTaskLogs`: the stored lines after the cursor, then new ones as
/// they land, until the task has ended and its last lines are sent.
pub(crate) async fn watch(
    shared: &Shared,
    namespace: &str,
    req: pb::WatchTaskLogsRequest,
) -> Result<LogStream, Error> {
    let id = task_id_of(&req.task_id)?;
    let mut after = cursor_of(&req.page_token)?;
    // Subscribed before the first read, so no write falls between them.
    let mut written = shared.logs.subscribe();
    let mut changes = shared.store.subscribe();
    let first = load_in(shared, namespace, &id).await?;
    let slot = shared.quotas.watch(namespace)?;
    let attempt = (req.attempt > 0).then_some(req.attempt);
    let (tx, rx) = mpsc::channel(16);
    let (store, budget) = (
        shared.store.clone(),
        page_budget(shared.opts.max_message_bytes),
    );
    tokio::spawn(async move {
        let _slot = slot;
        // Once the task is seen ended: read on until this instant.
        let mut ends_at = first.state.is_terminal().then(|| Instant::now() + SETTLE);
        // Whether the log writer's and the store's news still come.
        let mut hearing = (true, true);
        let mut polls = 0u32;
        loop {
            let query = LogQuery {
                attempt,
                after,
                limit: FOLLOW_PAGE,
            };
            let lines = match store.task_logs(&id, &query).await {
                Ok((_, lines)) => lines,
                Err(err) => {
                    warn!(task_id = %id, error = %err, "log watch read failed");
                    let _ = tx.send(Err(Status::from(Error::from(err)))).await;
                    return;
                }
            };
            let read = lines.len();
            let lines = within_budget(lines, budget);
            let cut = lines.len() < read;
            if let Some(last) = lines.last() {
                after = last.cursor();
                let answer = pb::WatchTaskLogsResponse {
                    lines: lines.into_iter().map(entry_to_pb).collect(),
                    next_page_token: after.token(),
                };
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
                if read == FOLLOW_PAGE || cut {
                    continue;
                }
            }
            if ends_at.is_some_and(|at| Instant::now() >= at) {
                return;
            }
            let wait = ends_at.map_or(FOLLOW_POLL, |at| {
                at.saturating_duration_since(Instant::now())
                    .min(FOLLOW_POLL)
            });
            let timer = tokio::time::sleep(wait);
            tokio::pin!(timer);
            // Waits for this task's lines or state, the poll, or the end;
            // other tasks' news is skipped without a read.
            let check_task = loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    () = &mut timer => {
                        polls = polls.wrapping_add(1);
                        break !hearing.1 || polls.is_multiple_of(STATE_EVERY_POLLS);
                    }
                    w = written.recv(), if hearing.0 => match w {
                        Ok(t) if *t == *id => break false,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => break false,
                        Err(broadcast::error::RecvError::Closed) => hearing.0 = false,
                    },
                    c = changes.recv(), if hearing.1 => match c {
                        Ok(c) if c.task_id == id => break true,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => break true,
                        Err(broadcast::error::RecvError::Closed) => hearing.1 = false,
                    },
                }
            };
            if check_task && ends_at.is_none() {
                match store.get_task(&id).await {
                    Ok(Some(t)) if !t.state.is_terminal() => {}
                    // Ended, or removed: the last lines, then the end.
                    Ok(_) => ends_at = Some(Instant::now() + SETTLE),
                    Err(err) => {
                        warn!(task_id = %id, error = %err, "log watch read failed");
                        let _ = tx.send(Err(Status::from(Error::from(err)))).await;
                        return;
                    }
                }
            }
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

fn cursor_of(token: &str) -> Result<LogCursor, Error> {
    if token.is_empty() {
        return Ok(LogCursor::default());
    }
    LogCursor::parse(token).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "page_token {token:?} is not a next_page_token of GetTaskLogs (\"ATTEMPT.SEQ\")"
        ))
    })
}

/// The first lines whose text fits in `budget` bytes (at least one).
fn within_budget(mut lines: Vec<LogEntry>, budget: usize) -> Vec<LogEntry> {
    let mut used = 0usize;
    let mut keep = 0usize;
    for l in &lines {
        used += l.line.message.len() + 64;
        if used > budget && keep > 0 {
            break;
        }
        keep += 1;
    }
    lines.truncate(keep);
    lines
}

fn entry_to_pb(e: LogEntry) -> pb::TaskLogEntry {
    pb::TaskLogEntry {
        attempt: e.attempt,
        seq: e.seq,
        time: Some(timestamp(e.line.at)),
        level: level_to_pb(e.line.level) as i32,
        message: e.line.message,
    }
}

fn attempt_to_pb(a: AttemptLogs) -> pb::AttemptLogs {
    pb::AttemptLogs {
        attempt: a.attempt,
        lines: a.lines,
        bytes: a.bytes,
        truncated: a.truncated(),
        truncated_lines: a.truncated_lines,
        dropped: a.dropped,
    }
}
