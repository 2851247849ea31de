use std::sync::Arc;

use meridian_core::Phase;
use meridian_core::kv::{BlockHash, Held, block_hashes};
use meridian_core::sched::RequestView;

/// What a request's tokens are, for the prefix cache: its prompt's ids and its answer's.
/// A thought's ids are its own (no later prompt holds them: chat templates drop it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenIds {
    pub prompt: Arc<[u32]>,
    pub answer: Arc<[u32]>,
}

/// A request as the caller submits it. Lengths are in tokens; the think and answer
/// lengths are what the model "would" generate, usually drawn from a workload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewRequest {
    pub id: String,
    pub prompt_tokens: u32,
    pub think_tokens: u32,
    pub answer_tokens: u32,
    /// vLLM-style priority: lower runs first (used by priority-aware policies).
    pub priority: i32,
    /// `thinking_token_budget`: thinking is cut (the end marker forced) at this many tokens.
    pub think_budget: Option<u32>,
    /// Its tokens, where the prefix cache should see which prompts share a prefix;
    /// without them every token is its own and nothing is ever a hit.
    pub ids: Option<TokenIds>,
    /// Prompt tokens whose KV arrives with it from another engine (vLLM's KV connector,
    /// an answer handed over at the end of its thought): held, not computed, when it is
    /// first admitted (short of the last token, which is computed to sample the next). A
    /// preemption loses them: the request then computes its prompt like any other.
    pub preloaded: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Waiting,
    Running,
}

#[derive(Debug, Clone)]
pub(crate) struct SimRequest {
    pub seq: u64,
    pub id: String,
    pub arrival_s: f64,
    pub priority: i32,
    pub prompt: u32,
    /// Think tokens this generation will have (budget applied).
    pub think_len: u32,
    /// The budget, not the model, ends the thought (so the scheduler can see it coming).
    pub think_forced: bool,
    /// An end-of-thought delimiter (`</think>`) follows the thought: one more sampled
    /// token, in a step of its own, that the reasoning parser swallows, so no client sees
    /// it and the first answer token comes a step later. Only when an answer follows (a
    /// thought cut by `max_tokens` just stops).
    pub closes_thought: bool,
    pub answer_len: u32,
    /// Tokens sampled so far (think + answer).
    pub generated: u32,
    /// Tokens whose KV is computed (prompt and generated).
    pub computed: u32,
    /// Prompt tokens whose KV came from another engine, until it is first admitted.
    pub preloaded: u32,
    /// Its KV blocks, in order.
    pub held: Held,
    pub ids: Option<TokenIds>,
    /// The names of its full blocks so far (prompt and generated), when the prefix cache is on.
    pub hashes: Vec<BlockHash>,
    /// How many of its first blocks are in the prefix cache.
    pub cached_blocks: u32,
    pub state: State,
    pub think_ended_s: Option<f64>,
    /// When it last entered the waiting queue.
    pub queued_s: f64,
}

/// Marks ids the twin makes up, so that they meet no caller's.
const MADE_UP: u32 = 1 << 31;

impl SimRequest {
    /// The id of the token at `position` (prompt, then generated): the caller's where it
    /// gave them, else one made up from the request and the position.
    fn token_at(&self, position: u32) -> u32 {
        let made_up =
            || MADE_UP | (self.seq as u32).wrapping_mul(0x9E37_79B9).wrapping_add(position) & !MADE_UP;
        let ids = self.ids.as_ref();
        if position < self.prompt {
            return ids.and_then(|t| t.prompt.get(position as usize).copied()).unwrap_or_else(made_up);
        }
        let generated = position - self.prompt;
        match generated.checked_sub(self.answer_starts()) {
            Some(a) => ids.and_then(|t| t.answer.get(a as usize).copied()).unwrap_or_else(made_up),
            None => made_up(),
        }
    }

    /// Names every block its known tokens (prompt and generated so far) fill.
    pub fn name_full_blocks(&mut self, block_size: u32) {
        let block_size = block_size.max(1);
        // Most steps fill no block: nothing is allocated for them.
        let mut block = Vec::new();
        while (self.hashes.len() as u32 + 1) * block_size <= self.tokens_needed() {
            let start = self.hashes.len() as u32 * block_size;
            block.clear();
            block.extend((start..start + block_size).map(|p| self.token_at(p)));
            self.hashes.extend(block_hashes(self.hashes.last().copied(), &block, block_size));
        }
    }

    /// Tokens that need KV before the next token can be sampled.
    pub fn tokens_needed(&self) -> u32 {
        self.prompt + self.generated
    }

    pub fn target(&self) -> u32 {
        self.answer_starts() + self.answer_len
    }

    /// Tokens sampled before the first answer token: the thought and its delimiter.
    pub fn answer_starts(&self) -> u32 {
        self.think_len + u32::from(self.closes_thought)
    }

    /// The phase of the next token this request will produce (sampling the delimiter is
    /// still thinking: the phase turns once it is out).
    pub fn phase(&self) -> Phase {
        if self.computed < self.prompt && self.generated == 0 {
            Phase::Pending
        } else if self.generated < self.answer_starts() {
            Phase::Think
        } else {
            Phase::Output
        }
    }

    /// KV still to compute before the next token can be sampled: the rest of the prompt,
    /// and after a preemption with recompute also the tokens generated before it. 0 while
    /// decoding (the one token a decode step computes is not a prefill).
    pub fn kv_to_compute(&self) -> u32 {
        let missing = self.tokens_needed().saturating_sub(self.computed);
        if self.computed < self.prompt || missing > 1 { missing } else { 0 }
    }

    pub fn view(&self) -> RequestView {
        RequestView {
            seq: self.seq,
            arrival_s: self.arrival_s,
            priority: self.priority,
            phase: self.phase(),
            prefill_remaining: self.kv_to_compute(),
            think_tokens: self.generated.min(self.think_len),
            output_tokens: self.generated.saturating_sub(self.answer_starts()),
            think_ended_s: self.think_ended_s,
            // A thought the budget cut short ends at a token everyone can count to: the
            // next step samples the forced delimiter.
            think_ends_next: self.think_forced
                && self.closes_thought
                && self.kv_to_compute() == 0
                && self.generated == self.think_len,
            queued_s: (self.state == State::Waiting).then_some(self.queued_s),
        }
    }
}
