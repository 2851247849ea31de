//! Multi-turn conversations through the twin, the workload where the prefix cache and its
//! eviction order matter: each conversation's next prompt is its earlier turns' prompts
//! and answers with the thinking dropped (as Qwen3's and DeepSeek-R1's chat templates
//! build it) plus a new user message, sent a think time after the previous answer ended.
//! Conversations start as a Poisson process; every conversation shares one system prompt.
//!
//! Each turn's record says how many of its prompt's tokens the prefix cache held when the
//! engine took it up, so the hit rate of turns after the first (the only ones with a
//! history to hit) and their time to first token can be read per eviction order.

mod in_flight;
pub mod trace;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use meridian_core::kv::PrefixCounters;
use meridian_core::sched::SchedulingPolicy;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};

use crate::engine::{Engine, EngineConfig, NewRequest, TokenIds};
use crate::workload::{Workload, WorkloadSpec};
use in_flight::{InFlight, TurnEvent};

/// The shape of the conversations.
#[derive(Debug, Clone)]
pub struct ConversationSpec {
    /// Each turn's lengths: `prompt` is the new user message, `think` and `answer` what
    /// the model generates for it.
    pub turn: WorkloadSpec,
    pub turns: u32,
    /// Tokens of the system prompt every conversation opens with.
    pub system_tokens: u32,
    /// Mean of the exponential wait between an answer's end and the next message.
    pub think_time_s: f64,
}

/// One turn's outcome, in seconds of engine time from when it was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    pub conversation: u32,
    /// 0 for the first turn.
    pub turn: u32,
    pub prompt_tokens: u32,
    /// Prompt tokens the prefix cache held when the engine first took the turn up.
    pub hit_tokens: u32,
    pub ttft: Option<f64>,
    pub e2e: Option<f64>,
}

/// A whole run's outcome.
#[derive(Debug, Clone)]
pub struct ConversationResult {
    pub turns: Vec<TurnRecord>,
    /// The engine's own prefix-cache counters (vLLM's `prefix_cache_queries`/`_hits`
    /// count every look-up, resumptions after preemption included).
    pub counters: PrefixCounters,
    pub makespan_s: f64,
    /// Tokens (prompt and generated) per second of engine time.
    pub token_throughput: f64,
    pub preemptions: u64,
}

impl ConversationResult {
    /// Hit tokens over prompt tokens of the turns after the first.
    pub fn later_turns_hit_rate(&self) -> f64 {
        let (hit, all) =
            self.turns.iter().filter(|t| t.turn > 0).fold((0u64, 0u64), |(h, a), t| {
                (h + u64::from(t.hit_tokens), a + u64::from(t.prompt_tokens))
            });
        if all == 0 { 0.0 } else { hit as f64 / all as f64 }
    }

    /// TTFTs of the turns after the first.
    pub fn later_turns_ttft(&self) -> Vec<f64> {
        self.turns.iter().filter(|t| t.turn > 0).filter_map(|t| t.ttft).collect()
    }
}

/// A conversation's next turn, waiting to be sent.
struct Due {
    /// The history it is sent with (system prompt, earlier messages and answers).
    history: Vec<u32>,
    turn: u32,
}

/// Fresh token ids, so that no two messages share a token by chance.
struct Ids(u32);

impl Ids {
    fn take(&mut self, n: u32) -> impl Iterator<Item = u32> + use<> {
        let start = self.0;
        self.0 += n;
        start..start + n
    }
}

