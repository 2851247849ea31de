use meridian_core::config::{LogFormat, TelemetryConfig};
use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber. `RUST_LOG`, when set, wins over the config.
pub fn init_logging(cfg: &TelemetryConfig) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v),
        _ => EnvFilter::try_new(&cfg.log_level),
    }
    .map_err(|e| format!("telemetry.log_level is not a valid filter: {e}"))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let result = match cfg.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| e.to_string())
}
