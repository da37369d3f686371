//! Multi-row statements for the hot paths: many task inserts, many
//! compare-and-set updates and their attempts rows, and many task reads,
//! each as a few statements instead of one (or three) per task.
//!
//! Why: every statement sqlx runs on SQLite is a round trip to the
//! connection's worker thread (two thread wake-ups), which costs more than
//! SQLite's own work on a small row. A batch of 256 transitions written one
//! by one made ~1,000 round trips; here it makes about six.
//!
//! Rows go in chunks of fixed sizes (the [`LADDER`]), so each statement
//! text is one of a few, prepared once and kept in sqlx's statement cache.
//! A transition writes only the columns `taskmesh_core::apply` may change;
//! the others (handler, payload, labels, ...) are fixed at insert.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use sqlx::{Row, SqliteConnection};
use taskmesh_core::{AttemptChange, TaskRecord, Transition};

use super::rows::{INSERT_TASK, bind_body, task_from_row};
use crate::Result;

/// Chunk sizes, largest first: a batch of n rows goes as ⌊n/256⌋ chunks of
/// 256, then the remainder by the smaller sizes.
const LADDER: [usize; 5] = [256, 64, 16, 4, 1];

/// Columns a transition may change, bound in this order after `id` and the
/// expected version.
const MUTABLE: [&str; 17] = [
    "state",
    "updated_at",
    "pending_at",
    "ready_at",
    "dispatching_at",
    "running_at",
    "retrying_at",
    "ended_at",
    "attempt",
    "run_count",
    "execution_id",
    "worker_id",
    "next_at",
    "output",
    "output_content_type",
    "error_message",
    "version",
];

/// Splits `n` rows into ladder-sized chunks.
pub(super) fn chunks(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for size in LADDER {
        while n >= size {
            out.push(size);
            n -= size;
        }
    }
    out
}

/// `sql(n)` for every ladder size, built once.
fn cached(
    cell: &'static OnceLock<Vec<String>>,
    sql: fn(usize) -> String,
    n: usize,
) -> &'static str {
    let all = cell.get_or_init(|| LADDER.iter().map(|&k| sql(k)).collect());
    let i = LADDER
        .iter()
        .position(|&k| k == n)
        .unwrap_or(LADDER.len() - 1);
    all[i].as_str()
}

fn placeholders(rows: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(", "));
    vec![row; rows].join(", ")
}

fn update_sql(rows: usize) -> String {
    let sets: Vec<String> = MUTABLE
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{c} = v.column{}", i + 3))
        .collect();
    format!(
        "UPDATE tasks SET {} FROM (VALUES {}) AS v \
         WHERE tasks.id = v.column1 AND tasks.version = v.column2 RETURNING tasks.id",
        sets.join(", "),
        placeholders(rows, MUTABLE.len() + 2)
    )
}

fn insert_tasks_sql(rows: usize) -> String {
    let (head, one) = INSERT_TASK
        .split_once("VALUES")
        .unwrap_or((INSERT_TASK, ""));
    let one = one.trim();
    format!("{head}VALUES {}", vec![one; rows].join(", "))
}

fn open_attempts_sql(rows: usize) -> String {
    format!(
        "INSERT INTO attempts (task_id, number, execution_id, worker_id, started_at, ended_at, \
         outcome, message) VALUES {}",
        placeholders(rows, 8)
    )
}

fn close_attempts_sql(rows: usize) -> String {
    format!(
        "UPDATE attempts SET ended_at = v.column3, outcome = v.column4, message = v.column5 \
         FROM (VALUES {}) AS v WHERE attempts.task_id = v.column1 \
         AND attempts.execution_id = v.column2 RETURNING attempts.execution_id",
        placeholders(rows, 5)
    )
}

fn select_sql(rows: usize) -> String {
    format!(
        concat!("SELECT ", task_columns!(), " FROM tasks WHERE id IN ({})"),
        vec!["?"; rows].join(", ")
    )
}

static UPDATE: OnceLock<Vec<String>> = OnceLock::new();
static INSERT: OnceLock<Vec<String>> = OnceLock::new();
static OPEN: OnceLock<Vec<String>> = OnceLock::new();
static CLOSE: OnceLock<Vec<String>> = OnceLock::new();
static SELECT: OnceLock<Vec<String>> = OnceLock::new();

/// Reads the tasks `ids` (attempts left empty), by id.
pub(super) async fn load_tasks(
    conn: &mut SqliteConnection,
    ids: &[&str],
) -> Result<HashMap<String, TaskRecord>> {
    let mut out = HashMap::with_capacity(ids.len());
    let mut rest = ids;
    for n in chunks(ids.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut q = sqlx::query(cached(&SELECT, select_sql, n));
        for id in chunk {
            q = q.bind(*id);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let task = task_from_row(&row)?;
            out.insert(task.id.clone(), task);
        }
    }
    Ok(out)
}

/// Inserts new task rows, each with its request fingerprint. The raw sqlx
/// error is returned so the caller can fall back to one insert per row.
pub(super) async fn insert_tasks(
    conn: &mut SqliteConnection,
    rows: &[(&TaskRecord, &str)],
) -> Result<Result<(), sqlx::Error>> {
    let mut rest = rows;
    for n in chunks(rows.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut q = sqlx::query(cached(&INSERT, insert_tasks_sql, n));
        for (task, fingerprint) in chunk {
            q = q
                .bind(task.id.clone())
                .bind(task.client_request_id.clone())
                .bind(fingerprint.to_string());
            q = bind_body(q, task)?;
        }
        if let Err(err) = q.execute(&mut *conn).await {
            return Ok(Err(err));
        }
    }
    Ok(Ok(()))
}

