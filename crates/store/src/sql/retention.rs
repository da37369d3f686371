//! Retention's removals, in bounded batches (one short write transaction
//! each, never a long lock or a table rewrite): `Store::remove_ended`
//! (old terminal tasks, each by its handler's, namespace's or the
//! server's horizon) and `Store::trim_fires` (fire history beyond a
//! schedule's newest records); and the horizons set through the API.

use taskmesh_core::retention::{Horizons, RetentionRule, TERMINAL};
use taskmesh_core::{TaskState, UnixMillis};

use super::backend::Backend;
use super::dialect::in_lists;
use super::tasks::sql_limit;
use super::{SqlStore, args};
use crate::decode::Columns;
use crate::{Error, Result};

impl<B: Backend> SqlStore<B> {
    /// Reads the ids (the oldest first) and deletes them in one write
    /// transaction; the delete names the terminal states again, so a row
    /// that is not terminal can never go.
    pub(super) async fn remove_ended_tasks(
        &self,
        state: TaskState,
        now: UnixMillis,
        default_horizon_ms: i64,
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
                args![state.as_str(), now, default_horizon_ms, sql_limit(limit)],
            )
            .await?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(
                row.text("id")
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

impl<B: Backend> SqlStore<B> {
    /// Replaces the horizons of (`namespace`, `handler`) in one write.
    pub(super) async fn retention_set(
        &self,
        namespace: &str,
        handler: &str,
        horizons: &Horizons,
    ) -> Result<()> {
        let b = self.backend();
        let sql = b.sql();
        let mut tx = b.begin_write().await?;
        b.exec(&mut tx, &sql.delete_retention, args![namespace, handler])
            .await?;
        for state in TERMINAL {
            if let Some(ms) = horizons.of(state) {
                b.exec(
                    &mut tx,
                    &sql.insert_retention,
                    args![namespace, handler, state.as_str(), ms],
                )
                .await?;
            }
        }
        b.commit(tx).await
    }

    /// The horizons set, of `namespace` or of all.
    pub(super) async fn retention_list(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<RetentionRule>> {
        let b = self.backend();
        let rows = match namespace {
            Some(ns) => b.read(&b.sql().retention_rules_in, args![ns]).await?,
            None => b.read(&b.sql().retention_rules, args![]).await?,
        };
        let bad = |e: String| Error::Internal(format!("bad retention_policies row: {e}"));
        let mut rules = Vec::with_capacity(rows.len());
        for row in rows {
            let state = row.text("state").map_err(bad)?;
            rules.push(RetentionRule {
                namespace: row.text("namespace").map_err(bad)?,
                handler: row.text("handler").map_err(bad)?,
                state: TaskState::parse(&state)
                    .ok_or_else(|| bad(format!("unknown state {state:?}")))?,
                horizon_ms: row.int("horizon_ms").map_err(bad)?,
            });
        }
        Ok(rules)
    }

    /// The first-created task kept in `namespace` and `state`, with when
    /// it ended.
    pub(super) async fn oldest_ended_task(
        &self,
        namespace: &str,
        state: TaskState,
    ) -> Result<Option<(String, Option<UnixMillis>)>> {
        let b = self.backend();
        let rows = b
            .read(&b.sql().oldest_ended, args![namespace, state.as_str()])
            .await?;
        let bad = |e: String| Error::Internal(format!("bad tasks row: {e}"));
        match rows.first() {
            None => Ok(None),
            Some(row) => Ok(Some((
                row.text("id").map_err(bad)?,
                row.opt_int("ended_at").map_err(bad)?,
            ))),
        }
    }
}

/// The instant `v` of the first row, if any.
fn instant<R: crate::decode::Columns>(rows: Vec<R>) -> Result<Option<UnixMillis>> {
    match rows.first() {
        None => Ok(None),
        Some(row) => row
            .opt_int("v")
            .map_err(|e| Error::Internal(format!("bad fire time: {e}"))),
    }
}
