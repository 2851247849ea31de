//! JSON log lines that carry the trace: one object per event, its fields flattened beside
//! `timestamp`, `level` and `message` (the shape `tracing-subscriber`'s flattened JSON
//! has), plus `trace_id` and `span_id` of the innermost exported span the event happened
//! in, so a log pipeline can join a line to its trace.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format of `telemetry.log_format = "json"`.
pub struct JsonWithTrace;

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), Value::from(format!("{value:?}")));
    }
}

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::from(timestamp));
        line.insert("level".into(), Value::from(event.metadata().level().as_str()));
        event.record(&mut Fields(&mut line));
        // The innermost span of the event's scope that has an OpenTelemetry context.
        let ids = ctx.event_scope().and_then(|scope| {
            scope.into_iter().find_map(|span| {
                let ext = span.extensions();
                let data = ext.get::<OtelData>()?;
                Some((data.trace_id()?, data.span_id()?))
            })
        });
        if let Some((trace_id, span_id)) = ids {
            line.insert("trace_id".into(), Value::from(trace_id.to_string()));
            line.insert("span_id".into(), Value::from(span_id.to_string()));
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::filter::{EnvFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::{Layer, fmt};

    use super::JsonWithTrace;
    use crate::telemetry::spans::TARGET;
    use crate::telemetry::tracing_layer::{json_log_filter, log_filter};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap().lines().map(str::to_owned).collect()
        }
    }

    /// Logs `inside` within a trace span, `outside` after it, and a span event; returns
    /// the log lines and the span's (trace id, span id).
    fn run(json: bool) -> (Vec<String>, String, String) {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let otel = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
        let buf = Buf::default();
        let out = buf.clone();
        let logs = fmt::layer().with_target(false).with_ansi(false).with_writer(move || out.clone());
        let logs = match json {
            true => {
                logs.event_format(JsonWithTrace).with_filter(json_log_filter(EnvFilter::new("info"))).boxed()
            }
            false => logs.with_filter(log_filter(EnvFilter::new("info"))).boxed(),
        };
        let subscriber = tracing_subscriber::registry().with(logs).with(otel);
        let (trace_id, span_id) = tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(target: TARGET, "request", meridian.request_id = "r1");
            let cx = span.context();
            {
                let _in = span.enter();
                tracing::info!(answer = 42u64, "inside");
            }
            tracing::event!(target: TARGET, parent: &span, tracing::Level::INFO, "think_start");
            tracing::info!("outside");
            let sc = cx.span().span_context().clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        (buf.lines(), trace_id, span_id)
    }

    #[test]
    fn json_lines_inside_a_trace_span_carry_its_ids_and_others_none() {
        let (lines, trace_id, span_id) = run(true);
        assert_eq!(lines.len(), 2, "two log lines, the span event not among them: {lines:?}");
        let inside: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(inside["message"], "inside");
        assert_eq!(inside["answer"], 42);
        assert_eq!(inside["level"], "INFO");
        assert_eq!(inside["trace_id"], trace_id.as_str());
        assert_eq!(inside["span_id"], span_id.as_str());
        assert_ne!(trace_id, opentelemetry::TraceId::INVALID.to_string());
        let outside: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(outside["message"], "outside");
        assert!(outside.get("trace_id").is_none(), "{outside}");
    }

    #[test]
    fn text_lines_are_unchanged_by_trace_spans() {
        let (lines, _, _) = run(false);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].ends_with("inside answer=42"), "no span prefix: {}", lines[0]);
        assert!(!lines.iter().any(|l| l.contains("request") || l.contains("think_start")), "{lines:?}");
    }
}
