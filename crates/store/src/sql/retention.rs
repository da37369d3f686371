//! Retention's removals, in bounded batches (one short write transaction
//! each, never a long lock or a table rewrite): `Store::remove_ended`
//! (old terminal tasks) and `Store::trim_fires` (fire history beyond a
//! schedule's newest records).

use taskmesh_core::{TaskState, UnixMillis};

use super::backend::Backend;
use super::dialect::in_lists;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::{Error, Result};

impl<B: Backend> SqlStore<B> {
    /// Reads the ids (the oldest first) and deletes them in one write
    /// transaction; the delete names the terminal states again, so a row
    /// that is not terminal can never go.
    pub(super) async fn remove_ended_tasks(
        &self,
        state: TaskState,
        ended_before: UnixMillis,
        limit: usize,
    ) -> Result<u64> {
        if !state.is_terminal() {
            return Err(Error::InvalidArgument(format!(
                "only ended tasks are removed; {} is not a terminal state",
                state.as_str()
            )));
        }
        if limit == 0 {
            return Ok(0);
        }
        let b = self.backend();
        let mut tx = b.begin_write().await?;
        let rows = b
            .fetch(
                &mut tx,
                &b.sql().ended_ids,
                args![state.as_str(), ended_before, sql_limit(limit)],
            )
            .await?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(
                crate::decode::Columns::text(row, "id")
                    .map_err(|e| Error::Internal(format!("bad tasks row: {e}")))?,
            );
        }
        let mut removed = 0;
        for list in in_lists(&ids) {
            let n = list.len();
            let values = list.into_iter().map(Into::into).collect();
            removed += b.exec(&mut tx, b.sql().delete_ended.get(n), values).await?;
        }
        b.commit(tx).await?;
        Ok(removed)
    }

    /// Finds the oldest fire time to keep (the `keep`-th newest), then the
    /// last of at most `limit` older ones, and deletes through it.
    pub(super) async fn trim_schedule_fires(
        &self,
        schedule_id: &str,
        keep: u32,
        limit: usize,
    ) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let b = self.backend();
        let sql = b.sql();
        let mut tx = b.begin_write().await?;
        let first_kept = instant(
            b.fetch(
                &mut tx,
                &sql.nth_newest_fire,
                args![schedule_id, i64::from(keep.max(1)) - 1],
            )
            .await?,
        )?;
        let Some(first_kept) = first_kept else {
            // No more than `keep` records.
            b.commit(tx).await?;
            return Ok(0);
        };
        let last_of_batch = instant(
            b.fetch(
                &mut tx,
                &sql.nth_oldest_fire_before,
                args![schedule_id, first_kept, sql_limit(limit) - 1],
            )
            .await?,
        )?
        .unwrap_or(first_kept);
        let removed = b
            .exec(
                &mut tx,
                &sql.delete_fires_through,
                args![schedule_id, first_kept, last_of_batch],
            )
            .await?;
        b.commit(tx).await?;
        Ok(removed)
    }
}

/// The instant `v` of the first row, if any.
fn instant<R: crate::decode::Columns>(rows: Vec<R>) -> Result<Option<UnixMillis>> {
    match rows.first() {
        None => Ok(None),
        Some(row) => crate::decode::Columns::opt_int(row, "v")
            .map_err(|e| Error::Internal(format!("bad fire time: {e}"))),
    }
}
