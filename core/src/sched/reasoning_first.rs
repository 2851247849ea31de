use super::{RequestView, SchedulingPolicy, by_arrival};
use crate::Phase;

/// Reasoning first, answers paced (after PASCAL, arXiv 2602.11530): the answer only has to
/// stay ahead of its reader, so an answering request that is more than `lead_tokens`
/// ahead of `reader_tokens_per_s` since its thinking ended sits out steps, and the step it
/// frees goes to requests still thinking — the ones whose users see nothing yet.
///
/// - Running order: thinking, then prefill, then answering; arrival order within each.
/// - Waiting order: arrival order (preempted requests keep their place).
/// - Victim (KV blocks ran out): the most recently arrived request not yet answering,
///   whose user sees nothing yet; with every running request answering, the most recently
///   arrived one ahead of its reader, else the most recently arrived. A paced answer is
///   not given up first: a preempted request resumes only after its prompt, thought and
///   answer so far are computed again, in a cache still short, which takes longer than an
///   answer's lead (on the real engine, set 15 of the policies page: giving up answers
///   ahead of their reader took 66 of 136 preemptions and stalled a third of the answers).
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
        let latest_where = |keep: &dyn Fn(&RequestView) -> bool| {
            running.iter().enumerate().filter(|(_, r)| keep(r)).max_by(|(_, a), (_, b)| by_arrival(a, b))
        };
        latest_where(&|r| r.phase != Phase::Output)
            .or_else(|| latest_where(&|r| self.ahead_of_reader(r, now_s)))
            .or_else(|| latest_where(&|_| true))
            .map_or(0, |(i, _)| i)
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
    fn under_kv_pressure_a_request_not_yet_answering_is_given_up_before_any_answer() {
        let mut p = ReasoningFirst { reader_tokens_per_s: 10.0, lead_tokens: 5.0 };
        let mut thinking = answering(3, 0, 0.0);
        thinking.phase = Phase::Think;
        thinking.think_ended_s = None;
        let mut prefilling = thinking.clone();
        prefilling.seq = 2;
        prefilling.arrival_s = 2.0;
        prefilling.phase = Phase::Pending;
        // An answer far ahead of its reader, one not, a thinker and a newer prompt.
        let running = vec![answering(0, 100, 0.0), answering(9, 1, 0.0), thinking, prefilling];
        assert_eq!(p.pick_victim(&running, 1.0), 2, "the newest request whose user sees nothing yet");
        let answers = vec![answering(0, 100, 0.0), answering(9, 1, 0.0)];
        assert_eq!(p.pick_victim(&answers, 1.0), 0, "all answering: the one with tokens in hand");
        let answers = vec![answering(0, 1, 0.0), answering(9, 1, 0.0)];
        assert_eq!(p.pick_victim(&answers, 1.0), 1, "nobody ahead: the newest, as vLLM");
    }
}
