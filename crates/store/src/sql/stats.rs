//! `Store::task_stats`: the figures GetStats shows, read in one snapshot so
//! every replica answers the same for the same moment.

use taskmesh_core::{TaskState, UnixMillis};

use super::backend::Backend;
use super::{SqlStore, args};
use crate::decode::Columns;
use crate::{Error, Result, TaskStats};

fn bad(what: &str) -> impl Fn(String) -> Error + '_ {
    move |e| Error::Internal(format!("bad {what} row: {e}"))
}

fn state_of(row: &impl Columns) -> Result<TaskState> {
    let text = row.text("state").map_err(bad("stats"))?;
    TaskState::parse(&text).ok_or_else(|| Error::Internal(format!("unknown task state {text:?}")))
}

fn count(row: &impl Columns) -> Result<u64> {
    Ok(u64::try_from(row.int("n").map_err(bad("stats"))?).unwrap_or(0))
}

impl<B: Backend> SqlStore<B> {
    /// `Store::task_stats`.
    pub(super) async fn stats(&self, namespace: &str, since: UnixMillis) -> Result<TaskStats> {
        let b = self.backend();
        let sql = b.sql();
        let mut tx = b.begin_read().await?;
        let mut out = TaskStats::default();
        for row in b
            .fetch(&mut tx, &sql.stats_counts, args![namespace])
            .await?
        {
            let handler = row.text("handler").map_err(bad("stats"))?;
            out.by_state_handler
                .push((state_of(&row)?, handler, count(&row)?));
        }
        for row in b
            .fetch(&mut tx, &sql.stats_queues, args![namespace])
            .await?
        {
            let handler = row.text("handler").map_err(bad("queue"))?;
            let oldest = row.opt_int("v").map_err(bad("queue"))?;
            out.queues.push((handler, count(&row)?, oldest));
        }
        for row in b
            .fetch(&mut tx, &sql.stats_ended, args![since, namespace])
            .await?
        {
            let minute = row.int("m").map_err(bad("minute"))?;
            out.ended_per_minute
                .push((minute, state_of(&row)?, count(&row)?));
        }
        let live = b
            .fetch(&mut tx, &sql.stats_reruns_live, args![namespace, since])
            .await?;
        let ended = b
            .fetch(
                &mut tx,
                &sql.stats_reruns_ended,
                args![since, namespace, since],
            )
            .await?;
        let mut reruns = std::collections::BTreeMap::<UnixMillis, u64>::new();
        for row in live.iter().chain(ended.iter()) {
            let minute = row.int("m").map_err(bad("minute"))?;
            *reruns.entry(minute).or_default() += count(row)?;
        }
        out.reruns_per_minute = reruns.into_iter().collect();
        b.commit(tx).await?;
        out.by_state_handler.sort();
        out.queues.sort();
        out.ended_per_minute.sort();
        Ok(out)
    }
}
