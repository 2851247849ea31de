//! Phase-boundary migration in virtual time: the same engines as one pool, each thinking
//! and answering in place, or split into a think pool and an answer pool, where a
//! request's answer moves to an answer engine once its thought has ended (what the
//! proxy does with `upstream.endpoints[].role`). The same arrivals run through both, so
//! every request's timings pair up.
//!
//! The answer moves where the proxy moves it: at the first event after the thought, so
//! the client's first answer token comes from the think engine (its think-to-answer gap
//! is the one in place) and the hand-over is the stall before the second.
//!
//! How an answer moves ([`Move`]): by re-prefill, the answer engine computes the prompt
//! and the thought again as a new request; by connector, the KV of both arrives after a
//! transfer time (a fixed part, then a time per token) and the answer engine computes
//! only the last token before it samples. The export's own short prefill on the think
//! engine is not modelled.
//!
//! A new request goes to the engine of its pool holding the fewest requests, an answer
//! to the answer engine holding the fewest: the proxy's phase-aware routing, reduced to
//! what matters here.

use std::collections::{HashMap, HashSet};

pub mod compare;

use meridian_core::sched::SchedulingPolicy;
use meridian_core::timings::Timeline;

use crate::engine::{Engine, EngineConfig, NewRequest};
use crate::experiment::{Arrival, SimRecord, record_token};

/// How a handed-over answer gets the KV of its prompt and thought.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Move {
    /// The answer engine prefills them again.
    Reprefill,
    /// vLLM's KV connector carries them: `fixed_s`, then `per_token_s` a token.
    Connector { fixed_s: f64, per_token_s: f64 },
}

impl Move {
    /// NIXL between two GPUs of one node: `kv_bytes_per_token` at `bytes_per_s`, after a
    /// handshake of `fixed_s`.
    pub fn nixl(kv_bytes_per_token: f64, bytes_per_s: f64, fixed_s: f64) -> Self {
        Move::Connector { fixed_s, per_token_s: kv_bytes_per_token / bytes_per_s }
    }

    fn delay_s(self, tokens: u32) -> f64 {
        match self {
            Move::Reprefill => 0.0,
            Move::Connector { fixed_s, per_token_s } => fixed_s + per_token_s * f64::from(tokens),
        }
    }
}

/// How the engines are used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pools {
    /// Every engine thinks and answers.
    Shared { engines: usize },
    /// `think` engines take the requests, `answer` engines their answers.
    Split { think: usize, answer: usize, moved: Move },
}

impl Pools {
    fn engines(self) -> usize {
        match self {
            Pools::Shared { engines } => engines,
            Pools::Split { think, answer, .. } => think + answer,
        }
    }
}

/// A run's outcome: every request's timings, as the experiment records them.
#[derive(Debug, Clone)]
pub struct MigrationResult {
    /// One per arrival the engines took, in arrival order (`index`).
    pub records: Vec<SimRecord>,
    /// Engine time from the first arrival to the last token.
    pub makespan_s: f64,
    /// Answers handed over to the answer pool.
    pub handed_over: usize,
    pub preemptions: u64,
}

impl MigrationResult {
    /// Requests finished per second of engine time.
    pub fn throughput(&self) -> f64 {
        self.records.iter().filter(|r| r.e2e.is_some()).count() as f64 / self.makespan_s.max(1e-12)
    }
}

/// An answer on its way to the answer pool.
struct Handing {
    at_s: f64,
    record: usize,
    prompt: u32,
    answer: u32,
    preloaded: u32,
}

