//! The times a reader of one streamed request feels, defined once for the proxy's
//! metrics, the load tester's records and the engine twin's A/B cells, so a "TTOT" means
//! the same thing on every page. Tools differ on these, hence the definitions:
//!
//! - **TTFT**, time to first token: the first chunk carrying a token of any kind,
//!   reasoning included, from when the request was sent.
//! - **TTFO**, time to first output: the first chunk with visible answer text (AIPerf's
//!   "time to first output token").
//! - **TTOT**, the think-to-output gap: from the last chunk of thinking before the answer
//!   (its last reasoning token, or the end-of-thinking marker) to the first visible
//!   answer; none for a request that did not think.
//! - **ITL**: every gap between two consecutive token-carrying chunks; **output ITL** the
//!   gaps between two consecutive chunks of the answer.
//! - **Largest answer gap**: a request's largest output ITL, the longest a reader waited
//!   mid-answer (a percentile over everyone's pooled gaps hides a stall that hits nearly
//!   every answer once).
//! - **TPOT**: vLLM's, (end to end - TTFT) / (completion tokens - 1).
//! - **End to end**: from the send to the last byte.
//!
//! Each observer takes its own clock ([`Moment`]: `Instant` in the proxy, seconds from
//! the send in the tester and the twin) and feeds a [`Timeline`] what arrived, in order;
//! what it reads back is defined here and nowhere else.

use std::time::Instant;

use crate::{PhaseEvent, PhaseRouter};

/// A point on a request's clock.
pub trait Moment: Copy {
    /// Seconds from `earlier` to `self` (zero when `earlier` is later).
    fn secs_since(self, earlier: Self) -> f64;
}

impl Moment for Instant {
    fn secs_since(self, earlier: Self) -> f64 {
        self.saturating_duration_since(earlier).as_secs_f64()
    }
}

/// Seconds on one clock (the tester's: from the request's send; the twin's: engine time).
impl Moment for f64 {
    fn secs_since(self, earlier: Self) -> f64 {
        self - earlier
    }
}

/// What one token-carrying chunk brought, as the phase tracker read it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arrived {
    /// Thinking tokens grew.
    pub thinking: bool,
    /// Visible answer tokens grew.
    pub answering: bool,
    /// The tracker saw the answer begin (its first visible output).
    pub answer_began: bool,
}

impl Arrived {
    /// What `router` read from one delta: its counts `before` it, and the `events` it
    /// raised.
    pub fn read(router: &PhaseRouter, before: (u32, u32), events: &[PhaseEvent]) -> Self {
        Arrived {
            thinking: router.think_tokens() > before.0,
            answering: router.output_tokens() > before.1,
            answer_began: began(events),
        }
    }

    /// What the tracker released at the stream's end (text it held back, a possible
    /// delimiter): only whether the answer began there.
    pub fn released(events: &[PhaseEvent]) -> Self {
        Arrived { answer_began: began(events), ..Arrived::default() }
    }
}

fn began(events: &[PhaseEvent]) -> bool {
    events.iter().any(|e| matches!(e, PhaseEvent::FirstOutput { .. }))
}

/// The gaps a chunk closed, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gaps {
    /// Since the previous token-carrying chunk.
    pub itl: Option<f64>,
    /// Since the previous chunk, when both were the answer's.
    pub output_itl: Option<f64>,
}

/// One request's marks, fed in arrival order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeline<T> {
    sent: T,
    first_token: Option<T>,
    first_think: Option<T>,
    /// The last chunk of thinking before the answer began.
    last_think: Option<T>,
    first_output: Option<T>,
    last_token: Option<T>,
    last_was_answer: bool,
    largest_answer_gap: Option<f64>,
}

impl<T: Moment> Timeline<T> {
    pub fn new(sent: T) -> Self {
        Timeline {
            sent,
            first_token: None,
            first_think: None,
            last_think: None,
            first_output: None,
            last_token: None,
            last_was_answer: false,
            largest_answer_gap: None,
        }
    }

    /// A chunk carrying tokens arrived `at`; returns the gaps it closed.
    pub fn tokens(&mut self, at: T, arrived: Arrived) -> Gaps {
        self.first_token.get_or_insert(at);
        self.marks(at, arrived);
        let itl = self.last_token.map(|prev| at.secs_since(prev));
        let output_itl = itl.filter(|_| arrived.answering && self.last_was_answer);
        if let Some(gap) = output_itl {
            self.largest_answer_gap = Some(self.largest_answer_gap.map_or(gap, |g| g.max(gap)));
        }
        self.last_token = Some(at);
        self.last_was_answer = arrived.answering;
        Gaps { itl, output_itl }
    }

