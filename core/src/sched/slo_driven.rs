use super::{Fcfs, OutputFirst, ReasoningFirst, RequestView, SchedulingPolicy, StepLimits};

/// The shipped start target (see [`SloDriven`], ADR 0012): a second in the queue, which
/// an engine with room never makes a request wait, so answers are protected from prompt
/// chunks while requests are admitted as they come, and the engine is scheduled as stock
/// while they queue.
pub const DEFAULT_START_WAIT_TARGET_S: f64 = 1.0;

/// Picks a policy by what the answers need now. The step time (measured between
/// consecutive steps, smoothed) is every answering request's inter-token latency: while
/// it runs above `output_itl_target_s`, answers are at risk and output-first limits
/// apply; once it is comfortably below (under `relax_below` of the target), answers have
/// slack, and the policy relaxes to vLLM's own order with no limits at all, so that an
/// engine whose answers meet their target is scheduled exactly as stock. It starts
/// relaxed: it intervenes only once steps have been measured slower than the target.
///
/// This is the shipped default (ADR 0010): on vLLM, output-first's limits always on
/// started requests later than stock on short prompts at 90% load with no gain to the
/// answers (`policies-real-engine.md`, set 6), while on long prompts they cut the
/// answer-stream tails. The default target, 100 ms (answers at 10 tokens/s, faster
/// than people read), sits above the steps of that short-prompt mix on the GPU-shaped
/// rig (smoothed step time p99 66–89 ms) and below the slow steps of the long one (over
/// 100 ms in 12–26% of its time), so the limits act where a reader would notice.
///
/// Starts have a target too: output-first's limits (the prompt-token cap, express steps)
/// slow the prompts going in, and every request queued behind them waits the longer, so
/// while a request has waited in the engine's queue (not yet admitted) longer than
/// `start_wait_target_s` (an engine behind Meridian's admission queue counts the wait
/// there too: see `observe_waiting`'s callers) the step gets no limits, whatever the answers' step time (the
/// answering requests keep their place at the front of the batch). Measured on vLLM
/// before this rule existed (`policies-real-engine.md`, set 8: long prompts at 90% load;
/// `start-cost.md`), the limits made the slowest starts later (TTFT p99 1.17x stock's),
/// the more the more capped steps a request's wait held, while requests whose wait held
/// none started as with stock; and 90% of the capped steps came while some request had
/// waited over a second for its first token. The price: where requests queue that long,
/// as on long prompts near capacity, the answers' gains go too (ADR 0012).
///
/// With `relax_to_stock` off it relaxes to reasoning-first pacing instead, which gives
/// steps to thinking (measured on the same mix: TTFT many times stock's).
#[derive(Debug, Clone)]
pub struct SloDriven {
    pub output_itl_target_s: f64,
    /// Fraction of the target under which the policy relaxes.
    pub relax_below: f64,
    /// Relax to stock's order (FCFS, no limits, no pacing) instead of reasoning-first.
    pub relax_to_stock: bool,
    /// How long a request may wait for its first token before the answers' limits are
    /// lifted for it (infinite: starts never lift them).
    pub start_wait_target_s: f64,
    pub output_first: OutputFirst,
    pub reasoning_first: ReasoningFirst,
    stock: Fcfs,
    last_step_s: Option<f64>,
    step_ema_s: Option<f64>,
    protecting_output: bool,
    /// Arrival of the request that has waited longest in the queue to start (the engine's
    /// last word, `observe_waiting`).
    oldest_waiting_start_s: Option<f64>,
}

impl Default for SloDriven {
    fn default() -> Self {
        SloDriven {
            output_itl_target_s: 0.1,
            relax_below: 0.7,
            relax_to_stock: true,
            start_wait_target_s: DEFAULT_START_WAIT_TARGET_S,
            output_first: OutputFirst::default(),
            reasoning_first: ReasoningFirst::default(),
            stock: Fcfs,
            last_step_s: None,
            step_ema_s: None,
            protecting_output: false,
            oldest_waiting_start_s: None,
        }
    }
}

impl SloDriven {
    /// Which mode the policy is in (true: output-first).
    pub fn protecting_output(&self) -> bool {
        self.protecting_output
    }

    /// Whether a request has waited in the queue, not yet admitted, longer than the start
    /// target (as the engine last told). A request already computing its prompt does not
    /// count: its own prefill is progress, and a long prompt's takes a second or more by
    /// itself (an 8k-token prompt on a loaded GPU, this rig's 2.8k), which would lift the
    /// limits for the very prompts they are for.
    fn starts_overdue(&self, now_s: f64) -> bool {
        self.oldest_waiting_start_s.is_some_and(|arrival_s| now_s - arrival_s > self.start_wait_target_s)
    }

