//! The sampling half of the hook: follows each batch slot's phase from its tokens and
//! says which rows must emit the end-of-thinking delimiter now: told to by the proxy,
//! past the request's think budget, or past the entropy signal's threshold.
//!
//! Under Model Runner V2 (vLLM's GPU default) the tokens and entropies live on the device,
//! and reading them in the step that made them would hold the engine's CPU until the GPU
//! finished that step (benchmarks/hook-gpu-sync.md). So the controller learns them late:
//! `observe_rows` counts each row's new token at once but marks it *unread*, and the
//! token's value arrives a step or more later (`observe_late`), once its copy to the host
//! has landed; entropies likewise (`entropies_later`, `entropies_arrived`). Counts stay
//! exact; only a token's value can be late. `decide` acts on what it knows and answers
//! `None` when a row's exit hinges on a value still unread (the unread token may itself
//! be the end of thinking): the caller then waits for the reads, a rare device sync
//! (about two per exit), and decides again.

use std::collections::VecDeque;
use std::sync::Arc;

use meridian_core::Phase;
use meridian_core::channel::RequestDirectives;
use meridian_core::config::ExitSignal;
use meridian_core::signals::{Rpdi, RpdiConfig};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::channel::{Shared, directives_in};
use crate::error::HookError;
use crate::metrics::Counter;
use meridian_core::phase::{PhaseTracker, ThinkMarkers};

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
    /// The request's output token list (vLLM V1's batch keeps it growing in place) and
    /// how many of its tokens the tracker has seen (`observe_outputs`).
    output: Option<Py<PyAny>>,
    seen: usize,
    /// The policy channel's directives for the request as looked up at directive-table
    /// generation `directives_generation` (`None`: not looked up yet).
    directives: Option<RequestDirectives>,
    directives_generation: Option<u64>,
    /// Which occupant of the slot this is (slots are reused): late values carry it, and
    /// are dropped when the slot has changed hands since.
    epoch: u64,
    /// Tokens counted (`observe_rows`) whose values have not arrived yet.
    unread: u32,
}

impl Slot {
    /// Takes `count` new tokens of the slot's request, reading them with `token(i)`
    /// only where their values matter: once its thought has ended, every token counts
    /// as output whatever it is.
    fn take(
        &mut self,
        markers: &ThinkMarkers,
        count: usize,
        mut token: impl FnMut(usize) -> PyResult<u32>,
    ) -> PyResult<()> {
        if self.tracker.settled() {
            self.tracker.push_output(u32::try_from(count).unwrap_or(u32::MAX));
            return Ok(());
        }
        for i in 0..count {
            if self.tracker.push(token(i)?, markers) {
                self.exit_wanted = false;
            }
        }
        Ok(())
    }
}

