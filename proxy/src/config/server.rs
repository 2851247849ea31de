//! The proxy's client-facing listener (`[server]`) and its admin listener (`[admin]`): each section's fields, defaults and checks.

use serde::Deserialize;

use super::validate::Checker;

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
