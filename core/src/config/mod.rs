//! `meridian.toml`: the typed configuration shared by the proxy and (later) the hook.
//!
//! Loading is strict: unknown fields are rejected, type errors name the dotted path of
//! the field, and [`MeridianConfig::validate`] reports every out-of-range value at once,
//! so an operator fixes the file in one pass before anything starts. Each section lives
//! in its own module with its fields, defaults and checks (`check`, beside the struct);
//! `validate` runs them in the file's order and adds what spans sections.

mod admission;
mod budget;
mod engine_side;
mod load;
mod server;
mod telemetry;
mod twin;
mod upstream;
mod validate;

use std::collections::BTreeMap;

use serde::Deserialize;

pub use admission::AdmissionConfig;
pub use budget::{BudgetConfig, Forcing};
pub use engine_side::{ExitConfig, ExitSignal, HookConfig, OnUnsupportedVllm, PriorityConfig};
pub use load::{ConfigError, Override, load_config, parse_config};
pub use server::{AdminConfig, ServerConfig};
pub use telemetry::{LogFormat, TRACING_PROTOCOLS, TelemetryConfig, TracingConfig};
pub use twin::TwinConfig;
pub use upstream::{EndpointConfig, UpstreamConfig};
pub use validate::FieldError;

use crate::models::ModelRegistry;
use validate::Checker;

/// The whole `meridian.toml`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MeridianConfig {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub models: ModelsConfig,
    pub telemetry: TelemetryConfig,
    pub twin: TwinConfig,
    pub budget: BudgetConfig,
    pub hook: HookConfig,
    pub exit: ExitConfig,
    pub priority: PriorityConfig,
    pub admission: AdmissionConfig,
    pub admin: AdminConfig,
}

/// Where model family boundaries come from.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Extra `*.toml` family files, added to (or replacing) the built-in ones.
    pub dir: Option<String>,
    /// Served model name → family name, for names no pattern matches.
    pub aliases: BTreeMap<String, String>,
    /// Family for served models that match nothing; unset means phases come only from
    /// `delta.reasoning` for those models.
    pub default_family: Option<String>,
}

impl ModelsConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    fn check(&self, c: &mut Checker, models: &ModelRegistry) {
        for (served, family) in &self.aliases {
            if models.get(family).is_none() {
                c.fail(format!("models.aliases.{served}"), format!("names unknown family {family:?}"));
            }
        }
        if let Some(family) = &self.default_family {
            if models.get(family).is_none() {
                c.fail("models.default_family", format!("names unknown family {family:?}"));
            }
        }
    }
}
