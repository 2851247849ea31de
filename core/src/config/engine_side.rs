//! The sections the engine's hook reads as well as the proxy: the in-engine hook
//! (`[hook]`) and the end of thinking gated on entropy (`[exit]`: the hook from logits,
//! the proxy from streamed logprobs or probes).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Checker;
use crate::signals::{EatConfig, RpdiConfig};

/// The vLLM hook (`meridian-vllm-hook`) and its policy channel to the proxy.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HookConfig {
    /// Where the hook's policy channel (and its `/metrics`, `/health`) listens inside vLLM. In
    /// a pod `0.0.0.0:9470` (the chart sets it).
    #[schemars(extend("x-kind" = "address", "x-range" = "`host:port`"))]
    pub listen: String,
    /// Environment variable with the channel's shared secret, on both sides. The hook refuses
    /// to open the channel without it.
    #[schemars(length(min = 1), regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"))]
    pub token_env: String,
    /// Scheduling policy the hook applies inside the engine. `slo-driven`, the default ([ADR
    /// 0010](adr/0010-slo-driven-default.md)), schedules exactly as vLLM (its order, no limits)
    /// while the engine's smoothed step time, which is every answering request's inter-token
    /// latency, stays under `output_itl_target_ms` (default 100), and applies output-first's
    /// limits only while it is over, relaxing again below `relax_below` of the target (0.7),
    /// and never while a request has waited in the engine's queue, not yet admitted, longer
    /// than `start_wait_target_s` (default 1; `inf`: starts never lift the limits) ([ADR
    /// 0012](adr/0012-slo-driven-start-target.md)); it takes output-first's parameters for
    /// that mode, and `relax_to_stock=0` relaxes to reasoning-first pacing instead. `output-first` protects answers always: while someone
    /// answers, a step's prompt tokens are capped at half of vLLM's `max_num_batched_tokens`
    /// (`output_prefill_share=0.5`; `output_prefill_cap=N` caps at N tokens instead), and a
    /// request that has just finished thinking gets a step of answering requests only.
    #[schemars(length(min = 1), extend("x-kind" = "policy", "x-range" = "as `twin.policy`"))]
    pub policy: String,
    /// Compute the entropy of thinking rows' logits inside the engine (what `[exit]` signals
    /// read in the engine). Nothing else needs it: it can be off while `exit.signal = "off"`.
    pub entropy: bool,
    /// How long the proxy waits for a channel reply before falling back to the HTTP API. Keep
    /// it short: it is on the request path.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout_s: f64,
    /// What the hook does inside a vLLM release outside the range it supports (the `vllm` extra
    /// of the `meridian-vllm-hook` package) or one that lacks an internal it needs: `refuse`
    /// stops the engine at start-up with an error naming each problem; `disable` runs it as
    /// stock vLLM, sets `meridian_hook_disabled` to 1 and answers the proxy's hello with policy
    /// `disabled`, so the proxy ends thinking as for an upstream without a hook.
    pub on_unsupported_vllm: OnUnsupportedVllm,
}

/// What the hook does on a vLLM it does not support.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
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
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExitConfig {
    /// Entropy-gated end of thinking. `off`: budgets only. `rpdi`: recent vs overall token
    /// entropy at sentence boundaries. `eat`: entropy after a probed end-of-thinking delimiter
    /// settles. Where it runs: `rpdi` inside the engine (the hook's logits processor, from full
    /// logits); `eat` in the proxy, which sends one-token probe requests (the reasoning so far
    /// closed by the delimiter, `continue_final_message`, top 20 logprobs; they reuse the
    /// stream's prefix cache) and tells the hook to end thinking. With a ready hook, `rpdi`
    /// runs in the engine and either signal ends thinking through the hook; without one, both
    /// act by continuation (`budget.forcing` other than `engine`), `rpdi` then computed in the
    /// proxy from the streamed top 20 logprobs (the proxy asks for them and hides them from
    /// clients that did not). Try a signal on recorded traffic before switching it on.
    pub signal: ExitSignal,
    /// No signal ends thinking before this many thinking tokens.
    pub min_think_tokens: u32,
    /// RPDI: recent window in tokens. Values come from second-hand descriptions of the paper:
    /// tune them on your traffic.
    #[schemars(range(min = 8, max = 65536))]
    pub rpdi_window: u32,
    /// RPDI: the ratio above which thinking ends. Higher ends thinking less often.
    #[schemars(extend("exclusiveMinimum" = 1))]
    pub rpdi_lambda: f64,
    /// EAT: EMA weight of the probed entropy.
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub eat_alpha: f64,
    /// EAT: variance threshold under which thinking ends. Lower ends thinking less often.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub eat_delta: f64,
    /// EAT: samples before a stop may fire.
    pub eat_warmup_steps: u32,
    /// EAT: thinking tokens between two probes. Lower reacts sooner and costs more engine work.
    #[schemars(range(min = 1, max = 1_048_576))]
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

impl HookConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub fn check(&self, c: &mut Checker) {
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
    pub fn check(&self, c: &mut Checker) {
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
