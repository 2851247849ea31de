//! The servers behind the proxy (`[upstream]`, `[[upstream.endpoints]]`): fields, defaults and checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use meridian_core::config::{Checker, is_host_port};
use meridian_core::route::{Role, RoutingKind};

/// The pool of OpenAI-compatible servers behind the proxy.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// The servers. Empty: `meridian serve` refuses to start, unless the embedded engine
    /// twin is asked for (`twin.enabled`), which is then the only upstream.
    pub endpoints: Vec<EndpointConfig>,
    /// TCP connect to an upstream. Keep it short: a refused or slow connect is retried on
    /// another upstream.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub connect_timeout_s: f64,
    /// How long an idle connection to an upstream is kept for reuse. Keep it below the
    /// upstream's keep-alive timeout (vLLM's API server closes idle connections after 5 s,
    /// `--timeout-keep-alive`): a request sent on a connection the server is closing at that
    /// instant fails with `upstream_error` ("connection closed before message completed").
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub pool_idle_timeout_s: f64,
    /// Wait for the response head, which covers queueing and prefill; past it the client gets
    /// 504 and the upstream request is cancelled. Keep it above your longest prefill under peak
    /// load.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub first_byte_timeout_s: f64,
    /// Longest silence between two chunks of a stream before it ends with an error event. A
    /// preempted request can go silent while it is recomputed: keep it well above your worst
    /// preemption stall.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub idle_timeout_s: f64,
    /// Attempts per request across upstreams, counting the first; retries happen only before
    /// any byte reached the client. 2 rides out one engine restarting; more only adds latency
    /// to failures.
    #[schemars(range(min = 1, max = 10))]
    pub max_attempts: u32,
    /// Largest non-streamed answer, or single SSE line, the proxy takes from an upstream; past
    /// it the request fails with `upstream_error` rather than buffering without bound. 64 MiB
    /// holds a long answer with `top_logprobs`; lower it to cap memory per request.
    #[schemars(range(min = 65536))]
    pub max_response_bytes: u64,
    /// Forward the client's `Authorization` header upstream. Off: the proxy is the trust
    /// boundary.
    pub forward_authorization: bool,
    /// Environment variable holding a bearer token sent to the upstreams (vLLM's `--api-key`).
    /// `meridian check` fails when the variable is not set.
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"), extend("x-range" = "names a set variable"))]
    pub api_key_env: Option<String>,
    /// Health check path on every upstream.
    #[schemars(regex(pattern = r"^/"), extend("x-kind" = "path", "x-range" = "starts with `/`"))]
    pub health_path: String,
    /// Health check cadence (each check times out after this or 5 s, whichever is less). Lower
    /// it (1–2 s) to take a dead engine out of rotation sooner.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub health_interval_s: f64,
    /// Consecutive failures (checks and failed requests) before an upstream leaves rotation;
    /// one success brings it back. Raise it if a busy engine's `/health` is occasionally slow.
    #[schemars(range(min = 1, max = 100))]
    pub unhealthy_after: u32,
    /// Which engine a new request goes to, among the healthy ones serving its model:
    /// `phase-aware` (fewest answering streams, then the emptiest KV cache, then fewest in
    /// flight), `prefix-affinity` (requests carrying the same `affinity_header` to the same
    /// engine, whose prefix cache holds their conversation, within `affinity_load_bound`;
    /// the rest by phase-aware load), `power-of-two` (the less loaded of two engines drawn
    /// at random: no herding when several proxy replicas read the same loads) or
    /// `round-robin`.
    pub routing: RoutingKind,
    /// The request header whose value is a request's affinity key under `prefix-affinity`
    /// (a session, conversation or agent-run id the client sends with every turn).
    /// Requests without it are routed by load.
    #[schemars(length(min = 1), extend("x-range" = "an HTTP header name"))]
    pub affinity_header: String,
    /// Under `prefix-affinity`, how far past the mean requests in flight a key's engine may
    /// go before the key's next request spills to its next engine: 1.25 lets an engine carry
    /// a quarter more than the mean. 1 balances strictly and keeps little affinity; a large
    /// value keeps every key home however hot it runs.
    #[schemars(range(min = 1.0, max = 10.0))]
    pub affinity_load_bound: f64,
    /// How an answer handed over by a `think` server (`endpoints[].role`) gets the KV of
    /// its prompt and thought: `reprefill` (the answer server computes it again, from
    /// text; works with any server) or `connector` (vLLM's KV connector carries it: the
    /// proxy first sends the answer's prompt to the think server with `max_tokens: 1`
    /// and `kv_transfer_params` asking it to export, then hands what that returns to the
    /// answer server; every server needs `--kv-transfer-config`, e.g. `ExampleConnector`
    /// with a shared directory on CPU, `NixlConnector` on GPUs). An export that fails
    /// falls back to re-prefill.
    pub handover: Handover,
}

/// How a handed-over answer's KV reaches the answer server (`upstream.handover`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Handover {
    /// The answer server prefills the prompt and the thought again.
    #[default]
    Reprefill,
    /// The think server exports the KV through vLLM's KV connector first.
    Connector,
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
            routing: RoutingKind::PhaseAware,
            affinity_header: "x-session-id".into(),
            affinity_load_bound: 1.25,
            handover: Handover::Reprefill,
        }
    }
}