    fn observe_step(&mut self, now_s: f64) {
        if let Some(last) = self.last_step_s {
            let gap = now_s - last;
            // An idle engine's clock jumps; such gaps are not step times.
            if gap > 0.0 && gap < 20.0 * self.output_itl_target_s {
                let ema = self.step_ema_s.map_or(gap, |e| 0.8 * e + 0.2 * gap);
                self.step_ema_s = Some(ema);
                if ema > self.output_itl_target_s {
                    self.protecting_output = true;
                } else if ema < self.relax_below * self.output_itl_target_s {
                    self.protecting_output = false;
                }
            }
        }
        self.last_step_s = Some(now_s);
    }

    fn current(&mut self) -> &mut dyn SchedulingPolicy {
        match (self.protecting_output, self.relax_to_stock) {
            (true, _) => &mut self.output_first,
            (false, false) => &mut self.reasoning_first,
            // Fcfs holds no state: a fresh one each step is vLLM's own scheduler.
            (false, true) => &mut self.stock,
        }
    }
}

impl SchedulingPolicy for SloDriven {
    fn name(&self) -> &str {
        "slo-driven"
    }

    fn order_running(&mut self, running: &mut Vec<RequestView>, now_s: f64) {
        // Called once at the start of every step: the clock between calls is step time.
        self.observe_step(now_s);
        self.current().order_running(running, now_s);
    }

    fn order_waiting(&mut self, waiting: &mut Vec<RequestView>, now_s: f64) {
        self.current().order_waiting(waiting, now_s);
    }

    fn pick_victim(&mut self, running: &[RequestView], now_s: f64) -> usize {
        self.current().pick_victim(running, now_s)
    }

    fn set_step_budget(&mut self, tokens: u32) {
        self.output_first.set_step_budget(tokens);
        self.reasoning_first.set_step_budget(tokens);
    }

    fn on_preempted(&mut self, now_s: f64) {
        // Pressure is remembered whichever mode is on, for when output-first takes over.
        self.output_first.on_preempted(now_s);
        self.reasoning_first.on_preempted(now_s);
    }

    fn observe_waiting(&mut self, oldest_start_arrival_s: Option<f64>) {
        self.oldest_waiting_start_s = oldest_start_arrival_s;
    }

    fn step_limits(&mut self, running: &[RequestView], now_s: f64) -> StepLimits {
        if self.protecting_output && self.starts_overdue(now_s) {
            return StepLimits::default();
        }
        self.current().step_limits(running, now_s)
    }

    fn defer(&mut self, request: &RequestView, now_s: f64) -> bool {
        self.current().defer(request, now_s)
    }

