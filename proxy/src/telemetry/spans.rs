//! The spans of a request and the W3C trace context around them.
//!
//! One `request` span per generation request, opened where the request is handled
//! (`routes::generate`), its parent the client's `traceparent` when it sent one. Its
//! children: the admission wait, each upstream attempt (whose context goes upstream as
//! `traceparent`, so an engine that traces joins the trace under it), each continuation
//! leg and each hook directive. Phase boundaries are events on the request span (think
//! start, think end, first visible token), never one per chunk.
//!
//! Spans are `tracing` spans of target [`TARGET`], turned into OpenTelemetry spans by
//! `tracing-opentelemetry`; GenAI semantic-convention names where one exists, Meridian's
//! own (`meridian.*`) beside them. While tracing is off every constructor here returns
//! `Span::none()`, which costs nothing, and the client's `traceparent` goes upstream as
//! it came.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of Meridian's trace spans and span events; logs leave it out.
pub const TARGET: &str = "meridian_otel";

static ON: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (set once the OTLP layer is installed).
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

pub(super) fn set_on() {
    ON.store(true, Ordering::Relaxed);
}

/// The W3C trace-context headers.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}

/// The span of one generation request (`route`: `chat_completions` or `completions`),
/// child of the client's trace context when its headers carry one.
pub fn request_span(route: &'static str, path: &str, client: &HeaderMap) -> Span {
    if !on() {
        return Span::none();
    }
    let operation = operation(route);
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = operation,
        otel.kind = "server",
        otel.status_code = Empty,
        "error.type" = Empty,
        gen_ai.operation.name = operation,
        gen_ai.request.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.reasoning.output_tokens = Empty,
        http.request.method = "POST",
        http.route = path,
        http.response.status_code = Empty,
        meridian.request_id = Empty,
        meridian.stream_id = Empty,
        meridian.family = Empty,
        meridian.upstream = Empty,
        meridian.think_budget_tokens = Empty,
        meridian.outcome = Empty,
        meridian.think_tokens = Empty,
        meridian.ttft_ms = Empty,
        meridian.ttfo_ms = Empty,
        meridian.ttot_ms = Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(client));
    // Only fails once the span has started, which it has not.
    let _ = span.set_parent(parent);
    span
}

/// The GenAI operation name of a route.
fn operation(route: &str) -> &'static str {
    match route {
        "chat_completions" => "chat",
        _ => "text_completion",
    }
}

/// Names the request span after its model, as the GenAI conventions do.
pub fn name_request(span: &Span, route: &str, model: &str) {
    if span.is_none() {
        return;
    }
    // The span started when the request was first polled, and `otel.name` only names
    // spans not started yet: rename the OpenTelemetry span itself.
    span.context().span().update_name(format!("{} {model}", operation(route)));
    span.record("gen_ai.request.model", model);
}

/// The wait in the admission queue, under the request span.
pub fn admission_span(parent: &Span, class: &'static str) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "admission",
        otel.name = "admission wait",
        meridian.admission.class = class,
        meridian.outcome = Empty,
        otel.status_code = Empty,
    )
}

/// One attempt to send the request upstream (attempt 0 is the first).
pub fn attempt_span(parent: &Span, attempt: u32, upstream: &str, url: &str) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "attempt",
        otel.name = "upstream attempt",
        otel.kind = "client",
        otel.status_code = Empty,
        "error.type" = Empty,
        url.full = url,
        http.request.method = "POST",
        http.response.status_code = Empty,
        meridian.attempt = i64::from(attempt),
        meridian.upstream = upstream,
        meridian.via_hook = Empty,
    )
}

/// The continuation that follows a cut (leg 2; leg 1 is the attempt that was cut).
pub fn leg_span(parent: &Span, reason: &'static str, upstream: &str) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "continuation_leg",
        otel.name = "continuation leg",
        otel.kind = "client",
        otel.status_code = Empty,
        meridian.continuation.leg = 2i64,
        meridian.continuation.reason = reason,
        meridian.upstream = upstream,
        http.response.status_code = Empty,
    )
}

/// One directive sent to an engine's hook.
pub fn directive_span(parent: &Span, action: &'static str, addr: &str) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "hook_directive",
        otel.name = format!("hook {action}"),
        otel.kind = "client",
        otel.status_code = Empty,
        meridian.hook.action = action,
        meridian.hook.addr = addr,
    )
}

/// Marks a span failed, with the outcome Meridian counts it under.
pub fn fail(span: &Span, error_type: &str) {
    if span.is_none() {
        return;
    }
    span.record("otel.status_code", "error");
    span.record("error.type", error_type);
}

/// Marks `span` as ending now. The bridge ends a span at the last time it was exited,
/// not when it is dropped, and the spans that outlive their handler (the request, the
/// attempt serving the response) are not entered while the response streams.
pub fn end_now(span: &Span) {
    if !span.is_none() {
        drop(span.enter());
    }
}

/// Puts `span`'s context in `headers` as `traceparent` (and `tracestate`), replacing the
/// client's: the upstream's own spans become children of `span`. A `Span::none()` leaves
/// the headers alone, so with tracing off the client's context passes through unchanged.
pub fn inject(span: &Span, headers: &mut HeaderMap) {
    if span.is_none() {
        return;
    }
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeadersMut(headers));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_none_and_headers_untouched_while_tracing_is_off() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let span = request_span("chat_completions", "/v1/chat/completions", &h);
        assert!(span.is_none());
        assert!(attempt_span(&span, 0, "u", "http://u/v1/chat/completions").is_none());
        inject(&span, &mut h);
        assert_eq!(h[TRACEPARENT], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    }

    #[test]
    fn client_context_is_read_from_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let cx = TraceContextPropagator::new().extract(&Headers(&h));
        let sc = cx.span().span_context().clone();
        assert_eq!(sc.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
        assert!(sc.is_remote() && sc.is_sampled());
    }
}
