//! Command line: `meridian serve`, `meridian check` and `meridian top`. Settings come from the config
//! file, then `MERIDIAN_SECTION__FIELD` environment variables, then flags.

use std::path::PathBuf;

use crate::config::{ConfigError, Override};
use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "meridian",
    version,
    about = "Phase-aware OpenAI-compatible proxy for reasoning models on vLLM"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the proxy.
    Serve(ConfigArgs),
    /// Load and validate the configuration, report problems, and exit.
    Check(ConfigArgs),
    /// Show a running proxy's open streams live, from its admin listener ([admin]).
    Top(crate::top::TopArgs),
    /// Print meridian.toml's JSON Schema (every field's type, bounds, default and meaning),
    /// for editors that validate and complete TOML against one.
    Schema,
}

#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Config file (default: ./meridian.toml when it exists, else built-in defaults).
    #[arg(long, short, env = "MERIDIAN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen address (server.listen).
    #[arg(long, env = "MERIDIAN_LISTEN")]
    pub listen: Option<String>,
    /// Upstream base URL, repeatable (replaces upstream.endpoints).
    #[arg(long = "upstream", env = "MERIDIAN_UPSTREAMS", value_delimiter = ',')]
    pub upstreams: Vec<String>,
    /// Serve simulated answers from the embedded engine twin, a stand-in for vLLM on
    /// machines without one (twin.enabled; only with no upstream).
    #[arg(long)]
    pub twin: bool,
    /// Log filter (telemetry.log_level).
    #[arg(long, env = "MERIDIAN_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Any setting as dotted.path=value, repeatable (e.g. upstream.max_attempts=3).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigArgs {
    /// The config file to read, if any.
    pub fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            let default = PathBuf::from("meridian.toml");
            default.is_file().then_some(default)
        })
    }

    /// Environment overrides, then flag overrides, in the order they apply.
    pub fn overrides(
        &self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Vec<Override>, ConfigError> {
        let mut out = Override::from_env(env);
        for spec in &self.set {
            out.push(Override::parse(spec, "--set")?);
        }
        if let Some(listen) = &self.listen {
            out.push(Override {
                path: "server.listen".into(),
                value: toml::Value::String(listen.clone()),
                origin: "--listen".into(),
            });
        }
        if !self.upstreams.is_empty() {
            let endpoints = self
                .upstreams
                .iter()
                .map(|url| {
                    let mut t = toml::Table::new();
                    t.insert("url".into(), toml::Value::String(url.trim().to_owned()));
                    toml::Value::Table(t)
                })
                .collect();
            out.push(Override {
                path: "upstream.endpoints".into(),
                value: toml::Value::Array(endpoints),
                origin: "--upstream".into(),
            });
        }
        if self.twin {
            out.push(Override {
                path: "twin.enabled".into(),
                value: toml::Value::Boolean(true),
                origin: "--twin".into(),
            });
        }
        if let Some(level) = &self.log_level {
            out.push(Override {
                path: "telemetry.log_level".into(),
                value: toml::Value::String(level.clone()),
                origin: "--log-level".into(),
            });
        }
        Ok(out)
    }
}
