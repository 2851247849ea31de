//! The sections of `meridian.toml` that the engine's hook reads as well as the proxy, and
//! how the file is read.
//!
//! `[hook]`, `[exit]`, `[budget]` and `[models]` live here, each in its own module with
//! its fields, defaults and checks (`check`, beside the struct); the proxy's own sections
//! (listener, upstreams, admission, telemetry, the twin, priorities, admin) and the whole
//! file's type are the proxy's (`meridian_proxy::config`). Loading is strict either way:
//! unknown fields in a section are rejected, type errors name the dotted path of the
//! field, and every out-of-range value is reported at once ([`Checker`]), so an operator
//! fixes the file in one pass before anything starts. The hook reads the file through
//! [`EngineFile`], which takes its sections and leaves the proxy's to the proxy.

mod budget;
mod engine_side;
mod load;
mod validate;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use budget::{BudgetConfig, Forcing};
pub use engine_side::{ExitConfig, ExitSignal, HookConfig, OnUnsupportedVllm};
pub use load::{ConfigError, ConfigFile, Override, load_config, parse_config};
pub use validate::{Checker, FieldError, is_host_port};

use crate::models::ModelRegistry;

/// `meridian.toml` as the engine's hook reads it: its own sections, checked as strictly
/// as the proxy checks them; every other table is the proxy's, which checks it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct EngineFile {
    pub hook: HookConfig,
    pub exit: ExitConfig,
    pub budget: BudgetConfig,
    pub models: ModelsConfig,
}

/// The tables [`EngineFile`] reads.
const ENGINE_SECTIONS: [&str; 4] = ["hook", "exit", "budget", "models"];

impl ConfigFile for EngineFile {
    fn models_dir(&self) -> Option<&str> {
        self.models.dir.as_deref()
    }

    fn leave_others(table: &mut toml::Table) {
        table.retain(|section, _| ENGINE_SECTIONS.contains(&section));
    }

    fn validate(&self, models: &ModelRegistry) -> Result<(), Vec<FieldError>> {
        let mut c = Checker::default();
        self.models.check(&mut c, models);
        self.budget.check(&mut c, models);
        self.hook.check(&mut c);
        self.exit.check(&mut c);
        c.finish()
    }
}

/// Where model family boundaries come from.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Extra model family files (`*.toml`, format of `models/`), relative to the config file;
    /// they add to or replace the built-in families.
    #[schemars(length(min = 1), extend("x-kind" = "path", "x-range" = "existing directory"))]
    pub dir: Option<String>,
    /// Family of a served model name that no family's `match` pattern catches (e.g. a fine-tune
    /// served under its own name).
    #[schemars(extend("additionalProperties" = {"type": "string", "minLength": 1}, "x-key" = "served-name", "x-range" = "an existing family"))]
    pub aliases: BTreeMap<String, String>,
    /// Family of served models that match nothing; unset, their phases come only from
    /// `delta.reasoning`.
    #[schemars(length(min = 1), extend("x-range" = "an existing family"))]
    pub default_family: Option<String>,
}

impl ModelsConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub fn check(&self, c: &mut Checker, models: &ModelRegistry) {
        if self.dir.as_deref().is_some_and(|d| d.trim().is_empty()) {
            c.fail("models.dir", "must name a directory when set");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_the_hook_keeps_are_its_sections() {
        let written = toml::Table::try_from(EngineFile::default()).unwrap();
        let mut sections: Vec<&str> = written.keys().map(String::as_str).collect();
        let mut kept = ENGINE_SECTIONS.to_vec();
        sections.sort_unstable();
        kept.sort_unstable();
        assert_eq!(sections, kept, "ENGINE_SECTIONS must name every field of EngineFile");
    }
}