/// Runs `arrivals` (in arrival order) through `pools` of engines of `config`, each with
/// its own `policy()`.
pub fn run(
    config: EngineConfig,
    policy: &dyn Fn() -> Box<dyn SchedulingPolicy>,
    arrivals: &[Arrival],
    pools: Pools,
) -> MigrationResult {
    let mut engines: Vec<Engine> = (0..pools.engines()).map(|_| Engine::new(config, policy())).collect();
    let (takes_new, answers): (Vec<usize>, Vec<usize>) = match pools {
        Pools::Shared { engines } => ((0..engines).collect(), Vec::new()),
        Pools::Split { think, answer, .. } => ((0..think).collect(), (think..think + answer).collect()),
    };
    let mut records: Vec<SimRecord> = Vec::with_capacity(arrivals.len());
    let mut timelines: Vec<Timeline<f64>> = Vec::with_capacity(arrivals.len());
    let mut owner: HashMap<(usize, u64), usize> = HashMap::new();
    let mut handing: Vec<Handing> = Vec::new();
    // Requests whose thought has ended on a think engine and whose first answer token
    // has not come yet.
    let mut thought_over: HashSet<(usize, u64)> = HashSet::new();
    let (mut next, mut handed_over) = (0, 0);
    loop {
        let next_arrival = arrivals.get(next).map_or(f64::INFINITY, |a| a.at_s);
        // The answer on its way that arrives first, and when.
        let soonest = (0..handing.len()).min_by(|&a, &b| handing[a].at_s.total_cmp(&handing[b].at_s));
        let next_handing = soonest.map_or(f64::INFINITY, |k| handing[k].at_s);
        let event_s = next_arrival.min(next_handing);
        // The engine furthest behind steps first, up to the next event.
        let behind = (0..engines.len())
            .filter(|&e| engines[e].has_work())
            .min_by(|&a, &b| engines[a].now().total_cmp(&engines[b].now()));
        if let Some(e) = behind.filter(|&e| engines[e].now() < event_s) {
            let Some(step) = engines[e].step_until(event_s) else { continue };
            for tok in step.tokens {
                let Some(&i) = owner.get(&(e, tok.seq)) else { continue };
                record_token(&mut records[i], &mut timelines[i], &tok);
                let Pools::Split { moved, .. } = pools else { continue };
                if tok.ends_thought && !tok.last {
                    thought_over.insert((e, tok.seq));
                } else if thought_over.remove(&(e, tok.seq)) && !tok.last {
                    // The first answer token is out: the rest of the answer moves, with
                    // the prompt, the thought, the delimiter and that token as its prompt.
                    engines[e].abort(tok.seq);
                    owner.remove(&(e, tok.seq));
                    let a = arrivals[records[i].index];
                    let prompt = a.prompt + a.think + 2;
                    let preloaded = match moved {
                        Move::Reprefill => 0,
                        Move::Connector { .. } => prompt,
                    };
                    let at_s = tok.at_s + moved.delay_s(prompt);
                    handing.push(Handing { at_s, record: i, prompt, answer: a.answer - 1, preloaded });
                    handed_over += 1;
                }
            }
            continue;
        }
        if event_s.is_infinite() {
            break;
        }
        if let Some(k) = soonest.filter(|_| next_handing <= next_arrival) {
            let h = handing.swap_remove(k);
            let e = least_held(&engines, &answers);
            let new = NewRequest {
                id: format!("{}-answer", h.record),
                prompt_tokens: h.prompt,
                answer_tokens: h.answer,
                preloaded: h.preloaded,
                ..NewRequest::default()
            };
            if let Some(seq) = submit_at(&mut engines[e], h.at_s, new) {
                owner.insert((e, seq), h.record);
            }
        } else {
            let a = arrivals[next];
            let e = least_held(&engines, &takes_new);
            if let Some(seq) = submit_at(&mut engines[e], a.at_s, a.request(next)) {
                owner.insert((e, seq), records.len());
                timelines.push(Timeline::new(a.at_s));
                records.push(a.record(next));
            }
            next += 1;
        }
    }
    for (r, t) in records.iter_mut().zip(&timelines) {
        (r.ttft, r.ttfo, r.think_to_output) = (t.ttft(), t.ttfo(), t.ttot());
    }
    let first = arrivals.first().map_or(0.0, |a| a.at_s);
    let last = engines.iter().map(Engine::now).fold(first, f64::max);
    MigrationResult {
        records,
        makespan_s: last - first,
        handed_over,
        preemptions: engines.iter().map(Engine::preemptions).sum(),
    }
}

/// Of `pool`, the engine holding the fewest requests (the first of equals).
fn least_held(engines: &[Engine], pool: &[usize]) -> usize {
    pool.iter().copied().min_by_key(|&e| engines[e].num_running() + engines[e].num_waiting()).unwrap_or(0)
}

