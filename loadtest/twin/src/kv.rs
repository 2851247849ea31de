//! The KV cache as a fixed number of blocks, as vLLM's block pool hands them out. Only
//! counts matter to the schedule; which physical block holds what does not.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPool {
    capacity: u32,
    free: u32,
    block_size: u32,
}

impl BlockPool {
    pub fn new(capacity: u32, block_size: u32) -> Self {
        BlockPool { capacity, free: capacity, block_size: block_size.max(1) }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn free(&self) -> u32 {
        self.free
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Fraction of blocks in use, as `vllm:kv_cache_usage_perc` reports it (0..1).
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 { 0.0 } else { f64::from(self.capacity - self.free) / f64::from(self.capacity) }
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// Takes `n` blocks if that many are free.
    pub fn try_take(&mut self, n: u32) -> bool {
        if n <= self.free {
            self.free -= n;
            true
        } else {
            false
        }
    }

    pub fn give_back(&mut self, n: u32) {
        self.free = (self.free + n).min(self.capacity);
    }
}
