//! The receiving half of MySQL's wake-ups: a task that polls the `changes`
//! table for rows past the last it read and relays them to this store's
//! subscribers (skipping its own).
//!
//! Sequence numbers are given out at insert but become visible at commit,
//! so a row with a smaller number can appear after a larger one: a gap
//! below the newest row read is waited for (re-read on every poll) for
//! [`GAP_WAIT`], then given up — a rolled-back insert leaves one for ever —
//! and subscribers are told to resync, in case it was a late commit. A
//! failed poll also ends in a resync once polling works again. Rows older
//! than [`KEEP`] are pruned (by any replica) every [`PRUNE_EVERY`].

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sqlx::{MySqlPool, Row};

use crate::Result;
use crate::wake::Channels;

/// How long a gap in the sequence is waited for.
const GAP_WAIT: Duration = Duration::from_secs(2);

/// How long rows are kept.
const KEEP: &str = "60 SECOND";

/// How often old rows are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// Most rows one poll reads.
const BATCH: i64 = 1_000;

/// What the poller has read: every sequence number up to `floor`, and
/// those above it in `seen`; `gap_since` is when the lowest missing one
/// was first noticed.
#[derive(Debug, Default)]
struct Cursor {
    floor: i64,
    seen: BTreeSet<i64>,
    gap_since: Option<Instant>,
}

impl Cursor {
    /// Takes in the numbers of one poll; returns true when a gap was given
    /// up (subscribers must resync).
    fn advance(&mut self, read: impl IntoIterator<Item = i64>, now: Instant) -> bool {
        self.seen
            .extend(read.into_iter().filter(|s| *s > self.floor));
        let mut gave_up = false;
        loop {
            while self.seen.remove(&(self.floor + 1)) {
                self.floor += 1;
                self.gap_since = None;
            }
            let Some(&next) = self.seen.first() else {
                self.gap_since = None;
                return gave_up;
            };
            let since = *self.gap_since.get_or_insert(now);
            if now.duration_since(since) < GAP_WAIT {
                return gave_up;
            }
            // Waited long enough: whatever was below `next` is not coming.
            self.floor = next - 1;
            self.gap_since = None;
            gave_up = true;
        }
    }
}

/// Reads the newest sequence number, then spawns the poller.
pub(super) async fn start(
    pool: MySqlPool,
    origin: String,
    channels: Weak<Channels>,
    every: Duration,
    failures: Arc<AtomicU64>,
) -> Result<tokio::task::AbortHandle> {
    let floor: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM changes")
        .fetch_one(&pool)
        .await?;
    let cursor = Cursor {
        floor,
        ..Cursor::default()
    };
    let task = tokio::spawn(run(pool, origin, channels, every, cursor, failures));
    Ok(task.abort_handle())
}

async fn run(
    pool: MySqlPool,
    origin: String,
    channels: Weak<Channels>,
    every: Duration,
    mut cursor: Cursor,
    failures: Arc<AtomicU64>,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut pruned = Instant::now();
    loop {
        ticker.tick().await;
        if channels.strong_count() == 0 {
            return;
        }
        let rows =
            sqlx::query("SELECT seq, payload FROM changes WHERE seq > ? ORDER BY seq LIMIT ?")
                .bind(cursor.floor)
                .bind(BATCH)
                .fetch_all(&pool)
                .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(err) => {
                if !failing {
                    tracing::warn!(error = %err, "cannot poll for changes; retrying");
                }
                failing = true;
                failures.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let Some(strong) = channels.upgrade() else {
            return;
        };
        if failing {
            tracing::info!("polling for changes again; subscribers resync");
            strong.lag();
            failing = false;
        }
        let mut read = Vec::with_capacity(rows.len());
        for row in &rows {
            let (Ok(seq), Ok(payload)) = (row.try_get::<i64, _>(0), row.try_get::<String, _>(1))
            else {
                tracing::warn!("unreadable change row; resyncing");
                strong.lag();
                continue;
            };
            if seq > cursor.floor && !cursor.seen.contains(&seq) {
                strong.relay(&payload, &origin);
            }
            read.push(seq);
        }
        if cursor.advance(read, Instant::now()) {
            tracing::debug!(
                floor = cursor.floor,
                "gave up waiting for a change row; resyncing"
            );
            strong.lag();
        }
        drop(strong);
        if pruned.elapsed() >= PRUNE_EVERY {
            pruned = Instant::now();
            let prune = format!(
                "DELETE FROM changes WHERE created_at < NOW(6) - INTERVAL {KEEP} LIMIT 10000"
            );
            if let Err(err) = sqlx::query(sqlx::AssertSqlSafe(prune)).execute(&pool).await {
                tracing::debug!(error = %err, "could not prune old change rows");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_follows_contiguous_rows_and_waits_for_gaps() {
        let t0 = Instant::now();
        let mut c = Cursor {
            floor: 10,
            ..Cursor::default()
        };
        assert!(!c.advance([11, 12, 14], t0));
        assert_eq!(c.floor, 12, "13 is missing");
        assert_eq!(c.seen.iter().copied().collect::<Vec<_>>(), [14]);
        // 13 commits late: read on the next poll.
        assert!(!c.advance([13, 14], t0 + Duration::from_millis(100)));
        assert_eq!((c.floor, c.seen.len()), (14, 0));
        // 15 never comes (a rolled-back insert): given up after GAP_WAIT.
        assert!(!c.advance([16], t0 + Duration::from_secs(1)));
        assert_eq!(c.floor, 14);
        assert!(c.advance([16], t0 + Duration::from_secs(4)));
        assert_eq!((c.floor, c.seen.len()), (16, 0));
        // Rows at or below the floor are never taken again.
        assert!(!c.advance([3, 16], t0 + Duration::from_secs(5)));
        assert_eq!(c.floor, 16);
    }
}
