//! The timing-wheel engine: every task `next_at` and schedule
//! `next_fire_at` within a horizon sits in a `DelayQueue` (a hierarchical
//! timing wheel) and wakes the scheduler at its instant.
//!
//! It is fed three ways: a load from the store at start and every
//! `reload_every` (the safety net that also brings in items as they enter
//! the horizon), and the store's task and schedule change streams for
//! everything created, moved or deleted in between. A lagging change
//! stream triggers a reload, so no change is lost for longer than a reload.
//!
//! A load runs beside the wheel, not in its loop: reading every item due
//! within the horizon takes a while when there are many (~0.4 s for the
//! ~20,000 of 100,000 mixed schedules due within a minute), and a wheel
//! waiting for it fired nothing meanwhile. An item changed (or fired) while
//! a load was in flight keeps what the change said, not what the load read;
//! a later change arrives after the load's answer and is applied after it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use taskmesh_core::{Clock, UnixMillis};
use taskmesh_store::{ScheduleChange, Store, TaskChange};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{Instrument, debug, warn};

use super::TriggerEngine;

/// Most items loaded per kind per reload.
const LOAD_LIMIT: usize = 200_000;

/// Longest a load may take before it counts as failed (and is retried in
/// a second): a store that hangs must not stop every later reload.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Item {
    Task(String),
    Schedule(String),
}

/// What a load read: every item due within the horizon, with its instant.
type Loaded = Vec<(Item, Option<UnixMillis>)>;

/// A load in flight: its answer (`None` when the store failed or took too
/// long), the items changed or fired since it started, and its task
/// (aborted if the engine is dropped first).
struct Loading {
    answer: oneshot::Receiver<Option<Loaded>>,
    touched: HashSet<Item>,
    _task: AbortOnDropHandle<()>,
}

/// The timing-wheel engine.
pub struct WheelEngine {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    horizon_ms: i64,
    reload_every: Duration,
    queue: DelayQueue<Item>,
    keys: HashMap<Item, (delay_queue::Key, UnixMillis)>,
    tasks: broadcast::Receiver<TaskChange>,
    schedules: broadcast::Receiver<ScheduleChange>,
    next_reload: Instant,
    loading: Option<Loading>,
}

impl WheelEngine {
    /// A wheel over `store`, holding items due within `horizon`.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, horizon: Duration) -> Self {
        let tasks = store.subscribe();
        let schedules = store.subscribe_schedules();
        let horizon = horizon.max(Duration::from_secs(1));
        Self {
            store,
            clock,
            horizon_ms: horizon.as_millis() as i64,
            reload_every: horizon / 2,
            queue: DelayQueue::new(),
            keys: HashMap::new(),
            tasks,
            schedules,
            next_reload: Instant::now(),
            loading: None,
        }
    }

    /// Items in the wheel (for tests and metrics).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the wheel holds nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn upsert(&mut self, item: Item, at: Option<UnixMillis>) {
        let now = self.clock.now_millis();
        self.upsert_at(now, item, at);
    }

    /// [`Self::upsert`] with the clock read by the caller.
    fn upsert_at(&mut self, now: UnixMillis, item: Item, at: Option<UnixMillis>) {
        let at = at.filter(|at| *at <= now + self.horizon_ms);
        match (self.keys.get(&item).copied(), at) {
            (Some((key, old)), Some(at)) if old != at => {
                self.queue.reset(&key, delay(now, at));
                self.keys.insert(item, (key, at));
            }
            (Some(_), Some(_)) => {}
            (Some((key, _)), None) => {
                self.queue.remove(&key);
                self.keys.remove(&item);
            }
            (None, Some(at)) => {
                let key = self.queue.insert(item.clone(), delay(now, at));
                self.keys.insert(item, (key, at));
            }
            (None, None) => {}
        }
    }

    /// A change from the store's streams: newer than a load in flight.
    fn apply_change(&mut self, item: Item, at: Option<UnixMillis>) {
        self.touch(&item);
        self.upsert(item, at);
    }

    /// Marks `item` as newer than a load in flight (changed, or fired).
    fn touch(&mut self, item: &Item) {
        if let Some(loading) = &mut self.loading {
            loading.touched.insert(item.clone());
        }
    }

    /// Starts a load of everything due within the horizon, beside the wheel.
    fn start_reload(&mut self) {
        let until = self.clock.now_millis() + self.horizon_ms;
        self.next_reload = Instant::now() + self.reload_every;
        let (tx, answer) = oneshot::channel();
        let store = self.store.clone();
        let task = tokio::spawn(
            async move {
                let loaded =
                    match tokio::time::timeout(LOAD_TIMEOUT, load(store.as_ref(), until)).await {
                        Ok(loaded) => loaded,
                        Err(_) => {
                            warn!(timeout = ?LOAD_TIMEOUT, "timing wheel load took too long");
                            None
                        }
                    };
                let _ = tx.send(loaded);
            }
            .in_current_span(),
        );
        self.loading = Some(Loading {
            answer,
            touched: HashSet::new(),
            _task: AbortOnDropHandle::new(task),
        });
    }

    /// Takes in a load's answer, but for the items touched since it started.
    fn take_load(&mut self, answer: Option<Loaded>, touched: &HashSet<Item>) {
        let Some(items) = answer else {
            self.next_reload = Instant::now() + Duration::from_secs(1);
            return;
        };
        let now = self.clock.now_millis();
        for (item, at) in items {
            if !touched.contains(&item) {
                self.upsert_at(now, item, at);
            }
        }
        debug!(items = self.keys.len(), "timing wheel loaded");
    }
}

