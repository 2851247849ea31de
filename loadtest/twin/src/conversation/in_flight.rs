//! The turns an engine holds, and what each step did to them: the one reading of a step's
//! report that both conversation drivers (drawn and recorded) share.

use std::collections::HashMap;

use crate::engine::StepReport;

/// A turn the engine holds.
struct Live<T> {
    /// Its place in the driver's records.
    record: usize,
    sent_s: f64,
    /// The engine has looked its prompt up in the prefix cache (a resumption after
    /// preemption looks again and finds its own blocks: only the first look counts, as
    /// vLLM's per-request `cached_tokens` does).
    looked_up: bool,
    /// What the driver keeps for the conversation's next turn.
    then: T,
}

/// What a step did to one turn.
pub(super) enum TurnEvent<T> {
    /// The engine first looked the turn's prompt up: `cached` of its tokens were there.
    Cached { record: usize, cached: u32 },
    /// A token, `since_s` after the turn was sent; `visible` unless it is the thought's
    /// closing delimiter (sampled and counted, never shown).
    Token { record: usize, since_s: f64, visible: bool },
    /// The turn's last token came at `at_s`, `since_s` after it was sent (after its
    /// `Token`); the turn is no longer held.
    Done { record: usize, since_s: f64, at_s: f64, then: T },
}

pub(super) struct InFlight<T> {
    live: HashMap<u64, Live<T>>,
}

impl<T> InFlight<T> {
    pub(super) fn new() -> Self {
        InFlight { live: HashMap::new() }
    }

    /// Holds the turn the engine took as `seq`.
    pub(super) fn insert(&mut self, seq: u64, record: usize, sent_s: f64, then: T) {
        self.live.insert(seq, Live { record, sent_s, looked_up: false, then });
    }

    /// Reads `step` for the turns held, in order: first look-ups, then each token.
    pub(super) fn observe(&mut self, step: StepReport, mut on: impl FnMut(TurnEvent<T>)) {
        for (seq, cached) in step.prefix_hits {
            if let Some(l) = self.live.get_mut(&seq)
                && !std::mem::replace(&mut l.looked_up, true)
            {
                on(TurnEvent::Cached { record: l.record, cached });
            }
        }
        for tok in step.tokens {
            let Some(l) = self.live.get(&tok.seq) else { continue };
            let (record, since_s) = (l.record, tok.at_s - l.sent_s);
            on(TurnEvent::Token { record, since_s, visible: !tok.ends_thought });
            if tok.last
                && let Some(l) = self.live.remove(&tok.seq)
            {
                on(TurnEvent::Done { record, since_s, at_s: tok.at_s, then: l.then });
            }
        }
    }
}
