//! Logs, metrics and traces (`[telemetry]`, `[telemetry.tracing]`): fields, defaults and checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use meridian_core::config::Checker;

/// Logs and metrics.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `trace` … `error` or a tracing directive (`meridian_proxy=debug,info`). `RUST_LOG` wins
    /// when set.
    #[schemars(length(min = 1), extend("x-kind" = "filter"))]
    pub log_level: String,
    /// `json` for log pipelines (the chart's default). With `telemetry.tracing.enabled`, each
    /// JSON line logged inside a request carries `trace_id` and `span_id`, the ids of that
    /// request's exported span, so logs and traces join. `text` has colours only when stdout is
    /// a terminal and `NO_COLOR` is unset or empty; a file, a pipe or a container log gets
    /// plain text.
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
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Export traces over OTLP (see [Observability](observability.md)): one span per generation
    /// request, children for the admission wait, each upstream attempt, each continuation leg
    /// and each hook directive, events at think start, think end and first visible token.
    /// Unset: on when `OTEL_TRACES_EXPORTER` names `otlp` (set explicitly, as for any other
    /// OpenTelemetry service), otherwise off; `false` keeps it off whatever the variables say.
    /// Off, no exporter is built and no span is made. `OTEL_SDK_DISABLED=true` turns it off in
    /// any case.
    pub enabled: Option<bool>,
    /// The OTLP collector, named as `OTEL_EXPORTER_OTLP_ENDPOINT` names it: over HTTP
    /// `/v1/traces` is added unless the URL ends with it. Unset:
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (as is), then `OTEL_EXPORTER_OTLP_ENDPOINT`, then
    /// `http://localhost:4317` (gRPC) or `http://localhost:4318/v1/traces` (HTTP). Headers
    /// (auth) come from `OTEL_EXPORTER_OTLP_HEADERS`.
    #[schemars(regex(pattern = r"^https?://"), extend("x-kind" = "URL", "x-range" = "`http://` or `https://`"))]
    pub endpoint: Option<String>,
    /// The OTLP transport. Unset: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, then `grpc`. `http/json` is not supported.
    #[schemars(extend("enum" = ["grpc", "http/protobuf"]))]
    pub protocol: Option<String>,
    /// Share of new traces kept (parent-based: a client's `traceparent` sampled flag is
    /// followed either way). Unset: `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, then
    /// every trace.
    #[schemars(range(min = 0, max = 1))]
    pub sample_ratio: Option<f64>,
    /// `service.name` of the exported spans. Unset: `OTEL_SERVICE_NAME`, then `meridian`.
    /// `OTEL_RESOURCE_ATTRIBUTES` adds resource attributes.
    #[schemars(length(min = 1))]
    pub service_name: Option<String>,
}

/// The OTLP transports `telemetry.tracing.protocol` names.
pub const TRACING_PROTOCOLS: [&str; 2] = ["grpc", "http/protobuf"];

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
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
