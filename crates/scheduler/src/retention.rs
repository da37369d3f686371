//! Retention, on the leader: tasks that ended longer ago than their
//! horizon — their handler's or namespace's (set through the API,
//! `Store::set_retention`), else the server's for their state — are
//! removed (with their attempts, delivered callbacks and logs) in
//! bounded batches (`Store::remove_ended`, one short write transaction
//! each), one batch per state per pass; an ended workflow goes whole, its
//! row with every step, once its end is past its namespace's (or the
//! server's) horizon for its end state (`Store::remove_ended_workflows`,
//! a transaction per workflow, a batch of steps per state per pass); after the round's promotions and
//! fires; and each schedule's fire history is trimmed to its newest
//! `fire_history` records (`Store::trim_fires`), a page of
//! [`SCHEDULES_PER_PASS`] schedules per pass, round robin. A pass that
//! found a full batch comes again after [`BUSY_PAUSE`], otherwise after
//! [`IDLE_PAUSE`] (both counted from the pass's end), so removal never
//! holds the store for long. Deletes carry no fencing token: a deposed
//! leader removing rows
//! past their horizon removes what the new leader would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use taskmesh_core::{TaskState, UnixMillis};
use taskmesh_store::Store;

/// Shortest pause after a pass that left more to remove (small batches
/// take a few milliseconds: the duty cycle below is what paces them).
pub const BUSY_PAUSE: Duration = Duration::from_millis(20);
/// Pause after a pass that failed (the store is likely struggling), or
/// the duty-cycle pause if that is longer.
pub const FAILED_PAUSE: Duration = Duration::from_secs(1);
/// Ended tasks removed per state per pass unless configured, on every
/// store: the SQL core's largest `IN` list, so a batch is one delete per
/// table (500 took two, the second padded to 256), and a shorter hold of
/// SQLite's writer at a time than 500 (docs/BENCHMARKS.md, "Fourth
/// figures"). Postgres and MySQL took 64 until the ninth figures: there a
/// pass's time is mostly its round trips, so 64 removed only 326 tasks/s
/// at 1,000/s of new ones (a third of what comes in) where 256 removed
/// 899/s, with the live p99 against its neighbours +24 % and +4 %.
pub const DEFAULT_BATCH: u32 = 256;
/// A pass that left more to remove is followed by a pause of at least this
/// many times as long as it took, so removal holds the store (SQLite's one
/// writer, Postgres's locks and I/O) at most 1/(1 + this) of the time: a
/// backlog of millions drains beside the live path rather than at the
/// store's full speed. A tenth: at ~50 µs a removed task on SQLite that
/// is ~2,000 tasks/s, twice a steady 1,000/s of new ones (a twentieth fell
/// behind that: `taskmesh bench --scenario latency --retention-succeeded`).
pub const BUSY_PAUSE_FACTOR: u32 = 9;
/// Pause after a pass that removed all there was.
pub const IDLE_PAUSE: Duration = Duration::from_secs(5);

/// The horizon that keeps tasks (the server keeps a state forever, but a
/// namespace or handler set a horizon for it): far enough that nothing
/// ever ended that long ago, near enough that subtracting it from a time
/// cannot overflow.
pub const KEEP_MS: i64 = i64::MAX / 4;

/// How long ended tasks are kept, per terminal state; `None` keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub succeeded: Option<Duration>,
    pub failed: Option<Duration>,
    pub timed_out: Option<Duration>,
    pub cancelled: Option<Duration>,
    /// Tasks removed per state per pass, and fire records per schedule.
    pub batch: usize,
    /// Fire records kept per schedule (the newest); at least 1.
    pub fire_history: u32,
}

/// A switch and a tally shared with whoever runs the node: retention can
/// be paused (a pass under way finishes; none starts until resumed) and
/// counts every row it removed. `taskmesh bench --retention-windows`
/// uses it to measure the live path with removal on and off in turns
/// beside one backlog.
#[derive(Debug)]
pub struct RetentionControl {
    paused: tokio::sync::watch::Sender<bool>,
    removed: AtomicU64,
    passes: AtomicU64,
    pass_micros: AtomicU64,
}

