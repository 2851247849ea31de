//! The proxy's client-facing listener (`[server]`) and its admin listener (`[admin]`): each section's fields, defaults and checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use meridian_core::config::Checker;

/// The proxy's listener and request limits.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where the proxy accepts clients. In a container or pod use `0.0.0.0:8080` (the chart and
    /// the image do).
    #[schemars(extend("x-kind" = "address", "x-range" = "`host:port`"))]
    pub listen: String,
    /// Largest request body; larger gets 413. Raise it only for very long prompts sent as text
    /// (16 MiB is ~4M tokens of English).
    #[schemars(range(min = 1024))]
    pub max_body_bytes: u64,
    /// Time a client gets to send a request's headers (HTTP/1); a client slower than that (or
    /// one that opens a connection and sends half a request) is disconnected, so idle sockets
    /// cannot pile up.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub header_read_timeout_s: f64,
    /// Largest request head (headers and URL, as on the wire) accepted; larger gets `431`
    /// (`request_headers_too_large`). 64 KiB fits any API client; raise it only for very large
    /// cookies or tokens.
    #[schemars(range(min = 4096, max = 262_144))]
    pub max_header_bytes: u64,
    /// Time a client gets to send its whole request body; a slower or stalled upload gets `408`
    /// (`request_timeout`) and frees its connection. Raise it only for clients that upload very
    /// long prompts over slow links.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub request_body_timeout_s: f64,
    /// After SIGTERM, readiness fails, no request is taken, and open responses get this long to
    /// finish; whatever is still open then ends with a `server_shutting_down` error event. Set
    /// it to your typical longest generation; keep the pod's `terminationGracePeriodSeconds`
    /// above it (the chart checks).
    #[schemars(range(min = 0))]
    pub shutdown_grace_s: f64,
    /// Longest silence on a streamed response before the proxy sends an SSE comment (`:
    /// keep-alive`), so load balancers with idle timeouts (often 60 s) do not cut a stream that
    /// is queued, prefilling or thinking silently. A streamed request with no response after
    /// this long gets `200` and its headers early; a failure after that arrives as an error
    /// event instead of a status. `0` turns heartbeats off.
    #[schemars(range(min = 0))]
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

impl ServerConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            c.fail("server.listen", format!("must be an address like 127.0.0.1:8080; got {:?}", self.listen));
        }
        if self.max_body_bytes < 1024 {
            c.fail("server.max_body_bytes", format!("must be at least 1024; got {}", self.max_body_bytes));
        }
        if !(4096..=262_144).contains(&self.max_header_bytes) {
            c.fail(
                "server.max_header_bytes",
                format!(
                    "must be from 4096 to 262144 (hyper's own buffer is larger); got {}",
                    self.max_header_bytes
                ),
            );
        }
        c.positive("server.request_body_timeout_s", self.request_body_timeout_s);
        c.positive("server.header_read_timeout_s", self.header_read_timeout_s);
        if !(self.shutdown_grace_s.is_finite() && self.shutdown_grace_s >= 0.0) {
            c.fail("server.shutdown_grace_s", format!("must be zero or more; got {}", self.shutdown_grace_s));
        }
        if !(self.sse_heartbeat_s.is_finite() && self.sse_heartbeat_s >= 0.0) {
            c.fail(
                "server.sse_heartbeat_s",
                format!("must be zero (off) or more; got {}", self.sse_heartbeat_s),
            );
        }
    }
}

/// The admin listener: a live list of open streams (`GET /admin/streams`) for operators
/// and `meridian top`, apart from the client-facing listener.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The admin listener ([Operations](operations.md#open-streams)): `GET /admin/streams`
    /// lists every open stream as JSON, and `meridian top` shows it live. Off when unset. It
    /// answers only requests bearing the token below; keep it off the client-facing network all
    /// the same.
    #[schemars(extend("x-kind" = "address", "x-range" = "`host:port`, not `server.listen`"))]
    pub listen: Option<String>,
    /// Environment variable with the admin listener's bearer token. With `admin.listen` set and
    /// the variable unset or empty, `meridian serve` refuses to start.
    #[schemars(length(min = 1))]
    pub token_env: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { listen: None, token_env: "MERIDIAN_ADMIN_TOKEN".into() }
    }
}

impl AdminConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker, server: &ServerConfig) {
        if let Some(listen) = &self.listen {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                c.fail("admin.listen", format!("must be an address like 127.0.0.1:9091; got {listen:?}"));
            }
            // Port 0 asks for any free port, which two listeners can both ask for.
            if listen == &server.listen && !listen.ends_with(":0") {
                c.fail("admin.listen", "must differ from server.listen (the admin listener is separate)");
            }
        }
        if self.token_env.trim().is_empty() {
            c.fail("admin.token_env", "must name an environment variable");
        }
    }
}
