//! Watches one request's response go by: parses each event once (in the response's API:
//! [`Dialect`]), runs a phase router per choice, timestamps the transitions where the
//! bytes arrived, and hands what it tracked to the request's watchers ([`super::watch`]).
//! On drop (completion, failure or client disconnect alike) the watchers hear of the end
//! exactly once.

mod builtin;

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_core::stream::{ChoiceDelta, Dialect, Usage};
use meridian_core::timings::Arrived;
use meridian_core::{Delta, Outcome, Phase, PhaseRouter};
use smallvec::SmallVec;

use super::watch::{Ended, Event, Part, SoFar, Watcher};
use crate::ctx::RequestCtx;
use crate::telemetry::{Metrics, RequestTimings};
use crate::upstream::Upstream;

/// More choices than this (`n` > 16) are relayed but not tracked: bounded memory
/// whatever an upstream sends.
const MAX_TRACKED_CHOICES: usize = 16;

/// What serves a request's response: fixed when its upstream answered.
pub struct Served {
    /// The upstream serving it, whose per-phase stream counts this stream moves in.
    pub upstream: Option<Arc<Upstream>>,
    /// The upstream attempt serving the response, ended with it.
    pub attempt: tracing::Span,
    /// Its place in the open-stream registry: the request stays listed while the
    /// response is open.
    pub listed: Option<crate::streams::Listed>,
}

/// Nothing: a response observed apart from any upstream (benchmarks, tests, tools).
impl Default for Served {
    fn default() -> Self {
        Served { upstream: None, attempt: tracing::Span::none(), listed: None }
    }
}

pub struct RequestObserver {
    /// The request observed: its API, family, starting phase, budget and span.
    ctx: Arc<RequestCtx>,
    routers: Vec<PhaseRouter>,
    so_far: SoFar,
    usage: Option<Usage>,
    outcome: Outcome,
    /// The choices seen and those whose `finish_reason` came (bit i: choice i, the
    /// first 64).
    choices_seen: u64,
    choices_finished: u64,
    /// The upstream ended the response with an error event of its own.
    upstream_error: bool,
    /// The last event's sequence number, where the API numbers them (Responses).
    last_sequence: Option<u64>,
    /// The prompt's token count from usage that was forgotten (see `forget_usage`).
    prompt_tokens: Option<u32>,
    /// An unstreamed answer: the characters of its reasoning and of its answer, to split
    /// the server's token count by when it does not count reasoning itself (the
    /// tracker saw one delta, not one per token).
    whole_text: Option<(usize, usize)>,
    /// The built-in watchers first (metrics, registry, span), then the request's own.
    watchers: Vec<Box<dyn Watcher>>,
    /// How many of `watchers` are built in.
    builtin: usize,
}

impl RequestObserver {
    /// Starts observing; `streaming` requests are counted in the open-stream gauges.
    pub fn new(metrics: Arc<Metrics>, ctx: Arc<RequestCtx>, served: Served, streaming: bool) -> Self {
        let so_far = SoFar::new(ctx.started());
        let watchers = builtin::watchers(metrics, &ctx, served, streaming);
        RequestObserver {
            ctx,
            routers: Vec::new(),
            so_far,
            usage: None,
            // Until told otherwise, a request that goes away was abandoned by its client.
            outcome: Outcome::ClientDisconnected,
            choices_seen: 0,
            choices_finished: 0,
            upstream_error: false,
            last_sequence: None,
            prompt_tokens: None,
            whole_text: (!streaming).then_some((0, 0)),
            builtin: watchers.len(),
            watchers,
        }
    }

    /// Adds a watcher (see `crate::ending` for those a request's plan adds).
    pub fn watch(mut self, watcher: Box<dyn Watcher>) -> Self {
        self.watchers.push(watcher);
        self
    }

    /// The response goes on from `to` (an answer handed over at the end of its thought):
    /// its watchers move what they count per upstream.
    pub fn moved_to(&mut self, to: &Arc<Upstream>) {
        for w in &mut self.watchers {
            w.on_moved(to);
        }
    }

    /// Feeds one `data:` payload (or a whole non-streaming body) that arrived at `at`.
    pub fn on_payload(&mut self, payload: &[u8], at: Instant) {
        self.observe(payload, at, None);
    }

