//! Reading `meridian.toml`: the file, then overrides, typed with errors naming the dotted
//! path, then every section's checks. Generic over the file's view: the proxy reads the
//! whole file ([`ConfigFile`] for its `MeridianConfig`), the engine's hook its own
//! sections ([`super::EngineFile`]).

use std::path::Path;

use serde::de::DeserializeOwned;

use super::FieldError;
use crate::models::{ModelError, ModelRegistry};

/// A view of `meridian.toml` that can be loaded: typed by serde, checked as a whole once
/// the model families it names are known.
pub trait ConfigFile: DeserializeOwned {
    /// `models.dir`: extra model family files, relative to the config file.
    fn models_dir(&self) -> Option<&str>;
    /// Every out-of-range or inconsistent value, each with its dotted path.
    fn validate(&self, models: &ModelRegistry) -> Result<(), Vec<FieldError>>;
    /// Drops, before typing, the tables this view leaves to another reader: typing
    /// would otherwise walk each of them only to ignore it.
    fn leave_others(_table: &mut toml::Table) {}
}

/// A `dotted.path=value` setting applied on top of the file (from `--set` or from a
/// `MERIDIAN_SECTION__FIELD` environment variable). The value is read as a TOML literal
/// when it is one (`3`, `true`, `["a"]`) and as a string otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub path: String,
    pub value: toml::Value,
    /// Where it came from, for error messages.
    pub origin: String,
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: not valid TOML: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: {path}: {message}")]
    Field { origin: String, path: String, message: String },
    #[error("{0}")]
    Override(String),
    #[error("invalid configuration:\n  {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n  "))]
    Invalid(Vec<FieldError>),
    #[error(transparent)]
    Models(#[from] ModelError),
}

impl Override {
    /// Parses `path=value`.
    pub fn parse(spec: &str, origin: &str) -> Result<Self, ConfigError> {
        let (path, raw) = spec
            .split_once('=')
            .ok_or_else(|| ConfigError::Override(format!("{origin}: expected KEY=VALUE, got {spec:?}")))?;
        let path = path.trim();
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(ConfigError::Override(format!("{origin}: bad key {path:?}")));
        }
        Ok(Override { path: path.to_owned(), value: parse_literal(raw.trim()), origin: origin.to_owned() })
    }

    /// The overrides in `MERIDIAN_SECTION__FIELD=value` variables. Only names with a double
    /// underscore are config paths; others (`MERIDIAN_CONFIG`, …) belong to flags.
    pub fn from_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<Override> {
        let mut out: Vec<Override> = vars
            .into_iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix("MERIDIAN_")?;
                if !rest.contains("__") {
                    return None;
                }
                let path = rest.split("__").map(str::to_ascii_lowercase).collect::<Vec<_>>().join(".");
                Some(Override {
                    path,
                    value: parse_literal(v.trim()),
                    origin: format!("environment variable {k}"),
                })
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    fn apply(&self, root: &mut toml::Table) -> Result<(), ConfigError> {
        let mut parts = self.path.split('.').peekable();
        let mut table = root;
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                table.insert(part.to_owned(), self.value.clone());
                return Ok(());
            }
            let entry =
                table.entry(part.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = entry.as_table_mut().ok_or_else(|| {
                ConfigError::Override(format!("{}: {} is not a table", self.origin, self.path))
            })?;
        }
        Ok(())
    }
}

fn parse_literal(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Parses config text plus overrides; no range checks yet.
pub fn parse_config<T: ConfigFile>(
    text: &str,
    origin: &str,
    overrides: &[Override],
) -> Result<T, ConfigError> {
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax {
        origin: origin.to_owned(),
        message: e.message().to_owned(),
    })?;
    for o in overrides {
        o.apply(&mut table)?;
    }
    T::leave_others(&mut table);
    let origin = if overrides.is_empty() { origin.to_owned() } else { format!("{origin} (with overrides)") };
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::Field { origin, path, message: e.into_inner().message().to_owned() }
    })
}

/// Reads, overrides, and validates a configuration, and builds the model registry it
/// refers to. `path = None` starts from the defaults.
pub fn load_config<T: ConfigFile>(
    path: Option<&Path>,
    overrides: &[Override],
) -> Result<(T, ModelRegistry), ConfigError> {
    let (text, origin) = match path {
        Some(p) => (
            std::fs::read_to_string(p)
                .map_err(|source| ConfigError::Read { path: p.display().to_string(), source })?,
            p.display().to_string(),
        ),
        None => (String::new(), "defaults".to_owned()),
    };
    let config: T = parse_config(&text, &origin, overrides)?;
    let mut models = ModelRegistry::builtin()?;
    if let Some(dir) = config.models_dir() {
        let dir = match path.and_then(Path::parent) {
            Some(base) if Path::new(dir).is_relative() => base.join(dir),
            _ => Path::new(dir).to_path_buf(),
        };
        models.load_dir(&dir)?;
    }
    config.validate(&models).map_err(ConfigError::Invalid)?;
    Ok((config, models))
}
