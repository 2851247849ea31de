//! A recorded multi-turn run replayed through the twin's prefix cache, turn by turn: the
//! twin's cache held to vLLM's own count of cached tokens on the same conversations.
//!
//! Each turn keeps what the real engine reported (its prompt, thinking and answer
//! lengths) and the wait the client took between the previous answer's end and this turn
//! (the conversation stays closed-loop: in the twin, the turn goes out that long after
//! the twin's previous answer ended). A turn's prompt is the previous turn's prompt,
//! token for token, and then fresh tokens (the answer's words and the new message, which
//! no block in the cache can hold: what the engine generated chains over its thought);
//! every conversation opens with the same system prompt. So the twin sees which prompts
//! share which prefixes exactly as vLLM's hashes do, and each turn's hit can be set beside
//! vLLM's `cached_tokens` for the same turn.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use meridian_core::sched::SchedulingPolicy;
use serde_json::{Value, json};

use super::in_flight::{InFlight, TurnEvent};
use super::{key_to_secs as secs, secs_to_key as key};
use crate::engine::{Engine, EngineConfig, NewRequest, TokenIds};

/// One turn of a recorded run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceTurn {
    /// Its `index` in the load tester's report.
    pub index: u64,
    pub conversation: u32,
    pub turn: u32,
    /// First turns: when it was sent, from the run's first send. Later turns: the wait
    /// after the previous turn's last token.
    pub wait_s: f64,
    pub prompt: u32,
    pub think: u32,
    pub answer: u32,
    /// Prompt tokens vLLM's prefix cache held for it (`usage.prompt_tokens_details`).
    pub measured_cached: Option<u32>,
}

/// A turn as the report recorded it: when it was sent, how long it took, and the turn to
/// replay when it can be.
struct Recorded {
    turn: u32,
    sent_s: f64,
    e2e_s: Option<f64>,
    replayable: Option<TraceTurn>,
}

/// The replayable turns of a `meridian-loadtest --dataset-name conversations` report:
/// every conversation's turns from its first up to its first turn that failed or carries
/// no usage (a history the engine never finished cannot be sent on). Lengths as
/// [`crate::replay::requests_of`] reads them (the thought's delimiter counted with it).
pub fn turns_of(report: &Value) -> Result<Vec<TraceTurn>, String> {
    let requests = report
        .pointer("/runs/0/requests")
        .and_then(Value::as_array)
        .ok_or("not a meridian-loadtest report: no runs[0].requests")?;
    let mut by_conversation: HashMap<u32, Vec<Recorded>> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        let uint = |name: &str| r.get(name).and_then(Value::as_u64);
        let (Some(index), Some(sent)) = (uint("index"), r.get("sent_at").and_then(Value::as_f64)) else {
            return Err(format!("request {i}: no index or sent_at"));
        };
        let (Some(conversation), Some(turn)) = (uint("conversation"), uint("turn")) else {
            return Err(format!("request {index}: no conversation or turn (not a conversations run)"));
        };
        let narrow = |v: u64| u32::try_from(v).map_err(|_| format!("request {index}: {v} out of range"));
        let (conversation, turn) = (narrow(conversation)?, narrow(turn)?);
        let ok = r.get("ok").and_then(Value::as_bool).unwrap_or(false);
        let lengths = (uint("prompt_tokens"), uint("usage_think_tokens"), uint("usage_output_tokens"));
        let replayable = match (ok, lengths) {
            (true, (Some(prompt), Some(think), Some(output))) => {
                let (prompt, think, output) = (narrow(prompt)?, narrow(think)?, narrow(output)?);
                let answer = output.saturating_sub(u32::from(think > 0)).max(1);
                let measured_cached = uint("cached_tokens").map(narrow).transpose()?;
                Some(TraceTurn {
                    index,
                    conversation,
                    turn,
                    wait_s: 0.0,
                    prompt,
                    think,
                    answer,
                    measured_cached,
                })
            }
            _ => None,
        };
        let e2e_s = r.get("e2e").and_then(Value::as_f64);
        by_conversation.entry(conversation).or_default().push(Recorded {
            turn,
            sent_s: sent,
            e2e_s,
            replayable,
        });
    }
    let first_send = requests
        .iter()
        .filter_map(|r| r.get("sent_at").and_then(Value::as_f64))
        .fold(f64::INFINITY, f64::min);
    let mut out = Vec::new();
    for turns in by_conversation.values_mut() {
        turns.sort_by_key(|t| t.turn);
        let mut previous_end: Option<f64> = None;
        for (k, r) in turns.iter().enumerate() {
            let Some(mut t) = r.replayable.filter(|_| r.turn as usize == k) else { break };
            t.wait_s = match previous_end {
                None => r.sent_s - first_send,
                Some(end) => (r.sent_s - end).max(0.0),
            };
            out.push(t);
            let Some(e2e) = r.e2e_s else { break };
            previous_end = Some(r.sent_s + e2e);
        }
    }
    out.sort_by_key(|t| (t.conversation, t.turn));
    Ok(out)
}

