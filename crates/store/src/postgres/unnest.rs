//! Postgres's own bulk write: a whole [`Batch`] (task rows, attempts opened
//! and closed, callbacks queued) in ONE statement of `UNNEST`ed column
//! arrays, where the portable form takes four. It joins the arrays against
//! `tasks` with the usual compare-and-set (`WHERE id = v.id AND version =
//! v.expected`); attempts and callbacks change only for the tasks whose row
//! was written, and the ids of the tasks whose row had moved come back.

use std::collections::HashSet;

use sqlx::{PgConnection, Row};
use taskmesh_core::TaskRecord;

use crate::sql::Batch;

/// The batch statement; see the module comment.
const WRITE: &str = "WITH upd AS ( \
    UPDATE tasks AS t SET state = v.state, updated_at = v.updated_at, \
        pending_at = v.pending_at, ready_at = v.ready_at, dispatching_at = v.dispatching_at, \
        running_at = v.running_at, retrying_at = v.retrying_at, ended_at = v.ended_at, \
        attempt = v.attempt, run_count = v.run_count, execution_id = v.execution_id, \
        worker_id = v.worker_id, next_at = v.next_at, output = v.output, \
        output_content_type = v.output_content_type, error_message = v.error_message, \
        version = v.version \
    FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], \
        $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], \
        $12::bigint[], $13::text[], $14::text[], $15::bigint[], $16::bytea[], $17::text[], \
        $18::text[], $19::bigint[]) \
      AS v(id, expected, state, updated_at, pending_at, ready_at, dispatching_at, running_at, \
        retrying_at, ended_at, attempt, run_count, execution_id, worker_id, next_at, output, \
        output_content_type, error_message, version) \
    WHERE t.id = v.id AND t.version = v.expected \
    RETURNING t.id), \
  ins AS ( \
    INSERT INTO attempts (task_id, number, execution_id, worker_id, started_at, ended_at, \
        outcome, message) \
    SELECT * FROM UNNEST($20::text[], $21::bigint[], $22::text[], $23::text[], $24::bigint[], \
        $25::bigint[], $26::text[], $27::text[]) \
      AS o(task_id, number, execution_id, worker_id, started_at, ended_at, outcome, message) \
    WHERE o.task_id IN (SELECT id FROM upd) \
    RETURNING 1), \
  cls AS ( \
    UPDATE attempts AS a SET ended_at = c.ended_at, outcome = c.outcome, message = c.message \
    FROM UNNEST($28::text[], $29::text[], $30::bigint[], $31::text[], $32::text[]) \
      AS c(task_id, execution_id, ended_at, outcome, message) \
    WHERE a.task_id = c.task_id AND a.execution_id = c.execution_id \
      AND c.task_id IN (SELECT id FROM upd) \
    RETURNING 1), \
  cbs AS ( \
    INSERT INTO callbacks (delivery_id, task_id, url, state, attempts, last_error, \
        next_attempt_at, delivered_at, created_at) \
    SELECT * FROM UNNEST($33::text[], $34::text[], $35::text[], $36::text[], $37::bigint[], \
        $38::text[], $39::bigint[], $40::bigint[], $41::bigint[]) \
      AS k(delivery_id, task_id, url, state, attempts, last_error, next_attempt_at, \
        delivered_at, created_at) \
    WHERE k.task_id IN (SELECT id FROM upd) \
    RETURNING 1) \
  SELECT ARRAY(SELECT id FROM upd), (SELECT count(*) FROM ins), (SELECT count(*) FROM cls), \
    (SELECT count(*) FROM cbs)";

