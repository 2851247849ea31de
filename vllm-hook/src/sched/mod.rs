//! The scheduler half of the hook: vLLM's scheduler hands over its running list each
//! step, this orders it by `meridian-core`'s policy (answering requests get the token
//! budget first, thinking ones fill the rest) and puts the policy's preemption victim
//! last, where vLLM's stock victim choice (`running[-1]`) takes it.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use meridian_core::Phase;
use meridian_core::sched::{RequestView, SchedulingPolicy, StepLimits, policy_by_name};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::channel::{Shared, directives_in};
use crate::error::HookError;
use crate::metrics::{Counter, KV_TIERS};
use meridian_core::kv::Tier;
use meridian_core::phase::{PhaseTracker, ThinkMarkers};

mod kv;
mod objects;
mod starts;
#[cfg(test)]
mod tests;

use objects::{AddressHasher, RequestObject};
use starts::oldest_start;

/// What the hook knows of one request, in a slot of `SchedulerCore::slots`.
pub(crate) struct Tracked {
    id: String,
    /// The proxy's id for the stream (`vllm_xargs.meridian_request_id`), which its
    /// directives name. Clients choose vLLM's request id (`X-Request-Id`) and may share
    /// one, so a request that has a stream id is looked up by it, never by the client's.
    stream_id: Option<String>,
    tracker: Option<PhaseTracker>,
    seq: u64,
    think_ended_s: Option<f64>,
    /// How many of the request's output tokens `plan_running` has fed the tracker.
    seen: usize,
    /// The policy channel's priority for it, as looked up at directive-table
    /// generation `directive_generation` (`None`: not looked up yet).
    directive_priority: Option<i32>,
    directive_generation: Option<u64>,
    /// The vLLM `Request` object `plan_running` last read it from.
    object: Option<RequestObject>,
    /// The think budget the engine enforces on it (vLLM's or the hook's), if any.
    think_budget: Option<u32>,
}

/// One running request as vLLM's scheduler sees it this step: `(request_id,
/// arrival_s, priority, prefill_remaining, new_tokens)`, the last being the output tokens
/// generated since the previous call.
#[derive(FromPyObject)]
pub struct RunningRow(String, f64, i32, u32, Vec<u32>);

/// What `plan_running` returns: the order to run in (`None`: vLLM's order as it is),
/// the step's prefill and think-decode caps, the positions (in the new order) of the
/// requests those caps hold out of the step (`None`: nobody), and the step's token
/// budget (`None`: vLLM's own), which makes the prefill cap a cap on the whole step.
type RunningPlan = (Option<Vec<usize>>, Option<u32>, Option<u32>, Option<Vec<usize>>, Option<u32>);

#[pyclass(module = "meridian_hook._native")]
pub struct SchedulerCore {
    // A Mutex only to make the class `Sync` for Python; vLLM calls it from one thread.
    policy: Mutex<Box<dyn SchedulingPolicy>>,
    markers: Option<ThinkMarkers>,
    /// Tracked requests; `by_id` (request id) and `by_object` (address of the vLLM
    /// `Request` object last read) index them, `free` lists empty slots.
    slots: Vec<Option<Tracked>>,
    free: Vec<usize>,
    by_id: HashMap<String, usize>,
    by_object: HashMap<usize, usize, BuildHasherDefault<AddressHasher>>,
    plans: u64,
    /// The request objects (address, slot) of the last `plan_running` call, in the order
    /// it returned: vLLM keeps that order, so the next call usually finds each row's
    /// slot at the same position without a lookup.
    last_running: Vec<(usize, usize)>,
    next_seq: u64,
    /// The engine clock the policy reads (`now` is seconds since then), and the same
    /// moment in wall-clock seconds, which vLLM's `Request.arrival_time` is in: the
    /// policy compares arrivals with `now`, so they are moved onto its clock.
    started: Instant,
    wall_at_start_s: f64,
    /// When the last `plan_running` ran (engine seconds), and the step time smoothed over
    /// the intervals between busy steps: the engine's pace, which the proxy reads.
    last_plan_s: Option<f64>,
    step_s: Option<f64>,
    shared: Arc<Shared>,
}

/// Weight of the newest step in the smoothed step time.
const STEP_SMOOTHING: f64 = 0.2;