    /// What the tracker read `at` from a chunk without tokens, or at the stream's end
    /// (text it held back, released): phase marks only, no gap.
    pub fn marks(&mut self, at: T, arrived: Arrived) {
        if arrived.thinking && self.first_output.is_none() {
            self.first_think.get_or_insert(at);
            self.last_think = Some(at);
        }
        if arrived.answer_began {
            self.first_output.get_or_insert(at);
        }
    }

    pub fn sent(&self) -> T {
        self.sent
    }

    /// When the first thinking token arrived.
    pub fn first_think(&self) -> Option<T> {
        self.first_think
    }

    /// When the answer began.
    pub fn first_output(&self) -> Option<T> {
        self.first_output
    }

    pub fn ttft(&self) -> Option<f64> {
        self.first_token.map(|t| t.secs_since(self.sent))
    }

    pub fn ttfo(&self) -> Option<f64> {
        self.first_output.map(|t| t.secs_since(self.sent))
    }

    pub fn ttot(&self) -> Option<f64> {
        Some(self.first_output?.secs_since(self.last_think?))
    }

    pub fn largest_answer_gap(&self) -> Option<f64> {
        self.largest_answer_gap
    }

    /// Seconds from the send to `at`.
    pub fn since_sent(&self, at: T) -> f64 {
        at.secs_since(self.sent)
    }
}

/// vLLM's time per output token: (end to end - TTFT) / (completion tokens - 1); none for
/// fewer than two tokens.
pub fn tpot(ttft: f64, e2e: f64, completion_tokens: u32) -> Option<f64> {
    (completion_tokens > 1).then(|| (e2e - ttft) / f64::from(completion_tokens - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINK: Arrived = Arrived { thinking: true, answering: false, answer_began: false };
    const BEGIN: Arrived = Arrived { thinking: false, answering: true, answer_began: true };
    const ANSWER: Arrived = Arrived { thinking: false, answering: true, answer_began: false };

    #[test]
    fn a_thought_then_an_answer() {
        let mut t = Timeline::new(10.0);
        assert_eq!(t.tokens(10.5, THINK), Gaps { itl: None, output_itl: None });
        assert_eq!(t.tokens(10.75, THINK).itl, Some(0.25));
        let begin = t.tokens(11.0, BEGIN);
        assert_eq!(
            begin,
            Gaps { itl: Some(0.25), output_itl: None },
            "the first answer chunk closes no answer gap"
        );
        assert_eq!(t.tokens(12.0, ANSWER).output_itl, Some(1.0));
        t.tokens(12.5, ANSWER);
        assert_eq!((t.ttft(), t.ttfo(), t.ttot()), (Some(0.5), Some(1.0), Some(0.25)));
        assert_eq!(t.largest_answer_gap(), Some(1.0));
        assert_eq!(t.first_think(), Some(10.5));
    }

    #[test]
    fn thinking_and_the_answer_in_one_chunk_leave_no_gap_between_them() {
        let mut t = Timeline::new(0.0);
        t.tokens(0.5, Arrived { thinking: true, answering: true, answer_began: true });
        assert_eq!((t.ttot(), t.ttfo()), (Some(0.0), Some(0.5)));
    }

    #[test]
    fn a_request_that_did_not_think_has_no_ttot() {
        let mut t = Timeline::new(0.0);
        t.tokens(0.3, BEGIN);
        t.tokens(0.4, ANSWER);
        assert_eq!((t.ttft(), t.ttfo(), t.ttot()), (Some(0.3), Some(0.3), None));
        assert!((t.largest_answer_gap().unwrap() - 0.1).abs() < 1e-12);
    }

    #[test]
    fn thinking_after_the_answer_began_moves_no_mark() {
        let mut t = Timeline::new(0.0);
        t.tokens(1.0, THINK);
        t.tokens(2.0, BEGIN);
        t.tokens(3.0, THINK);
        assert_eq!(t.ttot(), Some(1.0));
    }

    #[test]
    fn an_answer_released_at_the_end_begins_there() {
        let mut t = Timeline::new(0.0);
        t.tokens(1.0, THINK);
        t.marks(4.0, Arrived { answer_began: true, ..Arrived::default() });
        assert_eq!((t.ttfo(), t.ttot(), t.largest_answer_gap()), (Some(4.0), Some(3.0), None));
    }

    #[test]
    fn tpot_is_vllms() {
        assert_eq!(tpot(1.0, 3.0, 5), Some(0.5));
        assert_eq!(tpot(1.0, 3.0, 1), None);
    }

    #[test]
    fn instants_never_run_backwards() {
        let now = Instant::now();
        let t = Timeline::new(now + std::time::Duration::from_secs(1));
        assert_eq!(t.since_sent(now), 0.0);
    }
}
