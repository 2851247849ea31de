//! The embedded engine twin (`[twin]`): fields, defaults and checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::UpstreamConfig;
use meridian_core::config::Checker;

/// The embedded engine twin, a simulated vLLM: the upstream only when asked for
/// (`enabled`, or `meridian serve --twin`) and no endpoint is configured. Its answers are
/// made up, so it never serves by default: with no upstream and no twin, `meridian
/// serve` refuses to start.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TwinConfig {
    /// Serve simulated answers from the embedded engine twin (`meridian serve --twin` sets it).
    /// Every answer says so: header `x-meridian-simulated: meridian-twin/<profile>` and that
    /// `system_fingerprint`. Never on by default: with neither upstream nor twin the proxy
    /// refuses to start, naming these settings. Needs a build with the twin (cargo feature
    /// `twin`: on in `cargo build` and `scripts/run.sh`, off in the release image, whose
    /// `-twin` variant has it); a build without it refuses `twin.enabled` and says so.
    #[schemars(extend("x-range" = "only with no `upstream.endpoints`"))]
    pub enabled: bool,
    /// Cost model of the embedded twin; used only with `twin.enabled`.
    #[schemars(
        length(min = 1),
        extend("x-range" = "a profile in `loadtest/twin/profiles.toml`, or in `twin.profile_file` when set")
    )]
    pub profile: String,
    /// A file of cost-model profiles to take `twin.profile` from instead of the built-in
    /// ones, relative to the config file: the format of `loadtest/twin/profiles.toml`, as
    /// `meridian-sim calibrate` writes one from an engine's measured steps (for example the
    /// H100's, `docs/src/benchmarks/gpu-step-curve/fitted-profile.toml`), so the twin steps
    /// as your own GPU does. Unset: the built-in profiles.
    #[schemars(length(min = 1), extend("x-kind" = "path", "x-range" = "existing file"))]
    pub profile_file: Option<String>,
    /// Model name the twin serves and the proxy resolves to a family.
    #[schemars(length(min = 1))]
    pub served_model: String,
    /// Simulated seconds per wall second; above 1 runs faster than real time (demos, tests).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub speed: f64,
    /// Seed of the twin's synthetic workload.
    pub seed: u64,
    /// Scheduling policy inside the twin (see [Dispatch policies](benchmarks/dispatch.md)).
    #[schemars(length(min = 1), extend("x-kind" = "policy", "x-range" = "`fcfs`, `priority`, `output-first`, `reasoning-first`, `slo-driven`, the last three with `:key=value,…` parameters"))]
    pub policy: String,
    /// Workload file of the twin, relative to the config file (format:
    /// `loadtest/twin/workloads/default.toml`); unset: that default mix.
    #[schemars(length(min = 1), extend("x-kind" = "path", "x-range" = "existing file"))]
    pub workload: Option<String>,
}

impl Default for TwinConfig {
    fn default() -> Self {
        TwinConfig {
            enabled: false,
            profile: "h100-qwen3-8b".into(),
            profile_file: None,
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
        if self.profile.trim().is_empty() {
            c.fail("twin.profile", "must name a profile");
        }
        if self.profile_file.as_deref().is_some_and(|f| f.trim().is_empty()) {
            c.fail("twin.profile_file", "must name a file when set");
        }
        if self.workload.as_deref().is_some_and(|w| w.trim().is_empty()) {
            c.fail("twin.workload", "must name a file when set");
        }
        if self.served_model.trim().is_empty() {
            c.fail("twin.served_model", "must not be empty");
        }
    }
}
