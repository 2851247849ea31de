//! Think budgets (`[budget]`): fields, defaults and checks.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::validate::Checker;
use crate::models::ModelRegistry;

/// Think budgets the proxy applies.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// How thinking is ended on upstreams without a ready hook.
    pub forcing: Forcing,
    /// Budget for requests that set none; unset: no budget.
    pub think_tokens: Option<u32>,
    /// Per model family, overriding `think_tokens`.
    pub per_family: BTreeMap<String, u32>,
    /// Seconds of thinking for requests that set none: the hook is told to end thinking,
    /// or (without one) the proxy continues the stream past the delimiter.
    pub think_seconds: Option<f64>,
}

/// How the proxy ends thinking on an upstream whose hook is not ready. (With a ready
/// hook, the hook always does it: no second request, no second prefill.)
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
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
    pub(super) fn check(&self, c: &mut Checker, models: &ModelRegistry) {
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