/// Pushes generated tokens through a request's tracker, noting when its thought ended.
fn feed(
    entry: &mut Tracked,
    markers: Option<&ThinkMarkers>,
    tokens: impl IntoIterator<Item = u32>,
    now: f64,
) {
    if let (Some(tracker), Some(markers)) = (entry.tracker.as_mut(), markers) {
        for t in tokens {
            if tracker.push(t, markers) {
                entry.think_ended_s = Some(now);
            }
        }
    }
}

/// Item `i` of `list` without taking a reference to it. Taking one writes to the
/// object's header, a cache miss per running request and step that the hook's step cost
/// is mostly made of at 256 requests (measured: `scripts/bench-hook.sh`); `observe`
/// takes one only where it calls Python code that could drop the item (`to_owned`).
fn borrowed_item<'a, 'py>(list: &'a Bound<'py, PyList>, i: usize) -> PyResult<Borrowed<'a, 'py, PyAny>> {
    let index = isize::try_from(i).unwrap_or(isize::MAX);
    // SAFETY: `list` is a live list and we hold the GIL (`Bound`); `PyList_GetItem`
    // returns a borrowed reference, or null with IndexError set past the end, which
    // `from_ptr_or_err` turns into an error. The item stays alive while the borrow is
    // used: `observe` runs no Python code before it has a reference of its own (a
    // request it keeps running is held by its `RequestObject`; any other it takes a
    // reference to before `learn` reads it).
    unsafe { Borrowed::from_ptr_or_err(list.py(), pyo3::ffi::PyList_GetItem(list.as_ptr(), index)) }
}

/// The policy's view of a tracked request (priority as vLLM has it; directives later).
fn view_of(entry: &Tracked, arrival_s: f64, priority: i32, prefill_remaining: u32) -> RequestView {
    let (phase, think, output) = entry
        .tracker
        .as_ref()
        .map_or((Phase::Pending, 0, 0), |t| (t.phase(), t.think_tokens(), t.output_tokens()));
    RequestView {
        seq: entry.seq,
        arrival_s,
        priority,
        phase: if prefill_remaining > 0 { Phase::Pending } else { phase },
        prefill_remaining,
        think_tokens: think,
        output_tokens: output,
        think_ended_s: entry.think_ended_s,
        think_ends_next: prefill_remaining == 0
            && phase == Phase::Think
            && entry.think_budget.is_some_and(|budget| think >= budget),
        queued_s: None,
    }
}

impl SchedulerCore {
    pub fn create(
        policy: &str,
        start: Vec<u32>,
        end: Vec<u32>,
        shared: Arc<Shared>,
    ) -> Result<Self, HookError> {
        let policy = policy_by_name(policy).ok_or_else(|| {
            HookError::Config(format!(
                "hook.policy must be one of {:?} (optionally with parameters); got {policy:?}",
                meridian_core::sched::POLICY_NAMES
            ))
        })?;
        Ok(SchedulerCore {
            policy: Mutex::new(policy),
            markers: ThinkMarkers::new(start, end),
            slots: Vec::new(),
            free: Vec::new(),
            by_id: HashMap::new(),
            by_object: HashMap::default(),
            plans: 0,
            last_running: Vec::new(),
            next_seq: 0,
            started: Instant::now(),
            wall_at_start_s: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            last_plan_s: None,
            step_s: None,
            shared,
        })
    }

    /// Smooths the interval since the previous busy step into the engine's step time and
    /// publishes it. A gap far longer than the steps so far is the engine having been
    /// idle, not a step, and is left out.
    fn time_step(&mut self, now: f64) {
        if let Some(last) = self.last_plan_s.replace(now) {
            let dt = now - last;
            let usual = self.step_s.unwrap_or(0.25);
            if dt > 0.0 && dt <= (4.0 * usual).max(1.0) {
                self.step_s = Some(self.step_s.map_or(dt, |s| s + STEP_SMOOTHING * (dt - s)));
            }
        }
        self.shared.counters.set_steps(self.step_s, self.plans);
    }

    /// A vLLM time (wall-clock seconds, as `Request.arrival_time`) on the engine clock.
    fn engine_time(&self, wall_s: f64) -> f64 {
        wall_s - self.wall_at_start_s
    }

    fn get(&self, request_id: &str) -> Option<&Tracked> {
        self.by_id.get(request_id).and_then(|&i| self.slots[i].as_ref())
    }

