//! Reading vLLM's `Request` objects, once when a request enters the running list and then
//! as little as possible each step.
//!
//! Why so frugal: at 256 running requests the hook's cost per step is mostly cache misses
//! on those objects (a bare Python loop over them costs ~100 µs on the benchmark machine,
//! `docs/src/benchmarks/hook-overhead.md`). So `learn` keeps what stays put while a
//! request runs (its id, prompt length, priority, arrival time, and the list vLLM appends
//! its output tokens to), and for a request that keeps running `observe` reads only its
//! computed-token count while its prompt is not yet in, then just the output list's length
//! (answering) or its new tail (thinking).
//!
//! This is the Rust half of the hook's vLLM adapter: every `Request` attribute the hook
//! reads is read here and nowhere else in Rust, and `meridian_hook/vllm_adapter.py` checks
//! at start-up that vLLM's `Request` still has each of them (the Python half holds the
//! rest of what the hook touches inside vLLM).

use std::hash::Hasher;

use meridian_core::Phase;
use meridian_core::phase::PhaseTracker;
use meridian_core::sched::RequestView;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::{SchedulerCore, borrowed_item, feed, view_of};

/// One of vLLM's `Request` objects and what stays put in it while the request runs.
/// Holding a reference keeps its address from being reused by another object while
/// `SchedulerCore::by_object` may map that address here.
pub(crate) struct RequestObject {
    pub(super) address: usize,
    _object: Py<PyAny>,
    /// The object's `__dict__`, where `num_computed_tokens` is read from when its class
    /// does not define it (`None`: read it by `getattr`).
    attrs: Option<Py<PyDict>>,
    /// The list vLLM appends the request's output tokens to (`_output_token_ids` in the
    /// instance's dict; vLLM extends or clears it, never replaces it). `None`: read the
    /// public `output_token_ids` sequence instead.
    output: Option<Py<PyList>>,
    pub(super) id: Py<PyString>,
    arrival_s: f64,
    /// How long it waited in Meridian's admission queue before it reached vLLM (seconds).
    pub(super) queued_s: f64,
    priority: i32,
    prompt_len: i64,
    /// Its whole prompt was computed since it entered the running list. It stays so
    /// while the request runs: vLLM takes computed tokens back only on preemption (the
    /// request leaves the list, and is learnt afresh when it returns) or on rejected
    /// speculative tokens (past the prompt).
    prefilled: bool,
    /// The `plan_running` call that last saw it in the running list.
    pub(super) last_plan: u64,
    /// `observe_outputs` read its new output tokens after that call.
    outputs_read: bool,
}

/// Hashes an object address (already unique; only spread it over the bits).
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, n: usize) {
        let x = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

/// What a request's sampling params tell the scheduler, read once: the proxy's stream id
/// (`meridian_request_id` in `extra_args`, the body's `vllm_xargs`, when a string), how
/// long it waited in the proxy's admission queue (`meridian_queued_ms`), and the think
/// budget the engine enforces, where it has one: vLLM's own
/// `thinking_token_budget` or the hook's `meridian_think_budget` extra argument (the
/// smaller when both). Either forces the closing delimiter once that many tokens are
/// thought, so the step that samples it can be seen coming.
fn params_of<'py>(req: &Bound<'py, PyAny>) -> Params {
    let py = req.py();
    let Ok(params) = req.getattr(intern!(py, "sampling_params")) else { return Params::default() };
    let own: Option<u32> =
        params.getattr(intern!(py, "thinking_token_budget")).ok().and_then(|b| b.extract().ok());
    let extra = params.getattr(intern!(py, "extra_args")).ok().and_then(|e| e.cast_into::<PyDict>().ok());
    let arg = |key: &Bound<'py, PyString>| extra.as_ref().and_then(|e| e.get_item(key).ok().flatten());
    let stream_id = arg(intern!(py, "meridian_request_id")).and_then(|v| v.extract().ok());
    let hook: Option<u32> = arg(intern!(py, "meridian_think_budget")).and_then(|b| b.extract().ok());
    let think_budget = match (own, hook) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let queued_ms: f64 = arg(intern!(py, "meridian_queued_ms")).and_then(|v| v.extract().ok()).unwrap_or(0.0);
    let queued_s = if queued_ms.is_finite() && queued_ms > 0.0 { queued_ms / 1e3 } else { 0.0 };
    Params { stream_id, think_budget, queued_s }
}