/// One turn as replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceHit {
    pub index: u64,
    pub conversation: u32,
    pub turn: u32,
    pub prompt: u32,
    pub measured_cached: Option<u32>,
    /// Prompt tokens the twin's cache held when its engine first took the turn up.
    pub twin_cached: u32,
    pub twin_ttft_s: Option<f64>,
}

/// Replays `turns` (as [`turns_of`] gives them) through an engine with its prefix cache
/// on (`config.prefix_cache`) under `policy`; the first `system_tokens` of every
/// conversation's first prompt are the shared system prompt. A turn the engine refuses
/// (its history no longer fits) ends its conversation.
pub fn replay_turns(
    config: EngineConfig,
    policy: Box<dyn SchedulingPolicy>,
    turns: &[TraceTurn],
    system_tokens: u32,
) -> Vec<TraceHit> {
    let mut engine = Engine::new(config, policy);
    let mut by_conversation: HashMap<u32, Vec<TraceTurn>> = HashMap::new();
    for t in turns {
        by_conversation.entry(t.conversation).or_default().push(*t);
    }
    for ts in by_conversation.values_mut() {
        ts.sort_by_key(|t| t.turn);
    }
    let system: Vec<u32> = (1..=system_tokens).collect();
    let mut next_id = system_tokens + 1;
    let mut fresh = |n: u32| {
        let start = next_id;
        next_id += n;
        start..start + n
    };
    // (due time in ns, conversation, position in its turns); the previous prompt's ids.
    let mut due: BinaryHeap<Reverse<(u64, u32, usize)>> = BinaryHeap::new();
    let mut previous: HashMap<u32, Arc<[u32]>> = HashMap::new();
    for (&c, ts) in &by_conversation {
        if let Some(t) = ts.first().filter(|t| t.turn == 0) {
            due.push(Reverse((key(t.wait_s), c, 0)));
        }
    }
    let mut hits: Vec<TraceHit> = Vec::new();
    // Each held turn keeps its conversation and its place in that conversation's turns.
    let mut live: InFlight<(u32, usize)> = InFlight::new();
    loop {
        if !engine.has_work() {
            match due.peek() {
                Some(Reverse((k, _, _))) => engine.advance_to(secs(*k)),
                None => break,
            }
        }
        while let Some(&Reverse((k, c, pos))) = due.peek() {
            if secs(k) > engine.now() {
                break;
            }
            due.pop();
            let Some(&t) = by_conversation.get(&c).and_then(|ts| ts.get(pos)) else { continue };
            let base: &[u32] = previous.get(&c).map_or(&system, |p| p);
            let shared = base.len().min(t.prompt as usize);
            let mut prompt: Vec<u32> = base[..shared].to_vec();
            prompt.extend(fresh(t.prompt - shared as u32));
            let answer: Vec<u32> = fresh(t.answer).collect();
            let prompt: Arc<[u32]> = Arc::from(prompt);
            let submitted = engine.submit(NewRequest {
                id: format!("{c}-{}", t.turn),
                prompt_tokens: t.prompt,
                think_tokens: t.think,
                answer_tokens: t.answer,
                priority: 0,
                think_budget: None,
                ids: Some(TokenIds { prompt: prompt.clone(), answer: Arc::from(answer) }),
                ..NewRequest::default()
            });
            if let Ok(seq) = submitted {
                previous.insert(c, prompt);
                live.insert(seq, hits.len(), engine.now(), (c, pos));
                hits.push(TraceHit {
                    index: t.index,
                    conversation: c,
                    turn: t.turn,
                    prompt: t.prompt,
                    measured_cached: t.measured_cached,
                    twin_cached: 0,
                    twin_ttft_s: None,
                });
            }
        }
        let wake = due.peek().map_or(f64::INFINITY, |Reverse((k, _, _))| secs(*k));
        let Some(step) = engine.step_until(wake) else { continue };
        live.observe(step, |event| match event {
            TurnEvent::Cached { record, cached } => hits[record].twin_cached = cached,
            TurnEvent::Token { record, since_s, visible } => {
                if visible && hits[record].twin_ttft_s.is_none() {
                    hits[record].twin_ttft_s = Some(since_s);
                }
            }
            TurnEvent::Done { at_s, then: (c, pos), .. } => {
                if let Some(t) = by_conversation.get(&c).and_then(|ts| ts.get(pos + 1)) {
                    due.push(Reverse((key(at_s + t.wait_s), c, pos + 1)));
                }
            }
        });
    }
    hits.sort_by_key(|h| (h.conversation, h.turn));
    hits
}

