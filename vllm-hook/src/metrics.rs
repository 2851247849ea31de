//! The hook's counters. vLLM runs the scheduler and the logits processor in different
//! processes (on CPU, and with tensor parallelism), so each process counts locally,
//! workers hand their totals to the listening process at every sync, and `/metrics`
//! there shows the sum. The exposition is written here rather than with a metrics
//! library because the values are merged across processes, which those do not model.

use meridian_core::kv::Tier;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One counted sample: metric name plus its label set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub metric: &'static str,
    pub labels: &'static str,
}

macro_rules! samples {
    ($($id:ident = $metric:literal $labels:literal;)*) => {
        /// Every counter the hook keeps.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Counter { $($id),* }
        const SAMPLES: &[Sample] = &[$(Sample { metric: $metric, labels: $labels }),*];
        impl Counter {
            pub const ALL: &'static [Counter] = &[$(Counter::$id),*];
        }
    };
}

samples! {
    ScheduleSteps = "meridian_hook_schedule_steps_total" "";
    Reorders = "meridian_hook_reorders_total" "";
    ExpressSteps = "meridian_hook_express_steps_total" "";
    PrefillCappedSteps = "meridian_hook_prefill_capped_steps_total" "";
    PacedAnswers = "meridian_hook_paced_answers_total" "";
    PreemptOutput = "meridian_hook_preemptions_total" "tier=\"output-critical\"";
    PreemptThink = "meridian_hook_preemptions_total" "tier=\"think-active\"";
    PreemptPending = "meridian_hook_preemptions_total" "tier=\"pending\"";
    ExitDirective = "meridian_hook_forced_exits_total" "reason=\"directive\"";
    ExitBudget = "meridian_hook_forced_exits_total" "reason=\"budget\"";
    ExitRpdi = "meridian_hook_forced_exits_total" "reason=\"rpdi\"";
    EntropyRows = "meridian_hook_entropy_rows_total" "";
    KvDemoted = "meridian_hook_kv_demoted_blocks_total" "";
    Directives = "meridian_hook_directives_total" "";
    ChannelOk = "meridian_hook_channel_requests_total" "outcome=\"ok\"";
    ChannelUnauthorized = "meridian_hook_channel_requests_total" "outcome=\"unauthorized\"";
    ChannelVersion = "meridian_hook_channel_requests_total" "outcome=\"version\"";
    ChannelBad = "meridian_hook_channel_requests_total" "outcome=\"bad_request\"";
    PlacesGranted = "meridian_hook_place_claims_total" "outcome=\"granted\"";
    PlacesRefused = "meridian_hook_place_claims_total" "outcome=\"refused\"";
    PlacesReported = "meridian_hook_place_claims_total" "outcome=\"reported\"";
    PlacesWaitWoken = "meridian_hook_place_waits_total" "outcome=\"woken\"";
    PlacesWaitExpired = "meridian_hook_place_waits_total" "outcome=\"expired\"";
    PlacesWaitTurnedAway = "meridian_hook_place_waits_total" "outcome=\"turned_away\"";
    ErrorSchedule = "meridian_hook_errors_total" "site=\"scheduler\"";
    ErrorLogits = "meridian_hook_errors_total" "site=\"logits_processor\"";
    ErrorChannel = "meridian_hook_errors_total" "site=\"channel\"";
    ErrorSync = "meridian_hook_errors_total" "site=\"sync\"";
}

