//! Claims: READY candidates of one handler read in index order (highest
//! priority first, FIFO within a priority) with the dialect's
//! `{skip_locked}`, the chooser asked for each, and the claimed tasks
//! written as one [`Batch`], all in one transaction.
//!
//! Where rows are locked (Postgres, MySQL), `SKIP LOCKED` is what lets
//! replicas claim at once: a candidate another claim holds is passed over
//! instead of waited for, and a row another claim moved out of READY and
//! committed no longer matches, so no task is claimed twice and no claimer
//! waits. The price: a claim may come back short while another holds the
//! remaining READY rows; the next wake-up finds whatever it left. SQLite
//! has one writer, so nothing is held.
//!
//! The first read is `limit` rows (enough when the chooser takes them all,
//! the usual case); each further read continues after the last row seen
//! (a keyset on priority and id) with twice as many, up to
//! [`claim_scan`](crate::claim_scan)`(limit)` candidates in all, so a task
//! no stream can take does not block the ones behind it.

use taskmesh_core::{Event, TaskRecord, UnixMillis};

use super::backend::Backend;
use super::batch::Batch;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::{Chooser, Error, Result, decode};

impl<B: Backend> SqlStore<B> {
    /// `Store::claim_ready`; see the module comment.
    pub(super) async fn claim(
        &self,
        namespace: &str,
        handler: &str,
        limit: usize,
        now: UnixMillis,
        chooser: &mut Chooser<'_>,
    ) -> Result<Vec<TaskRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let b = self.backend();
        let sql = b.sql();
        let scan = crate::claim_scan(limit);
        let mut tx = b.begin_write().await?;
        let mut seen = 0usize;
        let mut cursor: Option<(i32, String)> = None;
        let mut batch = Batch::default();
        let mut claimed = 0usize;
        let mut want = limit;
        'scan: while claimed < limit && seen < scan {
            let take = want.min(scan - seen);
            let rows = match &cursor {
                None => {
                    b.fetch(
                        &mut tx,
                        &sql.claim_first,
                        args![namespace, handler, sql_limit(take)],
                    )
                    .await?
                }
                Some((priority, id)) => {
                    let values = args![
                        namespace,
                        handler,
                        *priority,
                        *priority,
                        id,
                        sql_limit(take)
                    ];
                    b.fetch(&mut tx, &sql.claim_after, values).await?
                }
            };
            let exhausted = rows.len() < take;
            for row in &rows {
                let task = decode::task(row)?;
                seen += 1;
                cursor = Some((task.priority, task.id.clone()));
                if claimed == limit {
                    break 'scan;
                }
                let Some(claim) = chooser(&task) else {
                    continue;
                };
                let event = Event::from(claim);
                match batch.apply(&task, &event, now) {
                    Ok(_) => claimed += 1,
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
            b.commit(tx).await?;
            return Ok(Vec::new());
        }
        // A claim that cannot be written fails whole: the tasks stay READY.
        // Its rows are locked (or the writer is single), so a missed
        // compare-and-set here is a bug, never a race.
        if !b.write_batch(&mut tx, &batch).await?.is_empty() {
            return Err(Error::Internal(format!(
                "claim of {claimed} {handler} tasks could not be written"
            )));
        }
        b.commit(tx).await?;
        self.publish(&batch.changes, &[]);
        Ok(batch.into_tasks())
    }
}