    fn slot(&self, i: usize) -> &Tracked {
        self.slots[i].as_ref().expect("indexed slots are filled")
    }

    fn slot_mut(&mut self, i: usize) -> &mut Tracked {
        self.slots[i].as_mut().expect("indexed slots are filled")
    }

    fn phase_of(&self, request_id: &str) -> Phase {
        self.get(request_id).and_then(|t| t.tracker.as_ref()).map_or(Phase::Pending, |t| t.phase())
    }

    /// Tracks `request_id` afresh (a new engine sequence number; with a phase tracker
    /// started from `prompt` when given); returns its slot.
    fn start_tracking(&mut self, request_id: &str, prompt: Option<&[u32]>) -> usize {
        let tracker = prompt.and_then(|p| self.markers.as_ref().map(|m| PhaseTracker::new(m, p)));
        self.next_seq += 1;
        let tracked = Tracked {
            id: request_id.to_owned(),
            stream_id: None,
            tracker,
            seq: self.next_seq,
            think_ended_s: None,
            seen: 0,
            directive_priority: None,
            directive_generation: None,
            object: None,
            think_budget: None,
        };
        if let Some(&i) = self.by_id.get(request_id) {
            self.slots[i] = Some(tracked);
            return i;
        }
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(tracked);
                i
            }
            None => {
                self.slots.push(Some(tracked));
                self.slots.len() - 1
            }
        };
        self.by_id.insert(request_id.to_owned(), i);
        i
    }

    /// The permutation of `rows` to run in (victim last).
    pub fn order_rows(&mut self, rows: &[RunningRow]) -> Vec<usize> {
        self.plan_rows(rows).0
    }

    /// The order (victim last) and the policy's limits for the coming step.
    pub fn plan_rows(&mut self, rows: &[RunningRow]) -> (Vec<usize>, StepLimits) {
        let now = self.started.elapsed().as_secs_f64();
        let mut views = Vec::with_capacity(rows.len());
        let mut row_slots = Vec::with_capacity(rows.len());
        for RunningRow(request_id, arrival_s, priority, prefill_remaining, new_tokens) in rows {
            let i = match self.by_id.get(request_id.as_str()) {
                Some(&i) => i,
                None => self.start_tracking(request_id, None),
            };
            let markers = self.markers.as_ref();
            let entry = self.slots[i].as_mut().expect("indexed slots are filled");
            feed(entry, markers, new_tokens.iter().copied(), now);
            views.push(view_of(entry, *arrival_s, *priority, *prefill_remaining));
            row_slots.push(i);
        }
        let (order, limits, _paced) = self.finish_plan(views, &row_slots, None, now);
        (order, limits)
    }

    /// Applies the policy channel's priorities, runs the policy, and maps its order
    /// back to row indices; also says which rows the policy paces (`paced[i]`: row i, a
    /// decoding request that sits this step out, as reasoning-first does to an answer
    /// ahead of its reader). `row_slots[i]`: row i's slot. `oldest_waiting_start`: the
    /// arrival (engine clock) of the request that has waited longest in vLLM's queue.
    fn finish_plan(
        &mut self,
        mut views: Vec<RequestView>,
        row_slots: &[usize],
        oldest_waiting_start: Option<f64>,
        now: f64,
    ) -> (Vec<usize>, StepLimits, Vec<bool>) {
        let shared = Arc::clone(&self.shared);
        // One lock for the step; lookups only while the table is not empty, and then
        // only for requests whose last lookup predates the table's latest change.
        if let Ok(table) = shared.directives.lock() {
            if !table.is_empty() {
                let generation = table.generation();
                for (view, &i) in views.iter_mut().zip(row_slots) {
                    let t = self.slot_mut(i);
                    if t.directive_generation != Some(generation) {
                        let found = match &t.stream_id {
                            // vLLM's full request id still names it exactly (an operator's
                            // tool may use it); its client part no longer does.
                            Some(stream) => table.get(stream).or_else(|| table.get(&t.id)),
                            None => directives_in(&table, &t.id),
                        };
                        t.directive_priority = found.and_then(|d| d.priority);
                        t.directive_generation = Some(generation);
                    }
                    if let Some(p) = t.directive_priority {
                        view.priority = p;
                    }
                }
            }
        }
        // Row index by engine sequence number (unique per tracked request).
        let mut index_of_seq: Vec<(u64, usize)> = views.iter().enumerate().map(|(i, v)| (v.seq, i)).collect();
        index_of_seq.sort_unstable();
        let policy = self.policy.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        policy.order_running(&mut views, now);
        policy.observe_waiting(oldest_waiting_start);
        let limits = policy.step_limits(&views, now);
        if !views.is_empty() {
            let victim = policy.pick_victim(&views, now).min(views.len() - 1);
            let v = views.remove(victim);
            views.push(v);
        }
        let mut paced = vec![false; views.len()];
        let order: Vec<usize> = views
            .iter()
            .filter_map(|v| {
                let row = index_of_seq
                    .binary_search_by_key(&v.seq, |&(seq, _)| seq)
                    .ok()
                    .map(|k| index_of_seq[k].1)?;
                // Only a request that would decode: pacing a prompt would only delay it.
                paced[row] = v.prefill_remaining == 0 && policy.defer(v, now);
                Some(row)
            })
            .collect();
        self.shared.counters.add(Counter::ScheduleSteps, 1);
        if order.iter().enumerate().any(|(pos, &i)| pos != i) {
            self.shared.counters.add(Counter::Reorders, 1);
        }
        (order, limits, paced)
    }
}

