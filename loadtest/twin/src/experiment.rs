//! Experiments in virtual time: a seeded workload arriving at a rate runs through the
//! engine as fast as the machine allows, and every request's user-facing timings come out
//! exactly (the twin knows each token's phase and time). This is how policies are compared
//! at loads up to saturation without a GPU or a wall clock.

use std::collections::HashMap;

use meridian_core::Phase;
use meridian_core::sched::SchedulingPolicy;
use meridian_core::timings::{Arrived, Timeline};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};

use crate::engine::{Engine, EngineConfig, NewRequest, RequestSteps, Token};
use crate::workload::{Workload, WorkloadSpec};

/// One request's timings, in seconds of engine time from its arrival, as
/// `meridian_core::timings` defines them (the proxy and the load tester read theirs the
/// same way).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimRecord {
    /// The request's position in the experiment's arrivals.
    pub index: usize,
    pub arrival_s: f64,
    pub ttft: Option<f64>,
    pub ttfo: Option<f64>,
    /// Last visible think token to first output token (two steps at least: the
    /// end-of-thought delimiter's and the first answer token's).
    pub think_to_output: Option<f64>,
    pub output_itl: Vec<f64>,
    /// Every token's time, from arrival.
    pub token_times: Vec<f64>,
    pub e2e: Option<f64>,
    pub think_tokens: u32,
    /// Answer tokens and the end-of-thought delimiter before them, as vLLM's usage counts.
    pub output_tokens: u32,
    pub prompt_tokens: u32,
}

impl SimRecord {
    /// The longest wait between two consecutive visible tokens of the answer (the
    /// largest of `output_itl`, `meridian_core::timings`' largest answer gap): the stall
    /// a reader sees, which a percentile over everyone's pooled gaps can hide when it is
    /// one gap among hundreds. `None` for answers of fewer than two tokens.
    pub fn largest_answer_gap(&self) -> Option<f64> {
        self.output_itl.iter().copied().reduce(f64::max)
    }
}

/// The whole experiment's outcome.
#[derive(Debug, Clone)]
pub struct ExperimentResult {
    pub records: Vec<SimRecord>,
    /// Engine time from the first arrival to the last token.
    pub makespan_s: f64,
    pub steps: u64,
    pub preemptions: u64,
    /// Preemptions of requests that were answering.
    pub output_critical_preemptions: u64,
    /// Steps run under a policy's prefill cap (`Engine::prefill_capped_steps`).
    pub prefill_capped_steps: u64,
    /// Running requests over the steps, and those that sat steps out
    /// (`Engine::request_steps`).
    pub request_steps: RequestSteps,
    /// Wall-clock seconds the simulation took.
    pub wall_s: f64,
}

impl ExperimentResult {
    /// Tokens (prompt + generated) processed per second of engine time.
    pub fn total_token_throughput(&self) -> f64 {
        let t: u64 =
            self.records.iter().map(|r| u64::from(r.prompt_tokens + r.think_tokens + r.output_tokens)).sum();
        t as f64 / self.makespan_s.max(1e-12)
    }

    /// Simulated engine steps per wall-clock second.
    pub fn steps_per_second(&self) -> f64 {
        self.steps as f64 / self.wall_s.max(1e-12)
    }
}

/// One request of an experiment: when it arrives (engine seconds) and its lengths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    pub at_s: f64,
    pub prompt: u32,
    pub think: u32,
    /// Visible answer tokens; the end-of-thought delimiter after a thought is added.
    pub answer: u32,
}

impl Arrival {
    /// The engine's request for arrival `index`.
    pub(crate) fn request(self, index: usize) -> NewRequest {
        NewRequest {
            id: index.to_string(),
            prompt_tokens: self.prompt,
            think_tokens: self.think,
            answer_tokens: self.answer,
            ..NewRequest::default()
        }
    }

    /// Arrival `index`'s record, before any token.
    pub(crate) fn record(self, index: usize) -> SimRecord {
        SimRecord { index, arrival_s: self.at_s, prompt_tokens: self.prompt, ..SimRecord::default() }
    }
}

/// Runs `n` requests arriving as a Poisson process at `rate` req/s.
pub fn run_poisson(
    config: EngineConfig,
    policy: Box<dyn SchedulingPolicy>,
    spec: WorkloadSpec,
    rate: f64,
    n: usize,
    seed: u64,
) -> ExperimentResult {
    run_arrivals(config, policy, &poisson_arrivals(spec, rate, n, seed))
}

/// `n` requests of `spec`'s shapes arriving as a Poisson process at `rate` req/s, from 0.
pub fn poisson_arrivals(spec: WorkloadSpec, rate: f64, n: usize, seed: u64) -> Vec<Arrival> {
    let mut workload = Workload::new(spec, seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED);
    let gap = Exp::new(rate.max(1e-9)).ok();
    let mut arrivals = Vec::with_capacity(n);
    let mut t = 0.0;
    for _ in 0..n {
        let shape = workload.next_shape();
        arrivals.push(Arrival { at_s: t, prompt: shape.prompt, think: shape.think, answer: shape.answer });
        t += gap.map_or(1.0 / rate.max(1e-9), |g| g.sample(&mut rng));
    }
    arrivals
}

