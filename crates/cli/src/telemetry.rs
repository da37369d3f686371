//! The process's telemetry: the Prometheus recorder behind `GET /metrics`.
//!
//! One recorder per process (the `metrics` facade has one global slot),
//! installed by the first node started; later nodes in the same process
//! (tests, benchmarks) share it. Histograms ending in `_seconds` get fixed
//! buckets so Prometheus can aggregate them across replicas; gauges nobody
//! sets for a minute (a worker that left) are dropped.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

/// Bucket bounds of every `*_seconds` histogram: 0.5 ms to 60 s.
pub const SECONDS_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus handle, installing the recorder on first use.
/// `None` when another recorder was installed first (by an embedding
/// program): then `/metrics` says so instead of rendering nothing.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(60)));
            let builder = match builder
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            {
                Ok(b) => b,
                Err(err) => {
                    tracing::warn!(error = %err, "histogram buckets refused; metrics disabled");
                    return None;
                }
            };
            match builder.install_recorder() {
                Ok(handle) => Some(handle),
                Err(err) => {
                    tracing::warn!(error = %err, "a metrics recorder is already installed; /metrics disabled");
                    None
                }
            }
        })
        .as_ref()
}

/// The exposition text for `GET /metrics`.
pub fn render() -> Option<String> {
    let handle = prometheus()?;
    handle.run_upkeep();
    Some(handle.render())
}
