//! Checking a loaded `meridian.toml`: every invalid value, each named by its dotted
//! path, collected across sections so all are reported at once. Each section's `check`
//! (beside its struct, here for the sections the engine's hook reads, in the proxy for the
//! proxy's own) adds to one [`Checker`].

use std::fmt;

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
#[derive(Debug, Default)]
pub struct Checker {
    errors: Vec<FieldError>,
}

impl Checker {
    pub fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError { path: path.into(), message: message.into() });
    }

    pub fn positive(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0) {
            self.fail(path, format!("must be a positive number of seconds; got {value}"));
        }
    }

    pub fn policy(&mut self, path: &str, spec: &str) {
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

    pub fn unit_interval(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0 && value <= 1.0) {
            self.fail(path, format!("must be in (0, 1]; got {value}"));
        }
    }

    pub fn range_u32(&mut self, path: &str, value: u32, lo: u32, hi: u32) {
        if !(lo..=hi).contains(&value) {
            self.fail(path, format!("must be in [{lo}, {hi}]; got {value}"));
        }
    }
}

impl Checker {
    /// Every invalid value found, or none.
    pub fn finish(self) -> Result<(), Vec<FieldError>> {
        if self.errors.is_empty() { Ok(()) } else { Err(self.errors) }
    }
}

/// `host:port` with a non-empty host and a numeric port (names are resolved later).
pub fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok(),
        None => false,
    }
}
