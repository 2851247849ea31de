//! What watches a response stream go by. The observer ([`super::RequestObserver`]) parses
//! each event once, runs the phase tracker over it, and hands the result to every
//! [`Watcher`] of the request: the built-in ones (metrics, the open-stream registry, the
//! request's span) and those the request's plan adds (a thinking-time deadline, the EAT
//! prober's feed, the hook's forget: see `crate::ending`). A watcher sees what was
//! tracked, never the bytes: adding one costs no parse.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::phase::PhaseEvents;
use meridian_core::stream::Usage;
use meridian_core::timings::Timeline;
use meridian_core::{Outcome, Phase, PhaseEvent};

use crate::telemetry::RequestTimings;
use crate::upstream::Upstream;

/// One choice's part of one event, after tracking.
#[derive(Debug)]
pub struct Part<'a> {
    pub choice: usize,
    /// Its reasoning text, if it carried any: borrowed from the payload unless the JSON
    /// string had escapes.
    pub reasoning: Option<Cow<'a, str>>,
    /// Its answer text (completions: all its text), likewise.
    pub content: Option<Cow<'a, str>>,
    /// Its `logprobs` as the server sent them (JSON text), unread.
    pub logprobs: Option<&'a str>,
    /// The phase boundaries it crossed.
    pub events: PhaseEvents,
    /// It added thinking before the choice's first visible output.
    pub thinking: bool,
    /// It added output tokens.
    pub output_grew: bool,
    /// The choice's thinking tokens so far.
    pub choice_think_tokens: u32,
}

/// The whole stream so far, all choices together.
#[derive(Debug, Clone, Copy)]
pub struct SoFar {
    /// Output if any choice answers, else think if any thinks, else pending.
    pub phase: Phase,
    pub think_tokens: u32,
    pub output_tokens: u32,
    /// When its first token, its thinking and its answer arrived, from the request's start:
    /// TTFT, TTFO and TTOT as `meridian_core::timings` defines them.
    pub timeline: Timeline<Instant>,
}

impl SoFar {
    pub fn new(started: Instant) -> Self {
        SoFar { phase: Phase::Pending, think_tokens: 0, output_tokens: 0, timeline: Timeline::new(started) }
    }

    /// When the request started.
    pub fn started(&self) -> Instant {
        self.timeline.sent()
    }

    /// How long the stream has been thinking at `at` (0 before its first thought).
    pub fn thinking_for(&self, at: Instant) -> Duration {
        self.timeline.first_think().map_or(Duration::ZERO, |t| at.saturating_duration_since(t))
    }
}

/// One event of the response (a `data:` payload, or a whole unstreamed body): the parts
/// the tracker read from it, in choice order.
#[derive(Debug)]
pub struct Event<'a> {
    /// When its bytes arrived.
    pub at: Instant,
    pub parts: &'a [Part<'a>],
    /// The token counts the event carried, if any (the final `usage` chunk, or each
    /// chunk's with vLLM's `continuous_usage_stats`).
    pub usage: Option<Usage>,
    pub so_far: &'a SoFar,
    /// The response already ended: these parts are what the tracker held back until
    /// then (text that might have begun a marker). Nothing is to be sent upstream now.
    pub last: bool,
}

/// How a response ended, once, whether it completed, failed or was dropped.
#[derive(Debug)]
pub struct Ended<'a> {
    /// How it ended (`ClientDisconnected` until told otherwise).
    pub outcome: Outcome,
    pub timings: &'a RequestTimings,
    pub so_far: &'a SoFar,
    /// The model family's name, the label of its metrics.
    pub family: &'a str,
    /// The server's prompt token count, when it sent one.
    pub prompt_tokens: Option<u32>,
}

/// Something that acts on a stream as it is tracked. Both calls run on the relay's hot
/// path: they must not block, and should not allocate per event.
pub trait Watcher: Send {
    /// An event was read and tracked.
    fn on_event(&mut self, _event: &Event<'_>) {}
    /// The response is over.
    fn on_end(&mut self, _ended: &Ended<'_>) {}
    /// The response goes on from another upstream (an answer handed over at the end of
    /// its thought).
    fn on_moved(&mut self, _to: &Arc<Upstream>) {}
}

/// Whether an event's parts crossed a phase boundary of this kind.
pub fn crossed(parts: &[Part<'_>], is: impl Fn(&PhaseEvent) -> bool) -> bool {
    parts.iter().any(|p| p.events.iter().any(&is))
}
