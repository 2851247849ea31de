//! The step loop: a discrete-time model of vLLM's V1 scheduler.
//!
//! Each step, running requests (in the policy's order) take their next tokens from the
//! step's token budget — one for a decoding request, a chunk of the prompt for a
//! prefilling one — and grow their KV blocks. When blocks run out, a victim (the policy's
//! choice; stock: the last running request) is preempted with recompute: its blocks are
//! freed and it returns to the front of the waiting queue with nothing computed. Waiting
//! requests are admitted only in steps without preemption, while budget, sequence slots
//! and blocks last, and only with room for the whole sequence so far (vLLM's default
//! `scheduler_reserve_full_isl`), though a request takes the blocks of its first chunk.
//! The step's duration comes from the cost model; a request whose KV catches up with its
//! tokens samples one token at the end of the step.
//!
//! A step in which nothing can run (every held request paced by the policy or held by
//! its limits, nothing admissible) is an idle step: the clock moves on to when the policy
//! lets a request run again, as vLLM's loop keeps asking its scheduler while real time
//! passes. Time-based decisions (pacing, protection windows) lapse only if it does.
//!
//! The KV cache is `meridian_core::kv`'s pool. With the prefix cache on
//! ([`EngineConfig::prefix_cache`], off by default as in every real-engine run so far), a
//! request's full blocks are named by chained hashes of its tokens and cached once
//! computed; a request taken from the waiting queue (new, or resumed after preemption)
//! starts from the longest cached prefix of its tokens, as vLLM's `get_computed_blocks`
//! does (at least its last token is computed again); freed blocks stay cached until the
//! pool's eviction order gives their space away.

mod hold;
mod outcome;
mod request;

use std::collections::{HashMap, VecDeque};

use meridian_core::Phase;
use meridian_core::sched::SchedulingPolicy;

pub use meridian_core::kv::{Eviction, PrefixCounters};
pub use outcome::{RequestSteps, StepReport, SubmitError, Token};
pub use request::{NewRequest, TokenIds};
use request::{SimRequest, State};

use crate::cost::{CostModel, Profile, StepShape};
use crate::spread::StepSpread;
use meridian_core::kv::{Held, KvPool, Released, tier_at_release};

/// Engine limits and costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    pub cost: CostModel,
    pub kv_blocks: u32,
    pub block_size: u32,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    /// vLLM's prefix caching, with the order its free blocks are evicted in (stock:
    /// [`Eviction::Lru`]; the hook: [`Eviction::DeadFirst`]); `None`: off.
    pub prefix_cache: Option<Eviction>,
    /// How each step's time varies around the cost model's (`crate::spread`); none:
    /// every step takes the model's time.
    pub step_spread: Option<StepSpread>,
}

impl From<&Profile> for EngineConfig {
    fn from(p: &Profile) -> Self {
        EngineConfig {
            cost: p.cost(),
            kv_blocks: p.kv_blocks,
            block_size: p.block_size,
            max_num_seqs: p.max_num_seqs,
            max_num_batched_tokens: p.max_num_batched_tokens,
            prefix_cache: None,
            step_spread: p.step_spread,
        }
    }
}

/// The shortest idle step: the clock always moves, so a deferral that lapses "now" only
/// up to rounding is asked about again a microsecond later instead of forever.
const MIN_IDLE_S: f64 = 1e-6;

pub struct Engine {
    config: EngineConfig,
    policy: Box<dyn SchedulingPolicy>,
    clock_s: f64,
    next_seq: u64,
    requests: HashMap<u64, SimRequest>,
    running: Vec<u64>,
    waiting: VecDeque<u64>,
    pool: KvPool,
    preemptions: u64,
    output_critical_preemptions: u64,
    /// Steps that ran with a prefill cap from the policy in force (whether or not a
    /// prompt was there to cap): the step trace's `prefill_cap`, which the rig's pages
    /// count per run, so twin and engine can be compared on how often a policy protected.
    prefill_capped_steps: u64,
    /// Over the steps that computed something: the running requests (held ones
    /// included) and those among them that computed nothing, as the rig's step trace
    /// counts `running` against the requests a step scheduled.
    request_steps: RequestSteps,
    steps: u64,
}

