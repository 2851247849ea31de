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
//! since the reading shows at the next one; admission shares the room a reading shows
//! between the replicas for that reason (`admission::share`).
//!
//! Where a reading falls between a request being sent and the engine holding it, the
//! request counts as sent since: every request this replica sent that the engine had not
//! yet answered when the reading was asked for ([`EngineReading::mark`]) is counted on top
//! of the reading, possibly twice, never not at all.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use meridian_core::channel::EngineState;

/// The last reading and this replica's traffic since it.
#[derive(Debug, Default)]
pub struct EngineReading {
    base: Mutex<Option<Base>>,
    /// Running totals (wrapping): requests sent to the engine, sent requests the engine
    /// answered or that failed on the way (settled), and answered requests that ended.
    sent: AtomicU32,
    settled: AtomicU32,
    ended: AtomicU32,
}

#[derive(Debug, Clone, Copy)]
struct Base {
    now: EngineNow,
    /// `settled` when the reading was asked for: every request sent beyond it may be
    /// missing from the reading.
    sent_mark: u32,
    /// `ended` when the reading came back.
    ended_mark: u32,
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

/// The last reading and what this replica did since, apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinceReading {
    /// The engine's count in the reading.
    pub read: EngineNow,
    /// Requests this replica sent that the reading may not hold.
    pub sent: u32,
    /// Requests of this replica's that ended since the reading.
    pub ended: u32,
}

/// Taken as a reading is asked for (see [`EngineReading::mark`]).
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    settled: u32,
}

impl EngineReading {
    /// Call as the reading is asked for, and give the mark to [`record`](Self::record).
    pub fn mark(&self) -> Mark {
        Mark { settled: self.settled.load(Ordering::Acquire) }
    }

    /// A new reading (`None`: the hook did not answer, or publishes none): this replica's
    /// traffic is counted from `mark` on.
    pub fn record(&self, mark: Mark, state: Option<EngineState>) {
        self.reset(mark, state.map(|s| EngineNow { requests: s.requests(), answering: s.answering }));
    }

    /// A reading of vLLM's own gauges (`None`: its `/metrics` did not say).
    pub fn record_counts(&self, mark: Mark, running: Option<f64>, waiting: Option<f64>) {
        let count = |v: f64| v.max(0.0).min(f64::from(u32::MAX)) as u32;
        let base = running.zip(waiting).map(|(r, w)| EngineNow { requests: count(r + w), answering: 0 });
        self.reset(mark, base);
    }

    fn reset(&self, mark: Mark, now: Option<EngineNow>) {
        let base = now.map(|now| Base {
            now,
            sent_mark: mark.settled,
            ended_mark: self.ended.load(Ordering::Acquire),
        });
        if let Ok(mut slot) = self.base.lock() {
            *slot = base;
        }
    }

    /// This replica sent the engine a request.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::AcqRel);
    }

    /// The engine answered a request this replica sent (it holds it now), or the request
    /// failed on the way; call once per [`sent`](Self::sent).
    pub fn settled(&self) {
        self.settled.fetch_add(1, Ordering::AcqRel);
    }

    /// A request this replica sent, that the engine answered, ended.
    pub fn ended(&self) {
        self.ended.fetch_add(1, Ordering::AcqRel);
    }

    /// The reading and this replica's traffic since it, apart; `None` without a reading.
    pub fn since(&self) -> Option<SinceReading> {
        let base = (*self.base.lock().ok()?)?;
        let ended = self.ended.load(Ordering::Acquire).wrapping_sub(base.ended_mark);
        let sent = self.sent.load(Ordering::Acquire).wrapping_sub(base.sent_mark);
        Some(SinceReading { read: base.now, sent, ended })
    }

    /// The engine's requests now: the reading plus what this replica sent since, less
    /// what of its own ended since (never below zero); `None` without a reading.
    pub fn now(&self) -> Option<EngineNow> {
        let s = self.since()?;
        Some(EngineNow { requests: s.read.requests.saturating_add(s.sent).saturating_sub(s.ended), ..s.read })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(prefilling: u32, thinking: u32, answering: u32, waiting: u32) -> EngineState {
        EngineState { prefilling, thinking, answering, waiting, steps: 1, ..EngineState::default() }
    }

    /// A request sent and answered.
    fn send(r: &EngineReading) {
        r.sent();
        r.settled();
    }

    #[test]
    fn the_engines_count_moves_with_this_replicas_traffic_until_the_next_reading() {
        let r = EngineReading::default();
        assert_eq!(r.now(), None, "no reading yet");
        // The engine holds 7 (other replicas' included): 2 prefilling, 2 thinking, 2
        // answering, 1 waiting.
        r.record(r.mark(), Some(reading(2, 2, 2, 1)));
        assert_eq!(r.now(), Some(EngineNow { requests: 7, answering: 2 }));
        // This replica sends three and one of its own ends: 9.
        send(&r);
        send(&r);
        send(&r);
        r.ended();
        assert_eq!(r.now().map(|n| n.requests), Some(9));
        assert_eq!(r.since().map(|s| (s.sent, s.ended)), Some((3, 1)));
        // The next reading counts them itself.
        r.record(r.mark(), Some(reading(3, 3, 3, 0)));
        assert_eq!(r.now(), Some(EngineNow { requests: 9, answering: 3 }));
        // More ended than the reading held (it was old): zero, not an underflow.
        for _ in 0..12 {
            r.ended();
        }
        assert_eq!(r.now().map(|n| n.requests), Some(0));
        // A hook that stops answering leaves no reading.
        r.record(r.mark(), None);
        assert_eq!(r.now(), None);
        // vLLM's own gauges: requests held, no phases.
        r.record_counts(r.mark(), Some(3.0), Some(2.0));
        assert_eq!(r.now(), Some(EngineNow { requests: 5, answering: 0 }));
        r.record_counts(r.mark(), Some(3.0), None);
        assert_eq!(r.now(), None, "half a reading is none");
    }

    #[test]
    fn a_request_the_engine_had_not_answered_when_the_reading_was_asked_for_counts_on_top() {
        let r = EngineReading::default();
        r.record(r.mark(), Some(reading(0, 0, 0, 0)));
        // Sent, not yet answered: the engine may or may not hold it when asked.
        r.sent();
        let mark = r.mark();
        // The engine had not seen it yet: the reading says 0, and the request still counts.
        r.record(mark, Some(reading(0, 0, 0, 0)));
        assert_eq!(r.now().map(|n| n.requests), Some(1));
        // Had it seen it, it counts twice until the next reading: too many, never too few.
        r.record(mark, Some(reading(1, 0, 0, 0)));
        assert_eq!(r.now().map(|n| n.requests), Some(2));
        // Answered before the next reading is asked for: the reading holds it alone.
        r.settled();
        r.record(r.mark(), Some(reading(1, 0, 0, 0)));
        assert_eq!(r.now().map(|n| n.requests), Some(1));
        // The counters wrap without harm.
        let w = EngineReading {
            sent: AtomicU32::new(u32::MAX),
            settled: AtomicU32::new(u32::MAX),
            ..Default::default()
        };
        w.record(w.mark(), Some(reading(0, 0, 0, 4)));
        send(&w);
        assert_eq!(w.now().map(|n| n.requests), Some(5));
    }
}
