//! The sampling half of the hook: follows each batch slot's phase from its tokens and
//! says which rows must emit the end-of-thinking delimiter now: told to by the proxy,
//! past the request's think budget, or past the entropy signal's threshold.

use std::collections::HashMap;
use std::sync::Arc;

use meridian_core::Phase;
use meridian_core::config::ExitSignal;
use meridian_core::signals::{Rpdi, RpdiConfig};
use pyo3::prelude::*;

use crate::channel::Shared;
use crate::error::HookError;
use crate::metrics::Counter;
use crate::phase::{PhaseTracker, ThinkMarkers};

struct Slot {
    request_id: Option<String>,
    tracker: PhaseTracker,
    budget: Option<u32>,
    rpdi: Option<Rpdi>,
    /// A forced exit was decided: force the next token of the end sequence each step
    /// (from what the tracker has matched) until the tracker has seen all of it. Kept
    /// as a wish rather than a position so a forced token that was thrown away (a
    /// prefill row) is simply forced again.
    exit_wanted: bool,
}

#[pyclass(module = "meridian_hook._native")]
pub struct ExitController {
    markers: Option<ThinkMarkers>,
    slots: HashMap<usize, Slot>,
    signal: ExitSignal,
    min_think_tokens: u32,
    rpdi: RpdiConfig,
    default_budget: Option<u32>,
    /// Act on the proxy's `end_thinking` directives. Off with tensor parallelism: each
    /// rank samples itself and would see a directive at a different step.
    use_directives: bool,
    /// Rows seen thinking in the last `observe`, with their slots.
    thinking: Vec<(usize, usize)>,
    shared: Arc<Shared>,
}

impl ExitController {
    pub fn create(
        think_start: Vec<u32>,
        think_end: Vec<u32>,
        signal: &str,
        min_think_tokens: u32,
        rpdi: RpdiConfig,
        default_budget: Option<u32>,
        shared: Arc<Shared>,
    ) -> Result<Self, HookError> {
        let signal = match signal {
            "off" => ExitSignal::Off,
            "rpdi" => ExitSignal::Rpdi,
            "eat" => ExitSignal::Eat,
            other => {
                return Err(HookError::Config(format!(
                    "exit.signal must be off, rpdi or eat; got {other:?}"
                )));
            }
        };
        Ok(ExitController {
            markers: ThinkMarkers::new(think_start, think_end),
            slots: HashMap::new(),
            signal,
            min_think_tokens,
            rpdi,
            default_budget,
            use_directives: true,
            thinking: Vec::new(),
            shared,
        })
    }

    fn force(&mut self, row: usize, slot_idx: usize, reason: Counter) -> Option<(usize, u32)> {
        let slot = self.slots.get_mut(&slot_idx)?;
        slot.exit_wanted = true;
        self.shared.counters.add(reason, 1);
        let next = *self.markers.as_ref()?.end.get(slot.tracker.end_matched())?;
        Some((row, next))
    }
}