/// Reads every task and schedule due before `until` (at most
/// [`LOAD_LIMIT`] of each); `None` when the store failed (logged).
async fn load(store: &dyn Store, until: UnixMillis) -> Option<Loaded> {
    let tasks = match store.due_tasks(until, LOAD_LIMIT).await {
        Ok(t) => t,
        Err(err) => {
            warn!(error = %err, "timing wheel could not load tasks");
            return None;
        }
    };
    let schedules = match store.due_schedules(until, LOAD_LIMIT).await {
        Ok(s) => s,
        Err(err) => {
            warn!(error = %err, "timing wheel could not load schedules");
            return None;
        }
    };
    let mut items = Vec::with_capacity(tasks.len() + schedules.len());
    items.extend(tasks.into_iter().map(|t| (Item::Task(t.id), t.next_at)));
    items.extend(
        schedules
            .into_iter()
            .map(|s| (Item::Schedule(s.id), s.next_fire_at)),
    );
    Some(items)
}

fn delay(now: UnixMillis, at: UnixMillis) -> Duration {
    Duration::from_millis(at.saturating_sub(now).max(0) as u64)
}

#[async_trait]
impl TriggerEngine for WheelEngine {
    fn name(&self) -> &'static str {
        "wheel"
    }

    async fn next_wake(&mut self) {
        loop {
            if self.loading.is_none() && Instant::now() >= self.next_reload {
                self.start_reload();
            }
            let idle = self.loading.is_none();
            let loading = &mut self.loading;
            let loaded = async move {
                match loading {
                    Some(l) => (&mut l.answer).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Changes first: an item the last round handled is removed
                // before its timer can wake a round for nothing.
                biased;
                change = self.tasks.recv() => match change {
                    Ok(c) => self.apply_change(Item::Task(c.task_id), c.next_at),
                    Err(RecvError::Lagged(n)) => {
                        debug!(missed = n, "timing wheel lagged behind task changes; reloading");
                        self.next_reload = Instant::now();
                    }
                    Err(RecvError::Closed) => self.tasks = self.store.subscribe(),
                },
                change = self.schedules.recv() => match change {
                    Ok(c) => self.apply_change(Item::Schedule(c.schedule_id), c.next_fire_at),
                    Err(RecvError::Lagged(n)) => {
                        debug!(missed = n, "timing wheel lagged behind schedule changes; reloading");
                        self.next_reload = Instant::now();
                    }
                    Err(RecvError::Closed) => self.schedules = self.store.subscribe_schedules(),
                },
                Some(expired) = self.queue.next(), if !self.queue.is_empty() => {
                    let item = expired.into_inner();
                    let Some((_, at)) = self.keys.remove(&item) else { continue };
                    let now = self.clock.now_millis();
                    if at > now {
                        // The timer ran ahead of the clock: wait the rest.
                        let key = self.queue.insert(item.clone(), delay(now, at));
                        self.keys.insert(item, (key, at));
                        continue;
                    }
                    // One round handles everything due: drop the other
                    // entries that are already due too. A load in flight
                    // read them before they fired: it must not bring them
                    // back (their round's change will, if they fire again).
                    self.touch(&item);
                    while let Some(Some(more)) = self.queue.next().now_or_never() {
                        self.keys.remove(more.get_ref());
                        self.touch(more.get_ref());
                    }
                    return;
                }
                answer = loaded => {
                    let answer = answer.unwrap_or_else(|_| {
                        warn!("timing wheel load ended without an answer (its task failed)");
                        None
                    });
                    if let Some(loading) = self.loading.take() {
                        self.take_load(answer, &loading.touched);
                    }
                }
                _ = tokio::time::sleep_until(self.next_reload), if idle => {}
            }
        }
    }
}