impl Default for RetentionControl {
    /// Running, nothing removed yet.
    fn default() -> Self {
        Self {
            paused: tokio::sync::watch::Sender::new(false),
            removed: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            pass_micros: AtomicU64::new(0),
        }
    }
}

impl RetentionControl {
    /// Pauses (`true`) or resumes (`false`) removal.
    pub fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// Whether removal is paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Told of every pause and resume.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.paused.subscribe()
    }

    /// Rows removed since the node started (tasks, workflows and their
    /// steps, fire records).
    pub fn removed(&self) -> u64 {
        self.removed.load(Ordering::Relaxed)
    }

    /// Passes run since the node started, and the time they took in all
    /// (µs of wall time, from the first read to the last commit).
    pub fn passes(&self) -> (u64, u64) {
        (
            self.passes.load(Ordering::Relaxed),
            self.pass_micros.load(Ordering::Relaxed),
        )
    }

    /// A pass that removed `n` rows in `took`.
    pub(crate) fn count(&self, n: u64, took: Duration) {
        self.removed.fetch_add(n, Ordering::Relaxed);
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.pass_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }
}

/// Schedules whose fire history one pass looks at (the next page each
/// pass, round robin over all of them).
pub const SCHEDULES_PER_PASS: u32 = 100;

impl Default for Retention {
    /// Succeeded and cancelled 24 h, failed and timed out 7 days,
    /// [`DEFAULT_BATCH`] per batch.
    fn default() -> Self {
        let day = Duration::from_secs(24 * 3600);
        Self {
            succeeded: Some(day),
            failed: Some(day * 7),
            timed_out: Some(day * 7),
            cancelled: Some(day),
            batch: DEFAULT_BATCH as usize,
            fire_history: 1_000,
        }
    }
}

impl Retention {
    /// The pause after a pass that took `took`: [`IDLE_PAUSE`] when it
    /// removed all there was, else the duty-cycle pause (see
    /// [`BUSY_PAUSE_FACTOR`]), at least [`BUSY_PAUSE`].
    pub fn pause_after(took: Duration, more: bool) -> Duration {
        if more {
            BUSY_PAUSE.max(took * BUSY_PAUSE_FACTOR)
        } else {
            IDLE_PAUSE
        }
    }

    /// Keeps everything.
    pub fn keep_all() -> Self {
        Self {
            succeeded: None,
            failed: None,
            timed_out: None,
            cancelled: None,
            batch: DEFAULT_BATCH as usize,
            fire_history: u32::MAX,
        }
    }

    /// The horizons in milliseconds, in `core::retention::TERMINAL` order.
    pub fn horizons_ms(&self) -> taskmesh_core::retention::Horizons {
        let ms = |d: Option<Duration>| {
            d.map(|d| i64::try_from(d.as_millis()).unwrap_or(KEEP_MS).min(KEEP_MS))
        };
        taskmesh_core::retention::Horizons([
            ms(self.succeeded),
            ms(self.failed),
            ms(self.timed_out),
            ms(self.cancelled),
        ])
    }

    /// Each terminal state with its horizon.
    pub fn horizons(&self) -> [(TaskState, Option<Duration>); 4] {
        [
            (TaskState::Succeeded, self.succeeded),
            (TaskState::Failed, self.failed),
            (TaskState::TimedOut, self.timed_out),
            (TaskState::Cancelled, self.cancelled),
        ]
    }
}