/// Runs `conversations` conversations, started at `rate` per second, through the engine.
pub fn run_conversations(
    config: EngineConfig,
    policy: Box<dyn SchedulingPolicy>,
    spec: &ConversationSpec,
    rate: f64,
    conversations: u32,
    seed: u64,
) -> ConversationResult {
    let mut engine = Engine::new(config, policy);
    let mut workload = Workload::new(spec.turn, seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC0_4E55);
    let starts = Exp::new(rate.max(1e-9)).ok();
    let pause = Exp::new(1.0 / spec.think_time_s.max(1e-9)).ok();
    let mut ids = Ids(spec.system_tokens + 1);
    let system: Vec<u32> = (1..=spec.system_tokens).collect();

    // Turns due, earliest first (time in ns as the key: f64 is not Ord).
    let mut due: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
    let mut waiting: HashMap<u32, Due> = HashMap::new();
    let mut t = 0.0;
    for c in 0..conversations {
        due.push(Reverse((secs_to_key(t), c)));
        waiting.insert(c, Due { history: system.clone(), turn: 0 });
        t += starts.map_or(1.0 / rate.max(1e-9), |g| g.sample(&mut rng));
    }

    let mut turns: Vec<TurnRecord> = Vec::new();
    // Each held turn keeps its prompt and answer: the next turn's history.
    let mut live: InFlight<Vec<u32>> = InFlight::new();
    let mut tokens_done = 0u64;
    loop {
        let next_due = due.peek().map(|Reverse((k, _))| key_to_secs(*k));
        if !engine.has_work() {
            match next_due {
                Some(at) => engine.advance_to(at),
                None => break,
            }
        }
        while let Some(Reverse((key, c))) = due.peek().copied() {
            if key_to_secs(key) > engine.now() {
                break;
            }
            due.pop();
            let Some(d) = waiting.remove(&c) else { continue };
            let shape = workload.next_shape();
            let mut prompt = d.history;
            prompt.extend(ids.take(shape.prompt.max(1)));
            let answer: Vec<u32> = ids.take(shape.answer.max(1)).collect();
            let prompt_tokens = prompt.len() as u32;
            let submitted = engine.submit(NewRequest {
                id: format!("{c}-{}", d.turn),
                prompt_tokens,
                think_tokens: shape.think,
                answer_tokens: answer.len() as u32,
                priority: 0,
                think_budget: None,
                ids: Some(TokenIds {
                    prompt: Arc::from(prompt.as_slice()),
                    answer: Arc::from(answer.as_slice()),
                }),
                ..NewRequest::default()
            });
            // A conversation whose history no longer fits in the KV cache ends there.
            if let Ok(seq) = submitted {
                let mut next = prompt;
                next.extend(&answer);
                live.insert(seq, turns.len(), engine.now(), next);
                turns.push(TurnRecord {
                    conversation: c,
                    turn: d.turn,
                    prompt_tokens,
                    hit_tokens: 0,
                    ttft: None,
                    e2e: None,
                });
            }
        }
        let wake = due.peek().map_or(f64::INFINITY, |Reverse((k, _))| key_to_secs(*k));
        let Some(step) = engine.step_until(wake) else { continue };
        live.observe(step, |event| match event {
            TurnEvent::Cached { record, cached } => turns[record].hit_tokens = cached,
            TurnEvent::Token { record, since_s, visible } => {
                tokens_done += 1;
                if visible && turns[record].ttft.is_none() {
                    turns[record].ttft = Some(since_s);
                }
            }
            TurnEvent::Done { record, since_s, at_s, then: history } => {
                let record = &mut turns[record];
                record.e2e = Some(since_s);
                tokens_done += u64::from(record.prompt_tokens);
                let (conversation, turn) = (record.conversation, record.turn + 1);
                if turn < spec.turns {
                    let at = at_s + pause.map_or(spec.think_time_s, |p| p.sample(&mut rng));
                    due.push(Reverse((secs_to_key(at), conversation)));
                    waiting.insert(conversation, Due { history, turn });
                }
            }
        });
    }
    let makespan_s = engine.now();
    ConversationResult {
        turns,
        counters: engine.prefix_counters(),
        makespan_s,
        token_throughput: tokens_done as f64 / makespan_s.max(1e-12),
        preemptions: engine.preemptions(),
    }
}

fn secs_to_key(s: f64) -> u64 {
    (s.max(0.0) * 1e9) as u64
}

fn key_to_secs(k: u64) -> f64 {
    k as f64 / 1e9
}

/// One cell of [`eviction_table`]: a cache size and a rate, stock's LRU against the
/// hook's order over the same seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionCell {
    pub kv_blocks: u32,
    pub rate: f64,
    /// Per seed: (hit rate of later turns, their p95 TTFT, token throughput), LRU then
    /// the hook's order.
    pub lru: Vec<(f64, f64, f64)>,
    pub dead_first: Vec<(f64, f64, f64)>,
}

