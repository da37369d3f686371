//! Quotas and rates per namespace, so one tenant (or one runaway client)
//! cannot take what the others need: a request rate (a token bucket per
//! namespace, GCRA by `governor`), the READY backlog, schedules and how
//! often they may fire, open watches, and workers. What is refused is
//! RESOURCE_EXHAUSTED naming the limit (REST 429); a refused rate says when
//! to retry in the `retry-after-ms` metadata, which the gateway turns into
//! `Retry-After`. Every limit is per namespace and the same for each; 0
//! turns one off.
//!
//! The READY backlog is checked against a count refreshed from the store
//! with the gauges (every couple of seconds) plus what this node accepted
//! since, so replicas may overshoot by what they accept in that interval;
//! the other counts are exact on one node (watches and workers are per
//! node, as their streams are).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::error::Error;

/// The per-namespace limits (0: no limit).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaOptions {
    /// Requests per second to `TaskApi` and `Admin` (workers' own calls
    /// are not counted: their capacity bounds them).
    pub rate_per_sec: u32,
    /// Requests allowed at once above the rate.
    pub burst: u32,
    /// READY tasks waiting for a worker.
    pub max_ready_tasks: u64,
    /// Schedules.
    pub max_schedules: u64,
    /// Shortest time between two fires of a schedule.
    pub min_schedule_interval: Duration,
    /// Open `WatchTask` streams (and their SSE form) on this node.
    pub max_watches: u32,
    /// Worker sessions on this node.
    pub max_workers: u32,
    /// Handlers one worker registration may name.
    pub max_handlers_per_worker: usize,
}

impl Default for QuotaOptions {
    fn default() -> Self {
        Self {
            rate_per_sec: 5_000,
            burst: 10_000,
            max_ready_tasks: 1_000_000,
            max_schedules: 10_000,
            min_schedule_interval: Duration::from_secs(1),
            max_watches: 1_000,
            max_workers: 1_000,
            max_handlers_per_worker: 256,
        }
    }
}

impl QuotaOptions {
    /// No limits at all (benchmarks).
    pub fn unlimited() -> Self {
        Self {
            rate_per_sec: 0,
            burst: 0,
            max_ready_tasks: 0,
            max_schedules: 0,
            min_schedule_interval: Duration::ZERO,
            max_watches: 0,
            max_workers: 0,
            max_handlers_per_worker: 0,
        }
    }
}

/// The quotas of this node.
pub struct Quotas {
    opts: QuotaOptions,
    rate: Option<DefaultKeyedRateLimiter<String>>,
    /// READY backlog per namespace: the last count read, plus what was
    /// accepted since.
    ready: Mutex<Backlog>,
    watches: Arc<Mutex<HashMap<String, u32>>>,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas").field("opts", &self.opts).finish()
    }
}

#[derive(Default)]
struct Backlog {
    /// The estimate per namespace.
    estimate: HashMap<String, u64>,
    /// Tasks admitted here, ever, per namespace.
    admitted: HashMap<String, u64>,
    /// Of those, the ones whose write has finished (committed or refused).
    settled: HashMap<String, u64>,
}

/// What had settled when a count of the store began.
pub struct BacklogMark(HashMap<String, u64>);

/// An open watch's place, given back on drop.
pub struct WatchSlot {
    namespace: String,
    watches: Arc<Mutex<HashMap<String, u32>>>,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut w = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = w.get_mut(&self.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                w.remove(&self.namespace);
            }
        }
    }
}

/// Adds `n` to `namespace`'s count, allocating its name only the first
/// time (this runs on every submit).
fn add(counts: &mut HashMap<String, u64>, namespace: &str, n: u64) {
    match counts.get_mut(namespace) {
        Some(c) => *c += n,
        None => {
            counts.insert(namespace.to_string(), n);
        }
    }
}

fn exhausted(message: String) -> Error {
    Error::ResourceExhausted {
        message,
        retry_after: None,
    }
}

