//! [`StoreClock`]: the store's clock, read locally. In a cluster, due-ness
//! (run_at, backoff ends, ACK and execution deadlines) is judged by the
//! database's clock, so a replica whose host clock is off neither fires
//! early nor late. Asking the database for every reading would cost a round
//! trip each; instead the offset between the database clock and the host
//! clock is sampled every few seconds and added to the host clock.
//!
//! A sample reads [`Store::db_now`] between two host readings and takes the
//! database reading as belonging to the midpoint, so the error is at most
//! half the round trip; of three quick samples the one with the shortest
//! round trip wins.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use taskmesh_core::{Clock, UnixMillis};

use crate::{Result, Store};

/// How often [`StoreClock::start`] resamples by default.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(5);

/// Samples per resync; the one with the shortest round trip is kept.
const SAMPLES: usize = 3;

/// A [`Clock`] showing the store's time: the host clock plus the last
/// measured offset. Cheap to clone; clones share the offset, and the
/// resampling task stops when the last clone is dropped.
#[derive(Clone)]
pub struct StoreClock {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    local: Arc<dyn Clock>,
    /// Store clock minus host clock, in milliseconds.
    offset: AtomicI64,
    /// Half the round trip of the kept sample: the offset's uncertainty.
    uncertainty: AtomicI64,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().ok().and_then(|mut t| t.take()) {
            task.abort();
        }
    }
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClock")
            .field("local", &self.inner.local)
            .field("offset_millis", &self.offset_millis())
            .field("uncertainty_millis", &self.uncertainty_millis())
            .finish()
    }
}

impl StoreClock {
    /// Measures the offset of `store`'s clock from `local` (the host clock;
    /// a `FakeClock` in tests) now, failing if the store cannot answer, and
    /// then every `every` from a spawned task. A failed resample keeps the
    /// last offset (clocks drift slowly) and is logged.
    pub async fn start(
        store: Arc<dyn Store>,
        local: Arc<dyn Clock>,
        every: Duration,
    ) -> Result<Self> {
        let clock = Self {
            inner: Arc::new(Inner {
                store,
                local,
                offset: AtomicI64::new(0),
                uncertainty: AtomicI64::new(0),
                task: std::sync::Mutex::new(None),
            }),
        };
        clock.resync().await?;
        let task = tokio::spawn(resample(Arc::downgrade(&clock.inner), every));
        if let Ok(mut slot) = clock.inner.task.lock() {
            *slot = Some(task.abort_handle());
        }
        Ok(clock)
    }

    /// Measures the offset now.
    pub async fn resync(&self) -> Result<()> {
        self.inner.sample().await
    }

    /// The store's clock minus the host clock, as last measured.
    pub fn offset_millis(&self) -> i64 {
        self.inner.offset.load(Ordering::SeqCst)
    }

    /// How far off the offset may be: half the round trip it was measured
    /// with.
    pub fn uncertainty_millis(&self) -> i64 {
        self.inner.uncertainty.load(Ordering::SeqCst)
    }
}

impl Clock for StoreClock {
    fn now_millis(&self) -> UnixMillis {
        self.inner
            .local
            .now_millis()
            .saturating_add(self.offset_millis())
    }
}

impl Inner {
    async fn sample(&self) -> Result<()> {
        let mut best: Option<(Duration, i64)> = None;
        for _ in 0..SAMPLES {
            let before = self.local.now_millis();
            let started = Instant::now();
            let db = self.store.db_now().await?;
            let round_trip = started.elapsed();
            let half = i64::try_from(round_trip.as_millis() / 2).unwrap_or(i64::MAX);
            let offset = db.saturating_sub(before.saturating_add(half));
            if best.is_none_or(|(rt, _)| round_trip < rt) {
                best = Some((round_trip, offset));
            }
        }
        if let Some((round_trip, offset)) = best {
            let previous = self.offset.swap(offset, Ordering::SeqCst);
            let uncertainty = i64::try_from(round_trip.as_millis().div_ceil(2)).unwrap_or(i64::MAX);
            self.uncertainty.store(uncertainty, Ordering::SeqCst);
            if (offset - previous).abs() > 1_000 {
                tracing::info!(
                    offset_ms = offset,
                    uncertainty_ms = uncertainty,
                    "store clock offset changed"
                );
            }
        }
        Ok(())
    }
}

async fn resample(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if let Err(err) = inner.sample().await {
            tracing::warn!(error = %err, "cannot read the store's clock; keeping the last offset");
        }
    }
}

#[cfg(test)]
mod tests {
    use taskmesh_core::{FakeClock, SystemClock};
    use tempfile::TempDir;

    use super::*;
    use crate::SqliteStore;

    /// On SQLite the store's clock is the process clock: a host clock set
    /// an hour ahead is corrected back to it.
    #[tokio::test]
    async fn follows_the_store_clock_not_the_host_clock() {
        let dir = TempDir::new().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in(dir.path()).await.expect("open"));
        let hour = 3_600_000;
        let host = FakeClock::new(SystemClock.now_millis() + hour);
        let clock = StoreClock::start(store, Arc::new(host.clone()), DEFAULT_RESYNC)
            .await
            .expect("start");
        let offset = clock.offset_millis();
        assert!((offset + hour).abs() < 1_000, "offset {offset}");
        let skew = clock.now_millis() - SystemClock.now_millis();
        assert!(skew.abs() < 1_000, "store clock off by {skew} ms");
        // The host clock moving moves the reading with it until resampled.
        host.advance(10_000);
        assert!((clock.now_millis() - SystemClock.now_millis() - 10_000).abs() < 1_000);
        clock.resync().await.expect("resync");
        assert!((clock.now_millis() - SystemClock.now_millis()).abs() < 1_000);
        assert!(format!("{clock:?}").contains("offset_millis"));
    }
}