    /// Feeds one payload, lending `also` the event after the request's own watchers: a
    /// watcher whose owner must read its verdict the moment the event is tracked (the
    /// continuation's think watch, which decides where the stream is cut).
    pub fn on_payload_also(&mut self, payload: &[u8], at: Instant, also: &mut dyn Watcher) {
        self.observe(payload, at, Some(also));
    }

    fn observe(&mut self, payload: &[u8], at: Instant, also: Option<&mut dyn Watcher>) {
        // Inline storage: the usual one or two choices cost no allocation.
        let mut parts: SmallVec<[Part<'_>; 2]> = SmallVec::new();
        let dialect = self.ctx.route().dialect();
        let read = dialect.parse(payload, |choice| {
            if let Some(part) = self.track(choice, at) {
                parts.push(part);
            }
        });
        if let Some(sequence) = read.and_then(|r| r.sequence) {
            self.last_sequence = Some(sequence);
        }
        let usage = read.and_then(|r| r.usage);
        if usage.is_some() {
            self.usage = usage;
        }
        self.update_totals();
        let event = Event { at, parts: &parts, usage, so_far: &self.so_far, last: false };
        for w in &mut self.watchers {
            w.on_event(&event);
        }
        if let Some(w) = also {
            w.on_event(&event);
        }
    }

    /// Forgets the token counts the server sent so far: they described a response that
    /// was cut and continued, and the continuation's own (or the tracker's) stand instead.
    pub fn forget_usage(&mut self) {
        // The prompt is the client's either way: its count stays.
        self.prompt_tokens = self.usage.take().and_then(|u| u.prompt_tokens).or(self.prompt_tokens);
    }

    /// Runs one choice's part through its phase router and the stream's moments.
    fn track<'p>(&mut self, c: ChoiceDelta<'p>, at: Instant) -> Option<Part<'p>> {
        self.upstream_error |= c.upstream_error;
        if let Some(bit) = 1u64.checked_shl(u32::try_from(c.index).unwrap_or(u32::MAX)) {
            self.choices_seen |= bit;
            if c.finished {
                self.choices_finished |= bit;
            }
        }
        if c.index >= MAX_TRACKED_CHOICES {
            return None;
        }
        while self.routers.len() <= c.index {
            let mut r = PhaseRouter::new(self.ctx.family.clone());
            if let Some(p) = self.ctx.initial_phase {
                r = r.with_initial_phase(p);
            }
            if let Some(b) = self.ctx.think_budget {
                r = r.with_think_budget(b);
            }
            self.routers.push(r);
        }
        if let Some((r, a)) = self.whole_text.as_mut() {
            *r += c.reasoning.as_deref().map_or(0, |s| s.chars().count());
            *a += c.content.as_deref().map_or(0, |s| s.chars().count());
        }
        let has_token = c.reasoning.as_deref().is_some_and(|s| !s.is_empty())
            || c.content.as_deref().is_some_and(|s| !s.is_empty())
            || c.token_ids.as_deref().is_some_and(|t| !t.is_empty());
        let router = &mut self.routers[c.index];
        let (think_before, output_before) = (router.think_tokens(), router.output_tokens());
        let events = router.observe(Delta {
            reasoning: c.reasoning.as_deref(),
            content: c.content.as_deref(),
            token_ids: c.token_ids.as_deref(),
        });
        let arrived = Arrived::read(router, (think_before, output_before), &events);
        let thinking = arrived.thinking && self.so_far.timeline.first_output().is_none();
        if has_token {
            self.so_far.timeline.tokens(at, arrived);
        } else {
            self.so_far.timeline.marks(at, arrived);
        }
        Some(Part {
            choice: c.index,
            reasoning: c.reasoning,
            content: c.content,
            logprobs: c.logprobs,
            events,
            thinking,
            output_grew: arrived.answering,
            choice_think_tokens: router.think_tokens(),
        })
    }

    fn update_totals(&mut self) {
        let phases = self.routers.iter().map(PhaseRouter::phase);
        self.so_far.phase = if phases.clone().any(|p| p == Phase::Output) {
            Phase::Output
        } else if phases.clone().any(|p| p == Phase::Think) {
            Phase::Think
        } else {
            Phase::Pending
        };
        self.so_far.think_tokens = self.routers.iter().map(PhaseRouter::think_tokens).sum();
        self.so_far.output_tokens = self.routers.iter().map(PhaseRouter::output_tokens).sum();
    }

    /// Whether every choice the stream started has had its end (a `finish_reason`, or
    /// the API's end-of-response event; some OpenAI-compatible servers end a complete
    /// stream so, without `[DONE]`).
    pub fn every_choice_finished(&self) -> bool {
        self.choices_seen != 0 && self.choices_seen & !self.choices_finished == 0
    }

    /// The response ended normally.
    pub fn complete(&mut self) {
        let at = Instant::now();
        let mut parts: SmallVec<[Part<'_>; 2]> = SmallVec::new();
        for (i, router) in self.routers.iter_mut().enumerate() {
            let events = router.finish();
            self.so_far.timeline.marks(at, Arrived::released(&events));
            if !events.is_empty() {
                parts.push(Part {
                    choice: i,
                    reasoning: None,
                    content: None,
                    logprobs: None,
                    events,
                    thinking: false,
                    output_grew: false,
                    choice_think_tokens: router.think_tokens(),
                });
            }
        }
        // An error event of the upstream's own ended it: relayed whole, but failed.
        self.outcome = if self.upstream_error { Outcome::UpstreamError } else { Outcome::Ok };
        if parts.is_empty() {
            return;
        }
        self.update_totals();
        let event = Event { at, parts: &parts, usage: None, so_far: &self.so_far, last: true };
        for w in &mut self.watchers {
            w.on_event(&event);
        }
    }

    /// The response ended badly; `outcome` names how.
    pub fn fail(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// How the response has ended so far (a client that goes away leaves it
    /// `client_disconnected`).
    #[cfg(test)]
    pub(crate) fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The request's span, for log lines written about it while it streams.
    pub fn span(&self) -> &tracing::Span {
        self.ctx.span()
    }

    /// The API the response speaks.
    pub fn dialect(&self) -> Dialect {
        self.ctx.route().dialect()
    }

    /// The sequence number an event the proxy adds takes: the one after the last the
    /// upstream sent (0 before any). Only the Responses API numbers its events.
    pub fn next_sequence(&self) -> u64 {
        self.last_sequence.map_or(0, |s| s.saturating_add(1))
    }

    /// Think and output token counts: the server's `usage` when it sent one (split by the
    /// tracker when the server does not count reasoning itself), else the tracker's counts.
    fn token_counts(&self) -> (Option<u32>, Option<u32>) {
        let (think, output) = (self.so_far.think_tokens, self.so_far.output_tokens);
        match self.usage {
            Some(Usage { completion_tokens, reasoning_tokens: Some(r), .. }) => {
                (Some(r), Some(completion_tokens.saturating_sub(r)))
            }
            Some(Usage { completion_tokens, reasoning_tokens: None, .. }) => {
                let think = match self.whole_text {
                    // By the share of the text, the nearest estimate there is.
                    Some((r, a)) if r + a > 0 => {
                        let share = r as f64 / (r + a) as f64;
                        (f64::from(completion_tokens) * share).round() as u32
                    }
                    _ => think,
                };
                let think = think.min(completion_tokens);
                (Some(think), Some(completion_tokens - think))
            }
            None if self.routers.is_empty() => (None, None),
            None => (Some(think), Some(output)),
        }
    }
}

impl Drop for RequestObserver {
    fn drop(&mut self) {
        let (think_tokens, output_tokens) = self.token_counts();
        let t = &self.so_far.timeline;
        let secs = |s: Option<f64>| s.and_then(|s| Duration::try_from_secs_f64(s).ok());
        let timings = RequestTimings {
            time_to_first_token: secs(t.ttft()),
            time_to_first_output: secs(t.ttfo()),
            think_to_output_gap: secs(t.ttot()),
            end_to_end: t.sent().elapsed(),
            think_tokens,
            output_tokens,
        };
        let family = self.ctx.family_name();
        let ended = Ended {
            outcome: self.outcome,
            timings: &timings,
            so_far: &self.so_far,
            family,
            prompt_tokens: self.usage.and_then(|u| u.prompt_tokens).or(self.prompt_tokens),
        };
        // The request's own watchers first (a hook's `forget` goes while the request's
        // span is open), then the built-ins, the span's end and the record last.
        let (builtin, own) = self.watchers.split_at_mut(self.builtin);
        for w in own.iter_mut().chain(builtin.iter_mut().rev()) {
            w.on_end(&ended);
        }
    }
}
