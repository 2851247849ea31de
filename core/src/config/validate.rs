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
        if !(s.shutdown_grace_s.is_finite() && s.shutdown_grace_s >= 0.0) {
            c.fail("server.shutdown_grace_s", format!("must be zero or more; got {}", s.shutdown_grace_s));
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
        }
        c.positive("upstream.connect_timeout_s", u.connect_timeout_s);
        c.positive("upstream.first_byte_timeout_s", u.first_byte_timeout_s);
        c.positive("upstream.idle_timeout_s", u.idle_timeout_s);
        c.positive("upstream.health_interval_s", u.health_interval_s);
        c.range_u32("upstream.max_attempts", u.max_attempts, 1, 10);
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
        for (family, n) in &b.per_family {
            if models.get(family).is_none() {
                c.fail(format!("budget.per_family.{family}"), format!("names unknown family {family:?}"));
            } else if *n == 0 {
                c.fail(format!("budget.per_family.{family}"), "must be at least 1");
            }
        }

        let tw = &self.twin;
        if !(tw.speed.is_finite() && tw.speed > 0.0) {
            c.fail("twin.speed", format!("must be a positive number; got {}", tw.speed));
        }
        if !crate::sched::POLICY_NAMES.contains(&tw.policy.as_str()) {
            c.fail(
                "twin.policy",
                format!("must be one of {:?}; got {:?}", crate::sched::POLICY_NAMES, tw.policy),
            );
        }
        if tw.served_model.trim().is_empty() {
            c.fail("twin.served_model", "must not be empty");
        }

        let t = &self.telemetry;
        if t.log_level.trim().is_empty() {
            c.fail("telemetry.log_level", "must not be empty");
        }

        if c.errors.is_empty() { Ok(()) } else { Err(c.errors) }
    }
}
