//! W3C trace context on the worker side: the assignment's `trace_context`
//! (the server's `dispatch` span) becomes the parent of the span the handler
//! runs in, so the handler's work joins the task's trace (submit → dispatch
//! → run → complete). Works with any OpenTelemetry layer the worker's
//! program installs; without one it costs nothing.
//!
//! (The server has the same few lines; the SDK depends on the contract
//! alone, never on server crates.)

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The context `traceparent` names, if it is a valid W3C traceparent.
pub(crate) fn context_of(traceparent: &str) -> Option<opentelemetry::Context> {
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
pub(crate) fn continue_from(span: &Span, traceparent: &str) {
    if let Some(cx) = context_of(traceparent) {
        let _ = span.set_parent(cx);
    }
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
}
