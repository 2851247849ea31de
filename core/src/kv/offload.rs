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

use std::collections::{BTreeMap, HashMap, HashSet};

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
    /// Blocks an admission is copying back up: not forgotten to make room until it is
    /// done (vLLM's offloading manager pins a lookup's blocks until their load ends).
    pinned: HashSet<BlockHash>,
    clock: u64,
}

impl Offload {
    pub fn new(capacity: u32, rule: OffloadRule) -> Self {
        Offload {
            capacity,
            rule,
            used: HashMap::new(),
            by_use: BTreeMap::new(),
            pinned: HashSet::new(),
            clock: 0,
        }
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
    /// it, the store holds it already (it is only marked used), or no block can make room
    /// (none at all, or every one pinned); else the least recently used unpinned block
    /// makes room. Whether it was copied down.
    pub(super) fn store(&mut self, hash: BlockHash, tier: Tier) -> bool {
        if self.capacity == 0 || (self.rule == OffloadRule::SkipDead && tier == Tier::ThinkComplete) {
            return false;
        }
        if self.used.contains_key(&hash) {
            self.touch(hash);
            return false;
        }
        if self.len() >= self.capacity {
            let Some((&stamp, &oldest)) = self.by_use.iter().find(|(_, h)| !self.pinned.contains(h)) else {
                return false;
            };
            self.by_use.remove(&stamp);
            self.used.remove(&oldest);
        }
        self.touch(hash);
        true
    }

    /// How many of `hashes`, in a row from the first and at most `max`, the store holds;
    /// those are marked used and pinned (they are about to be copied back up) until
    /// [`Offload::unpin`].
    pub(super) fn ingest_prefix(&mut self, hashes: &[BlockHash], max: u32) -> u32 {
        let n = hashes.iter().take_while(|h| self.used.contains_key(h)).count().min(max as usize);
        for &h in &hashes[..n] {
            self.touch(h);
            self.pinned.insert(h);
        }
        n as u32
    }

    /// The blocks an admission copied up may make room again.
    pub(super) fn unpin(&mut self) {
        self.pinned.clear();
    }

    fn touch(&mut self, hash: BlockHash) {
        self.clock += 1;
        if let Some(old) = self.used.insert(hash, self.clock) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(self.clock, hash);
    }
}