/// Moves the still-prefilling requests behind the decoding ones, each group keeping its
/// order, and the victim (the last entry) last.
fn prefill_after_decodes(order: &mut [usize], prefilling: &[bool]) {
    if let Some((_victim, rest)) = order.split_last_mut() {
        rest.sort_by_key(|&i| prefilling.get(i).copied().unwrap_or(false));
    }
}

#[pymethods]
impl SchedulerCore {
    /// `policy` as in `hook.policy`; `think_start` / `think_end`: the served model's
    /// delimiters as token ids (empty `think_end`: phases unknown, order by arrival).
    /// `step_budget`: vLLM's `max_num_batched_tokens`, which the policy's limits that
    /// are shares of the budget (output-first's default prefill cap) scale with.
    #[new]
    #[pyo3(signature = (policy, think_start, think_end, step_budget=None))]
    fn new(
        policy: &str,
        think_start: Vec<u32>,
        think_end: Vec<u32>,
        step_budget: Option<u32>,
    ) -> PyResult<Self> {
        let mut core = SchedulerCore::create(policy, think_start, think_end, crate::shared())?;
        if let Some(tokens) = step_budget {
            core.policy.get_mut().unwrap_or_else(|p| p.into_inner()).set_step_budget(tokens);
        }
        Ok(core)
    }

    /// Starts tracking a request from its prompt (call once, before `order`).
    fn track(&mut self, request_id: String, prompt: Vec<u32>) {
        self.start_tracking(&request_id, Some(&prompt));
    }

