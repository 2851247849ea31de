//! Checking a loaded `meridian.toml`: every invalid value, each named by its dotted
//! path, collected across sections so all are reported at once.

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

/// Collects the invalid values of every section, so all are reported at once.
#[derive(Default)]
pub(super) struct Checker {
    errors: Vec<FieldError>,
}

impl Checker {
    pub(super) fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError { path: path.into(), message: message.into() });
    }

    pub(super) fn positive(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0) {
            self.fail(path, format!("must be a positive number of seconds; got {value}"));
        }
    }

    pub(super) fn policy(&mut self, path: &str, spec: &str) {
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

    pub(super) fn unit_interval(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0 && value <= 1.0) {
            self.fail(path, format!("must be in (0, 1]; got {value}"));
        }
    }

    pub(super) fn range_u32(&mut self, path: &str, value: u32, lo: u32, hi: u32) {
        if !(lo..=hi).contains(&value) {
            self.fail(path, format!("must be in [{lo}, {hi}]; got {value}"));
        }
    }
}

impl MeridianConfig {
    /// Every out-of-range or inconsistent value, each with its dotted path: each
    /// section's own checks (beside its struct), in the file's order.
    pub fn validate(&self, models: &ModelRegistry) -> Result<(), Vec<FieldError>> {
        let mut c = Checker::default();
        self.server.check(&mut c);
        self.upstream.check(&mut c);
        self.models.check(&mut c, models);
        self.budget.check(&mut c, models);
        self.twin.check(&mut c, &self.upstream);
        self.admin.check(&mut c, &self.server);
        self.hook.check(&mut c);
        self.exit.check(&mut c);
        self.admission.check(&mut c);
        self.priority.check(&mut c);
        self.telemetry.check(&mut c);
        if c.errors.is_empty() { Ok(()) } else { Err(c.errors) }
    }
}

/// `host:port` with a non-empty host and a numeric port (names are resolved later).
pub(super) fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok(),
        None => false,
    }
}
