//! Wires the trace pipeline into the `tracing` subscriber: the OpenTelemetry layer sees
//! only Meridian's trace spans and events (target [`TARGET`]), and the log layers leave
//! those out, so turning traces on changes no log line except the ids JSON lines gain.

use crate::config::TracingConfig;
use tracing::Subscriber;
use tracing_subscriber::filter::{EnvFilter, FilterExt, Targets, filter_fn};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, layer::Filter};

use super::otel::{TracePipeline, TracingError};
use super::spans::{self, TARGET};

/// Keeps the trace pipeline for as long as the proxy runs.
pub struct TraceGuard(Option<TracePipeline>);

impl TraceGuard {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.0.is_some()
    }

    /// Flushes the spans still queued and stops the exporter, for at most
    /// [`FLUSH_LIMIT`]: a collector that hangs must not hold the process past its
    /// drain. The flush blocks (and gRPC's channel needs the runtime meanwhile), so it
    /// runs on a thread of its own, which exiting abandons if it overruns; a blocking
    /// task would not do, the runtime waits for those when it stops.
    pub async fn shutdown(self) {
        let Some(p) = self.0 else { return };
        let (done, flushed) = tokio::sync::oneshot::channel();
        let flush = std::thread::Builder::new().name("trace-flush".into()).spawn(move || {
            p.shutdown();
            let _ = done.send(());
        });
        if let Err(e) = flush {
            tracing::warn!(error = %e, "cannot flush the last spans: no thread for it");
            return;
        }
        if tokio::time::timeout(FLUSH_LIMIT, flushed).await.is_err() {
            tracing::warn!(
                limit_s = FLUSH_LIMIT.as_secs(),
                "the trace collector did not take the last spans in time; exiting without them"
            );
        }
    }
}

/// The longest the proxy waits at exit for its last spans to be exported.
pub const FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

type BoxedLayer<S> = Box<dyn Layer<S> + Send + Sync>;

/// The OpenTelemetry layer when `cfg` turns tracing on (else `None`), and its guard.
pub fn start<S>(cfg: &TracingConfig) -> Result<(Option<BoxedLayer<S>>, TraceGuard), TracingError>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let Some(pipeline) = TracePipeline::start(cfg)? else {
        return Ok((None, TraceGuard(None)));
    };
    let layer = tracing_opentelemetry::layer()
        .with_tracer(pipeline.tracer.clone())
        // No code locations, thread names or levels on every span: the attributes are
        // the ones Meridian sets.
        .with_location(false)
        .with_threads(false)
        .with_level(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
    spans::set_on();
    Ok((Some(Box::new(layer)), TraceGuard(Some(pipeline))))
}

/// Text logs: the operator's filter, without the trace spans and their events.
pub(super) fn log_filter(filter: EnvFilter) -> EnvFilter {
    match format!("{TARGET}=off").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// JSON logs: as text logs, but the trace spans stay visible to the formatter (never
/// printed themselves), which takes each line's trace and span ids from them.
pub(super) fn json_log_filter<S>(filter: EnvFilter) -> impl Filter<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    log_filter(filter).or(filter_fn(|meta| meta.is_span() && meta.target() == TARGET))
}