/// One upstream server.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// One vLLM (or other OpenAI-compatible) server. No endpoint at all: `meridian serve`
    /// refuses to start, unless `twin.enabled`.
    #[schemars(regex(pattern = r"^https?://"), extend("x-kind" = "URL", "x-range" = "`http(s)://host:port`, no `/v1`"))]
    pub url: String,
    /// Label in logs and the `upstream` label of metrics. Name engines so that dashboards
    /// survive address changes.
    #[schemars(length(min = 1), extend("x-default" = "host:port of the URL"))]
    pub name: Option<String>,
    /// The engine's Meridian hook policy channel. Unset: the proxy drives that server through
    /// its HTTP API alone.
    #[schemars(extend("x-kind" = "`host:port`", "x-range" = "host and numeric port"))]
    pub hook: Option<String>,
    /// The served model names this server takes requests for (vLLM's `--served-model-name`).
    /// Unset: learned from the server's `GET /v1/models` every health round (the last good list
    /// is kept when that fails; while none is known the server may get any model). Set it when
    /// the server has no `/v1/models`, or to route only some of its names through this proxy.
    #[schemars(length(min = 1), inner(length(min = 1)), extend("x-range" = "non-empty names, at least one"))]
    pub models: Option<Vec<String>>,
    /// Which work this server takes: `both` (anything), `think` (requests that will think;
    /// when a streamed chat or completion's thought ends, by itself, by a budget or by an
    /// exit signal, its answer continues on an `answer` or `both` server with room, one
    /// client stream and one id, the prompt and thought prefilled again there) or `answer`
    /// (requests that will not think, and the answers `think` servers hand over). A request
    /// with no server of its kind in rotation goes to any that serves its model.
    #[serde(default)]
    pub role: Role,
}

impl UpstreamConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        for (i, ep) in self.endpoints.iter().enumerate() {
            let path = format!("upstream.endpoints[{i}].url");
            match ep.url.split_once("://") {
                Some(("http" | "https", rest)) if !rest.is_empty() => {
                    if ep.url.trim_end_matches('/').ends_with("/v1") {
                        c.fail(path, format!("must be the server's base URL without /v1; got {:?}", ep.url));
                    }
                }
                _ => c.fail(path, format!("must be an http:// or https:// URL; got {:?}", ep.url)),
            }
            if ep.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
                c.fail(format!("upstream.endpoints[{i}].name"), "must not be empty when set");
            }
            if let Some(hook) = &ep.hook {
                if !is_host_port(hook) {
                    c.fail(
                        format!("upstream.endpoints[{i}].hook"),
                        format!("must be host:port of the hook's policy channel; got {hook:?}"),
                    );
                }
            }
            if let Some(models) = &ep.models {
                if models.is_empty() {
                    c.fail(
                        format!("upstream.endpoints[{i}].models"),
                        "must list at least one served model name (leave it unset to learn them from /v1/models)",
                    );
                }
                for (j, m) in models.iter().enumerate() {
                    if m.trim().is_empty() {
                        c.fail(format!("upstream.endpoints[{i}].models[{j}]"), "must not be empty");
                    }
                }
            }
        }
        let answers = self.endpoints.iter().any(|e| e.role != Role::Think);
        if let Some(i) = self.endpoints.iter().position(|e| e.role == Role::Think).filter(|_| !answers) {
            c.fail(
                format!("upstream.endpoints[{i}].role"),
                "`think` servers hand their answers to `answer` or `both` servers, and none is configured",
            );
        }
        c.positive("upstream.connect_timeout_s", self.connect_timeout_s);
        c.positive("upstream.pool_idle_timeout_s", self.pool_idle_timeout_s);
        c.positive("upstream.first_byte_timeout_s", self.first_byte_timeout_s);
        c.positive("upstream.idle_timeout_s", self.idle_timeout_s);
        c.positive("upstream.health_interval_s", self.health_interval_s);
        c.range_u32("upstream.max_attempts", self.max_attempts, 1, 10);
        if self.max_response_bytes < 65536 {
            c.fail(
                "upstream.max_response_bytes",
                format!("must be at least 65536; got {}", self.max_response_bytes),
            );
        }
        c.range_u32("upstream.unhealthy_after", self.unhealthy_after, 1, 100);
        if axum::http::HeaderName::from_bytes(self.affinity_header.as_bytes()).is_err() {
            c.fail(
                "upstream.affinity_header",
                format!("must be an HTTP header name; got {:?}", self.affinity_header),
            );
        }
        if !(1.0..=10.0).contains(&self.affinity_load_bound) {
            c.fail(
                "upstream.affinity_load_bound",
                format!("must be between 1 and 10; got {}", self.affinity_load_bound),
            );
        }
        if !self.health_path.starts_with('/') {
            c.fail("upstream.health_path", format!("must start with '/'; got {:?}", self.health_path));
        }
        if let Some(var) = &self.api_key_env {
            if var.is_empty() {
                c.fail("upstream.api_key_env", "must name an environment variable");
            } else if std::env::var_os(var).is_none() {
                c.fail("upstream.api_key_env", format!("names {var:?}, which is not set"));
            }
        }
    }
}
