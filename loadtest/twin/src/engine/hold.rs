//! Who sits a step out: the requests a policy's limits hold out of it, and when the hook
//! lets them.
//!
//! The hook's scheduler (`MeridianScheduler._meridian_apply_limits`) takes out of vLLM's
//! running list, for one step, the answers its policy paces to their readers, the thinkers
//! past its think-decode cap and, in a step that computes no prompt token, the requests
//! still computing their prompts. It does so only while the pool has a free block for every
//! request it keeps: otherwise vLLM would have to preempt, and with the held requests out
//! of its list the victim would be one the policy wanted to keep. In such a step nobody is
//! held, and a prompt the cap of no prompt tokens would have held runs its chunk (the hook
//! then only stops new admissions). The twin follows the same rule: under KV pressure a
//! paced answer runs on and frees its blocks, instead of keeping them for its reader.
//! A held request is out of the running list for the step, so it is never the one
//! preempted, and it goes back at the list's end, as the hook puts it back.

use meridian_core::Phase;
use meridian_core::sched::StepLimits;

use super::Engine;

/// The requests held out of one step, in running order.
#[derive(Debug, Default)]
pub(super) struct Holds {
    pub seqs: Vec<u64>,
    /// The earliest time a paced request may run again (`None`: none is paced).
    pub resume_s: Option<f64>,
}

impl Engine {
    /// The requests `limits` and the policy's pacing keep out of this step, in the running
    /// list's order (the policy's, victim last); none when the pool lacks a free block for
    /// every request kept.
    pub(super) fn holds(&mut self, limits: &StepLimits, now: f64) -> Holds {
        let mut holds = Holds::default();
        let mut thinking = 0u32;
        for seq in &self.running {
            let Some(r) = self.requests.get(seq) else { continue };
            let view = r.view();
            if view.prefill_remaining > 0 {
                if limits.max_prefill_tokens == Some(0) {
                    holds.seqs.push(*seq);
                }
                continue;
            }
            if self.policy.defer(&view, now) {
                if let Some(t) = self.policy.deferred_until(&view, now) {
                    holds.resume_s = Some(holds.resume_s.map_or(t, |r: f64| r.min(t)));
                }
                holds.seqs.push(*seq);
                continue;
            }
            if let Some(cap) = limits.max_think_decodes
                && view.phase == Phase::Think
            {
                if thinking >= cap {
                    holds.seqs.push(*seq);
                } else {
                    thinking += 1;
                }
            }
        }
        let kept = self.running.len() - holds.seqs.len();
        if (self.pool.free() as usize) < kept {
            return Holds::default();
        }
        holds
    }
}
