//! Multi-turn conversations, the workload where a server's prefix cache and its eviction
//! order matter: each conversation's next request is its system prompt, its earlier
//! messages and the server's answers to them (their `content`, so the thinking is
//! dropped, as Qwen3's and DeepSeek-R1's chat templates drop it), and a new message,
//! sent a think time after the previous answer ended. Conversations start at the run's
//! arrival offsets; within one, turns go one after another.
//!
//! `agent` is the same loop shaped like a tool-calling agent's: short tool outputs sent
//! back at once (a tenth of the think time), over more turns. It keeps to plain user
//! messages (no `tool_calls` protocol): what the prefix cache sees is the shape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore};

use crate::client::Target;
use crate::dataset::{Prompt, RandomLengths, random, synthetic_text};
use crate::record::RequestRecord;
use crate::run::{RunOutput, process_cpu_seconds};

/// What the conversations look like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConversationShape {
    /// Each turn's new message and what the model generates for it.
    pub turn: RandomLengths,
    pub turns: u32,
    /// Tokens of the system prompt every conversation opens with (0: none).
    pub system_tokens: u32,
    /// Mean of the exponential wait between an answer's end and the next message.
    pub think_time_s: f64,
}

/// One turn to send: its new message, and how long after the previous answer.
#[derive(Debug, Clone, PartialEq)]
pub struct UserTurn {
    pub prompt: Prompt,
    /// 0 for a conversation's first turn.
    pub wait_s: f64,
    /// Sent as the request's sampling `seed` when the run asks (`--sample-seeds`), so two
    /// runs of the same plan (the two sides of an A/B) generate the same answers and so
    /// send the same histories.
    pub sampling_seed: u64,
}

/// Every conversation of a run, seeded.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationPlan {
    /// Shared by every conversation (`None`: no system message).
    pub system: Option<Arc<str>>,
    pub conversations: Vec<Vec<UserTurn>>,
}

impl ConversationPlan {
    pub fn new(n: usize, shape: ConversationShape, seed: u64) -> Self {
        let turns = shape.turns.max(1) as usize;
        let mut rng = StdRng::seed_from_u64(seed ^ 0xC0_4E55);
        let system =
            (shape.system_tokens > 0).then(|| Arc::from(synthetic_text(&mut rng, shape.system_tokens)));
        let pause = Exp::new(1.0 / shape.think_time_s.max(1e-9)).ok();
        let messages = random(n * turns, shape.turn, seed);
        let conversations = messages
            .chunks(turns)
            .enumerate()
            .map(|(c, chunk)| {
                chunk
                    .iter()
                    .enumerate()
                    .map(|(k, prompt)| UserTurn {
                        prompt: prompt.clone(),
                        wait_s: if k == 0 {
                            0.0
                        } else {
                            pause.map_or(shape.think_time_s, |p| p.sample(&mut rng))
                        },
                        sampling_seed: seed.wrapping_mul(1_000_003).wrapping_add((c * turns + k) as u64),
                    })
                    .collect()
            })
            .collect();
        ConversationPlan { system, conversations }
    }

    /// Requests the plan sends if every turn succeeds.
    pub fn requests(&self) -> usize {
        self.conversations.iter().map(Vec::len).sum()
    }
}

/// A multi-turn run: the plan, when each conversation starts, and the limits.
pub struct ConversationRun {
    pub plan: ConversationPlan,
    /// Start offsets in seconds, one per conversation.
    pub offsets: Vec<f64>,
    pub max_concurrency: Option<usize>,
    /// Start no new conversation after this many seconds (those begun go on).
    pub duration_s: Option<f64>,
    /// Send each turn its `sampling_seed`.
    pub sample_seeds: bool,
    /// The header each turn carries its conversation's key in (`conv-<seed>-<n>`).
    pub session_header: Option<String>,
    /// The run's seed, in the keys: runs of different plans never share one.
    pub seed: u64,
}

fn message(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// Runs every conversation against `target`. A turn that fails ends its conversation
/// (there is no answer to build the next turn on); its record says why.
pub async fn run_conversations(target: &Target, run: &ConversationRun) -> RunOutput {
    let turns = run.plan.conversations.iter().map(Vec::len).max().unwrap_or(0);
    let limit = Arc::new(Semaphore::new(run.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS).max(1)));
    let records = Arc::new(Mutex::new(Vec::with_capacity(run.plan.requests())));
    let cpu_before = process_cpu_seconds();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(run.plan.conversations.len());
    for (c, (conversation, offset)) in run.plan.conversations.iter().zip(&run.offsets).enumerate() {
        if run.duration_s.is_some_and(|d| *offset > d) {
            break;
        }
        let (target, conversation, records, limit) =
            (target.clone(), conversation.clone(), records.clone(), limit.clone());
        let system = run.plan.system.clone();
        let sample_seeds = run.sample_seeds;
        let session = run.session_header.clone().map(|h| (h, format!("conv-{}-{c}", run.seed)));
        let begin = start + Duration::from_secs_f64(*offset);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(begin)).await;
            let mut history: Vec<Value> = system.iter().map(|s| message("system", s)).collect();
            for (k, turn) in conversation.iter().enumerate() {
                if turn.wait_s > 0.0 {
                    tokio::time::sleep(Duration::from_secs_f64(turn.wait_s)).await;
                }
                history.push(message("user", &turn.prompt.text));
                let permit = limit.acquire().await;
                let sent_at = start.elapsed().as_secs_f64();
                let index = c * turns + k;
                let (mut record, answer) = target
                    .send_turn(
                        index,
                        sent_at,
                        &history,
                        &turn.prompt,
                        sample_seeds.then_some(turn.sampling_seed),
                        session.as_ref().map(|(h, k)| (h.as_str(), k.as_str())),
                    )
                    .await;
                drop(permit);
                record.conversation = Some(c as u32);
                record.turn = Some(k as u32);
                let ok = record.ok;
                records.lock().await.push(record);
                if !ok {
                    break;
                }
                history.push(message("assistant", &answer));
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let duration_s = start.elapsed().as_secs_f64();
    let mut records: Vec<RequestRecord> = std::mem::take(&mut *records.lock().await);
    records.sort_by_key(|r| r.index);
    RunOutput { records, duration_s, client_cpu_s: process_cpu_seconds() - cpu_before }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ConversationShape {
        ConversationShape {
            turn: RandomLengths { input: 40, output: 16, think: Some(32), range_ratio: 0.5 },
            turns: 3,
            system_tokens: 20,
            think_time_s: 2.0,
        }
    }

    #[test]
    fn plans_are_seeded_and_shaped() {
        let a = ConversationPlan::new(5, shape(), 7);
        assert_eq!(a, ConversationPlan::new(5, shape(), 7));
        assert_ne!(a, ConversationPlan::new(5, shape(), 8));
        assert_eq!(a.requests(), 15);
        assert_eq!(a.system.as_deref().map(|s| s.split(' ').count()), Some(20));
        for conversation in &a.conversations {
            assert_eq!(conversation[0].wait_s, 0.0, "a first turn is sent at its start");
            assert!(conversation[1..].iter().all(|t| t.wait_s > 0.0));
        }
        let seeds: std::collections::HashSet<u64> =
            a.conversations.iter().flatten().map(|t| t.sampling_seed).collect();
        assert_eq!(seeds.len(), 15, "every turn samples with a seed of its own");
        let none = ConversationPlan::new(2, ConversationShape { system_tokens: 0, ..shape() }, 7);
        assert_eq!(none.system, None);
    }
}