/// What passes remember between them: where the fire trim goes on, and
/// what was found with nothing to remove (looked at again only after
/// [`IDLE_PAUSE`], so while one state drains a backlog every
/// [`BUSY_PAUSE`] or so, the others cost no reads).
#[derive(Debug, Default)]
pub struct Progress {
    /// The last schedule whose fire history was looked at.
    fire_cursor: Option<String>,
    /// Per state, in [`Retention::horizons`] order: no scan before this.
    quiet_until: [UnixMillis; 4],
    /// No look at fire histories before this.
    fires_quiet_until: UnixMillis,
}

/// One pass at `now`: a batch per state with a horizon, then the fire
/// history of the next page of schedules (back to the first after the
/// last page); a state, or the fire histories, found with nothing more
/// to remove is left out until [`IDLE_PAUSE`] later. Returns how many rows
/// went and whether a batch was full (more is waiting).
pub async fn pass(
    store: &dyn Store,
    retention: &Retention,
    now: UnixMillis,
    progress: &mut Progress,
) -> taskmesh_store::Result<(u64, bool)> {
    let idle_ms = IDLE_PAUSE.as_millis() as i64;
    let mut removed = 0;
    let mut more = false;
    // A small table: the horizons set per namespace and handler.
    let rules = store.retention_rules(None).await?;
    for (k, (state, horizon)) in retention.horizons().into_iter().enumerate() {
        if now < progress.quiet_until[k] {
            continue;
        }
        let default_ms = match horizon {
            Some(h) => i64::try_from(h.as_millis()).unwrap_or(KEEP_MS).min(KEEP_MS),
            // Kept by the server: only tasks with a horizon of their own go.
            None if rules.iter().any(|r| r.state == state) => KEEP_MS,
            None => continue,
        };
        let n = store
            .remove_ended(state, now, default_ms, retention.batch)
            .await?;
        if n > 0 {
            metrics::counter!(crate::meters::RETENTION_REMOVED, "kind" => "tasks", "state" => state.as_str())
                .increment(n);
        }
        removed += n;
        // Workflows that ended so, each with all its steps.
        let (workflows, steps) = store
            .remove_ended_workflows(state, now, default_ms, retention.batch)
            .await?;
        if workflows > 0 {
            metrics::counter!(crate::meters::RETENTION_REMOVED, "kind" => "workflows", "state" => state.as_str())
                .increment(workflows);
        }
        if steps > 0 {
            metrics::counter!(crate::meters::RETENTION_REMOVED, "kind" => "workflow_steps", "state" => state.as_str())
                .increment(steps);
        }
        removed += workflows + steps;
        let full = n as usize >= retention.batch || steps as usize >= retention.batch;
        if !full {
            progress.quiet_until[k] = now.saturating_add(idle_ms);
        }
        more |= full;
    }
    if now >= progress.fires_quiet_until {
        let keep = retention.fire_history.max(1);
        let (page, next) = store
            .list_schedules(None, progress.fire_cursor.as_deref(), SCHEDULES_PER_PASS)
            .await?;
        let mut full = false;
        for s in page {
            // Records ever written: nothing to trim below the cap.
            if s.fire_count + s.skipped_count <= u64::from(keep) {
                continue;
            }
            let n = store.trim_fires(&s.id, keep, retention.batch).await?;
            if n > 0 {
                metrics::counter!(crate::meters::RETENTION_REMOVED, "kind" => "fires").increment(n);
            }
            removed += n;
            full |= n as usize >= retention.batch;
        }
        // Through every schedule with nothing left over: rest a while.
        if next.is_none() && !full {
            progress.fires_quiet_until = now.saturating_add(idle_ms);
        }
        progress.fire_cursor = next;
        more |= full;
    }
    Ok((removed, more))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_pass_pauses_in_proportion_to_what_it_took() {
        let ms = Duration::from_millis;
        assert_eq!(
            Retention::pause_after(ms(1), true),
            BUSY_PAUSE,
            "at least the floor"
        );
        assert_eq!(
            Retention::pause_after(ms(50), true),
            ms(450),
            "a tenth of the time"
        );
        assert_eq!(Retention::pause_after(ms(50), false), IDLE_PAUSE);
    }
}