/// What [`params_of`] reads.
#[derive(Default)]
struct Params {
    stream_id: Option<String>,
    think_budget: Option<u32>,
    /// How long the request waited in Meridian's admission queue before the proxy sent it
    /// (`meridian_queued_ms`), in seconds; 0 when it did not.
    queued_s: f64,
}

impl SchedulerCore {
    /// Reads what stays put while a request runs from one of vLLM's `Request` objects,
    /// tracks the request from its prompt when it is new, and returns its slot.
    fn learn(&mut self, req: &Bound<'_, PyAny>, address: usize, plan: u64) -> PyResult<usize> {
        let py = req.py();
        let id_obj = req.getattr(intern!(py, "request_id"))?.cast_into::<PyString>()?;
        let id = id_obj.to_str()?;
        let prompt_len: i64 = req.getattr(intern!(py, "num_prompt_tokens"))?.extract()?;
        let priority: i64 = req.getattr(intern!(py, "priority"))?.extract()?;
        let arrival_s = self.engine_time(req.getattr(intern!(py, "arrival_time"))?.extract()?);
        let slot = match self.by_id.get(id) {
            Some(&i) => i,
            None => {
                let prompt_obj = req.getattr(intern!(py, "prompt_token_ids"))?;
                let prompt: Vec<u32> =
                    if prompt_obj.is_none() { Vec::new() } else { prompt_obj.extract()? };
                self.start_tracking(id, Some(&prompt))
            }
        };
        let Params { stream_id, think_budget, queued_s } = params_of(req);
        let entry = self.slot_mut(slot);
        entry.think_budget = think_budget;
        if entry.stream_id != stream_id {
            entry.stream_id = stream_id;
            entry.directive_generation = None;
        }
        // Straight from the instance's dict only where nothing on the class could shadow
        // the attribute there (a property, a slot).
        let class = req.get_type();
        let dict = req.getattr(intern!(py, "__dict__")).ok().and_then(|d| d.cast_into::<PyDict>().ok());
        let output = if class.hasattr(intern!(py, "_output_token_ids"))? {
            None
        } else {
            dict.as_ref()
                .and_then(|d| d.get_item(intern!(py, "_output_token_ids")).ok().flatten())
                .filter(|list| list.is_exact_instance_of::<PyList>())
                .and_then(|list| list.cast_into::<PyList>().ok())
        };
        let attrs = if class.hasattr(intern!(py, "num_computed_tokens"))? { None } else { dict };
        self.slot_mut(slot).object = Some(RequestObject {
            address,
            _object: req.clone().unbind(),
            attrs: attrs.map(Bound::unbind),
            output: output.map(Bound::unbind),
            id: id_obj.clone().unbind(),
            arrival_s,
            queued_s,
            priority: i32::try_from(priority).unwrap_or(if priority < 0 { i32::MIN } else { i32::MAX }),
            prompt_len,
            prefilled: false,
            last_plan: plan,
            outputs_read: false,
        });
        self.by_object.insert(address, slot);
        Ok(slot)
    }

