//! The policies that read load alone: phase-aware least load, two random choices on the
//! same load, and round robin.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{EngineView, RouteRequest, RoutingPolicy};

/// An engine's load as phase-aware routing compares it, lowest first: answering streams,
/// then KV pressure, then requests in flight.
///
/// KV usage counts in tenths: engines scrape their usage every health round and a few
/// points between two of them is noise, which must not outweigh a real difference in
/// requests in flight. An engine whose usage is not known yet counts as empty.
pub fn phase_aware_load(engine: &EngineView<'_>) -> (u32, u32, u32) {
    let kv_tenths = engine.kv_usage.map_or(0, |u| (u.clamp(0.0, 1.0) * 10.0).floor() as u32);
    (engine.answering, kv_tenths, engine.in_flight)
}

/// The engine with the least [`phase_aware_load`]; among equals, the first from a start
/// that moves one place each call, so equal engines share the load.
#[derive(Debug, Default)]
pub struct PhaseAwareLeastLoad {
    rotation: AtomicUsize,
}

impl PhaseAwareLeastLoad {
    /// The least loaded engine, ties broken from a rotating start.
    pub fn pick(&self, engines: &[EngineView<'_>]) -> Option<usize> {
        let n = engines.len();
        if n == 0 {
            return None;
        }
        let start = self.rotation.fetch_add(1, Ordering::Relaxed) % n;
        (0..n).map(|i| (start + i) % n).min_by_key(|&i| phase_aware_load(&engines[i]))
    }
}

impl RoutingPolicy for PhaseAwareLeastLoad {
    fn name(&self) -> &'static str {
        "phase-aware"
    }

    fn choose(&self, _request: &RouteRequest<'_>, engines: &[EngineView<'_>]) -> Option<usize> {
        self.pick(engines)
    }
}

/// Two engines drawn at random, the one with the lower [`phase_aware_load`] taken (the
/// first drawn on a tie). Mitzenmacher's "power of two choices": nearly least load's
/// balance, without sending every proxy replica's next request to the same engine.
#[derive(Debug)]
pub struct PowerOfTwoChoices {
    state: AtomicU64,
}

impl Default for PowerOfTwoChoices {
    fn default() -> Self {
        PowerOfTwoChoices::seeded(0x9e37_79b9_7f4a_7c15)
    }
}

impl PowerOfTwoChoices {
    /// A policy whose draws start from `seed` (replicas should differ: each proxy seeds
    /// its own from the clock).
    pub fn seeded(seed: u64) -> Self {
        PowerOfTwoChoices { state: AtomicU64::new(seed) }
    }

    /// The next draw (splitmix64: a counter through a mixer, so concurrent callers each
    /// get a distinct value from one atomic add).
    fn draw(&self) -> u64 {
        let x = self.state.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        super::affinity::mix(x)
    }
}

impl RoutingPolicy for PowerOfTwoChoices {
    fn name(&self) -> &'static str {
        "power-of-two"
    }

    fn choose(&self, _request: &RouteRequest<'_>, engines: &[EngineView<'_>]) -> Option<usize> {
        let n = engines.len();
        match n {
            0 => None,
            1 => Some(0),
            _ => {
                let r = self.draw();
                let a = (r % n as u64) as usize;
                // The second draw among the other n - 1, so the two always differ.
                let b = (a + 1 + ((r >> 32) % (n as u64 - 1)) as usize) % n;
                Some(if phase_aware_load(&engines[b]) < phase_aware_load(&engines[a]) { b } else { a })
            }
        }
    }
}

/// Each engine in turn, whatever its load.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoutingPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn choose(&self, _request: &RouteRequest<'_>, engines: &[EngineView<'_>]) -> Option<usize> {
        match engines.len() {
            0 => None,
            n => Some(self.next.fetch_add(1, Ordering::Relaxed) % n),
        }
    }
}