#[pymethods]
impl ExitController {
    /// `signal`: `off`, `rpdi` or `eat` (`eat` needs probe requests, which the proxy
    /// drives; inside the engine it behaves as `off`).
    #[new]
    #[pyo3(signature = (think_start, think_end, signal="off", min_think_tokens=256, rpdi_window=512, rpdi_lambda=2.0, default_budget=None, use_directives=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        think_start: Vec<u32>,
        think_end: Vec<u32>,
        signal: &str,
        min_think_tokens: u32,
        rpdi_window: usize,
        rpdi_lambda: f64,
        default_budget: Option<u32>,
        use_directives: bool,
    ) -> PyResult<Self> {
        let rpdi = RpdiConfig { window: rpdi_window, lambda: rpdi_lambda };
        let mut c = ExitController::create(
            think_start,
            think_end,
            signal,
            min_think_tokens,
            rpdi,
            default_budget,
            crate::shared(),
        )?;
        c.use_directives = use_directives;
        Ok(c)
    }

    /// A request entered batch slot `slot` (slots are reused: all state is reset).
    #[pyo3(signature = (slot, prompt, request_id=None, budget=None))]
    fn add(&mut self, slot: usize, prompt: Vec<u32>, request_id: Option<String>, budget: Option<u32>) {
        let Some(markers) = self.markers.as_ref() else { return };
        let rpdi = (self.signal == ExitSignal::Rpdi).then(|| Rpdi::new(self.rpdi));
        let tracker = PhaseTracker::new(markers, &prompt);
        self.slots.insert(
            slot,
            Slot { request_id, tracker, budget: budget.or(self.default_budget), rpdi, exit_wanted: false },
        );
    }

    /// Re-derives a slot's starting phase once its prompt is known (Model Runner V2 only
    /// gives it after `add`).
    fn reset_prompt(&mut self, slot: usize, prompt: Vec<u32>) {
        if let (Some(markers), Some(s)) = (self.markers.as_ref(), self.slots.get_mut(&slot)) {
            s.tracker = PhaseTracker::new(markers, &prompt);
        }
    }

    /// Feeds a slot tokens it generated before it (re)entered the batch (a request
    /// resumed after preemption), without deciding anything.
    fn replay(&mut self, slot: usize, tokens: Vec<u32>) {
        if let (Some(markers), Some(s)) = (self.markers.as_ref(), self.slots.get_mut(&slot)) {
            for t in tokens {
                if s.tracker.push(t, markers) {
                    s.exit_wanted = false;
                }
            }
        }
    }

    fn remove(&mut self, slot: usize) {
        self.slots.remove(&slot);
    }

    /// A request moved from one slot to another (vLLM V1 condenses its batch).
    fn moved(&mut self, from: usize, to: usize) {
        if let Some(s) = self.slots.remove(&from) {
            self.slots.insert(to, s);
        }
    }

    /// Swaps two slots' state.
    fn swapped(&mut self, a: usize, b: usize) {
        let sa = self.slots.remove(&a);
        let sb = self.slots.remove(&b);
        if let Some(s) = sa {
            self.slots.insert(b, s);
        }
        if let Some(s) = sb {
            self.slots.insert(a, s);
        }
    }

    /// Takes the tokens each row's request generated since the last step, as
    /// `(row, slot, new_tokens)`; returns the rows now thinking, whose entropy the
    /// caller may compute and pass to `decide`.
    fn observe(&mut self, rows: Vec<(usize, usize, Vec<u32>)>) -> Vec<usize> {
        self.thinking.clear();
        let Some(markers) = self.markers.as_ref() else { return Vec::new() };
        for (row, slot_idx, tokens) in rows {
            let Some(slot) = self.slots.get_mut(&slot_idx) else { continue };
            for t in tokens {
                if slot.tracker.push(t, markers) {
                    slot.exit_wanted = false;
                }
            }
            if slot.tracker.phase() == Phase::Think {
                self.thinking.push((row, slot_idx));
            }
        }
        self.thinking.iter().map(|&(row, _)| row).collect()
    }

    /// Rows that must emit a forced token now, as `(row, token_id)`. `entropies` holds
    /// the next-token entropy (nats) of each row `observe` returned, in that order, or
    /// is empty when none was computed.
    fn decide(&mut self, entropies: Vec<f64>) -> Vec<(usize, u32)> {
        let Some(end) = self.markers.as_ref().map(|m| m.end.clone()) else { return Vec::new() };
        let thinking = std::mem::take(&mut self.thinking);
        let mut forced = Vec::new();
        for (i, &(row, slot_idx)) in thinking.iter().enumerate() {
            let Some(slot) = self.slots.get_mut(&slot_idx) else { continue };
            if slot.exit_wanted {
                // Until the tracker has seen the whole delimiter (multi-token ones, or a
                // forced token a prefill row threw away).
                if let Some(&t) = end.get(slot.tracker.end_matched()) {
                    forced.push((row, t));
                }
                continue;
            }
            let think = slot.tracker.think_tokens();
            let directives = match self.use_directives {
                true => slot.request_id.as_deref().and_then(|id| self.shared.directives_for(id)),
                false => None,
            };
            let budget = directives.as_ref().and_then(|d| d.think_budget).or(slot.budget);
            let mut reason = None;
            if directives.as_ref().is_some_and(|d| d.end_thinking) {
                reason = Some(Counter::ExitDirective);
            } else if budget.is_some_and(|b| think >= b) {
                reason = Some(Counter::ExitBudget);
            } else if let (Some(rpdi), Some(&h)) = (slot.rpdi.as_mut(), entropies.get(i)) {
                if h.is_finite() {
                    rpdi.push(h);
                    self.shared.counters.add(Counter::EntropyRows, 1);
                    if think >= self.min_think_tokens && rpdi.exceeded() {
                        reason = Some(Counter::ExitRpdi);
                    }
                }
            }
            if let Some(reason) = reason {
                forced.extend(self.force(row, slot_idx, reason));
            }
        }
        self.thinking = thinking;
        forced
    }

    /// `"pending"`, `"think"` or `"output"` for a slot (`None` if empty).
    fn phase(&self, slot: usize) -> Option<&'static str> {
        self.slots.get(&slot).map(|s| s.tracker.phase().as_str())
    }

    fn think_tokens(&self, slot: usize) -> Option<u32> {
        self.slots.get(&slot).map(|s| s.tracker.think_tokens())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(signal: &str, budget: Option<u32>) -> ExitController {
        let rpdi = RpdiConfig { window: 4, lambda: 1.5 };
        ExitController::create(vec![465], vec![466], signal, 8, rpdi, budget, Arc::default()).unwrap()
    }

    #[test]
    fn budget_forces_the_end_token_once_then_lets_the_answer_run() {
        let mut c = controller("off", None);
        c.add(0, vec![465], None, Some(3));
        c.observe(vec![(0, 0, vec![5, 5])]);
        assert!(c.decide(vec![]).is_empty());
        c.observe(vec![(0, 0, vec![5])]);
        assert_eq!(c.decide(vec![]), vec![(0, 466)]);
        assert_eq!(c.shared.counters.get(Counter::ExitBudget), 1);
        assert!(c.observe(vec![(0, 0, vec![466])]).is_empty(), "answering now");
        assert!(c.decide(vec![]).is_empty());
        assert_eq!(c.phase(0), Some("output"));
    }

    #[test]
    fn proxy_directive_ends_thinking_by_request_id() {
        let shared = Arc::new(Shared::default());
        let mut c = ExitController::create(
            vec![465],
            vec![466],
            "off",
            0,
            RpdiConfig::default(),
            None,
            Arc::clone(&shared),
        )
        .unwrap();
        c.add(3, vec![465], Some("req-9".into()), None);
        c.observe(vec![(1, 3, vec![5])]);
        assert!(c.decide(vec![]).is_empty());
        shared.directives.lock().unwrap().apply(meridian_core::channel::Directive {
            request_id: "req-9".into(),
            action: meridian_core::channel::Action::EndThinking,
        });
        c.observe(vec![(1, 3, vec![5])]);
        assert_eq!(c.decide(vec![]), vec![(1, 466)]);
        assert_eq!(shared.counters.get(Counter::ExitDirective), 1);
    }

    #[test]
    fn rpdi_fires_only_after_min_tokens_when_recent_entropy_rises() {
        let mut c = controller("rpdi", None);
        c.add(0, vec![465], None, None);
        for _ in 0..20 {
            c.observe(vec![(0, 0, vec![5])]);
            assert!(c.decide(vec![0.5]).is_empty());
        }
        let mut fired = false;
        for _ in 0..4 {
            c.observe(vec![(0, 0, vec![5])]);
            fired |= !c.decide(vec![3.0]).is_empty();
        }
        assert!(fired, "recent mean 3.0 over a long-run mean near 0.5 exceeds lambda 1.5");
        assert_eq!(c.shared.counters.get(Counter::ExitRpdi), 1);
    }

    #[test]
    fn a_forced_token_that_was_thrown_away_is_forced_again() {
        let mut c = controller("off", Some(1));
        c.add(0, vec![465], None, None);
        c.observe(vec![(0, 0, vec![5])]);
        assert_eq!(c.decide(vec![]), vec![(0, 466)]);
        c.observe(vec![(0, 0, vec![])]); // the engine discarded that sample
        assert_eq!(c.decide(vec![]), vec![(0, 466)], "still wanted");
        assert_eq!(c.shared.counters.get(Counter::ExitBudget), 1, "counted once");
    }

    #[test]
    fn replayed_tokens_restore_a_resumed_requests_phase() {
        let mut c = controller("off", Some(3));
        c.add(0, vec![465], None, None);
        c.replay(0, vec![5, 466, 9, 9]);
        assert_eq!(c.phase(0), Some("output"));
        assert!(c.observe(vec![(0, 0, vec![9])]).is_empty());
        assert!(c.decide(vec![]).is_empty(), "an answering request is never forced");
    }

    #[test]
    fn multi_token_delimiter_is_forced_token_by_token() {
        let mut c = ExitController::create(
            vec![1],
            vec![7, 8],
            "off",
            0,
            RpdiConfig::default(),
            Some(1),
            Arc::default(),
        )
        .unwrap();
        c.add(0, vec![1], None, None);
        c.observe(vec![(0, 0, vec![5])]);
        assert_eq!(c.decide(vec![]), vec![(0, 7)]);
        c.observe(vec![(0, 0, vec![7])]);
        assert_eq!(c.decide(vec![]), vec![(0, 8)]);
        assert!(c.observe(vec![(0, 0, vec![8])]).is_empty());
    }
}
