//! Claims on Postgres: READY candidates read with
//! `SELECT … FOR UPDATE SKIP LOCKED` in growing batches, the chooser asked
//! for each in order, and the claimed tasks written with one statement, all
//! in one transaction.
//!
//! SKIP LOCKED is what lets replicas claim at once: a candidate another
//! claim holds is passed over instead of waited for, and a row that
//! another claim moved out of READY and committed no longer matches, so no
//! task is claimed twice and no claimer waits. The price: a claim may come
//! back short while another holds the remaining READY rows; the next
//! wake-up finds whatever that claim left READY.
//!
//! The first batch is `limit` rows (enough when the chooser takes them
//! all, the usual case); each further batch doubles, up to
//! [`claim_scan`](crate::claim_scan)`(limit)` candidates in all, so a task
//! nobody can take does not block the ones behind it, and a claim locks
//! few rows it will not take.

use taskmesh_core::{Event, TaskRecord, UnixMillis};

use super::batch::Batch;
use super::store_impl::sql_limit;
use super::{PostgresStore, sql};
use crate::{Chooser, Result, decode};

impl PostgresStore {
    /// See the module comment; `limit` is at least 1.
    pub(super) async fn claim(
        &self,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>> {
        let scan = crate::claim_scan(limit);
        let mut db = self.pool.begin().await?;
        let mut seen: Vec<String> = Vec::new();
        let mut batch = Batch::default();
        let mut claimed = Vec::new();
        let mut want = limit;
        'scan: while claimed.len() < limit && seen.len() < scan {
            let take = want.min(scan - seen.len());
            let rows = sqlx::query(sql::CLAIM)
                .bind(handler)
                .bind(&seen)
                .bind(sql_limit(take))
                .fetch_all(&mut *db)
                .await?;
            let exhausted = rows.len() < take;
            for row in &rows {
                let task = decode::task(row)?;
                seen.push(task.id.clone());
                if claimed.len() == limit {
                    break 'scan;
                }
                let Some(claim) = chooser(&task) else {
                    continue;
                };
                let event = Event::Dispatch {
                    execution_id: claim.execution_id,
                    worker_id: claim.worker_id,
                    ack_deadline: claim.ack_deadline,
                };
                match taskmesh_core::apply(&task, &event, now) {
                    Ok(mut transition) => {
                        batch.push(&task, &mut transition);
                        claimed.push(transition.task);
                    }
                    Err(err) => {
                        tracing::warn!(task_id = %task.id, error = %err, "READY task refused dispatch");
                    }
                }
            }
            if exhausted {
                break;
            }
            want = want.saturating_mul(2);
        }
        if batch.is_empty() {
            db.commit().await?;
            return Ok(Vec::new());
        }
        // As on SQLite, a claim that cannot be written fails whole: the
        // tasks stay READY. Rows this transaction locked cannot have moved,
        // so a missed compare-and-set here is a bug, never a race.
        if !batch.write(&mut db).await?.is_empty() {
            db.rollback().await?;
            return Err(crate::Error::Internal(format!(
                "claim of {} {handler} tasks could not be written",
                claimed.len()
            )));
        }
        db.commit().await?;
        self.publish(batch.changes, []);
        Ok(claimed)
    }
}
