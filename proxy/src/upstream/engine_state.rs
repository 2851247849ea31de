//! The engine's own count of its requests, brought up to date with what this replica did
//! since: as its hook reports it in every hello (the health loop asks each round), or,
//! for an engine without the hook, from vLLM's own `vllm:num_requests_running` and
//! `_waiting` (no phases: only the requests it holds).
//!
//! With several proxy replicas in front of one engine, a replica's own count of the
//! requests it has open there is a fraction of the engine's load. The hook counts every
//! request the engine holds, whoever sent it, by phase; between two readings this replica
//! adds the requests it sent and takes off those of its own that ended, so a reading a
//! health interval old still moves with this replica's traffic. Other replicas' traffic
//! since the reading shows at the next one, so replicas that each fill the room a reading
//! shows overfill the engine together; replicas told their number split its limit
//! instead (`crate::share`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use meridian_core::channel::EngineState;

/// The last reading and this replica's traffic since it.
#[derive(Debug, Default)]
pub struct EngineReading {
    base: Mutex<Option<EngineNow>>,
    sent: AtomicU32,
    ended: AtomicU32,
}

/// What the engine holds now, as far as this replica can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineNow {
    /// Requests running or waiting in the engine, from every replica.
    pub requests: u32,
    /// Running requests answering, from every replica, as of the reading (0 where the
    /// engine does not say: vLLM's own gauges have no phases).
    pub answering: u32,
}

impl EngineReading {
    /// A new reading (`None`: the hook did not answer, or publishes none): this replica's
    /// traffic is counted from now on.
    pub fn record(&self, state: Option<EngineState>) {
        self.reset(state.map(|s| EngineNow { requests: s.requests(), answering: s.answering }));
    }

    /// A reading of vLLM's own gauges (`None`: its `/metrics` did not say).
    pub fn record_counts(&self, running: Option<f64>, waiting: Option<f64>) {
        let count = |v: f64| v.max(0.0).min(f64::from(u32::MAX)) as u32;
        let base = running.zip(waiting).map(|(r, w)| EngineNow { requests: count(r + w), answering: 0 });
        self.reset(base);
    }

    fn reset(&self, base: Option<EngineNow>) {
        if let Ok(mut slot) = self.base.lock() {
            *slot = base;
        }
        self.sent.store(0, Ordering::Relaxed);
        self.ended.store(0, Ordering::Relaxed);
    }

    /// This replica sent the engine a request.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A request this replica sent the engine ended.
    pub fn ended(&self) {
        self.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine's requests now: the reading plus what this replica sent since, less
    /// what of its own ended since (never below zero); `None` without a reading.
    pub fn now(&self) -> Option<EngineNow> {
        let base = (*self.base.lock().ok()?)?;
        let sent = self.sent.load(Ordering::Relaxed);
        let ended = self.ended.load(Ordering::Relaxed);
        Some(EngineNow { requests: base.requests.saturating_add(sent).saturating_sub(ended), ..base })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(prefilling: u32, thinking: u32, answering: u32, waiting: u32) -> EngineState {
        EngineState { prefilling, thinking, answering, waiting, steps: 1, ..EngineState::default() }
    }

    #[test]
    fn the_engines_count_moves_with_this_replicas_traffic_until_the_next_reading() {
        let r = EngineReading::default();
        assert_eq!(r.now(), None, "no reading yet");
        // The engine holds 7 (other replicas' included): 2 prefilling, 2 thinking, 2
        // answering, 1 waiting.
        r.record(Some(reading(2, 2, 2, 1)));
        assert_eq!(r.now(), Some(EngineNow { requests: 7, answering: 2 }));
        // This replica sends three and one of its own ends: 9.
        r.sent();
        r.sent();
        r.sent();
        r.ended();
        assert_eq!(r.now().map(|n| n.requests), Some(9));
        // The next reading counts them itself.
        r.record(Some(reading(3, 3, 3, 0)));
        assert_eq!(r.now(), Some(EngineNow { requests: 9, answering: 3 }));
        // More ended than the reading held (it was old): zero, not an underflow.
        for _ in 0..12 {
            r.ended();
        }
        assert_eq!(r.now().map(|n| n.requests), Some(0));
        // A hook that stops answering leaves no reading.
        r.record(None);
        assert_eq!(r.now(), None);
        // vLLM's own gauges: requests held, no phases.
        r.record_counts(Some(3.0), Some(2.0));
        assert_eq!(r.now(), Some(EngineNow { requests: 5, answering: 0 }));
        r.record_counts(Some(3.0), None);
        assert_eq!(r.now(), None, "half a reading is none");
    }
}
