//! `meridian.toml`: the typed configuration shared by the proxy and (later) the hook.
//!
//! Loading is strict: unknown fields are rejected, type errors name the dotted path of
//! the field, and [`MeridianConfig::validate`] reports every out-of-range value at once,
//! so an operator fixes the file in one pass before anything starts.

mod engine_side;
mod load;
mod validate;

use std::collections::BTreeMap;

use serde::Deserialize;

pub use engine_side::{ExitConfig, ExitSignal, HookConfig, OnUnsupportedVllm, PriorityConfig};
pub use load::{ConfigError, Override, load_config, parse_config};
pub use validate::FieldError;

/// The whole `meridian.toml`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MeridianConfig {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub models: ModelsConfig,
    pub telemetry: TelemetryConfig,
    pub twin: TwinConfig,
    pub budget: BudgetConfig,
    pub hook: HookConfig,
    pub exit: ExitConfig,
    pub priority: PriorityConfig,
    pub admission: AdmissionConfig,
    pub admin: AdminConfig,
}

/// The proxy's listener and request limits.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the proxy listens on.
    pub listen: String,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: u64,
    /// Seconds a client gets to send a request's headers (HTTP/1); a slower one is
    /// disconnected.
    pub header_read_timeout_s: f64,
    /// Largest request head (headers and URL) accepted; larger ones get 431.
    pub max_header_bytes: u64,
    /// Seconds a client gets to send its whole request body; a slower one gets 408.
    pub request_body_timeout_s: f64,
    /// Seconds to let open streams finish on shutdown.
    pub shutdown_grace_s: f64,
    /// Longest a streamed response stays silent before the proxy sends an SSE comment
    /// (`: keep-alive`), so intermediaries with idle timeouts keep the connection; a
    /// request still queued or awaiting the upstream's headers this long gets its
    /// response headers early. 0 turns heartbeats off.
    pub sse_heartbeat_s: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 16 * 1024 * 1024,
            header_read_timeout_s: 30.0,
            max_header_bytes: 64 * 1024,
            request_body_timeout_s: 60.0,
            shutdown_grace_s: 30.0,
            sse_heartbeat_s: 15.0,
        }
    }
}

/// The pool of OpenAI-compatible servers behind the proxy.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// The servers. Empty: `meridian serve` refuses to start, unless the embedded engine
    /// twin is asked for (`twin.enabled`), which is then the only upstream.
    pub endpoints: Vec<EndpointConfig>,
    /// Seconds to wait for a TCP connection.
    pub connect_timeout_s: f64,
    /// Seconds an idle pooled connection to an upstream is kept for reuse. Below the
    /// upstream's own keep-alive timeout (vLLM's API server closes idle connections after
    /// 5 s), or a request may go out on a connection the server is closing that instant
    /// and fail with "connection closed before message completed".
    pub pool_idle_timeout_s: f64,
    /// Seconds to wait for the response head. Covers queueing and prefill, which for a
    /// long prompt on a busy engine takes a while.
    pub first_byte_timeout_s: f64,
    /// Longest silence allowed between two chunks of a streaming response.
    pub idle_timeout_s: f64,
    /// Attempts per request, across upstreams, before the first byte reaches the client.
    pub max_attempts: u32,
    /// Largest whole (non-streamed) answer, or single SSE line, taken from an upstream;
    /// beyond it the request fails with `upstream_error` instead of growing memory.
    pub max_response_bytes: u64,
    /// Forward the client's `Authorization` header upstream.
    pub forward_authorization: bool,
    /// Name of an environment variable holding a bearer token to send upstream instead.
    pub api_key_env: Option<String>,
    /// Health check path and cadence.
    pub health_path: String,
    pub health_interval_s: f64,
    /// Consecutive failed checks before an upstream is taken out of rotation.
    pub unhealthy_after: u32,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            endpoints: Vec::new(),
            connect_timeout_s: 5.0,
            pool_idle_timeout_s: 4.0,
            first_byte_timeout_s: 600.0,
            idle_timeout_s: 120.0,
            max_attempts: 2,
            max_response_bytes: 64 * 1024 * 1024,
            forward_authorization: false,
            api_key_env: None,
            health_path: "/health".into(),
            health_interval_s: 5.0,
            unhealthy_after: 2,
        }
    }
}

/// One upstream server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// Base URL, e.g. `http://vllm-0:8000` (no `/v1`).
    pub url: String,
    /// Name used in logs and metric labels; defaults to the URL's host:port.
    pub name: Option<String>,
    /// `host:port` of the Meridian hook's policy channel in this server's engine, if it
    /// runs one (see `[hook]`).
    pub hook: Option<String>,
    /// Served model names this server takes requests for. Unset: learned from its
    /// `GET /v1/models` every health round.
    pub models: Option<Vec<String>>,
}

