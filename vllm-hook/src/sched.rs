//! The scheduler half of the hook: vLLM's scheduler hands over its running list each
//! step, this orders it by `meridian-core`'s policy (answering requests get the token
//! budget first, thinking ones fill the rest) and puts the policy's preemption victim
//! last, where vLLM's stock victim choice (`running[-1]`) takes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use meridian_core::Phase;
use meridian_core::sched::{RequestView, SchedulingPolicy, StepLimits, policy_by_name};
use pyo3::prelude::*;

use crate::channel::Shared;
use crate::error::HookError;
use crate::metrics::{Counter, KV_TIERS};
use crate::phase::{PhaseTracker, ThinkMarkers};

struct Tracked {
    tracker: Option<PhaseTracker>,
    seq: u64,
    think_ended_s: Option<f64>,
}

/// One running request as vLLM's scheduler sees it this step: `(request_id,
/// arrival_s, priority, prefill_remaining, new_tokens)`, the last being the output tokens
/// generated since the previous call.
#[derive(FromPyObject)]
pub struct RunningRow(String, f64, i32, u32, Vec<u32>);

#[pyclass(module = "meridian_hook._native")]
pub struct SchedulerCore {
    // A Mutex only to make the class `Sync` for Python; vLLM calls it from one thread.
    policy: Mutex<Box<dyn SchedulingPolicy>>,
    markers: Option<ThinkMarkers>,
    requests: HashMap<String, Tracked>,
    next_seq: u64,
    started: Instant,
    shared: Arc<Shared>,
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
            requests: HashMap::new(),
            next_seq: 0,
            started: Instant::now(),
            shared,
        })
    }

    fn phase_of(&self, request_id: &str) -> Phase {
        self.requests.get(request_id).and_then(|t| t.tracker.as_ref()).map_or(Phase::Pending, |t| t.phase())
    }

    /// The permutation of `rows` to run in (victim last).
    pub fn order_rows(&mut self, rows: &[RunningRow]) -> Vec<usize> {
        self.plan_rows(rows).0
    }

    /// The order (victim last) and the policy's limits for the coming step.
    pub fn plan_rows(&mut self, rows: &[RunningRow]) -> (Vec<usize>, StepLimits) {
        let now = self.started.elapsed().as_secs_f64();
        let mut views = Vec::with_capacity(rows.len());
        let mut index_of_seq = HashMap::with_capacity(rows.len());
        for (i, RunningRow(request_id, arrival_s, priority, prefill_remaining, new_tokens)) in
            rows.iter().enumerate()
        {
            let entry = self.requests.entry(request_id.clone()).or_insert_with(|| {
                self.next_seq += 1;
                Tracked { tracker: None, seq: self.next_seq, think_ended_s: None }
            });
            if let (Some(tracker), Some(markers)) = (entry.tracker.as_mut(), self.markers.as_ref()) {
                for &t in new_tokens {
                    if tracker.push(t, markers) {
                        entry.think_ended_s = Some(now);
                    }
                }
            }
            let (phase, think, output) = entry
                .tracker
                .as_ref()
                .map_or((Phase::Pending, 0, 0), |t| (t.phase(), t.think_tokens(), t.output_tokens()));
            let priority =
                self.shared.directives_for(request_id).and_then(|d| d.priority).unwrap_or(*priority);
            index_of_seq.insert(entry.seq, i);
            views.push(RequestView {
                seq: entry.seq,
                arrival_s: *arrival_s,
                priority,
                phase: if *prefill_remaining > 0 { Phase::Pending } else { phase },
                prefill_remaining: *prefill_remaining,
                think_tokens: think,
                output_tokens: output,
                think_ended_s: entry.think_ended_s,
                queued_s: None,
            });
        }
        let policy = self.policy.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        policy.order_running(&mut views, now);
        let limits = policy.step_limits(&views, now);
        if !views.is_empty() {
            let victim = policy.pick_victim(&views, now).min(views.len() - 1);
            let v = views.remove(victim);
            views.push(v);
        }
        let order: Vec<usize> = views.iter().filter_map(|v| index_of_seq.get(&v.seq).copied()).collect();
        self.shared.counters.add(Counter::ScheduleSteps, 1);
        if order.iter().enumerate().any(|(pos, &i)| pos != i) {
            self.shared.counters.add(Counter::Reorders, 1);
        }
        (order, limits)
    }
}

#[pymethods]
impl SchedulerCore {
    /// `policy` as in `hook.policy`; `think_start` / `think_end`: the served model's
    /// delimiters as token ids (empty `think_end`: phases unknown, order by arrival).
    #[new]
    fn new(policy: &str, think_start: Vec<u32>, think_end: Vec<u32>) -> PyResult<Self> {
        Ok(SchedulerCore::create(policy, think_start, think_end, crate::shared())?)
    }