    /// One step's plan from vLLM's running list itself (its `Request` objects, in
    /// vLLM's order): new requests are tracked from their prompts, and per request and
    /// step only its computed-token count and the output tokens generated since the
    /// previous call are read. Returns `(order, max_prefill_tokens, max_think_decodes,
    /// hold)`: the order to run in (`None`: keep vLLM's), the policy's limits (`None`:
    /// no limit), and the positions in the new order of the requests the limits hold
    /// out of the step (`None`: nobody): still-prefilling ones when no prompt token may
    /// be computed, thinking ones past the think-decode cap. `oldest_waiting_start`: the
    /// `arrival_time` of the request that has waited longest in vLLM's queue to start
    /// (`None`: none waits), which a policy weighing starts against answers reads (with
    /// the running requests' waits in Meridian's admission queue: [`oldest_start`]).
    #[pyo3(signature = (running, oldest_waiting_start=None))]
    fn plan_running(
        &mut self,
        running: &Bound<'_, PyList>,
        oldest_waiting_start: Option<f64>,
    ) -> PyResult<RunningPlan> {
        let now = self.started.elapsed().as_secs_f64();
        let oldest_waiting_start = oldest_waiting_start.map(|t| self.engine_time(t));
        self.plans += 1;
        self.time_step(now);
        let n = running.len();
        let mut views = Vec::with_capacity(n);
        let mut row_slots = Vec::with_capacity(n);
        let mut scratch = Vec::new();
        let previous = std::mem::take(&mut self.last_running);
        for i in 0..n {
            let req = borrowed_item(running, i)?;
            let (slot, view) = self.observe(req, previous.get(i).copied(), now, &mut scratch)?;
            views.push(view);
            row_slots.push(slot);
            self.last_running.push((req.as_ptr() as usize, slot));
        }
        let prefilling: Vec<bool> = views.iter().map(|v| v.prefill_remaining > 0).collect();
        let oldest_start =
            oldest_start(oldest_waiting_start, self.longest_proxy_wait(&row_slots, &prefilling), now);
        let (mut order, limits, paced) = self.finish_plan(views, &row_slots, oldest_start, now);
        let capped = limits.max_prefill_tokens.filter(|&cap| cap > 0);
        if capped.is_some() {
            prefill_after_decodes(&mut order, &prefilling);
            self.shared.counters.add(Counter::PrefillCappedSteps, 1);
        }
        if limits.max_think_decodes == Some(0) && limits.max_prefill_tokens == Some(0) {
            self.shared.counters.add(Counter::ExpressSteps, 1);
        }
        let (prefill_cap, think_cap) = (limits.max_prefill_tokens, limits.max_think_decodes);
        let mut hold = Vec::new();
        if prefill_cap == Some(0) || think_cap.is_some() || paced.contains(&true) {
            let mut thinking = 0u32;
            for (pos, &i) in order.iter().enumerate() {
                if prefilling[i] {
                    if prefill_cap == Some(0) {
                        hold.push(pos);
                    }
                } else if paced[i] {
                    hold.push(pos);
                    self.shared.counters.add(Counter::PacedAnswers, 1);
                } else if let Some(cap) = think_cap {
                    let phase =
                        self.slot(row_slots[i]).tracker.as_ref().map_or(Phase::Pending, |t| t.phase());
                    if phase == Phase::Think {
                        if thinking >= cap {
                            hold.push(pos);
                        } else {
                            thinking += 1;
                        }
                    }
                }
            }
        }
        // vLLM's `long_prefill_token_threshold` caps each request's chunk, not the step:
        // two prompts going in, or one running and one admitted, would each get the cap.
        // A token budget of one per decoding request plus the cap bounds the step's prompt
        // tokens (with the prefilling requests after the decoding ones, which it
        // therefore never starves; new admissions get what the running ones leave).
        let budget = capped.map(|cap| {
            let decoding = order
                .iter()
                .filter(|&&i| !prefilling.get(i).copied().unwrap_or(false))
                .count()
                .saturating_sub(hold.len());
            u32::try_from(decoding).unwrap_or(u32::MAX).saturating_add(cap)
        });
        let identity = order.len() == n && order.iter().enumerate().all(|(pos, &i)| pos == i);
        if !identity && order.len() == n {
            self.last_running = order.iter().map(|&i| self.last_running[i]).collect();
        }
        Ok(((!identity).then_some(order), prefill_cap, think_cap, (!hold.is_empty()).then_some(hold), budget))
    }

    /// After vLLM's `update_from_output` appended the step's sampled tokens: reads them
    /// for the running requests the last `plan_running` call read, while they are still
    /// in the CPU's cache, so the next call reads no Python object of those requests;
    /// then publishes the running requests by phase and, when given, the waiting
    /// queue's length (`meridian_hook_requests`, and the hello the proxy reads).
    #[pyo3(signature = (running, waiting=None))]
    fn observe_outputs(&mut self, running: &Bound<'_, PyList>, waiting: Option<u64>) -> PyResult<()> {
        let by_phase = self.observe_outputs_of(running)?;
        self.shared.counters.set_running(by_phase);
        if let Some(waiting) = waiting {
            self.shared.counters.set_waiting(waiting);
        }
        Ok(())
    }

    /// The KV cache's free blocks, as vLLM's block pool counts them.
    fn count_free_blocks(&self, free: u64) {
        self.shared.counters.set_kv_free_blocks(free);
    }

    fn knows(&self, request_id: &str) -> bool {
        self.by_id.contains_key(request_id)
    }

    /// `rows`: `(request_id, arrival_time, priority, prefill_remaining, new_output_tokens)`
    /// per running request, in vLLM's order. Returns the order to run them in.
    fn order(&mut self, rows: Vec<RunningRow>) -> Vec<usize> {
        self.order_rows(&rows)
    }

