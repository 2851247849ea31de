//! The twin's prefix cache: what a later request finds of an earlier one's blocks, and
//! what the eviction order changes for multi-turn conversations.

use meridian_core::sched::Fcfs;
use meridian_sim::conversation::{ConversationSpec, run_conversations};
use meridian_sim::engine::{Eviction, TokenIds};
use meridian_sim::workload::{LengthDist, WorkloadSpec};
use meridian_sim::{Engine, EngineConfig, NewRequest, profile};

fn tiny(prefix_cache: Option<Eviction>) -> EngineConfig {
    EngineConfig { prefix_cache, ..EngineConfig::from(&profile("tiny-test").unwrap()) }
}

fn turn(prompt: &[u32], think: u32, answer: &[u32]) -> NewRequest {
    NewRequest {
        id: format!("{}", prompt.len()),
        prompt_tokens: prompt.len() as u32,
        think_tokens: think,
        answer_tokens: answer.len() as u32,
        ids: Some(TokenIds { prompt: prompt.into(), answer: answer.into() }),
        ..NewRequest::default()
    }
}

/// Runs `first` to its end, then `second`; the prompt tokens `second` found cached.
fn hits_of_second(config: EngineConfig, first: NewRequest, second: NewRequest) -> u32 {
    let mut e = Engine::new(config, Box::new(Fcfs));
    e.submit(first).unwrap();
    while e.step().is_some() {}
    let seq = e.submit(second).unwrap();
    let mut hits = None;
    while let Some(step) = e.step() {
        for (s, h) in step.prefix_hits {
            if s == seq {
                hits.get_or_insert(h);
            }
        }
    }
    hits.unwrap_or(0)
}

#[test]
fn the_next_turn_hits_the_history_up_to_where_the_thought_began() {
    let prompt: Vec<u32> = (0..10).collect(); // block size 4: blocks 0-1 full, 2 holds its end
    let answer: Vec<u32> = (100..106).collect();
    let mut next: Vec<u32> = prompt.iter().chain(&answer).copied().collect();
    next.extend(200..210);
    let cached = Some(Eviction::Lru);
    // Without a thought the answer follows the prompt in the next turn's history, as it
    // did in the engine: every block whose KV was computed is a hit (16 tokens, but the
    // last one sampled was never computed, as in vLLM: 3 full blocks).
    assert_eq!(hits_of_second(tiny(cached), turn(&prompt, 0, &answer), turn(&next, 3, &[1])), 12);
    // With one, the block holding the prompt's end chained over the thought: only the
    // prompt's full blocks are hits.
    assert_eq!(hits_of_second(tiny(cached), turn(&prompt, 5, &answer), turn(&next, 3, &[1])), 8);
    // Off, nothing is.
    assert_eq!(hits_of_second(tiny(None), turn(&prompt, 0, &answer), turn(&next, 3, &[1])), 0);
}

#[test]
fn a_prompt_wholly_cached_still_computes_its_last_token() {
    let prompt: Vec<u32> = (0..12).collect();
    let cached = Some(Eviction::Lru);
    assert_eq!(hits_of_second(tiny(cached), turn(&prompt, 2, &[7]), turn(&prompt, 2, &[7])), 8);
}

fn chat() -> ConversationSpec {
    ConversationSpec {
        turn: WorkloadSpec {
            prompt: LengthDist::Fixed { value: 12 },
            think: LengthDist::Fixed { value: 24 },
            answer: LengthDist::Fixed { value: 8 },
            ..WorkloadSpec::default()
        },
        turns: 4,
        system_tokens: 8,
        think_time_s: 0.5,
    }
}

/// Later turns' prefix-hit rate under each eviction order, at `blocks` blocks.
fn later_hits(blocks: u32, eviction: Eviction, rate: f64) -> f64 {
    let config = EngineConfig { kv_blocks: blocks, ..tiny(Some(eviction)) };
    run_conversations(config, Box::new(Fcfs), &chat(), rate, 40, 7).later_turns_hit_rate()
}

#[test]
fn with_room_for_every_history_each_later_turn_hits_all_of_its_last_prompt() {
    // Turn k's prompt: 8 system tokens, k earlier messages of 12 and answers of 8, its
    // own 12; it finds the whole of turn k-1's prompt (20k tokens, whole blocks). Over
    // turns 1-3: (20 + 40 + 60) / (40 + 60 + 80).
    for eviction in [Eviction::Lru, Eviction::DeadFirst, Eviction::ByTier] {
        let rate = later_hits(4096, eviction, 1.0);
        assert!((rate - 120.0 / 180.0).abs() < 1e-9, "{eviction:?}: {rate}");
    }
}

#[test]
fn in_a_cache_that_binds_finished_thoughts_going_first_keeps_more_histories() {
    for (blocks, rate) in [(128, 1.0), (256, 2.0)] {
        let (lru, dead_first) =
            (later_hits(blocks, Eviction::Lru, rate), later_hits(blocks, Eviction::DeadFirst, rate));
        assert!(dead_first > lru * 1.05, "{blocks} blocks at {rate}/s: {dead_first} against LRU's {lru}");
        assert!(lru > 0.1, "some histories survive LRU too: {lru}");
    }
}

#[test]
fn the_same_seed_gives_the_same_conversations() {
    let config = EngineConfig { kv_blocks: 128, ..tiny(Some(Eviction::DeadFirst)) };
    let a = run_conversations(config, Box::new(Fcfs), &chat(), 1.0, 20, 3);
    let b = run_conversations(config, Box::new(Fcfs), &chat(), 1.0, 20, 3);
    assert_eq!(a.turns, b.turns);
    assert_eq!(a.turns.len(), 80, "every conversation ran its four turns");
}
