//! Prefix affinity: one engine per affinity key, so a conversation's or an agent loop's
//! turns meet their history in that engine's prefix cache, within a bounded share of the
//! load.
//!
//! Each key ranks the engines by a hash of key and engine name (rendezvous hashing): an
//! engine that joins or leaves moves only the keys it ranks first, and every proxy
//! replica, hashing the same names, ranks them alike with no state shared. The key goes
//! to the first engine in its ranking whose requests in flight stay within `load_bound`
//! times the mean (consistent hashing with bounded loads, Mirrokni, Thorup and
//! Zadimoghaddam, SODA 2018): a hot key spills to its next engine instead of swamping
//! one.

use super::least_load::PhaseAwareLeastLoad;
use super::{EngineView, RouteRequest, RoutingPolicy};

/// splitmix64's finaliser: every input bit moves about half the output bits.
pub(super) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The rank of `engine` for `key`, the same in every process and on every platform
/// (FNV-1a over the key, a separator and the name, then [`mix`]; a std `Hasher` makes no
/// promise to stay the same across Rust releases, which replicas built apart rely on).
pub fn affinity_hash(key: &str, engine: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let bytes = key.as_bytes().iter().chain(&[0xff]).chain(engine.as_bytes());
    mix(bytes.fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME)))
}

/// See the module: the key's engine within the load bound; least load without a key.
#[derive(Debug)]
pub struct PrefixAffinity {
    load_bound: f64,
    fallback: PhaseAwareLeastLoad,
}

impl PrefixAffinity {
    /// `load_bound` (above 1): how far past the mean load a key's engine may go before the
    /// key spills to its next; 1.25 lets an engine carry a quarter more than the mean.
    pub fn new(load_bound: f64) -> Self {
        PrefixAffinity { load_bound: load_bound.max(1.0), fallback: PhaseAwareLeastLoad::default() }
    }

    /// The most requests in flight an engine may already hold and still take a key's
    /// request: the bound times the mean once this request is counted, rounded up.
    pub fn ceiling(&self, engines: &[EngineView<'_>]) -> u64 {
        let total: u64 = engines.iter().map(|e| u64::from(e.in_flight)).sum::<u64>() + 1;
        let share = (self.load_bound * total as f64 / engines.len().max(1) as f64).ceil() as u64;
        // `share` is at least 1: an engine with nothing in flight can always take it.
        share.max(1) - 1
    }
}

impl RoutingPolicy for PrefixAffinity {
    fn name(&self) -> &'static str {
        "prefix-affinity"
    }

    fn choose(&self, request: &RouteRequest<'_>, engines: &[EngineView<'_>]) -> Option<usize> {
        let Some(key) = request.affinity_key else { return self.fallback.pick(engines) };
        let ceiling = self.ceiling(engines);
        let mut ranked: Vec<(u64, usize)> =
            engines.iter().enumerate().map(|(i, e)| (affinity_hash(key, e.name), i)).collect();
        // Highest hash first; the name breaks the (astronomically rare) tie alike everywhere.
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| engines[a.1].name.cmp(engines[b.1].name)));
        ranked
            .iter()
            .map(|&(_, i)| i)
            .find(|&i| u64::from(engines[i].in_flight) <= ceiling)
            // Unreachable (the mean is within the bound), but never route nowhere.
            .or_else(|| self.fallback.pick(engines))
    }
}
