//! The engine's own count of its requests, as its hook reports it in every hello (the
//! health loop asks each round), brought up to date with what this replica did since.
//!
//! With several proxy replicas in front of one engine, a replica's own count of the
//! requests it has open there is a fraction of the engine's load. The hook counts every
//! request the engine holds, whoever sent it, by phase; between two readings this replica
//! adds the requests it sent and takes off those of its own that ended, so a reading a
//! health interval old still moves with this replica's traffic. Other replicas' traffic
//! since the reading shows at the next one.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use meridian_core::channel::EngineState;

/// The last reading and this replica's traffic since it.
#[derive(Debug, Default)]
pub struct EngineReading {
    state: Mutex<Option<EngineState>>,
    sent: AtomicU32,
    ended: AtomicU32,
}

/// What the engine holds now, as far as this replica can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineNow {
    /// Requests running or waiting in the engine, from every replica.
    pub requests: u32,
    /// Running requests answering, from every replica, as of the reading.
    pub answering: u32,
}

impl EngineReading {
    /// A new reading (`None`: the hook did not answer, or publishes none): this replica's
    /// traffic is counted from now on.
    pub fn record(&self, state: Option<EngineState>) {
        if let Ok(mut slot) = self.state.lock() {
            *slot = state;
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
        let state = self.state.lock().ok()?.clone()?;
        let sent = self.sent.load(Ordering::Relaxed);
        let ended = self.ended.load(Ordering::Relaxed);
        Some(EngineNow {
            requests: state.requests().saturating_add(sent).saturating_sub(ended),
            answering: state.answering,
        })
    }

    /// The reading itself (for operators: the open-streams view, logs).
    pub fn state(&self) -> Option<EngineState> {
        self.state.lock().ok()?.clone()
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
    }
}