const HELP: &[(&str, &str)] = &[
    ("meridian_hook_schedule_steps_total", "Scheduler steps the hook saw."),
    ("meridian_hook_reorders_total", "Steps in which the hook changed the order of the running batch."),
    (
        "meridian_hook_express_steps_total",
        "Steps run for answering requests only, so a just-finished thought's first visible token comes fast.",
    ),
    (
        "meridian_hook_prefill_capped_steps_total",
        "Steps whose prompt tokens the policy capped so that answers are not held up by a long prompt chunk.",
    ),
    (
        "meridian_hook_paced_answers_total",
        "Answering requests that sat a step out because they were ahead of their reader (reasoning-first pacing).",
    ),
    (
        "meridian_hook_preemptions_total",
        "Requests vLLM preempted, by the KV tier of the victim (target for output-critical: 0).",
    ),
    ("meridian_hook_forced_exits_total", "Ends of thinking the hook forced, by reason."),
    ("meridian_hook_entropy_rows_total", "Logits rows whose entropy the hook computed."),
    (
        "meridian_hook_kv_demoted_blocks_total",
        "Cached KV blocks of finished thoughts moved to the front of vLLM's eviction queue.",
    ),
    ("meridian_hook_directives_total", "Directives received on the policy channel."),
    ("meridian_hook_channel_requests_total", "Policy channel requests, by outcome."),
    (
        "meridian_hook_place_claims_total",
        "Proxy replicas' claims on places in the engine's limit (admission.places = \"engine\"): granted, refused, or a holding reported.",
    ),
    (
        "meridian_hook_place_waits_total",
        "Refused replicas' waits for a place to free: woken (a place is there for the waiting replica), expired (none was in time), or turned away (too many waits held).",
    ),
    (
        "meridian_hook_errors_total",
        "Errors the hook caught and fell back from (stock vLLM behaviour), by site.",
    ),
];

/// Counts of this process.
pub struct Counters {
    values: Vec<AtomicU64>,
    /// Totals reported by other processes, by worker name then sample key.
    remote: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    kv_blocks: [AtomicU64; 3],
    disabled: AtomicBool,
    engine: EngineGauges,
}

/// What the scheduler last saw of the engine (it runs in the listening process, so these
/// are never summed across processes): single atomics, so a reader may see one field a
/// step newer than another, never a torn value.
struct EngineGauges {
    /// Running requests: prefilling, thinking, answering.
    running: [AtomicU64; 3],
    waiting: AtomicU64,
    /// `u64::MAX` until counted.
    kv_free: AtomicU64,
    /// Smoothed step time in seconds, as f64 bits; NaN until two busy steps.
    step_s: AtomicU64,
    steps: AtomicU64,
}

impl Default for EngineGauges {
    fn default() -> Self {
        EngineGauges {
            running: Default::default(),
            waiting: AtomicU64::new(0),
            kv_free: AtomicU64::new(u64::MAX),
            step_s: AtomicU64::new(f64::NAN.to_bits()),
            steps: AtomicU64::new(0),
        }
    }
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            values: SAMPLES.iter().map(|_| AtomicU64::new(0)).collect(),
            remote: Mutex::new(BTreeMap::new()),
            kv_blocks: Default::default(),
            disabled: AtomicBool::new(false),
            engine: EngineGauges::default(),
        }
    }
}

/// The running phases the engine gauges count, in `EngineGauges::running`'s order.
const RUNNING_PHASES: [&str; 3] = ["prefilling", "thinking", "answering"];

/// KV tiers, cheapest to lose first.
pub const KV_TIERS: [&str; 3] =
    [Tier::ThinkComplete.as_str(), Tier::ThinkActive.as_str(), Tier::OutputCritical.as_str()];

fn key(s: &Sample) -> String {
    if s.labels.is_empty() { s.metric.to_owned() } else { format!("{}{{{}}}", s.metric, s.labels) }
}

