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

/// Keeps the trace pipeline alive; flushes and stops it when dropped.
#[must_use = "dropping the guard stops trace export"]
pub struct TracingGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl TracingGuard {
    /// True when spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends every finished span now.
    pub fn flush(&self) {
        if let Some(p) = &self.provider
            && let Err(err) = p.force_flush()
        {
            tracing::warn!(error = %err, "trace flush failed");
        }
    }
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global `tracing` subscriber: log lines to stderr (`filter`
/// in `EnvFilter` syntax, text or JSON) and, when the standard OpenTelemetry
/// variables ask for it (`OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, not `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none`), spans exported over OTLP/gRPC as
/// `service` (unless `OTEL_SERVICE_NAME` names another). Endpoint, headers,
/// timeout, compression and sampler come from the other `OTEL_*` variables,
/// read by the OpenTelemetry SDK itself. Must run inside a Tokio runtime.
pub fn init_tracing(filter: &str, json: bool, service: &str) -> TracingGuard {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let env_filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt: Box<dyn Layer<_> + Send + Sync> = if json {
        Box::new(fmt.json().with_filter(env_filter))
    } else {
        Box::new(fmt.with_filter(env_filter))
    };
    let (provider, problem) = match otlp_provider(service) {
        Ok(p) => (p, None),
        Err(err) => (None, Some(err)),
    };
    // Spans only, and only taskmesh's own (request, dispatch, complete,
    // run): per-task spans sit at debug, so with export off nobody is
    // interested in them and they cost nothing.
    let otel = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("taskmesh"))
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.is_span()
                    && m.target().starts_with("taskmesh")
                    && *m.level() <= tracing::Level::DEBUG
            }))
    });
    // Events a handler emits on its own task (INFO and up) also become
    // lines of its attempt's task log.
    let capture =
        taskmesh_worker::capture_layer().with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .with(capture)
        .try_init();
    if let Some(err) = problem {
        tracing::warn!(error = %err, "OTLP trace export not started");
    }
    TracingGuard { provider }
}

/// The OTLP trace pipeline the environment asks for, if any.
fn otlp_provider(
    service: &str,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    use crate::env;
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let wanted = var(env::OTEL_EXPORTER_OTLP_ENDPOINT).is_some()
        || var(env::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).is_some();
    let disabled = var(env::OTEL_SDK_DISABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var(env::OTEL_TRACES_EXPORTER).is_some_and(|v| v.eq_ignore_ascii_case("none"));
    if !wanted || disabled {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| e.to_string())?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if var(env::OTEL_SERVICE_NAME).is_none() {
        resource = resource.with_service_name(service.to_string());
    }
    Ok(Some(
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    ))
}
