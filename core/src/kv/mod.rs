//! The KV cache as vLLM keeps it, one model for the engine twin and the hook: fixed-size
//! blocks; each full block named by a hash chained over every token before it, so a block
//! is a prefix-cache hit only for a sequence that agrees with it from its first token;
//! unreferenced blocks kept as cache in free queues until their space is needed; and
//! Meridian's tiers, which say whose cached blocks go first.
//!
//! The tiers, in the order they are evicted ([`Tier`]):
//!
//! 1. **think-complete**: a finished request's thought and everything chained after it.
//!    The chat templates of reasoning models (Qwen3, DeepSeek-R1) drop earlier turns'
//!    thinking from the next prompt, so no later request can hit these blocks, though
//!    stock LRU keeps them longest (they were used last);
//! 2. **think-active**: the blocks of a thinking request vLLM preempted, which its
//!    resumption can hit;
//! 3. **output-critical**: prompts (the next turn's prefix) and answering requests'
//!    blocks.
//!
//! [`Eviction::Lru`] is stock vLLM: one queue, least recently freed first, whatever a
//! block holds. [`Eviction::ByTier`] evicts the lowest tier first, least recently freed
//! first within it ([`KvPool`]). [`Eviction::DeadFirst`] is what the hook does inside
//! vLLM: stock's queue with a finished request's think-complete blocks moved to its
//! front. Where a request's blocks stop being reachable is one rule,
//! [`first_dead_block`], used by the twin's pool and by the hook.
//!
//! Below the pool an [`Offload`] store can keep evicted blocks for a later request to
//! copy back up (offload and ingest); under [`OffloadRule::SkipDead`] think-complete
//! blocks are not copied down, since nothing can hit them.

mod offload;
mod pool;
mod queue;
#[cfg(test)]
mod tests;

use std::hash::{Hash, Hasher};

pub use offload::{Offload, OffloadRule};
pub use pool::{Eviction, Held, KvPool, PrefixCounters};

use crate::Phase;

/// A KV block's tier: which cached blocks are evicted first (the lowest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    ThinkComplete = 0,
    ThinkActive = 1,
    OutputCritical = 2,
}

impl Tier {
    /// Every tier, first evicted first.
    pub const ALL: [Tier; 3] = [Tier::ThinkComplete, Tier::ThinkActive, Tier::OutputCritical];

    /// Its label in metrics (the hook's `meridian_hook_kv_blocks{tier}`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::ThinkComplete => "think-complete",
            Tier::ThinkActive => "think-active",
            Tier::OutputCritical => "output-critical",
        }
    }
}

/// Why a request gave its blocks back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// It finished; `thought` says whether it produced a thought.
    Finished { thought: bool },
    /// vLLM preempted it while in this phase (it will be resumed).
    Preempted(Phase),
}

/// The first block of a finished request that no later request can hit: from the block
/// holding the end of its prompt on, when it thought (that block's hash chains over the
/// thought's first tokens, unless the prompt filled it exactly); `None` when it did not
/// think, since then its answer follows its prompt as the next turn's history does.
pub fn first_dead_block(prompt_tokens: u32, block_size: u32, thought: bool) -> Option<u32> {
    thought.then(|| prompt_tokens / block_size.max(1))
}

/// The tier of block `index` of a request released as `released`.
pub fn tier_at_release(index: u32, prompt_tokens: u32, block_size: u32, released: Released) -> Tier {
    match released {
        Released::Finished { thought } => match first_dead_block(prompt_tokens, block_size, thought) {
            Some(first) if index >= first => Tier::ThinkComplete,
            _ => Tier::OutputCritical,
        },
        Released::Preempted(Phase::Think) => Tier::ThinkActive,
        Released::Preempted(_) => Tier::OutputCritical,
    }
}

/// A full block's name in the prefix cache: a hash of its tokens and of the block before
/// it, so equal names mean equal sequences from the first token (as vLLM's block hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

/// The hashes of the full blocks of `tokens`, chained from `parent` (the block before
/// the first, if any); a last block not yet full has none.
pub fn block_hashes(parent: Option<BlockHash>, tokens: &[u32], block_size: u32) -> Vec<BlockHash> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1) as usize);
    let mut parent = parent;
    for block in tokens.chunks_exact(block_size.max(1) as usize) {
        // SipHash with fixed keys: the same name in every process and run.
        let mut h = std::hash::DefaultHasher::new();
        parent.map(|p| p.0).hash(&mut h);
        block.hash(&mut h);
        let hash = BlockHash(h.finish());
        out.push(hash);
        parent = Some(hash);
    }
    out
}