/// Writes the batch in one statement. Returns the ids of the tasks
/// whose compare-and-set missed (nothing of theirs was written).
pub(super) async fn write(
    batch: &Batch,
    conn: &mut PgConnection,
) -> Result<HashSet<String>, sqlx::Error> {
    let rows = &batch.rows;
    let col = |f: fn(&(i64, TaskRecord)) -> Option<i64>| rows.iter().map(f).collect::<Vec<_>>();
    let text =
        |f: fn(&TaskRecord) -> Option<String>| rows.iter().map(|(_, t)| f(t)).collect::<Vec<_>>();
    // Not a prepared statement kept on the connection: Postgres would
    // settle on a generic plan after five runs, costed for arrays of
    // unknown length against `tasks` as it was then, and a young table's
    // plan (a hash join over a sequential scan of `tasks`) then stays while
    // the table grows (measured: 871 sequential scans reading 38.8 M rows
    // in ~25 s of `bench --scenario workflows`). Unnamed, each write is
    // planned for its own arrays: an index lookup per row.
    let q = sqlx::query(WRITE)
        .persistent(false)
        .bind(rows.iter().map(|(_, t)| t.id.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|(v, _)| *v).collect::<Vec<_>>())
        .bind(text(|t| Some(t.state.as_str().to_string())))
        .bind(col(|(_, t)| Some(t.updated_at)))
        .bind(col(|(_, t)| t.times.pending))
        .bind(col(|(_, t)| t.times.ready))
        .bind(col(|(_, t)| t.times.dispatching))
        .bind(col(|(_, t)| t.times.running))
        .bind(col(|(_, t)| t.times.retrying))
        .bind(col(|(_, t)| t.times.end))
        .bind(col(|(_, t)| Some(i64::from(t.attempt))))
        .bind(col(|(_, t)| Some(i64::from(t.run_count))))
        .bind(text(|t| t.execution_id.clone()))
        .bind(text(|t| t.worker_id.clone()))
        .bind(col(|(_, t)| t.next_at))
        .bind(
            rows.iter()
                .map(|(_, t)| t.output.clone())
                .collect::<Vec<_>>(),
        )
        .bind(text(|t| Some(t.output_content_type.clone())))
        .bind(text(|t| Some(t.error_message.clone())))
        .bind(col(|(_, t)| Some(t.version)));
    let opens = &batch.opens;
    let q = q
        .bind(opens.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>())
        .bind(
            opens
                .iter()
                .map(|(_, a)| i64::from(a.number))
                .collect::<Vec<_>>(),
        )
        .bind(
            opens
                .iter()
                .map(|(_, a)| a.execution_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            opens
                .iter()
                .map(|(_, a)| a.worker_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(opens.iter().map(|(_, a)| a.started_at).collect::<Vec<_>>())
        .bind(opens.iter().map(|(_, a)| a.ended_at).collect::<Vec<_>>())
        .bind(
            opens
                .iter()
                .map(|(_, a)| a.outcome.map(|o| o.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            opens
                .iter()
                .map(|(_, a)| a.message.clone())
                .collect::<Vec<_>>(),
        );
    let closes = &batch.closes;
    let q = q
        .bind(closes.iter().map(|c| c.task_id.clone()).collect::<Vec<_>>())
        .bind(
            closes
                .iter()
                .map(|c| c.execution_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(closes.iter().map(|c| c.ended_at).collect::<Vec<_>>())
        .bind(closes.iter().map(|c| c.outcome).collect::<Vec<_>>())
        .bind(closes.iter().map(|c| c.message.clone()).collect::<Vec<_>>());
    let cbs = &batch.callbacks;
    let q = q
        .bind(
            cbs.iter()
                .map(|(_, c)| c.delivery_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(cbs.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>())
        .bind(cbs.iter().map(|(_, c)| c.url.clone()).collect::<Vec<_>>())
        .bind(
            cbs.iter()
                .map(|(_, c)| c.state.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            cbs.iter()
                .map(|(_, c)| i64::from(c.attempts))
                .collect::<Vec<_>>(),
        )
        .bind(
            cbs.iter()
                .map(|(_, c)| c.last_error.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            cbs.iter()
                .map(|(_, c)| c.next_attempt_at)
                .collect::<Vec<_>>(),
        )
        .bind(cbs.iter().map(|(_, c)| c.delivered_at).collect::<Vec<_>>())
        .bind(cbs.iter().map(|(_, c)| c.created_at).collect::<Vec<_>>());
    let row = q.fetch_one(&mut *conn).await?;
    let updated: Vec<String> = row.try_get(0)?;
    let closed: i64 = row.try_get(2)?;
    let updated: HashSet<String> = updated.into_iter().collect();
    let missed: HashSet<String> = rows
        .iter()
        .map(|(_, t)| &t.id)
        .filter(|id| !updated.contains(*id))
        .cloned()
        .collect();
    let expected_closes = closes
        .iter()
        .filter(|c| updated.contains(&c.task_id))
        .count();
    if usize::try_from(closed).ok() != Some(expected_closes) {
        // As on the row-by-row path: the task row is authoritative.
        tracing::warn!(
            expected = expected_closes,
            closed,
            "some attempts rows to close were missing"
        );
    }
    Ok(missed)
}
