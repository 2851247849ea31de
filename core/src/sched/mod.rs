//! Scheduling policy: the decisions a continuous-batching engine makes each step, as a
//! plain trait apart from any engine. The engine twin calls it every simulated step; the
//! in-engine vLLM hook will call the same implementations from vLLM's scheduler, so
//! experiments on the twin exercise the code that runs in production.
//!
//! The engine owns the mechanics (token budget, KV blocks, chunked prefill); a policy only
//! orders requests and picks preemption victims, from a read-only view of each request.

mod fcfs;
mod output_first;
mod priority;
mod reasoning_first;
mod slo_driven;

pub use fcfs::Fcfs;
pub use output_first::OutputFirst;
pub use priority::Priority;
pub use reasoning_first::ReasoningFirst;
pub use slo_driven::SloDriven;

use crate::Phase;

/// What a policy may know about a request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestView {
    /// Engine-assigned sequence number; lower arrived earlier.
    pub seq: u64,
    /// Arrival time in seconds on the engine's clock.
    pub arrival_s: f64,
    /// vLLM-style priority: lower runs first.
    pub priority: i32,
    pub phase: Phase,
    /// Tokens of KV still to compute before the request can sample again: its prompt
    /// (0 once decoding) and, where the engine knows it (the twin), tokens generated
    /// before a preemption that are being recomputed.
    pub prefill_remaining: u32,
    pub think_tokens: u32,
    pub output_tokens: u32,
    /// Engine time when the request last left the think phase, if it did.
    pub think_ended_s: Option<f64>,
    /// Thinking, and the next token it samples is forced to close the thought (its
    /// think budget is spent): the step that samples that delimiter shows the reader
    /// nothing, but the first visible token waits for it. Natural ends cannot be known.
    pub think_ends_next: bool,
    /// Engine time since when it has been waiting (arrival or preemption); `None` while
    /// running.
    pub queued_s: Option<f64>,
}

/// Arrival order (then engine sequence number), the tie-breaker every policy uses.
pub(crate) fn by_arrival(a: &RequestView, b: &RequestView) -> std::cmp::Ordering {
    a.arrival_s.total_cmp(&b.arrival_s).then(a.seq.cmp(&b.seq))
}

/// Limits a policy may put on one step, on top of the engine's own budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepLimits {
    /// Prompt tokens (prefill chunks, running or newly admitted) the step may compute.
    /// A long prefill chunk lengthens the step for every decoding request.
    pub max_prefill_tokens: Option<u32>,
    /// Think-phase requests that may decode in this step; the rest sit it out.
    pub max_think_decodes: Option<u32>,
}

/// The per-step decisions of a continuous-batching scheduler.
pub trait SchedulingPolicy: Send {
    /// Short name for reports and metric labels.
    fn name(&self) -> &str;

    /// Reorders the running requests: earlier ones get the step's token budget first,
    /// and the engine's stock victim is the last one.
    fn order_running(&mut self, running: &mut Vec<RequestView>, now_s: f64);

    /// Reorders the waiting queue: earlier ones are admitted first.
    fn order_waiting(&mut self, waiting: &mut Vec<RequestView>, now_s: f64);

    /// Index into `running` of the request to preempt when KV blocks run out.
    fn pick_victim(&mut self, running: &[RequestView], now_s: f64) -> usize;

    /// The engine's token budget per step (vLLM's `max_num_batched_tokens`), told once
    /// before the first step. Limits that must scale with the engine (a prefill cap
    /// that is harmless at one budget starves prompts at another) are shares of it.
    fn set_step_budget(&mut self, _tokens: u32) {}

    /// The engine preempted a request (KV blocks ran out). Engines call it after a
    /// preemption actually happens; `pick_victim` may also be asked just to rank.
    fn on_preempted(&mut self, _now_s: f64) {}

    /// The request that has waited longest to start: its arrival on the engine's clock,
    /// among those in the waiting queue that have generated nothing yet (new requests,
    /// not preempted ones); `None` when none waits. Engines tell it once per step, before
    /// [`SchedulingPolicy::step_limits`]: a limit on prompt tokens delays exactly these
    /// requests' starts, so a policy that weighs starts against answers needs it. An
    /// engine whose requests may first wait elsewhere counts that wait as well: the hook
    /// moves each arrival back by the request's wait in Meridian's admission queue, and
    /// counts a running request still computing its prompt as having waited just that.
    fn observe_waiting(&mut self, _oldest_start_arrival_s: Option<f64>) {}

    /// Limits for the coming step, given the running requests (in the policy's order).
    /// The stock engine has none.
    fn step_limits(&mut self, _running: &[RequestView], _now_s: f64) -> StepLimits {
        StepLimits::default()
    }

    /// Whether a decoding request sits out the coming step (for pacing). Stock: never.
    /// A deferral must lapse as time passes: an engine whose every request is deferred
    /// idles until the earliest [`SchedulingPolicy::deferred_until`].
    fn defer(&mut self, _request: &RequestView, _now_s: f64) -> bool {
        false
    }

