//! `meridian.toml`, the whole file as the proxy reads it: the proxy's own sections
//! (`[server]`, `[admin]`, `[upstream]`, `[admission]`, `[priority]`, `[tenants]`,
//! `[telemetry]`, `[twin]`) each in its own module with its fields, defaults and checks beside the struct,
//! and the sections the engine's hook reads too (`[hook]`, `[exit]`, `[budget]`,
//! `[models]`) from `meridian_core::config`, re-exported here so the proxy names every
//! section from one place.
//!
//! Loading (`meridian_core::config::load_config`) is strict: unknown fields are rejected,
//! type errors name the dotted path of the field, and [`MeridianConfig::validate`] reports
//! every out-of-range value at once. The file's JSON Schema ([`json_schema`]) is derived
//! from these types, bounds included; the chart's values schema and the book's
//! configuration reference are generated from it (`proxy/tests/config_generated.rs`).

mod admission;
mod priority;
mod schema;
mod server;
mod telemetry;
mod tenants;
mod twin;
mod upstream;

use std::path::Path;

use meridian_core::ModelRegistry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use admission::{AdmissionConfig, PlacesFrom};
pub use meridian_core::config::{
    BudgetConfig, Checker, ConfigError, ConfigFile, ExitConfig, ExitSignal, FieldError, Forcing, HookConfig,
    ModelsConfig, OnUnsupportedVllm, Override,
};
pub use priority::PriorityConfig;
pub use schema::json_schema;
pub use server::{AdminConfig, ServerConfig};
pub use telemetry::{LogFormat, TRACING_PROTOCOLS, TelemetryConfig, TracingConfig};
pub use tenants::{IdentifyBy, TenantConfig, TenantsConfig};
pub use twin::TwinConfig;
pub use upstream::{EndpointConfig, Handover, UpstreamConfig};

/// The whole `meridian.toml`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
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
    pub tenants: TenantsConfig,
    pub admin: AdminConfig,
}

impl ConfigFile for MeridianConfig {
    fn models_dir(&self) -> Option<&str> {
        self.models.dir.as_deref()
    }

    /// Every out-of-range or inconsistent value, each with its dotted path: each
    /// section's own checks (beside its struct), in the file's order; the few that span
    /// sections take the section they compare with.
    fn validate(&self, models: &ModelRegistry) -> Result<(), Vec<FieldError>> {
        let mut c = Checker::default();
        self.server.check(&mut c);
        self.upstream.check(&mut c);
        self.models.check(&mut c, models);
        self.budget.check(&mut c, models);
        self.twin.check(&mut c, &self.upstream);
        self.admin.check(&mut c, &self.server);
        self.hook.check(&mut c);
        self.exit.check(&mut c);
        self.admission.check(&mut c, &self.upstream);
        self.priority.check(&mut c);
        self.tenants.check(&mut c, &self.admission);
        self.telemetry.check(&mut c);
        c.finish()
    }
}

impl MeridianConfig {
    /// Every out-of-range or inconsistent value, each with its dotted path.
    pub fn validate(&self, models: &ModelRegistry) -> Result<(), Vec<FieldError>> {
        ConfigFile::validate(self, models)
    }
}

/// Reads, overrides and validates the whole file, and builds the model registry it
/// refers to. `path = None` starts from the defaults.
pub fn load_config(
    path: Option<&Path>,
    overrides: &[Override],
) -> Result<(MeridianConfig, ModelRegistry), ConfigError> {
    meridian_core::config::load_config(path, overrides)
}

/// Parses config text plus overrides into the whole file; no range checks yet.
pub fn parse_config(text: &str, origin: &str, overrides: &[Override]) -> Result<MeridianConfig, ConfigError> {
    meridian_core::config::parse_config(text, origin, overrides)
}