/// Runs the given requests (in arrival order) through the engine. Each record's `index`
/// is its request's position in `arrivals`; a request the engine refuses (it cannot fit
/// in the KV cache) has no record.
pub fn run_arrivals(
    config: EngineConfig,
    policy: Box<dyn SchedulingPolicy>,
    arrivals: &[Arrival],
) -> ExperimentResult {
    let started = std::time::Instant::now();
    let mut engine = Engine::new(config, policy);
    let n = arrivals.len();
    let mut records: Vec<SimRecord> = Vec::with_capacity(n);
    let mut by_seq: HashMap<u64, usize> = HashMap::new();
    // Each record's timeline, fed every visible token of its request.
    let mut timelines: Vec<Timeline<f64>> = Vec::with_capacity(n);
    let mut next = 0;
    loop {
        // Admit everything that has arrived by now; jump the clock when idle.
        if !engine.has_work() && next < n {
            engine.advance_to(arrivals[next].at_s);
        }
        while next < n && arrivals[next].at_s <= engine.now() {
            let a = arrivals[next];
            if let Ok(seq) = engine.submit(a.request(next)) {
                by_seq.insert(seq, records.len());
                timelines.push(Timeline::new(a.at_s));
                records.push(a.record(next));
            }
            next += 1;
        }
        // An idle engine wakes for the next arrival. `None` only when the engine holds
        // nothing: the clock jump above then brings the next arrival, or the run is over.
        let Some(step) = engine.step_until(arrivals.get(next).map_or(f64::INFINITY, |a| a.at_s)) else {
            if next >= n {
                break;
            }
            continue;
        };
        for tok in step.tokens {
            let Some(&i) = by_seq.get(&tok.seq) else { continue };
            record_token(&mut records[i], &mut timelines[i], &tok);
        }
    }
    for (r, t) in records.iter_mut().zip(&timelines) {
        (r.ttft, r.ttfo, r.think_to_output) = (t.ttft(), t.ttfo(), t.ttot());
    }
    let first = arrivals.first().map_or(0.0, |a| a.at_s);
    ExperimentResult {
        records,
        makespan_s: engine.now() - first,
        steps: engine.steps(),
        preemptions: engine.preemptions(),
        output_critical_preemptions: engine.output_critical_preemptions(),
        prefill_capped_steps: engine.prefill_capped_steps(),
        request_steps: engine.request_steps(),
        wall_s: started.elapsed().as_secs_f64(),
    }
}

/// Records one sampled token of a request in its record and timeline: the end-of-thought
/// delimiter is counted (vLLM's usage counts it with the answer) but never seen; every
/// other token is seen, in its phase.
pub(crate) fn record_token(r: &mut SimRecord, timeline: &mut Timeline<f64>, tok: &Token) {
    let since = tok.at_s - r.arrival_s;
    if tok.last {
        r.e2e = Some(since);
    }
    if tok.ends_thought {
        r.output_tokens += 1;
        return;
    }
    r.token_times.push(since);
    let thinking = tok.phase == Phase::Think;
    let arrived = Arrived { thinking, answering: !thinking, answer_began: !thinking };
    r.output_itl.extend(timeline.tokens(tok.at_s, arrived).output_itl);
    if thinking {
        r.think_tokens += 1;
    } else {
        r.output_tokens += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::LengthDist;
    use meridian_core::sched::Fcfs;

    fn spec(think: u32, answer: u32) -> WorkloadSpec {
        WorkloadSpec {
            prompt: LengthDist::Fixed { value: 10 },
            think: LengthDist::Fixed { value: think },
            answer: LengthDist::Fixed { value: answer },
            entropy: Default::default(),
        }
    }

    #[test]
    fn a_lone_request_has_the_hand_worked_timings() {
        // tiny-test profile: prefill 10 tokens = 20 ms; each decode step ~12 ms.
        let cfg = EngineConfig::from(&crate::profile("tiny-test").unwrap());
        let res = run_poisson(cfg, Box::new(Fcfs), spec(2, 2), 1.0, 1, 0);
        let r = &res.records[0];
        assert!((r.ttft.unwrap() - 0.020).abs() < 1e-9);
        // tokens at 20.0, 32.1, 44.3, 56.6, 69.0 ms: think, think, the end-of-thought
        // delimiter (no client sees it), output, output.
        assert!((r.think_to_output.unwrap() - 0.0245).abs() < 1e-9);
        assert!((r.ttfo.unwrap() - 0.0566).abs() < 1e-9);
        assert_eq!(r.token_times.len(), 4, "the delimiter is not a visible token");
        assert_eq!(r.output_itl.len(), 1);
        assert!((r.output_itl[0] - 0.0124).abs() < 1e-9);
        assert_eq!((r.think_tokens, r.output_tokens), (2, 3), "usage counts the delimiter with the answer");
        assert_eq!(res.steps, 5);
    }

    #[test]
    fn heavier_load_means_longer_waits_and_is_deterministic() {
        let cfg = EngineConfig::from(&crate::profile("h100-qwen3-8b").unwrap());
        let mean_ttft = |rate: f64| {
            let res = run_poisson(cfg, Box::new(Fcfs), WorkloadSpec::default(), rate, 300, 7);
            res.records.iter().filter_map(|r| r.ttft).sum::<f64>() / res.records.len() as f64
        };
        let low = mean_ttft(1.0);
        let high = mean_ttft(40.0);
        assert!(high > low, "{low} vs {high}");
        let a = run_poisson(cfg, Box::new(Fcfs), WorkloadSpec::default(), 5.0, 50, 3);
        let b = run_poisson(cfg, Box::new(Fcfs), WorkloadSpec::default(), 5.0, 50, 3);
        assert_eq!(a.records, b.records);
    }
}
