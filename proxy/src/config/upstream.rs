//! The servers behind the proxy (`[upstream]`, `[[upstream.endpoints]]`): fields, defaults and checks.

use serde::Deserialize;

use super::validate::{Checker, is_host_port};

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
