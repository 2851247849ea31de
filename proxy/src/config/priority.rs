//! The vLLM priorities the proxy sends (`[priority]`): fields, defaults and checks.

use meridian_core::config::Checker;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// vLLM request priorities the proxy sends as `X-Vllm-Priority`, by admission class
/// (vLLM's convention: lower runs first). vLLM refuses a priority other than 0 unless it
/// runs with `--scheduling-policy priority`, hence off by default.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityConfig {
    /// Send each request's vLLM priority as `X-Vllm-Priority`, by admission class. Needs
    /// engines started with `--scheduling-policy priority` (vLLM refuses a priority other than
    /// 0 otherwise). A client's own `X-Vllm-Priority` header or `priority` field is left alone.
    pub enabled: bool,
    /// Priority of requests that start answering at once (thinking switched off). Lower runs
    /// first and is preempted last.
    #[schemars(extend("x-range" = "≤ `priority.interactive`"))]
    pub output: i32,
    /// Priority of ordinary requests.
    pub interactive: i32,
    /// Priority of requests marked `"meridian": {"class": "batch"}`.
    #[schemars(extend("x-range" = "≥ `priority.interactive`"))]
    pub batch: i32,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig { enabled: false, output: -10, interactive: 0, batch: 10 }
    }
}

impl PriorityConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        if self.output > self.interactive {
            c.fail(
                "priority.output",
                format!(
                    "must not be above priority.interactive ({}): lower runs first; got {}",
                    self.interactive, self.output
                ),
            );
        }
        if self.interactive > self.batch {
            c.fail(
                "priority.batch",
                format!(
                    "must not be below priority.interactive ({}): lower runs first; got {}",
                    self.interactive, self.batch
                ),
            );
        }
    }
}