/// Runs every cache size and rate under [`Eviction::Lru`](crate::engine::Eviction::Lru)
/// and [`Eviction::DeadFirst`](crate::engine::Eviction::DeadFirst), each seed on both.
pub fn eviction_cells(
    config: EngineConfig,
    policy: &dyn Fn() -> Box<dyn SchedulingPolicy>,
    spec: &ConversationSpec,
    blocks: &[u32],
    rates: &[f64],
    conversations: u32,
    seeds: &[u64],
) -> Vec<EvictionCell> {
    use crate::engine::Eviction;
    let mut out = Vec::new();
    for &kv_blocks in blocks {
        for &rate in rates {
            let run = |eviction, seed| {
                let config = EngineConfig { kv_blocks, prefix_cache: Some(eviction), ..config };
                let r = run_conversations(config, policy(), spec, rate, conversations, seed);
                let p95 = crate::ab::percentile(&r.later_turns_ttft(), 95.0);
                (r.later_turns_hit_rate(), p95.unwrap_or(f64::NAN), r.token_throughput)
            };
            out.push(EvictionCell {
                kv_blocks,
                rate,
                lru: seeds.iter().map(|&s| run(Eviction::Lru, s)).collect(),
                dead_first: seeds.iter().map(|&s| run(Eviction::DeadFirst, s)).collect(),
            });
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

impl EvictionCell {
    /// The median over seeds of each paired ratio, the hook's order over LRU: later
    /// turns' hit rate, their p95 TTFT, token throughput.
    pub fn median_ratios(&self) -> (f64, f64, f64) {
        let ratio = |pick: fn(&(f64, f64, f64)) -> f64| {
            median(self.dead_first.iter().zip(&self.lru).map(|(d, l)| pick(d) / pick(l)).collect())
        };
        (ratio(|x| x.0), ratio(|x| x.1), ratio(|x| x.2))
    }

    /// The cell as JSON, for a harness that sets the twin beside a measurement.
    pub fn to_json(&self) -> serde_json::Value {
        let (hit, p95, tput) = self.median_ratios();
        let med = |side: &[(f64, f64, f64)], pick: fn(&(f64, f64, f64)) -> f64| {
            median(side.iter().map(pick).collect())
        };
        serde_json::json!({
            "kv_blocks": self.kv_blocks,
            "rate": self.rate,
            "seeds": self.lru.len(),
            "lru_hit_rate": med(&self.lru, |x| x.0),
            "dead_first_hit_rate": med(&self.dead_first, |x| x.0),
            "hit_rate_ratio": hit,
            "p95_ttft_ratio": p95,
            "throughput_ratio": tput,
        })
    }
}

/// The cells as a markdown table: medians over seeds, and each paired ratio (the hook's
/// order over LRU, seed by seed) as its median with the seeds' range.
pub fn eviction_table(cells: &[EvictionCell]) -> String {
    let ratio = |c: &EvictionCell, pick: fn(&(f64, f64, f64)) -> f64| {
        let r: Vec<f64> = c.dead_first.iter().zip(&c.lru).map(|(d, l)| pick(d) / pick(l)).collect();
        let (lo, hi) = r.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(*x), b.max(*x)));
        format!("{:.2} ({lo:.2}-{hi:.2})", median(r))
    };
    let mut s = String::from(
        "| KV blocks | conversations/s | later turns' hit rate, LRU | the hook's order | ratio | \
         p95 TTFT of later turns, LRU (s) | the hook's order (s) | ratio | token throughput ratio |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        let med = |side: &[(f64, f64, f64)], pick: fn(&(f64, f64, f64)) -> f64| {
            median(side.iter().map(pick).collect())
        };
        s += &format!(
            "| {} | {} | {:.1}% | {:.1}% | {} | {:.2} | {:.2} | {} | {} |\n",
            c.kv_blocks,
            c.rate,
            100.0 * med(&c.lru, |x| x.0),
            100.0 * med(&c.dead_first, |x| x.0),
            ratio(c, |x| x.0),
            med(&c.lru, |x| x.1),
            med(&c.dead_first, |x| x.1),
            ratio(c, |x| x.1),
            ratio(c, |x| x.2),
        );
    }
    s
}
