//! When a start has waited: what the scheduler tells its policy of the requests waiting
//! to start, in vLLM's queue and, before it, in Meridian's admission queue (ADR 0012).

use super::SchedulerCore;

/// The start that has waited longest, as the policy reads it (`observe_waiting`): the
/// arrival of the oldest request in vLLM's queue, or, for a running request still
/// computing its prompt that had already waited in Meridian's admission queue before it
/// reached vLLM, a start that has waited that long as of `now`. Its own prefill is not
/// counted as waiting (a long prompt's takes seconds by itself), its wait in the proxy is.
pub(super) fn oldest_start(in_queue: Option<f64>, proxy_wait: Option<f64>, now: f64) -> Option<f64> {
    let from_proxy = proxy_wait.map(|waited| now - waited);
    match (in_queue, from_proxy) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl SchedulerCore {
    /// The longest wait in Meridian's admission queue among the running requests still
    /// computing their prompt (`None`: none had waited there).
    pub(super) fn longest_proxy_wait(&self, row_slots: &[usize], prefilling: &[bool]) -> Option<f64> {
        row_slots
            .iter()
            .zip(prefilling)
            .filter(|(_, p)| **p)
            .filter_map(|(&slot, _)| self.slot(slot).object.as_ref().map(|o| o.queued_s))
            .filter(|&q| q > 0.0)
            .reduce(f64::max)
    }
}