    fn deferred_until(&mut self, request: &RequestView, now_s: f64) -> Option<f64> {
        self.current().deferred_until(request, now_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_on_step_time_with_hysteresis() {
        let mut p = SloDriven { output_itl_target_s: 0.05, relax_to_stock: false, ..SloDriven::default() };
        let mut t = 0.0;
        let mut steps = |p: &mut SloDriven, dt: f64, n: usize| {
            for _ in 0..n {
                t += dt;
                p.order_running(&mut Vec::new(), t);
            }
            p.protecting_output()
        };
        assert!(!steps(&mut p, 0.02, 20), "fast steps: answers have slack");
        assert!(!steps(&mut p, 0.04, 30), "between the thresholds: stays relaxed");
        assert!(steps(&mut p, 0.08, 30), "slow steps: protect the answers");
        assert!(steps(&mut p, 0.04, 30), "between the thresholds: stays protective");
        assert!(!steps(&mut p, 0.01, 30));
        assert!(!steps(&mut p, 5.0, 3), "idle gaps are ignored");
    }

    #[test]
    fn its_output_first_mode_caps_prefill_at_the_engines_budget_share() {
        use crate::Phase;
        let answering = RequestView {
            seq: 1,
            arrival_s: 0.0,
            priority: 0,
            phase: Phase::Output,
            prefill_remaining: 0,
            think_tokens: 10,
            output_tokens: 3,
            think_ended_s: Some(0.0),
            think_ends_next: false,
            queued_s: None,
        };
        let mut p = SloDriven::default();
        p.set_step_budget(2048);
        assert!(!p.protecting_output(), "it starts as stock");
        assert_eq!(p.step_limits(std::slice::from_ref(&answering), 0.0), StepLimits::default());
        let mut t = 0.0;
        for _ in 0..10 {
            t += 0.3;
            p.order_running(&mut Vec::new(), t);
        }
        assert!(p.protecting_output(), "steps slower than the target: answers are protected");
        assert_eq!(p.step_limits(&[answering], t).max_prefill_tokens, Some(1024));
    }

    #[test]
    fn a_start_waiting_past_its_target_lifts_the_answers_limits() {
        use crate::Phase;
        let request =
            |seq: u64, phase: Phase, arrival_s: f64, prefill: u32, think: u32, output: u32| RequestView {
                seq,
                arrival_s,
                priority: 0,
                phase,
                prefill_remaining: prefill,
                think_tokens: think,
                output_tokens: output,
                think_ended_s: (output > 0 || phase == Phase::Output).then_some(0.0),
                think_ends_next: false,
                queued_s: None,
            };
        let mut p = SloDriven { start_wait_target_s: 2.0, ..SloDriven::default() };
        p.set_step_budget(256);
        let mut t = 100.0;
        for _ in 0..10 {
            t += 0.3;
            p.order_running(&mut Vec::new(), t);
        }
        assert!(p.protecting_output(), "slow steps: answers are protected");
        let answering = request(1, Phase::Output, 0.0, 0, 10, 3);
        let capped = StepLimits { max_prefill_tokens: Some(128), max_think_decodes: None };
        let limits = |p: &mut SloDriven, other: RequestView| p.step_limits(&[answering.clone(), other], t);

        // A prompt going in is capped however long ago it arrived: its own prefill is
        // progress, not a wait.
        assert_eq!(limits(&mut p, request(2, Phase::Pending, t - 1.5, 500, 0, 0)), capped);
        assert_eq!(limits(&mut p, request(2, Phase::Pending, t - 30.0, 500, 0, 0)), capped);
        // A request waiting in the queue, as the engine tells it.
        let thinker = request(4, Phase::Think, t - 9.0, 0, 40, 0);
        p.observe_waiting(Some(t - 2.5));
        assert_eq!(limits(&mut p, thinker.clone()), StepLimits::default(), "a start overdue in the queue");
        p.observe_waiting(Some(t - 0.5));
        assert_eq!(limits(&mut p, thinker.clone()), capped);
        p.observe_waiting(None);
        assert_eq!(limits(&mut p, thinker.clone()), capped);
        // No express step (which admits nothing) either while a start is overdue.
        let awaiting_first = request(5, Phase::Output, 0.0, 0, 10, 0);
        let express = StepLimits { max_prefill_tokens: Some(0), max_think_decodes: Some(0) };
        assert_eq!(p.step_limits(&[awaiting_first.clone(), thinker.clone()], t), express);
        p.observe_waiting(Some(t - 2.5));
        assert_eq!(p.step_limits(&[awaiting_first, thinker.clone()], t), StepLimits::default());

        // With no start target (the policy before it had one), starts never lift limits.
        let mut before = SloDriven { start_wait_target_s: f64::INFINITY, ..p.clone() };
        before.observe_waiting(Some(t - 60.0));
        assert_eq!(limits(&mut before, thinker), capped);
        // Relaxed (fast steps), there were no limits to lift.
        let mut relaxed = SloDriven { start_wait_target_s: 2.0, ..SloDriven::default() };
        relaxed.set_step_budget(256);
        assert_eq!(
            relaxed.step_limits(&[answering.clone(), request(2, Phase::Pending, t - 1.0, 500, 0, 0)], t),
            StepLimits::default()
        );
    }

    #[test]
    fn relaxed_to_stock_it_schedules_exactly_as_vllm_while_answers_meet_their_target() {
        use crate::Phase;
        let view = |seq: u64, phase: Phase, arrival_s: f64, think_ended_s: Option<f64>| RequestView {
            seq,
            arrival_s,
            priority: 0,
            phase,
            prefill_remaining: 0,
            think_tokens: 10,
            output_tokens: 3,
            think_ended_s,
            think_ends_next: false,
            queued_s: None,
        };
        let mut p = SloDriven::default();
        assert!(p.relax_to_stock, "the shipped default relaxes to stock");
        p.set_step_budget(256);
        let mut t = 0.0;
        let running = vec![view(1, Phase::Think, 0.0, None), view(2, Phase::Output, 1.0, Some(1.5))];
        // Fast steps: no limits, admission order kept, and stock's victim (the last).
        for _ in 0..30 {
            t += 0.01;
            p.order_running(&mut running.clone(), t);
        }
        assert!(!p.protecting_output());
        t += 0.01;
        let mut order = running.clone();
        p.order_running(&mut order, t);
        assert_eq!(order, running, "stock keeps the running order");
        assert_eq!(p.step_limits(&running, t), StepLimits::default());
        assert_eq!(p.pick_victim(&running, t), 1);
        assert!(!p.defer(&running[1], t), "no pacing: answers are never held back");
        // Slow steps: the answers miss their target, and output-first takes over.
        for _ in 0..30 {
            t += 0.2;
            p.order_running(&mut running.clone(), t);
        }
        assert!(p.protecting_output());
        let mut order = running.clone();
        p.order_running(&mut order, t + 0.2);
        assert_eq!(order[0].seq, 2, "the answering request first");
        assert_eq!(p.step_limits(&running, t + 0.2).max_prefill_tokens, Some(128));
    }
}