/// The replay beside the measurement: per turn, and for the later turns pooled, the
/// hit rate each side saw and the share of later turns whose twin hit lies within one
/// block of vLLM's.
pub fn hits_json(hits: &[TraceHit], block_size: u32) -> Value {
    let later: Vec<&TraceHit> = hits.iter().filter(|h| h.turn > 0).collect();
    let prompt: u64 = later.iter().map(|h| u64::from(h.prompt)).sum();
    let measured: Vec<(u32, u32)> =
        later.iter().filter_map(|h| h.measured_cached.map(|m| (m, h.twin_cached))).collect();
    let rate = |v: u64| if prompt == 0 { Value::Null } else { json!(v as f64 / prompt as f64) };
    let within = measured.iter().filter(|(m, t)| m.abs_diff(*t) <= block_size).count();
    json!({
        "later_turns": {
            "turns": later.len(),
            "twin_hit_rate": rate(later.iter().map(|h| u64::from(h.twin_cached)).sum()),
            "measured_hit_rate": if measured.len() == later.len() {
                rate(measured.iter().map(|(m, _)| u64::from(*m)).sum())
            } else { Value::Null },
            "within_one_block": if measured.is_empty() { Value::Null } else {
                json!(within as f64 / measured.len() as f64)
            },
        },
        "turns": hits.iter().map(|h| json!({
            "index": h.index, "conversation": h.conversation, "turn": h.turn, "prompt_tokens": h.prompt,
            "measured_cached": h.measured_cached, "twin_cached": h.twin_cached, "twin_ttft": h.twin_ttft_s,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Eviction;
    use meridian_core::sched::Fcfs;

    fn request(index: u64, conversation: u64, turn: u64, sent: f64, prompt: u64, cached: u64) -> Value {
        json!({"index": index, "conversation": conversation, "turn": turn, "sent_at": sent, "ok": true,
               "e2e": 1.0, "prompt_tokens": prompt, "usage_think_tokens": 8, "usage_output_tokens": 5,
               "cached_tokens": cached})
    }

    fn config(kv_blocks: u32, eviction: Eviction) -> EngineConfig {
        let profile = crate::profile("tiny-test").expect("tiny-test profile");
        EngineConfig { kv_blocks, prefix_cache: Some(eviction), ..EngineConfig::from(&profile) }
    }

    #[test]
    fn turns_keep_their_waits_and_stop_at_a_broken_history() {
        let mut failed = request(5, 1, 1, 20.0, 30, 0);
        failed["ok"] = json!(false);
        let report = json!({"runs": [{"requests": [
            request(0, 0, 0, 10.0, 20, 0), request(1, 0, 1, 14.0, 40, 16),
            request(4, 1, 0, 12.0, 20, 0), failed, request(6, 1, 2, 30.0, 50, 0),
        ]}]});
        let turns = turns_of(&report).expect("a conversations report");
        let got: Vec<(u32, u32, f64)> = turns.iter().map(|t| (t.conversation, t.turn, t.wait_s)).collect();
        // Turn 1 of conversation 0 went 3 s after turn 0 ended (10 + 1 s); conversation
        // 1's second turn failed, so its third (whose history it was) is not replayed.
        assert_eq!(got, vec![(0, 0, 0.0), (0, 1, 3.0), (1, 0, 2.0)]);
        assert_eq!((turns[1].think, turns[1].answer, turns[1].measured_cached), (8, 4, Some(16)));
        assert!(turns_of(&json!({"runs": [{"requests": [{"index": 0, "sent_at": 1.0}]}]})).is_err());
    }

    #[test]
    fn a_later_turn_hits_its_previous_prompt_in_whole_blocks() {
        // tiny-test: 4-token blocks. Turn 0: 22 tokens, 5 whole blocks named; turn 1
        // starts with those 22 tokens, so it finds 20 of them cached (an uncrowded cache).
        let report =
            json!({"runs": [{"requests": [request(0, 0, 0, 0.0, 22, 0), request(1, 0, 1, 5.0, 40, 20)]}]});
        let turns = turns_of(&report).expect("a report");
        let hits = replay_turns(config(64, Eviction::Lru), Box::new(Fcfs), &turns, 10);
        assert_eq!(hits.iter().map(|h| h.twin_cached).collect::<Vec<_>>(), vec![0, 20]);
        let summary = hits_json(&hits, 4);
        assert_eq!(summary["later_turns"]["within_one_block"], 1.0);
        assert_eq!(summary["later_turns"]["twin_hit_rate"], 0.5);
    }

    #[test]
    fn conversations_share_the_system_prompt_and_nothing_else() {
        // Two first turns 1 s apart: the second finds the 12-token system prompt's 3
        // whole blocks, and none of the first's own message.
        let report =
            json!({"runs": [{"requests": [request(0, 0, 0, 0.0, 22, 0), request(1, 1, 0, 1.0, 22, 12)]}]});
        let hits = replay_turns(
            config(64, Eviction::Lru),
            Box::new(Fcfs),
            &turns_of(&report).expect("a report"),
            12,
        );
        assert_eq!(hits.iter().map(|h| h.twin_cached).collect::<Vec<_>>(), vec![0, 12]);
    }
}
