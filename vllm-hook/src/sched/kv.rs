//! KV-cache blocks by tier: which of the running requests' blocks hold a finished
//! thought (think-complete), a thought in progress (think-active) or what an answer
//! still needs (output-critical). Measured every few steps for the hook's metrics.

use meridian_core::Phase;
use meridian_core::kv::Tier;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{SchedulerCore, Tracked};

impl SchedulerCore {
    /// Adds a request's `blocks` to the KV tiers its phase puts them in: an answering
    /// request's blocks covering its finished thought are think-complete, the rest
    /// output-critical; a thinking request's are think-active.
    fn add_to_tiers(tiers: &mut [u64; 3], tracked: Option<&Tracked>, blocks: u64, block_size: u64) {
        match tracked.and_then(|t| t.tracker.as_ref()).map(|t| (t.phase(), t.think_tokens())) {
            Some((Phase::Output, think)) => {
                let thought = (u64::from(think) / block_size).min(blocks);
                tiers[Tier::ThinkComplete as usize] += thought;
                tiers[Tier::OutputCritical as usize] += blocks - thought;
            }
            Some((Phase::Think, _)) => tiers[Tier::ThinkActive as usize] += blocks,
            _ => tiers[Tier::OutputCritical as usize] += blocks,
        }
    }

    /// The tiers of `(request_id, blocks_held)`, published to the metrics.
    pub(super) fn tiers_of(&self, held: Vec<(String, u64)>, block_size: u64) -> [u64; 3] {
        let mut tiers = [0u64; 3];
        let block_size = block_size.max(1);
        for (id, blocks) in held {
            Self::add_to_tiers(&mut tiers, self.get(&id), blocks, block_size);
        }
        self.shared.counters.set_kv_blocks(tiers);
        tiers
    }

    /// The tiers of the requests of the last `plan_running` call, their blocks counted
    /// in vLLM's per-KV-cache-group tables (`request_id -> blocks`), published to the
    /// metrics.
    pub(super) fn tiers_of_running(
        &self,
        py: Python<'_>,
        tables: &[Bound<'_, PyDict>],
        block_size: u64,
    ) -> PyResult<[u64; 3]> {
        let mut tiers = [0u64; 3];
        let block_size = block_size.max(1);
        for (address, slot) in &self.last_running {
            let tracked = self.slots[*slot].as_ref();
            let Some(object) = tracked.and_then(|t| t.object.as_ref()).filter(|o| o.address == *address)
            else {
                continue;
            };
            let id = object.id.bind(py);
            let mut blocks = 0u64;
            for table in tables {
                if let Some(group) = table.get_item(id)? {
                    blocks += group.len()? as u64;
                }
            }
            Self::add_to_tiers(&mut tiers, tracked, blocks, block_size);
        }
        self.shared.counters.set_kv_blocks(tiers);
        Ok(tiers)
    }
}
