//! The gauges refreshed on a timer rather than on events: READY tasks per
//! handler (from the store), worker streams connected to this node and the
//! tasks in flight on each.
//!
//! A handler or worker that disappears is set to 0 once, then no longer
//! touched; the exporter forgets gauges nobody sets (its idle timeout).

use std::collections::HashSet;
use std::time::Duration;

use taskmesh_scheduler::meters;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::engine::Shared;

/// What the last refresh set: gauges that disappear are set to 0 once.
#[derive(Debug, Default)]
pub struct Seen {
    /// (namespace, handler) pairs with a queue-depth gauge.
    pub handlers: HashSet<(String, String)>,
    /// Workers with an in-flight gauge.
    pub workers: HashSet<String>,
}

/// Refreshes the gauges every `every` until `shutdown`, the first time
/// `every` from now (the caller ran the first refresh).
pub async fn run(shared: Shared, every: Duration, mut seen: Seen, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        refresh(&shared, &mut seen).await;
    }
}

/// One refresh (also run by tests before they scrape).
pub async fn refresh(shared: &Shared, seen: &mut Seen) {
    let mark = shared.quotas.backlog_mark();
    // Bounded: a store call on a connection the network silently cut waits
    // for TCP to give up (minutes), and the worker gauges below must not
    // wait with it.
    let limit = shared
        .opts
        .gauge_interval
        .max(std::time::Duration::from_millis(100));
    let counts = match tokio::time::timeout(limit, shared.store.ready_counts()).await {
        Ok(counts) => counts,
        Err(_) => Err(taskmesh_store::Error::Unavailable(format!(
            "no answer within {} ms",
            limit.as_millis()
        ))),
    };
    match counts {
        Ok(counts) => {
            // Pairs past the label cap add up under `other`.
            let mut depth = std::collections::HashMap::<(String, String), u64>::new();
            let mut per_namespace = std::collections::HashMap::<String, u64>::new();
            for (ns, h, n) in counts {
                *depth.entry(meters::labels(&ns, &h)).or_default() += n;
                *per_namespace.entry(ns).or_default() += n;
            }
            // The backlog quota starts again from the store's count.
            shared.quotas.refresh_ready(mark, per_namespace);
            let now: HashSet<(String, String)> = depth.keys().cloned().collect();
            for (ns, h) in seen.handlers.difference(&now) {
                metrics::gauge!(meters::QUEUE_DEPTH, "namespace" => ns.clone(), "handler" => h.clone())
                    .set(0.0);
            }
            for ((ns, handler), n) in depth {
                metrics::gauge!(meters::QUEUE_DEPTH, "namespace" => ns, "handler" => handler)
                    .set(n as f64);
            }
            seen.handlers = now;
        }
        Err(err) => debug!(error = %err, "queue depth not refreshed"),
    }
    let snapshot = shared.registry.snapshot(shared.coord.node_id(), None);
    metrics::gauge!(meters::WORKERS_CONNECTED).set(snapshot.len() as f64);
    let mut active = std::collections::HashMap::<String, u32>::new();
    for w in &snapshot {
        *active
            .entry(meters::namespace_label(&w.namespace))
            .or_default() += w.active;
    }
    let now: HashSet<String> = active.keys().cloned().collect();
    for gone in seen.workers.difference(&now) {
        metrics::gauge!(meters::WORKER_ACTIVE, "namespace" => gone.clone()).set(0.0);
    }
    for (ns, n) in active {
        metrics::gauge!(meters::WORKER_ACTIVE, "namespace" => ns).set(f64::from(n));
    }
    seen.workers = now;
}
