//! The sections about what engines are told: the in-engine hook (`[hook]`), the end of
//! thinking gated on entropy (`[exit]`: the hook from logits, later the proxy from
//! streamed logprobs), and the vLLM priorities the proxy sends (`[priority]`).

use serde::Deserialize;

use super::validate::Checker;
use crate::signals::{EatConfig, RpdiConfig};

/// The vLLM hook (`meridian-vllm-hook`) and its policy channel to the proxy.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HookConfig {
    /// Address the hook's policy channel listens on, inside vLLM's engine-core process.
    pub listen: String,
    /// Environment variable holding the channel's shared secret, read on both sides.
    pub token_env: String,
    /// Scheduling policy the hook applies inside the engine (names as `twin.policy`).
    pub policy: String,
    /// Compute the entropy of every thinking row's logits inside the engine and feed the
    /// `[exit]` signal with it.
    pub entropy: bool,
    /// Seconds the proxy waits for a channel reply before it treats the hook as absent
    /// and falls back to what the HTTP API can do.
    pub timeout_s: f64,
    /// What the hook does inside a vLLM release outside the range it supports, or one
    /// that lacks an internal it needs.
    pub on_unsupported_vllm: OnUnsupportedVllm,
}

/// What the hook does on a vLLM it does not support.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnUnsupportedVllm {
    /// The engine does not start; its log names each problem.
    #[default]
    Refuse,
    /// The engine runs as stock vLLM; the hook says so on its metrics
    /// (`meridian_hook_disabled`) and to the proxy, which ends thinking itself.
    Disable,
}

impl OnUnsupportedVllm {
    pub fn as_str(self) -> &'static str {
        match self {
            OnUnsupportedVllm::Refuse => "refuse",
            OnUnsupportedVllm::Disable => "disable",
        }
    }
}

impl Default for HookConfig {
    fn default() -> Self {
        HookConfig {
            listen: "127.0.0.1:9470".into(),
            token_env: "MERIDIAN_HOOK_TOKEN".into(),
            policy: "slo-driven".into(),
            entropy: true,
            timeout_s: 1.0,
            on_unsupported_vllm: OnUnsupportedVllm::Refuse,
        }
    }
}

/// Which signal ends thinking early.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExitSignal {
    /// Only budgets end thinking.
    #[default]
    Off,
    /// Recent vs overall token entropy at sentence boundaries.
    Rpdi,
    /// Entropy after a probed end-of-thinking delimiter, EMA variance settles.
    Eat,
}

/// Entropy-gated ends of thinking.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExitConfig {
    pub signal: ExitSignal,
    /// Never end thinking on a signal before this many thinking tokens.
    pub min_think_tokens: u32,
    /// RPDI: tokens in the recent window, and the ratio past which thinking ends.
    pub rpdi_window: u32,
    pub rpdi_lambda: f64,
    /// EAT: EMA weight, variance threshold, samples before a stop may fire, and
    /// thinking tokens between two probes.
    pub eat_alpha: f64,
    pub eat_delta: f64,
    pub eat_warmup_steps: u32,
    pub eat_probe_every_tokens: u32,
}

impl Default for ExitConfig {
    fn default() -> Self {
        let rpdi = RpdiConfig::default();
        let eat = EatConfig::default();
        ExitConfig {
            signal: ExitSignal::Off,
            min_think_tokens: 256,
            rpdi_window: rpdi.window as u32,
            rpdi_lambda: rpdi.lambda,
            eat_alpha: eat.alpha,
            eat_delta: eat.delta,
            eat_warmup_steps: eat.warmup_steps,
            eat_probe_every_tokens: 64,
        }
    }
}

impl ExitConfig {
    pub fn rpdi(&self) -> RpdiConfig {
        RpdiConfig { window: self.rpdi_window as usize, lambda: self.rpdi_lambda }
    }

    pub fn eat(&self) -> EatConfig {
        EatConfig { alpha: self.eat_alpha, delta: self.eat_delta, warmup_steps: self.eat_warmup_steps }
    }
}

/// vLLM request priorities the proxy sends as `X-Vllm-Priority`, by admission class
/// (vLLM's convention: lower runs first). vLLM refuses a priority other than 0 unless it
/// runs with `--scheduling-policy priority`, hence off by default.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityConfig {
    pub enabled: bool,
    /// Requests that start in the output phase (thinking switched off).
    pub output: i32,
    pub interactive: i32,
    /// Requests marked `"meridian": {"class": "batch"}`.
    pub batch: i32,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig { enabled: false, output: -10, interactive: 0, batch: 10 }
    }
}

impl HookConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            c.fail("hook.listen", format!("must be an address like 0.0.0.0:9470; got {:?}", self.listen));
        }
        if self.token_env.trim().is_empty() {
            c.fail("hook.token_env", "must name an environment variable");
        }
        c.policy("hook.policy", &self.policy);
        c.positive("hook.timeout_s", self.timeout_s);
    }
}

impl ExitConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        c.range_u32("exit.rpdi_window", self.rpdi_window, 8, 1 << 16);
        if !(self.rpdi_lambda.is_finite() && self.rpdi_lambda > 1.0) {
            c.fail("exit.rpdi_lambda", format!("must be a ratio above 1; got {}", self.rpdi_lambda));
        }
        c.unit_interval("exit.eat_alpha", self.eat_alpha);
        if !(self.eat_delta.is_finite() && self.eat_delta > 0.0) {
            c.fail("exit.eat_delta", format!("must be a positive variance; got {}", self.eat_delta));
        }
        c.range_u32("exit.eat_probe_every_tokens", self.eat_probe_every_tokens, 1, 1 << 20);
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
