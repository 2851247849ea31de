//! Logs, metrics and traces (`[telemetry]`, `[telemetry.tracing]`): fields, defaults and checks.

use serde::Deserialize;

use super::validate::Checker;

/// Logs and metrics.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `trace`, `debug`, `info`, `warn` or `error` (a tracing filter directive also works).
    pub log_level: String,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// Traces over OTLP.
    pub tracing: TracingConfig,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            log_level: "info".into(),
            log_format: LogFormat::Text,
            tracing: TracingConfig::default(),
        }
    }
}

/// Traces over OTLP. Off by default; when on, every unset field falls back to the
/// standard `OTEL_*` environment variable, then to the OpenTelemetry default, so a
/// deployment that already sets those for its other services needs nothing here.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Export spans. Unset: on when `OTEL_TRACES_EXPORTER` names `otlp` (an explicit
    /// choice, which other OpenTelemetry services honour too), otherwise off.
    /// `OTEL_SDK_DISABLED=true` turns it off in any case.
    pub enabled: Option<bool>,
    /// Collector URL. Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, then
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, then `http://localhost:4317` (gRPC) or
    /// `http://localhost:4318/v1/traces` (HTTP).
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf`. Unset: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, then `grpc`.
    pub protocol: Option<String>,
    /// Share of new traces kept, 0 to 1 (a client's sampled flag is followed). Unset:
    /// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, then every trace.
    pub sample_ratio: Option<f64>,
    /// `service.name` of the spans. Unset: `OTEL_SERVICE_NAME`, then `meridian`.
    pub service_name: Option<String>,
}

/// The OTLP transports `telemetry.tracing.protocol` names.
pub const TRACING_PROTOCOLS: [&str; 2] = ["grpc", "http/protobuf"];

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl TelemetryConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        if self.log_level.trim().is_empty() {
            c.fail("telemetry.log_level", "must not be empty");
        }
        let tr = &self.tracing;
        if let Some(p) = &tr.protocol {
            if !TRACING_PROTOCOLS.contains(&p.as_str()) {
                c.fail(
                    "telemetry.tracing.protocol",
                    format!("must be one of {:?}; got {p:?}", TRACING_PROTOCOLS),
                );
            }
        }
        if let Some(r) = tr.sample_ratio {
            if !(0.0..=1.0).contains(&r) {
                c.fail("telemetry.tracing.sample_ratio", format!("must be in [0, 1]; got {r}"));
            }
        }
        if let Some(e) = &tr.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                c.fail(
                    "telemetry.tracing.endpoint",
                    format!("must be an http:// or https:// URL; got {e:?}"),
                );
            }
        }
        if tr.service_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            c.fail("telemetry.tracing.service_name", "must not be empty when set");
        }
    }
}