impl Counters {
    pub fn add(&self, c: Counter, n: u64) {
        if let Some(v) = self.values.get(c as usize) {
            v.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.values.get(c as usize).map_or(0, |v| v.load(Ordering::Relaxed))
    }

    /// Blocks held per KV tier (see [`KV_TIERS`]), as last measured by the scheduler.
    pub fn set_kv_blocks(&self, blocks: [u64; 3]) {
        for (slot, b) in self.kv_blocks.iter().zip(blocks) {
            slot.store(b, Ordering::Relaxed);
        }
    }

    /// The running requests by phase (prefilling, thinking, answering), as of the step
    /// the scheduler just finished.
    pub fn set_running(&self, by_phase: [u64; 3]) {
        for (slot, n) in self.engine.running.iter().zip(by_phase) {
            slot.store(n, Ordering::Relaxed);
        }
    }

    /// The waiting queue's length.
    pub fn set_waiting(&self, waiting: u64) {
        self.engine.waiting.store(waiting, Ordering::Relaxed);
    }

    /// The KV cache's free blocks.
    pub fn set_kv_free_blocks(&self, free: u64) {
        self.engine.kv_free.store(free, Ordering::Relaxed);
    }

    /// The smoothed step time (`None`: not measured yet) and the steps scheduled so far.
    pub fn set_steps(&self, step_s: Option<f64>, steps: u64) {
        self.engine.step_s.store(step_s.unwrap_or(f64::NAN).to_bits(), Ordering::Relaxed);
        self.engine.steps.store(steps, Ordering::Relaxed);
    }

    /// The engine as the hook last saw it, for the hello reply (`None` before the
    /// scheduler's first step: a logits-processor-only process, or an idle engine).
    pub fn engine_state(&self) -> Option<meridian_core::channel::EngineState> {
        let e = &self.engine;
        let steps = e.steps.load(Ordering::Relaxed);
        if steps == 0 {
            return None;
        }
        let count = |a: &AtomicU64| u32::try_from(a.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        let kv_free = e.kv_free.load(Ordering::Relaxed);
        let step_s = f64::from_bits(e.step_s.load(Ordering::Relaxed));
        Some(meridian_core::channel::EngineState {
            prefilling: count(&e.running[0]),
            thinking: count(&e.running[1]),
            answering: count(&e.running[2]),
            waiting: count(&e.waiting),
            kv_free_blocks: (kv_free != u64::MAX).then_some(kv_free),
            kv_blocks: std::array::from_fn(|i| self.kv_blocks[i].load(Ordering::Relaxed)),
            step_s: (!step_s.is_nan()).then_some(step_s),
            steps,
        })
    }

    /// Whether the hook runs disabled (see `Shared::disabled`).
    pub fn set_disabled(&self, disabled: bool) {
        self.disabled.store(disabled, Ordering::Relaxed);
    }

    /// This process's totals by sample key, for a sync to the listening process.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        SAMPLES.iter().zip(&self.values).map(|(s, v)| (key(s), v.load(Ordering::Relaxed))).collect()
    }

    /// Records the totals another process reported (replacing its previous report).
    pub fn record_remote(&self, worker: &str, totals: BTreeMap<String, u64>) {
        if let Ok(mut remote) = self.remote.lock() {
            remote.insert(worker.to_owned(), totals);
        }
    }

    /// Prometheus text exposition of local plus remote totals.
    pub fn render(&self) -> String {
        let mut totals = self.snapshot();
        if let Ok(remote) = self.remote.lock() {
            for worker in remote.values() {
                for (k, v) in worker {
                    if let Some(t) = totals.get_mut(k) {
                        *t += v;
                    }
                }
            }
        }
        let mut out = String::with_capacity(2048);
        for (metric, help) in HELP {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
            for s in SAMPLES.iter().filter(|s| s.metric == *metric) {
                let k = key(s);
                let _ = writeln!(out, "{k} {}", totals.get(&k).copied().unwrap_or(0));
            }
        }
        let _ = writeln!(
            out,
            "# HELP meridian_hook_kv_blocks KV blocks held by running requests, by tier.\n# TYPE meridian_hook_kv_blocks gauge"
        );
        for (tier, b) in KV_TIERS.iter().zip(&self.kv_blocks) {
            let _ = writeln!(out, "meridian_hook_kv_blocks{{tier=\"{tier}\"}} {}", b.load(Ordering::Relaxed));
        }
        let e = &self.engine;
        let _ = writeln!(
            out,
            "# HELP meridian_hook_requests Requests in the engine as its scheduler last saw them: running by phase, and waiting.\n# TYPE meridian_hook_requests gauge"
        );
        for (phase, n) in RUNNING_PHASES.iter().zip(&e.running) {
            let _ = writeln!(
                out,
                "meridian_hook_requests{{state=\"running\",phase=\"{phase}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "meridian_hook_requests{{state=\"waiting\"}} {}",
            e.waiting.load(Ordering::Relaxed)
        );
        let kv_free = e.kv_free.load(Ordering::Relaxed);
        if kv_free != u64::MAX {
            let name = "meridian_hook_kv_free_blocks";
            let _ =
                writeln!(out, "# HELP {name} Free KV cache blocks.\n# TYPE {name} gauge\n{name} {kv_free}");
        }
        let step_s = f64::from_bits(e.step_s.load(Ordering::Relaxed));
        if !step_s.is_nan() {
            let name = "meridian_hook_step_seconds";
            let _ = writeln!(
                out,
                "# HELP {name} The engine's step time, smoothed over recent busy steps.\n# TYPE {name} gauge\n{name} {step_s}"
            );
        }
        let disabled = "meridian_hook_disabled";
        let _ = writeln!(
            out,
            "# HELP {disabled} 1 when the hook runs as stock vLLM because this vLLM is one it does not support.\n\
             # TYPE {disabled} gauge\n{disabled} {}",
            u8::from(self.disabled.load(Ordering::Relaxed))
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disabled_gauge_reads_what_the_hook_decided() {
        let c = Counters::default();
        assert!(c.render().contains("\nmeridian_hook_disabled 0\n"));
        c.set_disabled(true);
        assert!(c.render().contains("# TYPE meridian_hook_disabled gauge\nmeridian_hook_disabled 1\n"));
    }

    #[test]
    fn the_engine_gauges_read_what_the_scheduler_last_saw() {
        let c = Counters::default();
        assert_eq!(c.engine_state(), None, "nothing before the first step");
        assert!(!c.render().contains("meridian_hook_step_seconds"));
        c.set_running([1, 3, 2]);
        c.set_waiting(4);
        c.set_kv_free_blocks(120);
        c.set_kv_blocks([5, 6, 7]);
        c.set_steps(Some(0.012), 40);
        let state = c.engine_state().unwrap();
        assert_eq!((state.prefilling, state.thinking, state.answering, state.waiting), (1, 3, 2, 4));
        assert_eq!((state.running(), state.requests()), (6, 10));
        assert_eq!(state.kv_free_blocks, Some(120));
        assert_eq!(state.kv_blocks, [5, 6, 7]);
        assert_eq!((state.step_s, state.steps), (Some(0.012), 40));
        let text = c.render();
        assert!(text.contains("meridian_hook_requests{state=\"running\",phase=\"thinking\"} 3\n"), "{text}");
        assert!(text.contains("meridian_hook_requests{state=\"waiting\"} 4\n"), "{text}");
        assert!(text.contains("\nmeridian_hook_kv_free_blocks 120\n"), "{text}");
        assert!(text.contains("\nmeridian_hook_step_seconds 0.012\n"), "{text}");
    }

    #[test]
    fn every_counter_has_help_and_renders_summed_across_processes() {
        let c = Counters::default();
        for s in SAMPLES {
            assert!(HELP.iter().any(|(m, _)| *m == s.metric), "{} has no HELP", s.metric);
        }
        assert_eq!(Counter::ALL.len(), SAMPLES.len());
        c.add(Counter::ExitBudget, 2);
        let mut worker = BTreeMap::new();
        worker.insert("meridian_hook_forced_exits_total{reason=\"budget\"}".to_owned(), 3);
        worker.insert("unknown_metric".to_owned(), 9);
        c.record_remote("worker-1", worker.clone());
        c.record_remote("worker-1", worker);
        let text = c.render();
        assert!(text.contains("meridian_hook_forced_exits_total{reason=\"budget\"} 5\n"), "{text}");
        assert!(!text.contains("unknown_metric"));
        assert!(text.contains("meridian_hook_preemptions_total{tier=\"output-critical\"} 0\n"));
    }
}