    /// One running request this step: its slot, with the tracker fed the output tokens
    /// generated since the last call, and its view. `hint`: the (address, slot) at this
    /// row's position in the previous call.
    pub(super) fn observe<'py>(
        &mut self,
        req: Borrowed<'_, 'py, PyAny>,
        hint: Option<(usize, usize)>,
        now: f64,
        scratch: &mut Vec<u32>,
    ) -> PyResult<(usize, RequestView)> {
        let py = req.py();
        let address = req.as_ptr() as usize;
        let plan = self.plans;
        // A request object seen in the previous call's running list has not left it
        // since (vLLM changes a request's prompt or arrival time only while it waits),
        // so what `learn` read still holds; anything else is read afresh.
        let slot = match self.planned_slot(address, hint, plan - 1) {
            Some(i) => i,
            None => self.learn(&req.to_owned(), address, plan)?,
        };
        let object = self.slot_mut(slot).object.as_mut().expect("learnt above");
        object.last_plan = plan;
        let (arrival_s, priority) = (object.arrival_s, object.priority);
        let prefill_remaining = if object.prefilled {
            0
        } else {
            let name = intern!(py, "num_computed_tokens");
            let computed =
                match object.attrs.as_ref().map(|d| d.bind(py).get_item(name)).transpose()?.flatten() {
                    Some(value) => value,
                    None => req.to_owned().getattr(name)?,
                };
            let computed: i64 = computed.extract()?;
            let remaining = u32::try_from((object.prompt_len - computed).max(0)).unwrap_or(u32::MAX);
            object.prefilled = remaining == 0;
            remaining
        };
        // Unless `observe_outputs` fed its tokens since the last call (vLLM appends them
        // only in `update_from_output`).
        if !std::mem::take(&mut object.outputs_read) {
            self.read_outputs(slot, req, now, scratch)?;
        }
        Ok((slot, view_of(self.slot(slot), arrival_s, priority, prefill_remaining)))
    }

    /// Feeds the output tokens `req` (the request object of `slot`) generated since they
    /// were last read to its tracker. A request whose thought has ended counts every new
    /// token as output, whatever it is: only how many there are is read.
    fn read_outputs(
        &mut self,
        slot: usize,
        req: Borrowed<'_, '_, PyAny>,
        now: f64,
        scratch: &mut Vec<u32>,
    ) -> PyResult<()> {
        let py = req.py();
        let entry = self.slot(slot);
        let seen = entry.seen;
        let answering = entry.tracker.as_ref().is_some_and(PhaseTracker::settled);
        scratch.clear();
        let n = match entry.object.as_ref().and_then(|o| o.output.as_ref()) {
            Some(list) => {
                let list = list.bind(py);
                let n = list.len();
                if !answering {
                    for i in seen..n {
                        scratch.push(list.get_item(i)?.extract()?);
                    }
                }
                n
            }
            None => {
                let out = req.to_owned().getattr(intern!(py, "output_token_ids"))?;
                let n = out.len()?;
                if !answering {
                    for i in seen..n {
                        scratch.push(out.get_item(i)?.extract()?);
                    }
                }
                n
            }
        };
        let markers = self.markers.as_ref();
        let entry = self.slots[slot].as_mut().expect("indexed slots are filled");
        if answering {
            if let Some(tracker) = entry.tracker.as_mut() {
                tracker.push_output(u32::try_from(n.saturating_sub(seen)).unwrap_or(u32::MAX));
            }
        } else {
            feed(entry, markers, scratch.iter().copied(), now);
        }
        entry.seen = n;
        Ok(())
    }

    /// The slot of a request object that `plan_running` call number `plan` read, if
    /// `address` is one (`hint`: the (address, slot) at its position in that call).
    pub(super) fn planned_slot(
        &self,
        address: usize,
        hint: Option<(usize, usize)>,
        plan: u64,
    ) -> Option<usize> {
        let known = match hint {
            Some((a, i)) if a == address => Some(i),
            _ => self.by_object.get(&address).copied(),
        }?;
        let object = self.slots[known].as_ref()?.object.as_ref()?;
        (object.address == address && object.last_plan == plan).then_some(known)
    }

    /// After vLLM's `update_from_output`: reads the new output tokens of every running
    /// request the last `plan_running` call read, while the lists vLLM has just appended
    /// them to are still in the CPU's cache, and marks them read, so that the next
    /// `plan_running` reads nothing of those requests' objects. Read cold at the next
    /// step, after the forward pass, those lists are most of what the hook's step costs
    /// at 256 running requests (`scripts/bench-hook.sh`). Requests it does not know yet
    /// (admitted by the step just planned) are read by `plan_running` as before.
    ///
    /// Returns the running requests by phase (prefilling, thinking, answering): a
    /// request admitted by the step just planned counts as prefilling, and one whose
    /// prompt the plan still saw unfinished as well (a step behind for its last chunk).
    pub(super) fn observe_outputs_of(&mut self, running: &Bound<'_, PyList>) -> PyResult<[u64; 3]> {
        let now = self.started.elapsed().as_secs_f64();
        let mut scratch = Vec::new();
        let mut by_phase = [0u64; 3];
        for i in 0..running.len() {
            let req = borrowed_item(running, i)?;
            let Some(slot) =
                self.planned_slot(req.as_ptr() as usize, self.last_running.get(i).copied(), self.plans)
            else {
                by_phase[0] += 1;
                continue;
            };
            self.read_outputs(slot, req, now, &mut scratch)?;
            let entry = self.slot_mut(slot);
            let prefilled = entry.object.as_ref().is_some_and(|o| o.prefilled);
            let thinking = entry.tracker.as_ref().is_some_and(|t| t.phase() == Phase::Think);
            by_phase[if !prefilled {
                0
            } else if thinking {
                1
            } else {
                2
            }] += 1;
            if let Some(object) = entry.object.as_mut() {
                object.outputs_read = true;
            }
        }
        Ok(by_phase)
    }
}
