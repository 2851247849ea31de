use meridian_core::config::{LogFormat, TelemetryConfig};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use super::tracing_layer::{self, TraceGuard};

/// Installs the global tracing subscriber: logs, and spans over OTLP when
/// `telemetry.tracing` is on. `RUST_LOG`, when set, wins over the config. Keep the guard
/// until exit: dropping it flushes the spans still queued.
pub fn init_logging(cfg: &TelemetryConfig) -> Result<TraceGuard, String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v),
        _ => EnvFilter::try_new(&cfg.log_level),
    }
    .map_err(|e| format!("telemetry.log_level is not a valid filter: {e}"))?;
    let (traces, guard) = tracing_layer::start(&cfg.tracing).map_err(|e| e.to_string())?;
    let builder = tracing_subscriber::fmt::layer().with_target(false);
    let logs = match cfg.log_format {
        LogFormat::Text => builder.with_filter(tracing_layer::log_filter(filter)).boxed(),
        LogFormat::Json => builder
            .event_format(super::json_log::JsonWithTrace)
            .with_filter(tracing_layer::json_log_filter(filter))
            .boxed(),
    };
    tracing_subscriber::registry().with(logs).with(traces).try_init().map_err(|e| e.to_string())?;
    Ok(guard)
}