    /// Starts tracking a request from its prompt (call once, before `order`).
    fn track(&mut self, request_id: String, prompt: Vec<u32>) {
        let tracker = self.markers.as_ref().map(|m| PhaseTracker::new(m, &prompt));
        self.next_seq += 1;
        self.requests.insert(request_id, Tracked { tracker, seq: self.next_seq, think_ended_s: None });
    }

    fn knows(&self, request_id: &str) -> bool {
        self.requests.contains_key(request_id)
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
            Phase::Output => (Counter::PreemptOutput, "output-critical"),
            Phase::Think => (Counter::PreemptThink, "think-active"),
            Phase::Pending => (Counter::PreemptPending, "pending"),
        };
        self.shared.counters.add(counter, 1);
        tier
    }

    /// Measures KV blocks per tier from `(request_id, blocks_held)` of the running
    /// requests: an answering request's blocks covering its finished thought are
    /// think-complete, the rest output-critical; a thinking request's are think-active.
    fn account_kv(&self, held: Vec<(String, u64)>, block_size: u64) -> [u64; 3] {
        let mut tiers = [0u64; 3];
        let block_size = block_size.max(1);
        for (id, blocks) in held {
            let tracker = self.requests.get(&id).and_then(|t| t.tracker.as_ref());
            match tracker.map(|t| (t.phase(), t.think_tokens())) {
                Some((Phase::Output, think)) => {
                    let thought = (u64::from(think) / block_size).min(blocks);
                    tiers[0] += thought;
                    tiers[2] += blocks - thought;
                }
                Some((Phase::Think, _)) => tiers[1] += blocks,
                _ => tiers[2] += blocks,
            }
        }
        self.shared.counters.set_kv_blocks(tiers);
        tiers
    }

    /// Whether a request generated thinking tokens (its blocks from the end of the prompt
    /// on hold a thought that chat templates drop from the next turn's history).
    fn thought(&self, request_id: &str) -> bool {
        self.requests.get(request_id).and_then(|t| t.tracker.as_ref()).is_some_and(|t| t.think_tokens() > 0)
    }

    /// Counts KV blocks moved to the front of the eviction queue (the think-complete tier).
    fn demoted(&self, blocks: u64) {
        self.shared.counters.add(Counter::KvDemoted, blocks);
    }

    /// Forgets requests vLLM no longer holds.
    fn retain(&mut self, live: Vec<String>) {
        let live: std::collections::HashSet<String> = live.into_iter().collect();
        self.requests.retain(|id, _| live.contains(id));
    }

    fn tracked(&self) -> usize {
        self.requests.len()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, arrival: f64, new_tokens: Vec<u32>) -> RunningRow {
        RunningRow(id.into(), arrival, 0, 0, new_tokens)
    }

    #[test]
    fn answering_requests_run_first_and_a_thinker_is_the_victim() {
        let mut core = SchedulerCore::create("output-first", vec![465], vec![466], Arc::default()).unwrap();
        for id in ["early-thinker", "late-answerer", "mid-thinker"] {
            core.track(id.into(), vec![1, 465]);
        }
        let rows = vec![
            row("early-thinker", 1.0, vec![5]),
            row("late-answerer", 3.0, vec![466, 7]),
            row("mid-thinker", 2.0, vec![5]),
        ];
        let order = core.order_rows(&rows);
        assert_eq!(order[0], 1, "the answering request gets the budget first");
        assert_ne!(*order.last().unwrap(), 1, "the answering request is never the victim");
        assert_eq!(core.phase("late-answerer"), "output");
        assert_eq!(core.shared.counters.get(Counter::Reorders), 1);
        assert_eq!(core.preempted("mid-thinker"), "think-active");
    }

    #[test]
    fn fcfs_keeps_vllm_order() {
        let mut core = SchedulerCore::create("fcfs", vec![465], vec![466], Arc::default()).unwrap();
        core.track("a".into(), vec![465]);
        core.track("b".into(), vec![465]);
        let order = core.order_rows(&[row("a", 1.0, vec![466]), row("b", 2.0, vec![])]);
        assert_eq!(order, vec![0, 1]);
        assert_eq!(core.shared.counters.get(Counter::Reorders), 0);
    }

    #[test]
    fn kv_tiers_split_answering_requests_at_their_thought() {
        let mut core = SchedulerCore::create("output-first", vec![465], vec![466], Arc::default()).unwrap();
        core.track("ans".into(), vec![465]);
        core.track("think".into(), vec![465]);
        let mut tokens = vec![5; 40];
        tokens.push(466);
        core.order_rows(&[row("ans", 1.0, tokens), row("think", 1.0, vec![5; 3])]);
        // 41 thinking tokens = 2 full blocks of 16 are a finished thought.
        assert_eq!(core.account_kv(vec![("ans".into(), 5), ("think".into(), 2)], 16), [2, 2, 3]);
    }

    #[test]
    fn unknown_policy_is_a_config_error() {
        assert!(matches!(
            SchedulerCore::create("lifo", vec![], vec![], Arc::default()),
            Err(HookError::Config(_))
        ));
    }
}
