//! A block pool with a prefix cache, as vLLM's v1 `BlockPool` keeps one: a request takes
//! the cached blocks its prefix hits and fresh blocks for the rest; a fresh block comes
//! from the front of the free queues, and if it was cached, its cache entry goes with
//! it; a request gives its blocks back last block first, so that its tail is evicted
//! before its head; a free block that is hit again leaves the queue. With an
//! [`Offload`] below it, an evicted cached block is copied down, and a request's prefix
//! goes on from the pool's cached blocks into the ones stored there.

use std::collections::HashMap;

use smallvec::SmallVec;

use super::offload::Offload;
use super::queue::FreeQueue;
use super::{BlockHash, Tier};

/// Which free block is taken when a fresh one is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Stock vLLM: the least recently freed, whatever it holds.
    Lru,
    /// Meridian's tiers in full: the lowest tier first, the least recently freed within
    /// it; a freed block that holds nothing cacheable before any that does.
    ByTier,
    /// What the hook does inside vLLM today: stock's one queue, except that a finished
    /// request's think-complete blocks go to its front, in block order (vLLM frees a
    /// request's blocks to the back, then the hook moves those to the front with
    /// `prepend_n`), so the thought finished last is evicted first. Think-active and
    /// output-critical blocks stay in LRU order.
    DeadFirst,
}

#[derive(Debug, Clone)]
pub(super) struct Block {
    pub(super) hash: Option<BlockHash>,
    refs: u32,
    /// The tier it was freed into (meaningful while free).
    pub(super) tier: Tier,
}

/// The blocks one request holds, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Held {
    pub(super) blocks: Vec<u32>,
    hit: u32,
    ingested: u32,
}

impl Held {
    pub fn len(&self) -> u32 {
        self.blocks.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// How many of its first blocks came from the prefix cache when it was admitted.
    pub fn hit_blocks(&self) -> u32 {
        self.hit
    }

    /// How many blocks after those were copied up from the offload store (fresh blocks
    /// whose KV did not have to be computed).
    pub fn ingested_blocks(&self) -> u32 {
        self.ingested
    }
}

/// What the prefix cache did, in vLLM's terms (`vllm:prefix_cache_queries` and
/// `vllm:prefix_cache_hits` count tokens), with the cached blocks evicted by tier.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCounters {
    pub queried_tokens: u64,
    pub hit_tokens: u64,
    /// Cached blocks whose space was taken, by the tier they were freed into.
    pub evicted: [u64; 3],
    /// Evicted blocks copied down to the offload store (not those it held already), and
    /// blocks copied back up.
    pub offloaded: u64,
    pub ingested: u64,
}

impl PrefixCounters {
    /// Hit tokens over queried tokens (0 before any query).
    pub fn hit_rate(&self) -> f64 {
        if self.queried_tokens == 0 { 0.0 } else { self.hit_tokens as f64 / self.queried_tokens as f64 }
    }
}

#[derive(Debug, Clone)]
pub struct KvPool {
    block_size: u32,
    eviction: Eviction,
    pub(super) blocks: Vec<Block>,
    /// Free blocks by tier under [`Eviction::ByTier`]; all in the first otherwise.
    queues: [FreeQueue; 3],
    cached: HashMap<BlockHash, SmallVec<[u32; 1]>>,
    counters: PrefixCounters,
    offload: Option<Offload>,
}

impl KvPool {
    /// `capacity` blocks of `block_size` tokens, all free and empty.
    pub fn new(capacity: u32, block_size: u32, eviction: Eviction) -> Self {
        let mut queues = [FreeQueue::new(capacity), FreeQueue::new(capacity), FreeQueue::new(capacity)];
        for id in 0..capacity {
            queues[0].push_back(id);
        }
        let empty = Block { hash: None, refs: 0, tier: Tier::ThinkComplete };
        KvPool {
            block_size: block_size.max(1),
            eviction,
            blocks: vec![empty; capacity as usize],
            queues,
            cached: HashMap::new(),
            counters: PrefixCounters::default(),
            offload: None,
        }
    }

