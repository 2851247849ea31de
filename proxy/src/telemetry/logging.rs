use std::io::IsTerminal;

use crate::config::{LogFormat, TelemetryConfig};
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
    let ansi = use_colour(std::io::stdout().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let builder = tracing_subscriber::fmt::layer().with_target(false).with_ansi(ansi);
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

/// Colour only for a person at a terminal: a file, a pipe or a log collector would keep
/// the escape sequences as text. `NO_COLOR` set to anything but the empty string turns
/// it off there too (https://no-color.org).
fn use_colour(stdout_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stdout_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::use_colour;

    #[test]
    fn colour_only_at_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
    }
}
