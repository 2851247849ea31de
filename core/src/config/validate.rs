use std::fmt;

use super::MeridianConfig;
use crate::models::ModelRegistry;

/// One invalid value, named by its dotted path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, self.message)
    }
}

#[derive(Default)]
struct Checker {
    errors: Vec<FieldError>,
}

impl Checker {
    fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError { path: path.into(), message: message.into() });
    }

    fn positive(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0) {
            self.fail(path, format!("must be a positive number of seconds; got {value}"));
        }
    }

    fn policy(&mut self, path: &str, spec: &str) {
        if crate::sched::policy_by_name(spec).is_none() {
            self.fail(
                path,
                format!(
                    "must be one of {:?}, optionally with parameters (\"output-first:think_decode_cap=16\"); got {spec:?}",
                    crate::sched::POLICY_NAMES
                ),
            );
        }
    }

    fn unit_interval(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0 && value <= 1.0) {
            self.fail(path, format!("must be in (0, 1]; got {value}"));
        }
    }

    fn range_u32(&mut self, path: &str, value: u32, lo: u32, hi: u32) {
        if !(lo..=hi).contains(&value) {
            self.fail(path, format!("must be in [{lo}, {hi}]; got {value}"));
        }
    }
}

impl MeridianConfig {
    /// Every out-of-range or inconsistent value, each with its dotted path.
    pub fn validate(&self, models: &ModelRegistry) -> Result<(), Vec<FieldError>> {
        let mut c = Checker::default();
        let s = &self.server;
        if s.listen.parse::<std::net::SocketAddr>().is_err() {
            c.fail("server.listen", format!("must be an address like 127.0.0.1:8080; got {:?}", s.listen));
        }
        if s.max_body_bytes < 1024 {
            c.fail("server.max_body_bytes", format!("must be at least 1024; got {}", s.max_body_bytes));
        }
        if !(4096..=262_144).contains(&s.max_header_bytes) {
            c.fail(
                "server.max_header_bytes",
                format!(
                    "must be from 4096 to 262144 (hyper's own buffer is larger); got {}",
                    s.max_header_bytes
                ),
            );
        }
        c.positive("server.request_body_timeout_s", s.request_body_timeout_s);
        c.positive("server.header_read_timeout_s", s.header_read_timeout_s);
        if !(s.shutdown_grace_s.is_finite() && s.shutdown_grace_s >= 0.0) {
            c.fail("server.shutdown_grace_s", format!("must be zero or more; got {}", s.shutdown_grace_s));
        }
        if !(s.sse_heartbeat_s.is_finite() && s.sse_heartbeat_s >= 0.0) {
            c.fail(
                "server.sse_heartbeat_s",
                format!("must be zero (off) or more; got {}", s.sse_heartbeat_s),
            );
        }

        let u = &self.upstream;
        for (i, ep) in u.endpoints.iter().enumerate() {
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
        c.positive("upstream.connect_timeout_s", u.connect_timeout_s);
        c.positive("upstream.pool_idle_timeout_s", u.pool_idle_timeout_s);
        c.positive("upstream.first_byte_timeout_s", u.first_byte_timeout_s);
        c.positive("upstream.idle_timeout_s", u.idle_timeout_s);
        c.positive("upstream.health_interval_s", u.health_interval_s);
        c.range_u32("upstream.max_attempts", u.max_attempts, 1, 10);
        if u.max_response_bytes < 65536 {
            c.fail(
                "upstream.max_response_bytes",
                format!("must be at least 65536; got {}", u.max_response_bytes),
            );
        }
        c.range_u32("upstream.unhealthy_after", u.unhealthy_after, 1, 100);
        if !u.health_path.starts_with('/') {
            c.fail("upstream.health_path", format!("must start with '/'; got {:?}", u.health_path));
        }
        if let Some(var) = &u.api_key_env {
            if var.is_empty() {
                c.fail("upstream.api_key_env", "must name an environment variable");
            } else if std::env::var_os(var).is_none() {
                c.fail("upstream.api_key_env", format!("names {var:?}, which is not set"));
            }
        }

        let m = &self.models;
        for (served, family) in &m.aliases {
            if models.get(family).is_none() {
                c.fail(format!("models.aliases.{served}"), format!("names unknown family {family:?}"));
            }
        }
        if let Some(family) = &m.default_family {
            if models.get(family).is_none() {
                c.fail("models.default_family", format!("names unknown family {family:?}"));
            }
        }

        let b = &self.budget;
        if b.think_tokens == Some(0) {
            c.fail("budget.think_tokens", "must be at least 1 (leave it unset for no budget)");
        }
        if let Some(s) = b.think_seconds {
            if !(s.is_finite() && s > 0.0) {
                c.fail("budget.think_seconds", format!("must be a positive number of seconds; got {s}"));
            }
        }
        for (family, n) in &b.per_family {
            if models.get(family).is_none() {
                c.fail(format!("budget.per_family.{family}"), format!("names unknown family {family:?}"));
            } else if *n == 0 {
                c.fail(format!("budget.per_family.{family}"), "must be at least 1");
            }
        }

        let tw = &self.twin;
        if tw.enabled && !self.upstream.endpoints.is_empty() {
            c.fail(
                "twin.enabled",
                "the twin (simulated answers) serves only when no upstream.endpoints are configured; \
                 drop one or the other",
            );
        }
        if !(tw.speed.is_finite() && tw.speed > 0.0) {
            c.fail("twin.speed", format!("must be a positive number; got {}", tw.speed));
        }
        c.policy("twin.policy", &tw.policy);
        if tw.served_model.trim().is_empty() {
            c.fail("twin.served_model", "must not be empty");
        }

        let a = &self.admin;
        if let Some(listen) = &a.listen {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                c.fail("admin.listen", format!("must be an address like 127.0.0.1:9091; got {listen:?}"));
            }
            // Port 0 asks for any free port, which two listeners can both ask for.
            if listen == &s.listen && !listen.ends_with(":0") {
                c.fail("admin.listen", "must differ from server.listen (the admin listener is separate)");
            }
        }
        if a.token_env.trim().is_empty() {
            c.fail("admin.token_env", "must name an environment variable");
        }
        let h = &self.hook;
        if h.listen.parse::<std::net::SocketAddr>().is_err() {
            c.fail("hook.listen", format!("must be an address like 0.0.0.0:9470; got {:?}", h.listen));
        }
        if h.token_env.trim().is_empty() {
            c.fail("hook.token_env", "must name an environment variable");
        }
        c.policy("hook.policy", &h.policy);
        c.positive("hook.timeout_s", h.timeout_s);

        let x = &self.exit;
        c.range_u32("exit.rpdi_window", x.rpdi_window, 8, 1 << 16);
        if !(x.rpdi_lambda.is_finite() && x.rpdi_lambda > 1.0) {
            c.fail("exit.rpdi_lambda", format!("must be a ratio above 1; got {}", x.rpdi_lambda));
        }
        c.unit_interval("exit.eat_alpha", x.eat_alpha);
        if !(x.eat_delta.is_finite() && x.eat_delta > 0.0) {
            c.fail("exit.eat_delta", format!("must be a positive variance; got {}", x.eat_delta));
        }
        c.range_u32("exit.eat_probe_every_tokens", x.eat_probe_every_tokens, 1, 1 << 20);

        let a = &self.admission;
        if a.max_streams == Some(0) {
            c.fail("admission.max_streams", "must be at least 1 (leave it unset for no cap)");
        }
        if let Some(kv) = a.max_kv_usage {
            c.unit_interval("admission.max_kv_usage", kv);
        }
        c.positive("admission.queue_timeout_s", a.queue_timeout_s);
        c.range_u32("admission.max_queued", a.max_queued, 1, 1_000_000);
        if a.enabled && a.max_streams.is_none() && a.max_waiting.is_none() && a.max_kv_usage.is_none() {
            c.fail(
                "admission.enabled",
                "is true but no saturation signal is set: set max_streams, max_waiting or max_kv_usage",
            );
        }

        let pr = &self.priority;
        if pr.output > pr.interactive {
            c.fail(
                "priority.output",
                format!(
                    "must not be above priority.interactive ({}): lower runs first; got {}",
                    pr.interactive, pr.output
                ),
            );
        }
        if pr.interactive > pr.batch {
            c.fail(
                "priority.batch",
                format!(
                    "must not be below priority.interactive ({}): lower runs first; got {}",
                    pr.interactive, pr.batch
                ),
            );
        }

        let t = &self.telemetry;
        if t.log_level.trim().is_empty() {
            c.fail("telemetry.log_level", "must not be empty");
        }
        let tr = &t.tracing;
        if let Some(p) = &tr.protocol {
            if !super::TRACING_PROTOCOLS.contains(&p.as_str()) {
                c.fail(
                    "telemetry.tracing.protocol",
                    format!("must be one of {:?}; got {p:?}", super::TRACING_PROTOCOLS),
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

        if c.errors.is_empty() { Ok(()) } else { Err(c.errors) }
    }
}

/// `host:port` with a non-empty host and a numeric port (names are resolved later).
fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok(),
        None => false,
    }
}