    /// The same pool with `offload` below it.
    pub fn with_offload(mut self, offload: Offload) -> Self {
        self.offload = Some(offload);
        self
    }

    pub fn offload(&self) -> Option<&Offload> {
        self.offload.as_ref()
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn capacity(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks no request holds (cached or empty): what can be taken.
    pub fn free(&self) -> u32 {
        self.queues.iter().map(FreeQueue::len).sum()
    }

    /// Fraction of blocks held, as `vllm:kv_cache_usage_perc` reports it (0..1; cached
    /// blocks no request holds count as free).
    pub fn usage(&self) -> f64 {
        match self.capacity() {
            0 => 0.0,
            n => f64::from(n - self.free()) / f64::from(n),
        }
    }

    pub fn counters(&self) -> PrefixCounters {
        self.counters
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// How many of the first of `hashes` the cache holds, in a row from the first.
    pub fn cached_prefix(&self, hashes: &[BlockHash]) -> u32 {
        hashes.iter().take_while(|h| self.cached.contains_key(h)).count() as u32
    }

    /// Free cached blocks by the tier they were freed into.
    pub fn free_cached_by_tier(&self) -> [u32; 3] {
        let mut out = [0; 3];
        for b in self.blocks.iter().filter(|b| b.refs == 0 && b.hash.is_some()) {
            out[b.tier as usize] += 1;
        }
        out
    }

    /// Admits a request needing `blocks` blocks whose full blocks are named `hashes`:
    /// the cached prefix is shared, the rest taken fresh, the first of those copied up
    /// from the offload store where it holds how the prefix goes on (and cached again);
    /// `query_tokens` (its prompt) are counted as queried, the hit blocks' tokens as hits
    /// (ingested blocks apart, as vLLM counts a connector's tokens apart). `None`, and
    /// nothing changed, when the pool cannot hold it.
    pub fn admit(&mut self, hashes: &[BlockHash], blocks: u32, query_tokens: u32) -> Option<Held> {
        let (hits, hit_ids) = self.hit_blocks(hashes, blocks);
        if !self.room_for(blocks, hits, &hit_ids) {
            return None;
        }
        let rest = &hashes[(hits as usize).min(hashes.len())..];
        let ingested = self.offload.as_mut().map_or(0, |o| o.ingest_prefix(rest, blocks - hits));
        let mut held = Held { blocks: Vec::with_capacity(blocks as usize), hit: hits, ingested };
        for id in hit_ids {
            self.share(id);
            held.blocks.push(id);
        }
        for _ in hits..blocks {
            held.blocks.push(self.take_fresh()?);
        }
        for (i, &hash) in rest.iter().take(ingested as usize).enumerate() {
            self.cache(&held, hits + i as u32, hash);
        }
        if let Some(o) = self.offload.as_mut() {
            o.unpin();
        }
        self.counters.queried_tokens += u64::from(query_tokens);
        self.counters.hit_tokens += u64::from((hits * self.block_size).min(query_tokens));
        self.counters.ingested += u64::from(ingested);
        Some(held)
    }

    /// Whether [`KvPool::admit`] could take `blocks` blocks whose full blocks are named
    /// `hashes`, changing nothing: vLLM's gate for a request it takes from the waiting
    /// queue (`scheduler_reserve_full_isl`, on by default), which asks room for the whole
    /// sequence so far, prompt and tokens generated, though it allocates the first chunk.
    pub fn fits(&self, hashes: &[BlockHash], blocks: u32) -> bool {
        let (hits, hit_ids) = self.hit_blocks(hashes, blocks);
        self.room_for(blocks, hits, &hit_ids)
    }

    /// The cached blocks the first of `hashes` name, in a row from the first (at most
    /// `blocks`): how many, and their ids.
    fn hit_blocks(&self, hashes: &[BlockHash], blocks: u32) -> (u32, SmallVec<[u32; 16]>) {
        let hits = self.cached_prefix(hashes).min(blocks);
        let ids =
            hashes[..hits as usize].iter().filter_map(|h| self.cached.get(h).map(|ids| ids[0])).collect();
        (hits, ids)
    }

    /// Whether `blocks` blocks, `hits` of them the cached `hit_ids`, can be held: a hit
    /// block no request holds comes out of the free blocks like a fresh one.
    fn room_for(&self, blocks: u32, hits: u32, hit_ids: &[u32]) -> bool {
        let free_hits = hit_ids.iter().filter(|id| self.blocks[**id as usize].refs == 0).count() as u32;
        blocks - hits <= self.free() - free_hits
    }

    /// Adds `n` fresh blocks to `held` (a request that grew); false, and nothing
    /// changed, when fewer are free.
    pub fn grow(&mut self, held: &mut Held, n: u32) -> bool {
        if n > self.free() {
            return false;
        }
        for _ in 0..n {
            held.blocks.extend(self.take_fresh());
        }
        true
    }

    /// Block `index` of `held` is full and named `hash`: it joins the cache.
    pub fn cache(&mut self, held: &Held, index: u32, hash: BlockHash) {
        let Some(&id) = held.blocks.get(index as usize) else { return };
        let block = &mut self.blocks[id as usize];
        if block.hash.is_none() {
            block.hash = Some(hash);
            self.cached.entry(hash).or_default().push(id);
        }
    }

    /// Gives `held` back, last block first; a block no other request holds is freed
    /// into the tier `tier_of` gives its index (a block holding nothing cacheable goes
    /// first under [`Eviction::ByTier`], as an empty block would).
    pub fn release(&mut self, held: Held, tier_of: impl Fn(u32) -> Tier) {
        for (index, &id) in held.blocks.iter().enumerate().rev() {
            let block = &mut self.blocks[id as usize];
            block.refs -= 1;
            if block.refs > 0 {
                continue;
            }
            block.tier = if block.hash.is_some() { tier_of(index as u32) } else { Tier::ThinkComplete };
            match self.eviction {
                Eviction::Lru => self.queues[0].push_back(id),
                // Blocks come last first, so pushing each to the front leaves the first
                // dead block at the very front, as `prepend_n` of them in order does.
                Eviction::DeadFirst if block.hash.is_some() && block.tier == Tier::ThinkComplete => {
                    self.queues[0].push_front(id)
                }
                Eviction::DeadFirst => self.queues[0].push_back(id),
                Eviction::ByTier if block.hash.is_none() => self.queues[0].push_front(id),
                Eviction::ByTier => self.queues[block.tier as usize].push_back(id),
            }
        }
    }

    /// A cached block one more request holds: out of the free queue if it was free.
    fn share(&mut self, id: u32) {
        let block = &mut self.blocks[id as usize];
        if block.refs == 0 {
            let q = &mut self.queues;
            let _ = q[0].remove(id) || q[1].remove(id) || q[2].remove(id);
        }
        block.refs += 1;
    }

    /// The first free block in eviction order, its cache entry dropped.
    fn take_fresh(&mut self) -> Option<u32> {
        let id = self.queues.iter_mut().find_map(FreeQueue::pop_front)?;
        let block = &mut self.blocks[id as usize];
        if let Some(hash) = block.hash.take() {
            self.counters.evicted[block.tier as usize] += 1;
            if self.offload.as_mut().is_some_and(|o| o.store(hash, block.tier)) {
                self.counters.offloaded += 1;
            }
            if let Some(ids) = self.cached.get_mut(&hash) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    self.cached.remove(&hash);
                }
            }
        }
        block.refs = 1;
        Some(id)
    }

    /// The free queues, first evicted first (for tests).
    #[cfg(test)]
    pub(super) fn free_order(&self) -> Vec<u32> {
        self.queues.iter().flat_map(FreeQueue::ids).collect()
    }

    /// Whether block `id` is cached under `hash` (for tests).
    #[cfg(test)]
    pub(super) fn holds(&self, hash: BlockHash) -> bool {
        self.cached.contains_key(&hash)
    }
}
