use super::{RequestView, SchedulingPolicy, by_arrival};
use crate::Phase;

/// Reasoning first, answers paced (after PASCAL, arXiv 2602.11530): the answer only has to
/// stay ahead of its reader, so an answering request that is more than `lead_tokens`
/// ahead of `reader_tokens_per_s` since its thinking ended sits out steps, and the step it
/// frees goes to requests still thinking — the ones whose users see nothing yet.
///
/// - Running order: thinking, then prefill, then answering; arrival order within each.
/// - Waiting order: arrival order (preempted requests keep their place).
/// - Victim: an answering request that is ahead of its reader (most recently arrived),
///   else the most recently arrived request, as stock vLLM does.
#[derive(Debug, Clone)]
pub struct ReasoningFirst {
    pub reader_tokens_per_s: f64,
    pub lead_tokens: f64,
}

impl Default for ReasoningFirst {
    fn default() -> Self {
        // ~25 tokens/s is a fast reader; a 2-second lead absorbs stalls.
        ReasoningFirst { reader_tokens_per_s: 25.0, lead_tokens: 50.0 }
    }
}

impl ReasoningFirst {
    /// How many tokens an answering request may have produced by `now_s`.
    fn allowance(&self, r: &RequestView, now_s: f64) -> Option<f64> {
        let since = now_s - r.think_ended_s?;
        Some(self.lead_tokens + self.reader_tokens_per_s * since.max(0.0))
    }

    fn ahead_of_reader(&self, r: &RequestView, now_s: f64) -> bool {
        r.phase == Phase::Output && self.allowance(r, now_s).is_some_and(|a| f64::from(r.output_tokens) >= a)
    }

    /// When the reader catches up with what an answering request has produced: the
    /// allowance grows by `reader_tokens_per_s`, so it passes `output_tokens` then.
    fn reader_catches_up_s(&self, r: &RequestView) -> Option<f64> {
        let ended = r.think_ended_s?;
        let rate = self.reader_tokens_per_s;
        (rate > 0.0).then(|| ended + (f64::from(r.output_tokens) - self.lead_tokens) / rate)
    }
}

fn rank(r: &RequestView) -> u8 {
    match r.phase {
        Phase::Think => 0,
        Phase::Pending => 1,
        Phase::Output => 2,
    }
}

impl SchedulingPolicy for ReasoningFirst {
    fn name(&self) -> &str {
        "reasoning-first"
    }

    fn order_running(&mut self, running: &mut Vec<RequestView>, _now_s: f64) {
        running.sort_by(|a, b| rank(a).cmp(&rank(b)).then(by_arrival(a, b)));
    }

    fn order_waiting(&mut self, waiting: &mut Vec<RequestView>, _now_s: f64) {
        waiting.sort_by(by_arrival);
    }

    fn pick_victim(&mut self, running: &[RequestView], now_s: f64) -> usize {
        let ahead = running
            .iter()
            .enumerate()
            .filter(|(_, r)| self.ahead_of_reader(r, now_s))
            .max_by(|(_, a), (_, b)| by_arrival(a, b));
        let latest = running.iter().enumerate().max_by(|(_, a), (_, b)| by_arrival(a, b));
        ahead.or(latest).map_or(0, |(i, _)| i)
    }

    fn defer(&mut self, request: &RequestView, now_s: f64) -> bool {
        self.ahead_of_reader(request, now_s)
    }

    fn deferred_until(&mut self, request: &RequestView, now_s: f64) -> Option<f64> {
        if !self.ahead_of_reader(request, now_s) {
            return None;
        }
        self.reader_catches_up_s(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answering(seq: u64, output_tokens: u32, think_ended_s: f64) -> RequestView {
        RequestView {
            seq,
            arrival_s: seq as f64,
            priority: 0,
            phase: Phase::Output,
            prefill_remaining: 0,
            think_tokens: 10,
            output_tokens,
            think_ended_s: Some(think_ended_s),
            think_ends_next: false,
            queued_s: None,
        }
    }

    #[test]
    fn answers_are_paced_to_the_reader() {
        let mut p = ReasoningFirst { reader_tokens_per_s: 10.0, lead_tokens: 5.0 };
        // 2 s after thinking ended the reader allows 5 + 20 = 25 tokens.
        assert!(!p.defer(&answering(0, 24, 0.0), 2.0));
        assert!(p.defer(&answering(0, 25, 0.0), 2.0));
        let mut thinking = answering(1, 0, 0.0);
        thinking.phase = Phase::Think;
        thinking.think_ended_s = None;
        assert!(!p.defer(&thinking, 2.0), "thinking is never deferred");
    }

    #[test]
    fn a_deferred_answer_resumes_when_its_reader_catches_up() {
        let mut p = ReasoningFirst { reader_tokens_per_s: 10.0, lead_tokens: 5.0 };
        // 25 tokens out: the reader allows them at 5 + 10 t = 25, t = 2 s.
        let ahead = answering(0, 25, 0.0);
        assert_eq!(p.deferred_until(&ahead, 1.0), Some(2.0));
        assert!(!p.defer(&ahead, 2.0 + 1e-9), "runs again right after that time");
        assert_eq!(p.deferred_until(&answering(0, 3, 0.0), 1.0), None, "not deferred at all");
    }

    #[test]
    fn victim_is_an_answer_ahead_of_its_reader_before_anyone_else() {
        let mut p = ReasoningFirst { reader_tokens_per_s: 10.0, lead_tokens: 5.0 };
        let mut thinking = answering(9, 0, 0.0);
        thinking.phase = Phase::Think;
        let running = vec![answering(0, 100, 0.0), answering(1, 1, 0.0), thinking];
        assert_eq!(p.pick_victim(&running, 1.0), 0);
        let running = vec![answering(1, 1, 0.0), running[2].clone()];
        assert_eq!(p.pick_victim(&running, 1.0), 1, "nobody ahead: the latest arrival");
    }
}