/// Submits `new` to `engine` at `at_s`: an idle engine's clock moves on to it first (a
/// busy one takes it at its next step). `None`: refused (it cannot fit).
fn submit_at(engine: &mut Engine, at_s: f64, new: NewRequest) -> Option<u64> {
    if !engine.has_work() && engine.now() < at_s {
        engine.advance_to(at_s);
    }
    engine.submit(new).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::sched::Fcfs;

    fn tiny() -> EngineConfig {
        EngineConfig::from(&crate::profile("tiny-test").unwrap())
    }

    fn fcfs() -> Box<dyn SchedulingPolicy> {
        Box::new(Fcfs)
    }

    fn one(prompt: u32, think: u32, answer: u32) -> Vec<Arrival> {
        vec![Arrival { at_s: 0.0, prompt, think, answer }]
    }

    #[test]
    fn one_engine_in_one_pool_is_the_plain_experiment() {
        let arrivals: Vec<Arrival> = (0..20)
            .map(|i| Arrival {
                at_s: f64::from(i) * 0.01,
                prompt: 10 + i,
                think: 5 + i % 7,
                answer: 3 + i % 4,
            })
            .collect();
        let shared = run(tiny(), &fcfs, &arrivals, Pools::Shared { engines: 1 });
        let plain = crate::experiment::run_arrivals(tiny(), fcfs(), &arrivals);
        assert_eq!(shared.records, plain.records);
        assert_eq!(shared.handed_over, 0);
    }

    #[test]
    fn a_lone_request_hands_its_answer_over_after_its_first_answer_token() {
        let (think, answer) = (4, 3);
        let alone = run(tiny(), &fcfs, &one(10, think, answer), Pools::Shared { engines: 2 });
        let split =
            |moved| run(tiny(), &fcfs, &one(10, think, answer), Pools::Split { think: 1, answer: 1, moved });
        let (reprefill, connector) =
            (split(Move::Reprefill), split(Move::Connector { fixed_s: 0.0, per_token_s: 0.0 }));
        for r in [&alone, &reprefill, &connector] {
            let rec = &r.records[0];
            assert_eq!((rec.think_tokens, rec.output_tokens), (think, answer + 1), "usage as in one engine");
            assert_eq!(rec.token_times.len() as u32, think + answer);
            assert_eq!(rec.ttft, alone.records[0].ttft, "the thought runs alike");
            // The first answer token comes from the think engine, as through the proxy.
            assert_eq!(rec.think_to_output, alone.records[0].think_to_output);
        }
        assert_eq!((reprefill.handed_over, connector.handed_over), (1, 1));
        // The stall before the second answer token (`token_times` holds the thought's
        // tokens, then the answer's). In place it is a step; handed over, a prefill of
        // prompt, thought, delimiter and first answer token (16 tokens), or of the one
        // token a connector leaves.
        let gap = |r: &MigrationResult| {
            let t = &r.records[0].token_times;
            t[think as usize + 1] - t[think as usize]
        };
        let (in_place, again, carried) = (gap(&alone), gap(&reprefill), gap(&connector));
        assert!(again > carried && again > in_place, "{in_place} {again} {carried}");
        let slow = split(Move::Connector { fixed_s: 0.5, per_token_s: 0.01 });
        assert!(
            (gap(&slow) - gap(&connector) - (0.5 + 0.01 * 16.0)).abs() < 1e-9,
            "the transfer time adds up"
        );
    }

    #[test]
    fn an_answer_that_ends_the_generation_at_the_delimiter_is_not_moved_and_runs_are_deterministic() {
        let r =
            run(tiny(), &fcfs, &one(10, 4, 0), Pools::Split { think: 1, answer: 1, moved: Move::Reprefill });
        assert_eq!(r.handed_over, 0, "nothing to answer");
        let r =
            run(tiny(), &fcfs, &one(10, 4, 1), Pools::Split { think: 1, answer: 1, moved: Move::Reprefill });
        assert_eq!(r.handed_over, 0, "an answer of one token is over where it began");
        let arrivals: Vec<Arrival> = (0..30)
            .map(|i| Arrival { at_s: f64::from(i) * 0.005, prompt: 40, think: 20, answer: 10 })
            .collect();
        let pools = Pools::Split { think: 2, answer: 1, moved: Move::Reprefill };
        let (a, b) = (run(tiny(), &fcfs, &arrivals, pools), run(tiny(), &fcfs, &arrivals, pools));
        assert_eq!(a.records, b.records);
        assert_eq!(a.handed_over, 30);
        assert!(a.records.iter().all(|r| r.e2e.is_some()), "every request finished");
    }
}
