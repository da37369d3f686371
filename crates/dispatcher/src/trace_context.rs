//! W3C trace context across the hops of a task: the caller's `traceparent`
//! (gRPC metadata) becomes the parent of the request's span; the task stores
//! the context of that span; the push carries the context of its `dispatch`
//! span to the worker; the recording of the result is a child of the stored
//! context again. So one trace shows submit → dispatch → run → complete.
//!
//! With no OpenTelemetry layer installed (no `OTEL_EXPORTER_OTLP_*`), spans
//! have no context to inject, and the caller's own `traceparent` is passed
//! along unchanged: propagation works even when this node exports nothing.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The context `traceparent` names, if it is a valid W3C traceparent.
pub fn context_of(traceparent: &str) -> Option<opentelemetry::Context> {
    if traceparent.is_empty() {
        return None;
    }
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes the span named by `traceparent` the parent of `span` (nothing if
/// it names none).
pub fn continue_from(span: &Span, traceparent: &str) {
    if let Some(cx) = context_of(traceparent) {
        let _ = span.set_parent(cx);
    }
}

/// The `traceparent` of `span`, or `fallback` when the span has no
/// OpenTelemetry context (no exporter installed).
pub fn traceparent_of(span: &Span, fallback: &str) -> String {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return fallback.to_string();
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier
        .remove("traceparent")
        .unwrap_or_else(|| fallback.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_traceparents_give_a_context() {
        assert!(context_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_some());
        assert!(context_of("").is_none());
        assert!(context_of("garbage").is_none());
        assert!(context_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
    }

    #[test]
    fn without_a_layer_the_fallback_passes_through() {
        let span = tracing::info_span!("x");
        assert_eq!(traceparent_of(&span, "given"), "given");
    }
}