#[pyclass(module = "meridian_hook._native")]
pub struct ExitController {
    markers: Option<ThinkMarkers>,
    /// By batch slot, in slot order (rows are reported in that order).
    slots: slots::Slots,
    signal: ExitSignal,
    min_think_tokens: u32,
    rpdi: RpdiConfig,
    default_budget: Option<u32>,
    /// Act on the proxy's `end_thinking` directives. Off with tensor parallelism: each
    /// rank samples itself and would see a directive at a different step.
    use_directives: bool,
    /// Rows seen thinking in the last `observe`, with their slots.
    thinking: Vec<(usize, usize)>,
    /// Model Runner V2, from the last `observe_rows`: the sampling rows with their slots,
    /// and the rows whose fed token is new.
    sampling: Vec<(usize, usize)>,
    fresh: Vec<usize>,
    /// Model Runner V2, values still on their way to the host, oldest first: per step,
    /// the row, slot and occupant of each row whose fed token was counted unread, and of
    /// each thinking row whose entropy was asked for.
    unread_tokens: VecDeque<Vec<late::Unread>>,
    unread_entropies: VecDeque<Vec<late::Unread>>,
    next_epoch: u64,
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
            slots: slots::Slots::default(),
            signal,
            min_think_tokens,
            rpdi,
            default_budget,
            use_directives: true,
            thinking: Vec::new(),
            sampling: Vec::new(),
            fresh: Vec::new(),
            unread_tokens: VecDeque::new(),
            unread_entropies: VecDeque::new(),
            next_epoch: 0,
            shared,
        })
    }

    /// Feeds one entropy to a thinking slot's RPDI signal.
    fn push_entropy(slot: &mut Slot, h: f64, shared: &Shared) {
        if let Some(rpdi) = slot.rpdi.as_mut() {
            if h.is_finite() {
                rpdi.push(h);
                shared.counters.add(Counter::EntropyRows, 1);
            }
        }
    }

    /// Why a thinking slot must stop now, if it must (no side effects but the directive
    /// cache). `think` counts its unread tokens as thinking: exact once they are read.
    fn exit_reason(
        slot: &mut Slot,
        table: Option<&meridian_core::channel::DirectiveTable>,
        min_think_tokens: u32,
    ) -> Option<Counter> {
        let think = slot.tracker.think_tokens().saturating_add(slot.unread);
        let directives = match (table, slot.request_id.as_deref()) {
            (Some(table), Some(id)) => {
                if slot.directives_generation != Some(table.generation()) {
                    slot.directives = directives_in(table, id).cloned();
                    slot.directives_generation = Some(table.generation());
                }
                slot.directives.as_ref()
            }
            _ => None,
        };
        let budget = directives.and_then(|d| d.think_budget).or(slot.budget);
        if directives.is_some_and(|d| d.end_thinking) {
            Some(Counter::ExitDirective)
        } else if budget.is_some_and(|b| think >= b) {
            Some(Counter::ExitBudget)
        } else if think >= min_think_tokens && slot.rpdi.as_ref().is_some_and(Rpdi::exceeded) {
            Some(Counter::ExitRpdi)
        } else {
            None
        }
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
    fn add(
        &mut self,
        slot: usize,
        prompt: Vec<u32>,
        request_id: Option<String>,
        budget: Option<u32>,
    ) -> PyResult<()> {
        let Some(markers) = self.markers.as_ref() else { return Ok(()) };
        let rpdi = (self.signal == ExitSignal::Rpdi).then(|| Rpdi::new(self.rpdi));
        let tracker = PhaseTracker::new(markers, &prompt);
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let added = self.slots.insert(
            slot,
            Slot {
                request_id,
                tracker,
                budget: budget.or(self.default_budget),
                rpdi,
                exit_wanted: false,
                output: None,
                seen: 0,
                directives: None,
                directives_generation: None,
                epoch,
                unread: 0,
            },
        );
        if !added {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "batch slot {slot} is past the {} the hook follows",
                slots::MAX_SLOTS
            )));
        }
        Ok(())
    }

    /// Which occupant a slot holds (for values read late: compare before applying them).
    fn epoch(&self, slot: usize) -> Option<u64> {
        self.slots.get(&slot).map(|s| s.epoch)
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
            self.slots.insert(to, s); // a batch index: below MAX_SLOTS, as `from` was
        }
    }

    /// Swaps two slots' state.
    fn swapped(&mut self, a: usize, b: usize) {
        let sa = self.slots.remove(&a);
        let sb = self.slots.remove(&b);
        // Batch indices both, below MAX_SLOTS (each was filled, or a neighbour of one).
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

    /// Gives a slot its request's output token list (vLLM V1: the list the batch appends
    /// each sampled token to), for `observe_outputs`.
    fn watch(&mut self, slot: usize, output: Bound<'_, PyAny>) {
        if let Some(s) = self.slots.get_mut(&slot) {
            s.output = Some(output.unbind());
            s.seen = 0;
        }
    }

    /// `observe` for vLLM V1, from the watched output lists themselves: each slot below
    /// `n_rows` is its row, its new tokens those past what was seen last time. Returns
    /// the rows now thinking.
    fn observe_outputs(&mut self, py: Python<'_>, n_rows: usize) -> PyResult<Vec<usize>> {
        self.thinking.clear();
        let Some(markers) = self.markers.as_ref() else { return Ok(Vec::new()) };
        for (slot_idx, slot) in self.slots.below_mut(n_rows) {
            let Some(output) = slot.output.as_ref().map(|o| o.bind(py).clone()) else { continue };
            let seen = slot.seen;
            let n = if let Ok(list) = output.cast::<PyList>() {
                let n = list.len();
                slot.take(markers, n.saturating_sub(seen), |i| list.get_item(seen + i)?.extract())?;
                n
            } else {
                let n = output.len()?;
                slot.take(markers, n.saturating_sub(seen), |i| output.get_item(seen + i)?.extract())?;
                n
            };
            slot.seen = n;
            if slot.tracker.phase() == Phase::Think {
                self.thinking.push((slot_idx, slot_idx));
            }
        }
        Ok(self.thinking.iter().map(|&(row, _)| row).collect())
    }

    /// Model Runner V2: the batch in columns, by row (`slots`: the row's batch slot;
    /// `seq_lens`, `prompt_lens`, `prefill_lens`: the slot's sequence length fed so far,
    /// prompt length, and length to (re)fill before it samples). Rows still filling do
    /// not sample and are left out. Returns `None` when no row samples, else the rows
    /// whose fed token is new: each is counted now, unread; the caller copies those rows'
    /// fed tokens to the host and passes their values to `observe_late` once they land.
    /// `thinking_rows` then says which rows think, as far as the values read tell.
    fn observe_rows(
        &mut self,
        slots: Vec<i64>,
        seq_lens: Vec<i64>,
        prompt_lens: Vec<i64>,
        prefill_lens: Vec<i64>,
    ) -> Option<Vec<usize>> {
        let rows = slots.into_iter().zip(seq_lens).zip(prompt_lens).zip(prefill_lens);
        self.observe_columns(rows.map(|(((a, b), c), d)| [a, b, c, d]))?;
        Some(self.fresh.clone())
    }

    /// `observe_rows` from the four columns packed as native-endian int64, one column
    /// after the other (`np.stack(...).astype(np.int64).tobytes()`): a Python list would
    /// cost an int object per row and column, a fifth of the hook's sampling step at 256
    /// rows (`scripts/bench-hook.sh`), and this abi3 build has no buffer protocol. Returns
    /// `None` when no row samples, else how many rows' fed tokens are new (their values:
    /// `observe_late_fed`).
    fn observe_batch(&mut self, columns: &[u8]) -> PyResult<Option<usize>> {
        let [slots, seq_lens, prompt_lens, prefill_lens] = late::int64_columns::<4>(columns)?;
        let rows = slots.zip(seq_lens).zip(prompt_lens).zip(prefill_lens);
        Ok(self.observe_columns(rows.map(|(((a, b), c), d)| [a, b, c, d])).map(|_| self.fresh.len()))
    }

    /// The values of the oldest unread batch `observe_rows` counted: `tokens[k]` is the
    /// token fed to the k-th row it returned that step. Values for a slot that has since
    /// changed hands are dropped.
    fn observe_late(&mut self, tokens: Vec<u32>) -> PyResult<()> {
        let batch = late::oldest(&mut self.unread_tokens, tokens.len(), "observe_late")?;
        self.land_tokens(batch.iter().map(|u| (u.slot, u.epoch)).zip(tokens));
        Ok(())
    }

    /// `observe_late` from every row's fed token that step, as native-endian int64
    /// (`tobytes()` of the host copy); the rows counted unread are picked here.
    fn observe_late_fed(&mut self, fed: &[u8]) -> PyResult<()> {
        let [fed] = late::int64_columns::<1>(fed)?;
        let fed: Vec<i64> = fed.collect();
        let batch = late::oldest_within(&mut self.unread_tokens, fed.len(), "observe_late_fed")?;
        let tokens = batch.iter().map(|u| u32::try_from(fed[u.row]).unwrap_or(u32::MAX));
        self.land_tokens(batch.iter().map(|u| (u.slot, u.epoch)).zip(tokens));
        Ok(())
    }

    /// The rows of the last `observe_rows` that are thinking, as far as the values read
    /// so far tell (call again after `observe_late`).
    fn thinking_rows(&mut self) -> Vec<usize> {
        self.refresh_thinking();
        self.thinking.iter().map(|&(row, _)| row).collect()
    }

    /// Model Runner V2: the entropies of this step's thinking rows will arrive later
    /// (`entropies_arrived`); returns those rows, in the order the values must come.
    fn entropies_later(&mut self) -> Vec<usize> {
        self.entropies_later_rows();
        self.unread_entropies.back().map(|b| b.iter().map(|u| u.row).collect()).unwrap_or_default()
    }

    /// The entropies (nats) of the oldest batch `entropies_later` announced, in its order.
    fn entropies_arrived(&mut self, entropies: Vec<f64>) -> PyResult<()> {
        let batch = late::oldest(&mut self.unread_entropies, entropies.len(), "entropies_arrived")?;
        self.land_entropies(batch.iter().map(|u| (u.slot, u.epoch)).zip(entropies));
        Ok(())
    }

    /// `entropies_arrived` from every row's entropy that step, as native-endian float64
    /// (`tobytes()`); the thinking rows announced are picked here.
    fn entropies_arrived_all(&mut self, entropies: &[u8]) -> PyResult<()> {
        let all = late::float64_column(entropies)?;
        let batch = late::oldest_within(&mut self.unread_entropies, all.len(), "entropies_arrived_all")?;
        self.land_entropies(batch.iter().map(|u| (u.slot, u.epoch)).zip(batch.iter().map(|u| all[u.row])));
        Ok(())
    }

    /// How many generated tokens a slot's tracker has seen (a request resumed after
    /// preemption: those `replay` fed it). Never lowers the count: tokens counted since
    /// stay counted.
    fn set_seen(&mut self, slot: usize, seen: usize) {
        if let Some(s) = self.slots.get_mut(&slot) {
            s.seen = s.seen.max(seen);
        }
    }

    /// Rows that must emit a forced token now, as `(row, token_id)`. `entropies`, when
    /// not empty, holds the next-token entropy (nats) of each row the last observation
    /// returned as thinking, in that order (values on the host at once; Model Runner V2
    /// sends them late through `entropies_arrived` instead). `None` (Model Runner V2
    /// only): some row's exit hinges on a token whose value has not arrived; nothing was
    /// decided or counted: read every unread value, then `thinking_rows` and decide again.
    fn decide(&mut self, entropies: Vec<f64>) -> Option<Vec<(usize, u32)>> {
        let Some(end) = self.markers.as_ref().map(|m| m.end.clone()) else { return Some(Vec::new()) };
        let thinking = std::mem::take(&mut self.thinking);
        let shared = Arc::clone(&self.shared);
        for (&(_, slot_idx), &h) in thinking.iter().zip(&entropies) {
            if let Some(slot) = self.slots.get_mut(&slot_idx) {
                Self::push_entropy(slot, h, &shared);
            }
        }
        // One lock for the call; per request, a lookup only after the table changed.
        let table = if self.use_directives { shared.directives.lock().ok() } else { None };
        let table = table.as_deref().filter(|t| !t.is_empty());
        let mut decided = Vec::with_capacity(thinking.len());
        let mut hinges_on_unread = false;
        for &(row, slot_idx) in &thinking {
            let Some(slot) = self.slots.get_mut(&slot_idx) else { continue };
            let wanted =
                if slot.exit_wanted { None } else { Self::exit_reason(slot, table, self.min_think_tokens) };
            if (slot.exit_wanted || wanted.is_some()) && slot.unread > 0 {
                hinges_on_unread = true;
                break;
            }
            decided.push((row, slot_idx, wanted));
        }
        if hinges_on_unread {
            self.thinking = thinking;
            return None;
        }
        let mut forced = Vec::new();
        for (row, slot_idx, reason) in decided {
            let Some(slot) = self.slots.get(&slot_idx) else { continue };
            if slot.exit_wanted {
                // Until the tracker has seen the whole delimiter (multi-token ones, or a
                // forced token a prefill row threw away).
                if let Some(&t) = end.get(slot.tracker.end_matched()) {
                    forced.push((row, t));
                }
            } else if let Some(reason) = reason {
                forced.extend(self.force(row, slot_idx, reason));
            }
        }
        self.thinking = thinking;
        Some(forced)
    }

    /// `"pending"`, `"think"` or `"output"` for a slot (`None` if empty).
    fn phase(&self, slot: usize) -> Option<&'static str> {
        self.slots.get(&slot).map(|s| s.tracker.phase().as_str())
    }

    fn think_tokens(&self, slot: usize) -> Option<u32> {
        self.slots.get(&slot).map(|s| s.tracker.think_tokens())
    }
}

mod late;
mod slots;
#[cfg(test)]
mod tests;