impl Engine {
    pub fn new(config: EngineConfig, mut policy: Box<dyn SchedulingPolicy>) -> Self {
        // As the hook tells its policy vLLM's budget: limits that are shares of it.
        policy.set_step_budget(config.max_num_batched_tokens);
        Engine {
            config,
            policy,
            clock_s: 0.0,
            next_seq: 0,
            requests: HashMap::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            pool: KvPool::new(
                config.kv_blocks,
                config.block_size,
                config.prefix_cache.unwrap_or(Eviction::Lru),
            ),
            preemptions: 0,
            output_critical_preemptions: 0,
            prefill_capped_steps: 0,
            request_steps: RequestSteps::default(),
            steps: 0,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// Engine time in seconds.
    pub fn now(&self) -> f64 {
        self.clock_s
    }

    /// Moves the clock forward while idle (arrivals in virtual time).
    pub fn advance_to(&mut self, t_s: f64) {
        if t_s > self.clock_s {
            self.clock_s = t_s;
        }
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Running requests by phase (computing their prompt, thinking, answering) and those
    /// waiting: what the hook reports of a vLLM engine in its hello.
    pub fn requests_by_phase(&self) -> meridian_core::channel::EngineState {
        let mut state = meridian_core::channel::EngineState {
            waiting: u32::try_from(self.waiting.len()).unwrap_or(u32::MAX),
            steps: self.steps,
            ..Default::default()
        };
        for r in self.running.iter().filter_map(|seq| self.requests.get(seq)) {
            let slot = match r.phase() {
                Phase::Pending => &mut state.prefilling,
                Phase::Think => &mut state.thinking,
                Phase::Output => &mut state.answering,
            };
            *slot += 1;
        }
        state
    }

    pub fn kv_usage(&self) -> f64 {
        self.pool.usage()
    }

    /// What the prefix cache did (tokens queried and hit, cached blocks evicted by tier);
    /// all zero while it is off.
    pub fn prefix_counters(&self) -> PrefixCounters {
        if self.config.prefix_cache.is_some() { self.pool.counters() } else { PrefixCounters::default() }
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Preemptions of requests that were answering: the KV tier whose evictions a user
    /// sees as a stall mid-answer. Meridian's target for it is zero.
    pub fn output_critical_preemptions(&self) -> u64 {
        self.output_critical_preemptions
    }

    /// Steps (idle ones aside) run under a policy's prefill cap.
    pub fn prefill_capped_steps(&self) -> u64 {
        self.prefill_capped_steps
    }

    /// Running requests summed over the steps that computed something, and those that
    /// sat such a step out (held by the policy, or given no tokens by its limits).
    pub fn request_steps(&self) -> RequestSteps {
        self.request_steps
    }

    /// Steps that computed something (idle steps are not counted).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// The caller's id of a request.
    pub fn id_of(&self, seq: u64) -> Option<&str> {
        self.requests.get(&seq).map(|r| r.id.as_str())
    }

    /// Queues a request; it arrives now.
    pub fn submit(&mut self, req: NewRequest) -> Result<u64, SubmitError> {
        let think_len = req.think_budget.map_or(req.think_tokens, |b| req.think_tokens.min(b));
        if think_len + req.answer_tokens == 0 {
            return Err(SubmitError::Empty);
        }
        let closes_thought = think_len > 0 && req.answer_tokens > 0;
        let generated = think_len + u32::from(closes_thought) + req.answer_tokens;
        if self.pool.blocks_for(req.prompt_tokens + generated) > self.pool.capacity() {
            return Err(SubmitError::TooLong {
                prompt: req.prompt_tokens,
                generated,
                blocks: self.pool.capacity(),
                block_size: self.pool.block_size(),
            });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.requests.insert(
            seq,
            SimRequest {
                seq,
                id: req.id,
                arrival_s: self.clock_s,
                priority: req.priority,
                prompt: req.prompt_tokens,
                think_len,
                think_forced: req.think_budget.is_some_and(|b| b <= req.think_tokens),
                closes_thought,
                answer_len: req.answer_tokens,
                generated: 0,
                computed: 0,
                preloaded: req.preloaded.min(req.prompt_tokens),
                held: Held::default(),
                ids: req.ids,
                hashes: Vec::new(),
                cached_blocks: 0,
                state: State::Waiting,
                think_ended_s: None,
                queued_s: self.clock_s,
            },
        );
        self.waiting.push_back(seq);
        Ok(seq)
    }

    /// Drops a request (its client went away); frees its blocks.
    pub fn abort(&mut self, seq: u64) -> bool {
        let Some(r) = self.requests.remove(&seq) else { return false };
        let released = Released::Finished { thought: r.generated.min(r.think_len) > 0 };
        self.release(r.held, r.prompt, released);
        match r.state {
            State::Running => self.running.retain(|s| *s != seq),
            State::Waiting => self.waiting.retain(|s| *s != seq),
        }
        true
    }

    /// Ends thinking now: the next token is the forced delimiter, then the answer ("end
    /// thinking now" from the proxy, or an entropy-gated exit). No effect once the
    /// delimiter is due or out. Not marked as seen coming (`think_forced`): the hook's
    /// scheduler learns of such an exit only from the delimiter itself.
    pub fn end_thinking(&mut self, seq: u64) -> bool {
        match self.requests.get_mut(&seq) {
            Some(r) if r.generated < r.think_len => {
                r.think_len = r.generated;
                r.closes_thought = r.answer_len > 0;
                true
            }
            _ => false,
        }
    }

    /// Runs one step (an idle one when nothing can run yet). `None` only when the engine
    /// holds no request.
    pub fn step(&mut self) -> Option<StepReport> {
        self.step_until(f64::INFINITY)
    }

    /// Like [`Engine::step`], but an idle step ends by `wake_s` (the caller's next arrival,
    /// which a real engine would admit as soon as it came).
    pub fn step_until(&mut self, wake_s: f64) -> Option<StepReport> {
        if !self.has_work() {
            return None;
        }
        let now = self.clock_s;
        let mut budget = self.config.max_num_batched_tokens;
        let mut report = StepReport { started_s: now, ..StepReport::default() };

        let views = self.order_running(now);
        self.policy.observe_waiting(self.oldest_waiting_start());
        let limits = self.policy.step_limits(&views, now);
        self.victim_last(views, limits.max_prefill_tokens.is_some_and(|cap| cap > 0), now);
        let holds = self.holds(&limits, now);
        if !holds.seqs.is_empty() {
            self.running.retain(|s| !holds.seqs.contains(s));
        }
        // A cap of no prompt tokens holds the prompts out (above) or, when nobody may be
        // held, only stops admissions: the running prompts then compute their chunks.
        let prompts_held = limits.max_prefill_tokens == Some(0);
        let mut prefill_left = limits.max_prefill_tokens.unwrap_or(u32::MAX);
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = self.running[i];
            let r = &self.requests[&seq];
            let missing = r.tokens_needed() - r.computed;
            let prefilling = missing > 1;
            let mut n_new = missing.min(budget);
            if prefilling && !prompts_held {
                n_new = n_new.min(prefill_left);
            }
            if n_new == 0 {
                i += 1; // sits this step out
                continue;
            }
            if self.grow_or_preempt(i, n_new, now, &mut report) {
                report.scheduled.push((seq, n_new));
                budget -= n_new;
                if prefilling {
                    prefill_left = prefill_left.saturating_sub(n_new);
                }
                i += 1;
            }
        }
        if report.preempted.is_empty() {
            self.admit_waiting(&mut budget, &mut prefill_left, holds.seqs.len(), now, &mut report);
        }
        // Held requests are still running: back at the list's end, as the hook puts them.
        self.running.extend(&holds.seqs);
        if report.scheduled.is_empty() {
            return Some(self.idle(report, holds.resume_s, wake_s));
        }
        if limits.max_prefill_tokens.is_some() {
            self.prefill_capped_steps += 1;
        }
        let running = self.running.len() as u64;
        self.request_steps.running += running;
        self.request_steps.sat_out += running.saturating_sub(report.scheduled.len() as u64);
        self.finish_step(report)
    }

    /// Nothing could run this step: moves the clock to `resume_s` (when the policy said a
    /// paced request may run again; else one step's fixed cost later, when the engine asks
    /// its policy again), or to `wake_s` if that comes first.
    fn idle(&mut self, mut report: StepReport, resume_s: Option<f64>, wake_s: f64) -> StepReport {
        let poll_s = self.clock_s + self.config.cost.fixed_s.max(MIN_IDLE_S);
        let until = resume_s.filter(|t| t.is_finite()).unwrap_or(poll_s).min(wake_s);
        let wait = (until - self.clock_s).max(MIN_IDLE_S);
        self.clock_s += wait;
        report.duration_s = wait;
        report
    }

    /// Arrival of the request that has waited longest in the queue without generating a
    /// token (preempted ones have started), as the hook reads vLLM's queue.
    fn oldest_waiting_start(&self) -> Option<f64> {
        self.waiting
            .iter()
            .filter_map(|s| self.requests.get(s))
            .filter(|r| r.generated == 0)
            .map(|r| r.arrival_s)
            .min_by(f64::total_cmp)
    }

    /// Puts the running list in the policy's order; returns the views in that order.
    fn order_running(&mut self, now: f64) -> Vec<meridian_core::sched::RequestView> {
        let mut views: Vec<_> = self.running.iter().map(|s| self.requests[s].view()).collect();
        self.policy.order_running(&mut views, now);
        self.running = views.iter().map(|v| v.seq).collect();
        views
    }

    /// The running list as the hook hands it to vLLM: the policy's victim last (vLLM
    /// preempts the last entry, and schedules in order, so the victim is also served
    /// last: under reasoning-first, the newest arrival, usually the request computing its
    /// prompt, comes after the answers instead of taking the step's budget before them),
    /// and, in a step whose prompt tokens the policy caps, the requests computing their
    /// prompts behind the decoding ones.
    fn victim_last(&mut self, mut views: Vec<meridian_core::sched::RequestView>, capped: bool, now: f64) {
        if views.is_empty() {
            return;
        }
        let victim = self.policy.pick_victim(&views, now).min(views.len() - 1);
        let v = views.remove(victim);
        views.push(v);
        if capped && let Some((_victim, rest)) = views.split_last_mut() {
            rest.sort_by_key(|v| v.prefill_remaining > 0);
        }
        self.running = views.iter().map(|v| v.seq).collect();
    }

    /// Makes room for `n_new` more tokens of `running[i]`, preempting as needed. False
    /// when `running[i]` itself was preempted (the caller must not advance `i`).
    fn grow_or_preempt(&mut self, i: usize, n_new: u32, now: f64, report: &mut StepReport) -> bool {
        let seq = self.running[i];
        loop {
            // (`running` holds only requests the engine holds.)
            let Some(r) = self.requests.get_mut(&seq) else { return true };
            let need = self.pool.blocks_for(r.computed + n_new).saturating_sub(r.held.len());
            if self.pool.grow(&mut r.held, need) {
                return true;
            }
            // vLLM preempts the running list's last entry: the policy's victim, put there
            // at the step's start (`victim_last`), then the list's end in the policy's
            // order. It is never one scheduled earlier in the step (those come before `i`).
            let Some(victim) = self.running.pop() else { return true };
            self.policy.on_preempted(now);
            self.preempt(victim);
            report.preempted.push(victim);
            if victim == seq {
                return false;
            }
        }
    }

    fn preempt(&mut self, seq: u64) {
        let now = self.clock_s;
        if let Some(r) = self.requests.get_mut(&seq) {
            if r.phase() == Phase::Output && r.generated > 0 {
                self.output_critical_preemptions += 1;
            }
            r.queued_s = now;
            let held = std::mem::take(&mut r.held);
            let released = Released::Preempted(r.phase());
            let prompt = r.prompt;
            r.computed = 0;
            r.cached_blocks = 0;
            r.state = State::Waiting;
            self.release(held, prompt, released);
        }
        self.waiting.push_front(seq);
        self.preemptions += 1;
    }

    /// `slots_held`: running requests held out of the step, whose sequence slots stay taken.
    fn admit_waiting(
        &mut self,
        budget: &mut u32,
        prefill_left: &mut u32,
        slots_held: usize,
        now: f64,
        report: &mut StepReport,
    ) {
        let mut views: Vec<_> = self.waiting.iter().map(|s| self.requests[s].view()).collect();
        self.policy.order_waiting(&mut views, now);
        self.waiting = views.into_iter().map(|v| v.seq).collect();
        let caching = self.config.prefix_cache.is_some();
        let block_size = self.pool.block_size();
        while let Some(&seq) = self.waiting.front() {
            if *budget == 0
                || *prefill_left == 0
                || self.running.len() + slots_held >= self.config.max_num_seqs as usize
            {
                break;
            }
            let Some(r) = self.requests.get_mut(&seq) else { break };
            // A request taken from the waiting queue holds nothing; with the prefix cache
            // on, the cached blocks of its tokens' prefix are computed already, short of
            // its last token, which must be computed to sample the next.
            let mut hits = 0;
            if caching {
                r.name_full_blocks(block_size);
                let most = ((r.tokens_needed() - 1) / block_size).min(r.hashes.len() as u32);
                hits = self.pool.cached_prefix(&r.hashes[..most as usize]);
            }
            // vLLM takes a request from the queue only with room for its whole sequence so
            // far (`scheduler_reserve_full_isl`, its default), though it allocates only the
            // first chunk: otherwise a resumed request whose first chunk fits is admitted,
            // preempted again before its recompute ends, and the cache thrashes.
            if !self.pool.fits(&r.hashes[..hits as usize], self.pool.blocks_for(r.tokens_needed())) {
                break;
            }
            // KV that came with it counts as computed, once.
            let start = (hits * block_size).max(std::mem::take(&mut r.preloaded).min(r.tokens_needed() - 1));
            let n_new = (r.tokens_needed() - start).min(*budget).min(*prefill_left);
            let blocks = self.pool.blocks_for(start + n_new);
            let Some(held) = self.pool.admit(&r.hashes[..hits as usize], blocks, r.tokens_needed()) else {
                break;
            };
            r.held = held;
            r.computed = start;
            r.cached_blocks = hits;
            r.state = State::Running;
            if caching {
                report.prefix_hits.push((seq, start));
            }
            self.waiting.pop_front();
            self.running.push(seq);
            report.scheduled.push((seq, n_new));
            *budget -= n_new;
            *prefill_left -= n_new;
        }
    }

    fn finish_step(&mut self, mut report: StepReport) -> Option<StepReport> {
        let mut shape = StepShape::default();
        for (seq, n) in &report.scheduled {
            let Some(r) = self.requests.get(seq) else { continue };
            if *n == 1 && r.computed >= r.prompt {
                shape.tokens += 1.0;
                shape.decode_reqs += 1.0;
                shape.decode_context += f64::from(r.computed) + 1.0;
            } else {
                shape.add_prefill(u64::from(*n), u64::from(r.computed));
            }
        }
        let spread = self.config.step_spread.map_or(1.0, |s| s.factor(self.steps));
        let duration = self.config.cost.step_seconds(&shape) * spread;
        self.clock_s += duration;
        self.steps += 1;
        report.duration_s = duration;
        let end = self.clock_s;
        let mut finished = Vec::new();
        let caching = self.config.prefix_cache.is_some();
        let block_size = self.pool.block_size();
        for &(seq, n) in &report.scheduled {
            let Some(r) = self.requests.get_mut(&seq) else { continue };
            r.computed += n;
            if caching {
                // Full blocks whose KV is now computed join the cache, as vLLM's
                // `cache_blocks` adds them after each allocation.
                r.name_full_blocks(block_size);
                let full = (r.computed / block_size).min(r.hashes.len() as u32);
                for index in r.cached_blocks..full {
                    self.pool.cache(&r.held, index, r.hashes[index as usize]);
                }
                r.cached_blocks = r.cached_blocks.max(full);
            }
            if r.computed < r.tokens_needed() {
                continue; // a prefill chunk that did not reach the end of the prompt
            }
            let index = r.generated;
            let phase = if index < r.answer_starts() { Phase::Think } else { Phase::Output };
            let ends_thought = r.closes_thought && index == r.think_len;
            r.generated += 1;
            if r.generated == r.answer_starts() {
                r.think_ended_s = Some(end);
            }
            let last = r.generated >= r.target();
            report.tokens.push(Token { seq, index, phase, ends_thought, at_s: end, last });
            if last {
                finished.push(seq);
            }
        }
        for seq in finished {
            if let Some(r) = self.requests.remove(&seq) {
                self.release(r.held, r.prompt, Released::Finished { thought: r.think_len > 0 });
            }
            self.running.retain(|s| *s != seq);
        }
        Some(report)
    }

    /// Gives a request's blocks back, each into its tier (`meridian_core::kv`'s rule).
    fn release(&mut self, held: Held, prompt: u32, released: Released) {
        let block_size = self.pool.block_size();
        self.pool.release(held, |index| tier_at_release(index, prompt, block_size, released));
    }
}
