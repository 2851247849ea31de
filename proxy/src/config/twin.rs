//! The embedded engine twin (`[twin]`): fields, defaults and checks.

use serde::Deserialize;

use super::UpstreamConfig;
use super::validate::Checker;

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

impl TwinConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker, upstream: &UpstreamConfig) {
        if self.enabled && !upstream.endpoints.is_empty() {
            c.fail(
                "twin.enabled",
                "the twin (simulated answers) serves only when no upstream.endpoints are configured; \
                 drop one or the other",
            );
        }
        if !(self.speed.is_finite() && self.speed > 0.0) {
            c.fail("twin.speed", format!("must be a positive number; got {}", self.speed));
        }
        c.policy("twin.policy", &self.policy);
        if self.served_model.trim().is_empty() {
            c.fail("twin.served_model", "must not be empty");
        }
    }
}