    /// Engine time from which a request that `defer` holds back may run again; `None`
    /// when the policy cannot say (an idle engine then asks again after a short wait).
    fn deferred_until(&mut self, _request: &RequestView, _now_s: f64) -> Option<f64> {
        None
    }
}

/// The policies by name, for configuration and command lines.
pub const POLICY_NAMES: [&str; 5] = ["fcfs", "priority", "output-first", "reasoning-first", "slo-driven"];

/// A policy by its configuration name, optionally with parameters:
/// `output-first:think_decode_cap=16,output_prefill_share=0.25` or
/// `reasoning-first:reader_tokens_per_s=30`; `slo-driven` also takes output-first's
/// parameters, for its output-first mode, `output_itl_target_ms`, `relax_below`, and
/// `relax_to_stock=0` to relax to reasoning-first pacing instead of vLLM's own order,
/// and `start_wait_target_s` (`inf`: starts never lift the limits).
/// `None` for an unknown name or parameter.
pub fn policy_by_name(spec: &str) -> Option<Box<dyn SchedulingPolicy>> {
    let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
    let mut pairs = Vec::new();
    for kv in params.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = kv.split_once('=')?;
        pairs.push((k.trim(), v.trim().parse::<f64>().ok()?));
    }
    match name {
        "fcfs" if pairs.is_empty() => Some(Box::new(Fcfs)),
        "priority" if pairs.is_empty() => Some(Box::new(Priority)),
        "output-first" => {
            let mut p = OutputFirst::default();
            for (k, v) in pairs {
                set_output_first(&mut p, k, v)?;
            }
            Some(Box::new(p))
        }
        "reasoning-first" => {
            let mut p = ReasoningFirst::default();
            for (k, v) in pairs {
                match k {
                    // A reader who never reads would hold every answer back forever.
                    "reader_tokens_per_s" if v > 0.0 && v.is_finite() => p.reader_tokens_per_s = v,
                    "lead_tokens" if v >= 0.0 && v.is_finite() => p.lead_tokens = v,
                    _ => return None,
                }
            }
            Some(Box::new(p))
        }
        "slo-driven" => {
            let mut p = SloDriven::default();
            for (k, v) in pairs {
                match k {
                    "output_itl_target_ms" => p.output_itl_target_s = v / 1000.0,
                    "relax_below" => p.relax_below = v,
                    "relax_to_stock" => p.relax_to_stock = v != 0.0,
                    "start_wait_target_s" if v > 0.0 => p.start_wait_target_s = v,
                    // Anything else sets its output-first mode, named as output-first's.
                    _ => set_output_first(&mut p.output_first, k, v)?,
                }
            }
            Some(Box::new(p))
        }
        _ => None,
    }
}

/// Sets one output-first parameter (for output-first itself and for slo-driven's
/// output-first mode); `None` for an unknown key or a value out of range.
fn set_output_first(p: &mut OutputFirst, key: &str, v: f64) -> Option<()> {
    let cap = |v: f64| (v >= 0.0).then_some(v as u32);
    match key {
        "protect_after_think_s" => p.protect_after_think_s = v,
        "max_think_wait_s" => p.max_think_wait_s = v,
        "output_prefill_cap" => p.output_prefill_cap = cap(v),
        "output_prefill_share" if (0.0..=1.0).contains(&v) => p.output_prefill_share = v,
        "think_decode_cap" => p.think_decode_cap = cap(v),
        "pressure_hold_s" => p.pressure_hold_s = v,
        "express" => p.express = v != 0.0,
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_by_name_with_parameters() {
        for name in POLICY_NAMES {
            assert_eq!(policy_by_name(name).unwrap().name(), name);
        }
        assert!(policy_by_name("output-first:think_decode_cap=16,output_prefill_cap=256").is_some());
        assert!(policy_by_name("output-first:output_prefill_share=0.25").is_some());
        assert!(policy_by_name("output-first:output_prefill_share=1.5").is_none(), "a share of the budget");
        assert!(policy_by_name("slo-driven:output_prefill_share=0.25").is_some());
        assert!(policy_by_name("slo-driven:relax_to_stock=1,output_itl_target_ms=60").is_some());
        assert!(policy_by_name("slo-driven:start_wait_target_s=inf").is_some(), "starts never lift limits");
        assert!(policy_by_name("slo-driven:start_wait_target_s=0").is_none(), "limits that never apply");
        assert!(policy_by_name("reasoning-first:reader_tokens_per_s=30").is_some());
        assert!(policy_by_name("reasoning-first:reader_tokens_per_s=0").is_none(), "answers never resume");
        assert!(policy_by_name("reasoning-first:lead_tokens=-1").is_none());
        assert!(policy_by_name("output-first:nonsense=1").is_none());
        assert!(policy_by_name("output-first:think_decode_cap").is_none());
        assert!(policy_by_name("fcfs:x=1").is_none());
        assert!(policy_by_name("lifo").is_none());
    }
}