/// One task's write: the version it must still have, the row to write and
/// the attempts changes, in order.
pub(super) struct Write<'a> {
    /// Compare-and-set key.
    pub expected_version: i64,
    /// The task as it must be written.
    pub task: &'a TaskRecord,
    /// Attempts rows to open or close, in the order the events happened.
    pub attempts: Vec<&'a AttemptChange>,
}

impl<'a> Write<'a> {
    /// The write of one transition.
    pub fn of(expected_version: i64, t: &'a Transition) -> Self {
        Self {
            expected_version,
            task: &t.task,
            attempts: vec![&t.attempt],
        }
    }
}

/// Writes every task whose row still has its expected version, with its
/// attempts changes. Returns, per write, whether it was written (false: the
/// compare-and-set missed and nothing of that task was written). The ids
/// must be distinct. Errors leave the transaction to the caller to roll
/// back (to a savepoint).
pub(super) async fn write(conn: &mut SqliteConnection, writes: &[Write<'_>]) -> Result<Vec<bool>> {
    if cfg!(debug_assertions) {
        let ids: HashSet<&str> = writes.iter().map(|w| w.task.id.as_str()).collect();
        debug_assert_eq!(ids.len(), writes.len(), "one write per task");
    }
    let mut written: HashSet<String> = HashSet::with_capacity(writes.len());
    let mut rest = writes;
    for n in chunks(writes.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut q = sqlx::query(cached(&UPDATE, update_sql, n));
        for w in chunk {
            let t = w.task;
            q = q
                .bind(t.id.clone())
                .bind(w.expected_version)
                .bind(t.state.as_str())
                .bind(t.updated_at)
                .bind(t.times.pending)
                .bind(t.times.ready)
                .bind(t.times.dispatching)
                .bind(t.times.running)
                .bind(t.times.retrying)
                .bind(t.times.end)
                .bind(i64::from(t.attempt))
                .bind(i64::from(t.run_count))
                .bind(t.execution_id.clone())
                .bind(t.worker_id.clone())
                .bind(t.next_at)
                .bind(t.output.clone())
                .bind(t.output_content_type.clone())
                .bind(t.error_message.clone())
                .bind(t.version);
        }
        for row in q.fetch_all(&mut *conn).await? {
            written.insert(row.try_get::<String, _>(0)?);
        }
    }
    let done: Vec<bool> = writes
        .iter()
        .map(|w| written.contains(&w.task.id))
        .collect();

    // Opens before closes: an attempt opened and closed in one batch must
    // exist before it is closed.
    let mut opens = Vec::new();
    let mut closes = Vec::new();
    for (w, _) in writes.iter().zip(&done).filter(|(_, ok)| **ok) {
        for change in &w.attempts {
            match change {
                AttemptChange::None => {}
                AttemptChange::Open(a) => opens.push((w.task.id.as_str(), a)),
                AttemptChange::Close { .. } => closes.push((w.task.id.as_str(), *change)),
            }
        }
    }
    let mut rest = opens.as_slice();
    for n in chunks(opens.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut q = sqlx::query(cached(&OPEN, open_attempts_sql, n));
        for (task_id, a) in chunk {
            q = q
                .bind(task_id.to_string())
                .bind(i64::from(a.number))
                .bind(a.execution_id.clone())
                .bind(a.worker_id.clone())
                .bind(a.started_at)
                .bind(a.ended_at)
                .bind(a.outcome.map(|o| o.as_str()))
                .bind(a.message.clone());
        }
        q.execute(&mut *conn).await?;
    }
    let mut closed: HashSet<String> = HashSet::with_capacity(closes.len());
    let mut rest = closes.as_slice();
    for n in chunks(closes.len()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut q = sqlx::query(cached(&CLOSE, close_attempts_sql, n));
        for (task_id, change) in chunk {
            if let AttemptChange::Close {
                execution_id,
                outcome,
                message,
                ended_at,
            } = change
            {
                q = q
                    .bind(task_id.to_string())
                    .bind(execution_id.clone())
                    .bind(*ended_at)
                    .bind(outcome.as_str())
                    .bind(message.clone());
            }
        }
        for row in q.fetch_all(&mut *conn).await? {
            closed.insert(row.try_get::<String, _>(0)?);
        }
    }
    for (task_id, change) in &closes {
        if let AttemptChange::Close { execution_id, .. } = change
            && !closed.contains(execution_id)
        {
            // The task row is authoritative; a missing attempts row must
            // not block the task's life, but it is worth a look.
            tracing::warn!(task_id = %task_id, execution_id = %execution_id, "no attempts row to close");
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_the_ladder() {
        assert_eq!(chunks(0), Vec::<usize>::new());
        assert_eq!(chunks(1), vec![1]);
        assert_eq!(chunks(300), vec![256, 16, 16, 4, 4, 4]);
        assert_eq!(chunks(300).iter().sum::<usize>(), 300);
        for n in 0..1_000 {
            assert_eq!(chunks(n).iter().sum::<usize>(), n);
        }
    }

    #[test]
    fn statements_have_one_placeholder_per_bind() {
        assert_eq!(update_sql(4).matches('?').count(), 4 * 19);
        assert_eq!(insert_tasks_sql(16).matches('?').count(), 16 * 37);
        assert_eq!(open_attempts_sql(1).matches('?').count(), 8);
        assert_eq!(close_attempts_sql(64).matches('?').count(), 64 * 5);
        assert_eq!(select_sql(256).matches('?').count(), 256);
    }
}