    /// Like `order`, plus the policy's limits for the step: `(order, max_prefill_tokens,
    /// max_think_decodes)`, `None` meaning no limit.
    fn plan(&mut self, rows: Vec<RunningRow>) -> (Vec<usize>, Option<u32>, Option<u32>) {
        let (order, limits) = self.plan_rows(&rows);
        if limits.max_think_decodes == Some(0) && limits.max_prefill_tokens == Some(0) {
            self.shared.counters.add(Counter::ExpressSteps, 1);
        }
        (order, limits.max_prefill_tokens, limits.max_think_decodes)
    }

    /// `"pending"`, `"think"` or `"output"`.
    fn phase(&self, request_id: &str) -> &'static str {
        self.phase_of(request_id).as_str()
    }

    /// Records that vLLM preempted a request; returns the KV tier it was in.
    fn preempted(&mut self, request_id: &str) -> &'static str {
        let now = self.started.elapsed().as_secs_f64();
        self.policy.get_mut().unwrap_or_else(|p| p.into_inner()).on_preempted(now);
        let (counter, tier) = match self.phase_of(request_id) {
            Phase::Output => (Counter::PreemptOutput, Tier::OutputCritical.as_str()),
            Phase::Think => (Counter::PreemptThink, Tier::ThinkActive.as_str()),
            Phase::Pending => (Counter::PreemptPending, "pending"),
        };
        self.shared.counters.add(counter, 1);
        tier
    }

    /// Measures KV blocks per tier from `(request_id, blocks_held)` of the running
    /// requests: an answering request's blocks covering its finished thought are
    /// think-complete, the rest output-critical; a thinking request's are think-active.
    fn account_kv(&self, held: Vec<(String, u64)>, block_size: u64) -> [u64; 3] {
        self.tiers_of(held, block_size)
    }

    /// `account_kv` for the requests of the last `plan_running` call, their blocks
    /// counted in vLLM's per-KV-cache-group tables (`request_id -> blocks`, as
    /// `single_type_managers[g].req_to_blocks`) without a Python call per request.
    fn account_kv_running(
        &self,
        py: Python<'_>,
        tables: Vec<Bound<'_, PyDict>>,
        block_size: u64,
    ) -> PyResult<[u64; 3]> {
        self.tiers_of_running(py, &tables, block_size)
    }

    /// The first KV block of a finishing request that no later request can hit (it and
    /// every block after it hold or chain over a thought, which chat templates drop from
    /// the next turn's history), by core's one rule (`meridian_core::kv::first_dead_block`);
    /// `None` when it did not think.
    fn first_dead_block(&self, request_id: &str, prompt_tokens: u32, block_size: u32) -> Option<u32> {
        let thought =
            self.get(request_id).and_then(|t| t.tracker.as_ref()).is_some_and(|t| t.think_tokens() > 0);
        meridian_core::kv::first_dead_block(prompt_tokens, block_size, thought)
    }

    /// Counts KV blocks moved to the front of the eviction queue (the think-complete tier).
    fn demoted(&self, blocks: u64) {
        self.shared.counters.add(Counter::KvDemoted, blocks);
    }

    /// Forgets requests vLLM no longer holds: `live` iterates the ids of those it holds
    /// (a list, or the keys of vLLM's `requests` dict).
    fn retain(&mut self, live: &Bound<'_, PyAny>) -> PyResult<()> {
        let live: Vec<Bound<'_, PyString>> =
            live.try_iter()?.map(|id| Ok(id?.cast_into::<PyString>()?)).collect::<PyResult<_>>()?;
        let live: HashSet<&str> = live.iter().map(|id| id.to_str()).collect::<PyResult<_>>()?;
        let slots = &mut self.slots;
        let free = &mut self.free;
        self.by_id.retain(|id, &mut i| {
            let keep = live.contains(id.as_str());
            if !keep {
                slots[i] = None;
                free.push(i);
            }
            keep
        });
        // Before any slot is reused: drop the addresses of forgotten requests and of
        // objects a slot no longer holds.
        self.by_object.retain(|&address, &mut i| {
            slots[i].as_ref().and_then(|t| t.object.as_ref()).is_some_and(|o| o.address == address)
        });
        Ok(())
    }

    fn tracked(&self) -> usize {
        self.by_id.len()
    }

    #[getter]
    fn policy_name(&self) -> String {
        self.policy.lock().map(|p| p.name().to_owned()).unwrap_or_default()
    }

    #[staticmethod]
    fn kv_tiers() -> [&'static str; 3] {
        KV_TIERS
    }
}