/// Admission control: new requests wait in the proxy while their upstreams are saturated,
/// and are released highest class first (output-phase starts, interactive, batch).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Off: every request goes upstream at once (vLLM queues it).
    pub enabled: bool,
    /// Requests open through this proxy per upstream at which it counts as saturated.
    pub max_streams: Option<u32>,
    /// Saturated while the engine's `vllm:num_requests_waiting` is above this.
    pub max_waiting: Option<u32>,
    /// Saturated while the engine's `vllm:kv_cache_usage_perc` (0-1) is above this.
    pub max_kv_usage: Option<f64>,
    /// Longest a request waits in the proxy's queue before it gets 503.
    pub queue_timeout_s: f64,
    /// Requests the queue holds; beyond it new ones get 503 at once.
    pub max_queued: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: false,
            max_streams: None,
            max_waiting: None,
            max_kv_usage: None,
            queue_timeout_s: 30.0,
            max_queued: 1024,
        }
    }
}

/// The admin listener: a live list of open streams (`GET /admin/streams`) for operators
/// and `meridian top`, apart from the client-facing listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin listener; unset: off.
    pub listen: Option<String>,
    /// Environment variable holding the bearer token the admin listener requires; with
    /// `listen` set and the variable unset or empty, `meridian serve` refuses to start.
    pub token_env: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { listen: None, token_env: "MERIDIAN_ADMIN_TOKEN".into() }
    }
}

/// Where model family boundaries come from.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Extra `*.toml` family files, added to (or replacing) the built-in ones.
    pub dir: Option<String>,
    /// Served model name → family name, for names no pattern matches.
    pub aliases: BTreeMap<String, String>,
    /// Family for served models that match nothing; unset means phases come only from
    /// `delta.reasoning` for those models.
    pub default_family: Option<String>,
}

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

/// Think budgets the proxy applies.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// How thinking is ended on upstreams without a ready hook.
    pub forcing: Forcing,
    /// Budget for requests that set none; unset: no budget.
    pub think_tokens: Option<u32>,
    /// Per model family, overriding `think_tokens`.
    pub per_family: BTreeMap<String, u32>,
    /// Seconds of thinking for requests that set none: the hook is told to end thinking,
    /// or (without one) the proxy continues the stream past the delimiter.
    pub think_seconds: Option<f64>,
}

/// How the proxy ends thinking on an upstream whose hook is not ready. (With a ready
/// hook, the hook always does it: no second request, no second prefill.)
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Forcing {
    /// Token budgets through vLLM's `thinking_token_budget`; what only the proxy can
    /// enforce (time budgets, entropy exits) by continuation.
    #[default]
    Auto,
    /// vLLM's `thinking_token_budget` alone; time budgets and entropy exits are not
    /// enforced without a hook.
    Engine,
    /// Everything by continuation: the proxy ends the upstream's think stream and
    /// continues it with the reasoning so far plus the end-of-thinking delimiter, for
    /// OpenAI-compatible engines without `thinking_token_budget`.
    Continuation,
}

impl BudgetConfig {
    /// The configured budget for a family (`None` family: an unrecognised model).
    pub fn for_family(&self, family: Option<&str>) -> Option<u32> {
        family.and_then(|f| self.per_family.get(f).copied()).or(self.think_tokens)
    }
}

/// The embedded engine twin, a simulated vLLM: the upstream only when asked for
/// (`enabled`, or `meridian serve --twin`) and no endpoint is configured. Its answers are
/// made up, so it never serves by default: with no upstream and no twin, `meridian
/// serve` refuses to start.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TwinConfig {
    /// Serve simulated answers from the twin (only with no `upstream.endpoints`).
    pub enabled: bool,
    /// Cost-model profile (see loadtest/twin/profiles.toml).
    pub profile: String,
    /// Model name the twin serves.
    pub served_model: String,
    /// Simulated seconds per wall second (1 = real time).
    pub speed: f64,
    /// Seed of the synthetic workload (lengths, entropy).
    pub seed: u64,
    /// Scheduling policy inside the twin (see `meridian_core::sched::POLICY_NAMES`).
    pub policy: String,
    /// Workload file for the twin (relative to the config file); unset: the default mix.
    pub workload: Option<String>,
}

impl Default for TwinConfig {
    fn default() -> Self {
        TwinConfig {
            enabled: false,
            profile: "h100-qwen3-8b".into(),
            served_model: "Qwen/Qwen3-8B".into(),
            speed: 1.0,
            seed: 0,
            policy: "fcfs".into(),
            workload: None,
        }
    }
}
