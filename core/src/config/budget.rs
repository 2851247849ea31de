//! Think budgets (`[budget]`): fields, defaults and checks.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Checker;
use crate::models::ModelRegistry;

/// Think budgets the proxy applies.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// How thinking is ended on upstreams without a ready hook (a ready hook always does it in
    /// place). `auto`: token budgets as vLLM's `thinking_token_budget`, continuation for time
    /// budgets and entropy exits. `engine`: `thinking_token_budget` only. `continuation`:
    /// everything by continuation — the proxy drops the think stream at the cut and sends the
    /// conversation plus the reasoning so far closed by the family's delimiter
    /// (`continue_final_message`), splicing the answer into the client's stream with one id and
    /// merged usage; for OpenAI-compatible engines without `thinking_token_budget`. Costs a
    /// second prefill (mostly prefix-cache hits). Streamed requests with `n` = 1 and families
    /// with text delimiters only; others fall back to `thinking_token_budget`. See [the proxy
    /// data path](architecture/proxy.md#forcing-by-continuation-no-hook).
    pub forcing: Forcing,
    /// Think budget for requests that set none (`"meridian": {"think_budget_tokens": N}` sets
    /// one). Enforced by the upstream's hook when ready, else as `budget.forcing` says: vLLM's
    /// `thinking_token_budget` (the engine needs `--reasoning-parser`) or continuation. Start
    /// from your p95 of useful thinking; too low cuts reasoning short and costs answer quality.
    #[schemars(range(min = 1))]
    pub think_tokens: Option<u32>,
    /// Per model family, overriding `budget.think_tokens`.
    #[schemars(extend("additionalProperties" = {"type": "integer", "format": "uint32", "minimum": 1}, "x-key" = "family", "x-range" = "≥ 1, an existing family"))]
    pub per_family: BTreeMap<String, u32>,
    /// Thinking-time budget for requests that set none (`"meridian": {"think_budget_s": S}`
    /// sets one): once a stream has thought this long, the proxy tells the upstream's hook to
    /// end thinking now, or, without a ready hook, cuts the stream and continues it (unless
    /// `budget.forcing = "engine"`, where it is not enforced).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub think_seconds: Option<f64>,
}

/// How the proxy ends thinking on an upstream whose hook is not ready. (With a ready
/// hook, the hook always does it: no second request, no second prefill.)
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Forcing {
    /// Token budgets through vLLM's `thinking_token_budget`; what only the proxy can
    /// enforce (time budgets, entropy exits) by continuation.
    #[default]
    Auto,
    /// vLLM's `thinking_token_budget` alone; time budgets and entropy exits are not
    /// enforced without a hook.
    Engine,
    /// Everything by continuation: the proxy ends the upstream's think stream and
    /// continues it with the reasoning so far plus the end-of-thinking delimiter, for
    /// OpenAI-compatible engines without `thinking_token_budget`.
    Continuation,
}

impl BudgetConfig {
    /// The configured budget for a family (`None` family: an unrecognised model).
    pub fn for_family(&self, family: Option<&str>) -> Option<u32> {
        family.and_then(|f| self.per_family.get(f).copied()).or(self.think_tokens)
    }
}

impl BudgetConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub fn check(&self, c: &mut Checker, models: &ModelRegistry) {
        if self.think_tokens == Some(0) {
            c.fail("budget.think_tokens", "must be at least 1 (leave it unset for no budget)");
        }
        if let Some(s) = self.think_seconds {
            if !(s.is_finite() && s > 0.0) {
                c.fail("budget.think_seconds", format!("must be a positive number of seconds; got {s}"));
            }
        }
        for (family, n) in &self.per_family {
            if models.get(family).is_none() {
                c.fail(format!("budget.per_family.{family}"), format!("names unknown family {family:?}"));
            } else if *n == 0 {
                c.fail(format!("budget.per_family.{family}"), "must be at least 1");
            }
        }
    }
}