impl Quotas {
    /// Quotas with `opts`.
    pub fn new(opts: QuotaOptions) -> Self {
        let rate = NonZeroU32::new(opts.rate_per_sec).map(|per_sec| {
            let burst = NonZeroU32::new(opts.burst.max(opts.rate_per_sec)).unwrap_or(per_sec);
            DefaultKeyedRateLimiter::keyed(Quota::per_second(per_sec).allow_burst(burst))
        });
        Self {
            opts,
            rate,
            ready: Mutex::default(),
            watches: Arc::default(),
        }
    }

    /// The limits.
    pub fn options(&self) -> &QuotaOptions {
        &self.opts
    }

    /// Takes one request of `namespace` from its bucket.
    pub fn request(&self, namespace: &str) -> Result<(), Error> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        // The limiter is keyed by owned names: one small allocation per
        // request (governor looks keys up by `&K` only).
        match rate.check_key(&namespace.to_string()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                let wait = wait.max(Duration::from_millis(1));
                Err(Error::ResourceExhausted {
                    message: format!(
                        "namespace {namespace:?} is over its request rate of {}/s (burst {}); retry in {} ms",
                        self.opts.rate_per_sec,
                        self.opts.burst.max(self.opts.rate_per_sec),
                        wait.as_millis()
                    ),
                    retry_after: Some(wait),
                })
            }
        }
    }

    /// Checks that `n` more READY tasks fit `namespace`'s backlog and
    /// counts them; [`Quotas::settled`] must follow once their write ends.
    pub fn admit_tasks(&self, namespace: &str, n: u64) -> Result<(), Error> {
        let max = self.opts.max_ready_tasks;
        if max == 0 {
            return Ok(());
        }
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let now = ready.estimate.get(namespace).copied().unwrap_or(0);
        if now.saturating_add(n) > max {
            return Err(exhausted(format!(
                "namespace {namespace:?} has {now} tasks waiting for a worker, its limit is {max}; \
                 submit again once workers have taken some"
            )));
        }
        add(&mut ready.estimate, namespace, n);
        add(&mut ready.admitted, namespace, n);
        Ok(())
    }

    /// The write of `n` admitted tasks of `namespace` has ended (whatever
    /// became of them).
    pub fn settled(&self, namespace: &str, n: u64) {
        if self.opts.max_ready_tasks == 0 {
            return;
        }
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        add(&mut ready.settled, namespace, n);
    }

    /// Taken right before the store's READY counts are read: what had
    /// settled then is in the count.
    pub fn backlog_mark(&self) -> BacklogMark {
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        BacklogMark(ready.settled.clone())
    }

    /// The READY counts per namespace read from the store after `mark`:
    /// the estimate becomes them plus what was admitted here and had not
    /// settled at the mark (a write that ended during the read may be
    /// counted twice: the estimate may run high by that, never low).
    pub fn refresh_ready(&self, mark: BacklogMark, mut counts: HashMap<String, u64>) {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        for (namespace, admitted) in &ready.admitted {
            let settled = mark.0.get(namespace).copied().unwrap_or(0);
            let open = admitted.saturating_sub(settled);
            if open > 0 {
                *counts.entry(namespace.clone()).or_insert(0) += open;
            }
        }
        ready.estimate = counts;
    }

    /// True when a namespace's schedules are counted (a limit is set).
    pub fn limits_schedules(&self) -> bool {
        self.opts.max_schedules > 0
    }

    /// Checks that `namespace`, holding `existing` schedules, may have
    /// one more.
    pub fn admit_schedule(&self, namespace: &str, existing: u64) -> Result<(), Error> {
        let max = self.opts.max_schedules;
        if max > 0 && existing >= max {
            return Err(exhausted(format!(
                "namespace {namespace:?} has {existing} schedules, its limit is {max}"
            )));
        }
        Ok(())
    }

    /// Checks the time between two fires of a schedule.
    pub fn schedule_interval(&self, interval: Duration) -> Result<(), Error> {
        let min = self.opts.min_schedule_interval;
        if interval < min {
            return Err(Error::InvalidArgument(format!(
                "the schedule would fire every {} ms; the shortest interval allowed is {} ms",
                interval.as_millis(),
                min.as_millis()
            )));
        }
        Ok(())
    }

    /// A place for one more open watch of `namespace`.
    pub fn watch(&self, namespace: &str) -> Result<WatchSlot, Error> {
        let max = self.opts.max_watches;
        let mut w = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        let n = w.entry(namespace.to_string()).or_insert(0);
        if max > 0 && *n >= max {
            return Err(exhausted(format!(
                "namespace {namespace:?} has {n} open watches on this server, its limit is {max}; \
                 close one first"
            )));
        }
        *n += 1;
        Ok(WatchSlot {
            namespace: namespace.to_string(),
            watches: self.watches.clone(),
        })
    }

    /// Checks a worker registration: its handlers, and `namespace`'s
    /// `sessions` on this node.
    pub fn admit_worker(
        &self,
        namespace: &str,
        handlers: usize,
        sessions: usize,
    ) -> Result<(), Error> {
        let max = self.opts.max_handlers_per_worker;
        if max > 0 && handlers > max {
            return Err(Error::InvalidArgument(format!(
                "registration.handlers names {handlers} handlers; at most {max} are allowed"
            )));
        }
        let max = self.opts.max_workers as usize;
        if max > 0 && sessions >= max {
            return Err(exhausted(format!(
                "namespace {namespace:?} has {sessions} workers on this server, its limit is {max}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> QuotaOptions {
        QuotaOptions {
            rate_per_sec: 10,
            burst: 10,
            max_ready_tasks: 5,
            max_schedules: 2,
            min_schedule_interval: Duration::from_secs(1),
            max_watches: 2,
            max_workers: 1,
            max_handlers_per_worker: 3,
        }
    }

    #[test]
    fn the_rate_is_per_namespace_and_says_when_to_retry() {
        let q = Quotas::new(opts());
        for _ in 0..10 {
            q.request("a").unwrap();
        }
        match q.request("a") {
            Err(Error::ResourceExhausted {
                message,
                retry_after: Some(wait),
            }) => {
                assert!(message.contains("10/s"), "{message}");
                assert!(
                    wait > Duration::ZERO && wait <= Duration::from_millis(100),
                    "{wait:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        q.request("b")
            .expect("another namespace has its own bucket");
        assert!(Quotas::new(QuotaOptions::unlimited()).request("a").is_ok());
    }

    #[test]
    fn counts_and_places() {
        let q = Quotas::new(opts());
        q.admit_tasks("a", 5).unwrap();
        assert!(q.admit_tasks("a", 1).is_err());
        q.admit_tasks("b", 1).unwrap();
        // a's 5 settled (one is READY, say); b's 1 is still being written.
        q.settled("a", 5);
        let mark = q.backlog_mark();
        q.refresh_ready(mark, HashMap::from([("a".to_string(), 1)]));
        q.admit_tasks("a", 4)
            .expect("the store's count replaces the estimate");
        assert!(q.admit_tasks("a", 1).is_err());
        q.admit_tasks("b", 4)
            .expect("b: 1 not yet written, room for 4 more");
        assert!(q.admit_tasks("b", 1).is_err());
        assert!(q.admit_schedule("a", 1).is_ok() && q.admit_schedule("a", 2).is_err());
        assert!(q.schedule_interval(Duration::from_millis(999)).is_err());
        assert!(q.schedule_interval(Duration::from_secs(1)).is_ok());
        let w1 = q.watch("a").unwrap();
        let _w2 = q.watch("a").unwrap();
        assert!(q.watch("a").is_err());
        drop(w1);
        q.watch("a").expect("a place came back");
        assert!(q.admit_worker("a", 3, 0).is_ok());
        assert!(matches!(
            q.admit_worker("a", 4, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            q.admit_worker("a", 1, 1),
            Err(Error::ResourceExhausted { .. })
        ));
    }
}
