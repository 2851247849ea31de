//! An optional tier below the block pool (host memory, a disk, a KV connector's store),
//! as vLLM's offloading connectors and LMCache keep one: a cached block whose space the
//! pool takes is copied down instead of lost, and a later request whose prefix goes on
//! past the pool's cached blocks ingests the next ones from there (a copy back up, no
//! compute). The store is bounded and forgets its least recently used block first.
//!
//! Meridian's rule ([`OffloadRule::SkipDead`]): a think-complete block is not worth the
//! copy, since no later request can hit it (its hash chains over a thought the next turn's
//! prompt drops), so only think-active and output-critical blocks go down, and the
//! store's room goes to prefixes that can come back.

use std::collections::{BTreeMap, HashMap};

use super::{BlockHash, Tier};

/// Which evicted blocks are copied down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadRule {
    /// Every cached block whose space is taken (what an offloading connector does).
    All,
    /// All but think-complete blocks, which nothing can hit again.
    SkipDead,
}

/// The store below the pool: at most `capacity` blocks, named by their hashes.
#[derive(Debug, Clone)]
pub struct Offload {
    capacity: u32,
    rule: OffloadRule,
    /// Each stored block's last use.
    used: HashMap<BlockHash, u64>,
    /// Stored blocks by last use, oldest first.
    by_use: BTreeMap<u64, BlockHash>,
    clock: u64,
}

impl Offload {
    pub fn new(capacity: u32, rule: OffloadRule) -> Self {
        Offload { capacity, rule, used: HashMap::new(), by_use: BTreeMap::new(), clock: 0 }
    }

    /// Blocks stored.
    pub fn len(&self) -> u32 {
        self.used.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    pub fn holds(&self, hash: BlockHash) -> bool {
        self.used.contains_key(&hash)
    }

    /// A block of `tier` named `hash` leaves the pool: copied down unless the rule skips
    /// it (or there is no room at all); the least recently used block makes room. Whether
    /// it was stored.
    pub(super) fn store(&mut self, hash: BlockHash, tier: Tier) -> bool {
        if self.capacity == 0 || (self.rule == OffloadRule::SkipDead && tier == Tier::ThinkComplete) {
            return false;
        }
        if !self.used.contains_key(&hash) && self.len() >= self.capacity {
            if let Some((_, oldest)) = self.by_use.pop_first() {
                self.used.remove(&oldest);
            }
        }
        self.touch(hash);
        true
    }

    /// How many of `hashes`, in a row from the first, the store holds; those are marked
    /// used now (they are about to be copied back up).
    pub(super) fn ingest_prefix(&mut self, hashes: &[BlockHash]) -> u32 {
        let n = hashes.iter().take_while(|h| self.used.contains_key(h)).count();
        for &h in &hashes[..n] {
            self.touch(h);
        }
        n as u32
    }

    fn touch(&mut self, hash: BlockHash) {
        self.clock += 1;
        if let Some(old) = self.used.insert(hash, self.clock) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(self.clock, hash);
    }
}
