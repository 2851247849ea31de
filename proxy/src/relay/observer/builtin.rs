//! The watchers every request has: the open-stream registry and per-upstream phase
//! gauges ([`Progress`]), the output inter-token latency ([`OutputItl`]), the request's
//! span ([`SpanTrace`]), and the request's measurements, counts and log line
//! ([`Record`]).

use std::sync::Arc;
use std::time::Instant;

use meridian_core::{Phase, PhaseEvent};
use tracing::Level;

use super::Served;
use crate::ctx::{End, RequestCtx};
use crate::relay::watch::{Ended, Event, Watcher, crossed};
use crate::streams::Listed;
use crate::telemetry::Metrics;
use crate::telemetry::spans::TARGET;
use crate::upstream::Upstream;

/// The built-in watchers of a request, in the order they hear of each event.
pub(super) fn watchers(
    metrics: Arc<Metrics>,
    ctx: &Arc<RequestCtx>,
    served: Served,
    streaming: bool,
) -> Vec<Box<dyn Watcher>> {
    vec![
        Box::new(Progress::new(ctx.clone(), served.listed, served.upstream, streaming)),
        Box::new(OutputItl { metrics: metrics.clone(), ctx: ctx.clone(), last: Vec::new(), histogram: None }),
        Box::new(SpanTrace { span: ctx.span().clone(), attempt: served.attempt, traced: 0 }),
        Box::new(Record { metrics, ctx: ctx.clone() }),
    ]
}

/// Keeps the request's progress and its upstream's per-phase stream counts current, and
/// the request listed until the response ends.
struct Progress {
    ctx: Arc<RequestCtx>,
    _listed: Option<Listed>,
    upstream: Option<Arc<Upstream>>,
    /// The phase this stream is counted under in `meridian_open_streams` (streamed
    /// responses only).
    open_as: Option<Phase>,
}

impl Progress {
    fn new(
        ctx: Arc<RequestCtx>,
        listed: Option<Listed>,
        upstream: Option<Arc<Upstream>>,
        streaming: bool,
    ) -> Self {
        let open_as = streaming.then_some(Phase::Pending);
        if let Some(u) = &upstream {
            u.move_stream(None, open_as);
        }
        Progress { ctx, _listed: listed, upstream, open_as }
    }
}

impl Watcher for Progress {
    fn on_event(&mut self, event: &Event<'_>) {
        let so_far = event.so_far;
        self.ctx.progress.set_phase(so_far.phase, so_far.think_tokens, so_far.output_tokens);
        if self.open_as.is_some() {
            let now = Some(so_far.phase);
            if let Some(u) = &self.upstream {
                u.move_stream(self.open_as, now);
            }
            self.open_as = now;
        }
    }

    fn on_end(&mut self, _: &Ended<'_>) {
        if let Some(u) = &self.upstream {
            u.move_stream(self.open_as, None);
        }
    }

    /// The stream's count moves with it.
    fn on_moved(&mut self, to: &Arc<Upstream>) {
        if let Some(u) = &self.upstream {
            u.move_stream(self.open_as, None);
        }
        to.move_stream(None, self.open_as);
        self.ctx.progress.set_upstream(&to.name);
        self.upstream = Some(to.clone());
    }
}

/// Output ITL: per choice, the gap since its previous chunk of visible output.
struct OutputItl {
    metrics: Arc<Metrics>,
    ctx: Arc<RequestCtx>,
    /// Per tracked choice: arrival of its last chunk of output.
    last: Vec<Option<Instant>>,
    /// The family's histogram, looked up at the first gap and kept, so a chunk costs one
    /// record and no lookup.
    histogram: Option<metrics::Histogram>,
}

impl Watcher for OutputItl {
    fn on_event(&mut self, event: &Event<'_>) {
        for part in event.parts.iter().filter(|p| p.output_grew) {
            if self.last.len() <= part.choice {
                self.last.resize(part.choice + 1, None);
            }
            let Some(prev) = self.last[part.choice].replace(event.at) else { continue };
            let (metrics, family) = (&self.metrics, self.ctx.family_name());
            let itl = self.histogram.get_or_insert_with(|| metrics.output_itl(family));
            itl.record(event.at.saturating_duration_since(prev).as_secs_f64());
        }
    }
}

/// The span events of a stream's phases, first occurrence only (bits of `traced`).
const THINK_START: u8 = 1;
const THINK_END: u8 = 2;
const FIRST_VISIBLE: u8 = 4;

/// Puts the stream's phase boundaries on the request span (only at boundaries, never per
/// chunk, and not at all untraced), and its outcome and counts at the end.
struct SpanTrace {
    span: tracing::Span,
    attempt: tracing::Span,
    traced: u8,
}

impl Watcher for SpanTrace {
    fn on_event(&mut self, event: &Event<'_>) {
        if self.span.is_none() {
            return;
        }
        for (which, is) in [
            (THINK_START, (|e: &PhaseEvent| matches!(e, PhaseEvent::EnterThink)) as fn(&PhaseEvent) -> bool),
            (THINK_END, |e| matches!(e, PhaseEvent::ExitThink { .. })),
            (FIRST_VISIBLE, |e| matches!(e, PhaseEvent::FirstOutput { .. })),
        ] {
            if self.traced & which == 0 && crossed(event.parts, is) {
                self.traced |= which;
                self.trace_phase(which, event);
            }
        }
    }

    fn on_end(&mut self, ended: &Ended<'_>) {
        let span = &self.span;
        if span.is_none() {
            return;
        }
        let timings = ended.timings;
        span.record("meridian.outcome", ended.outcome.as_str());
        span.record("meridian.family", ended.family);
        if let (Some(think), Some(output)) = (timings.think_tokens, timings.output_tokens) {
            span.record("gen_ai.usage.output_tokens", i64::from(think) + i64::from(output));
            span.record("gen_ai.usage.reasoning.output_tokens", i64::from(think));
            span.record("meridian.think_tokens", i64::from(think));
        }
        if let Some(n) = ended.prompt_tokens {
            span.record("gen_ai.usage.input_tokens", i64::from(n));
        }
        let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        if let Some(v) = ms(timings.time_to_first_token) {
            span.record("meridian.ttft_ms", v);
        }
        if let Some(v) = ms(timings.time_to_first_output) {
            span.record("meridian.ttfo_ms", v);
        }
        if let Some(v) = ms(timings.think_to_output_gap) {
            span.record("meridian.ttot_ms", v);
        }
        // A client that left is not the proxy's failure.
        if ended.outcome.is_failure() {
            crate::telemetry::spans::fail(span, ended.outcome.as_str());
            crate::telemetry::spans::fail(&self.attempt, ended.outcome.as_str());
        }
        crate::telemetry::spans::end_now(&self.attempt);
        crate::telemetry::spans::end_now(span);
    }
}

impl SpanTrace {
    fn trace_phase(&self, which: u8, event: &Event<'_>) {
        // As i64: the OpenTelemetry bridge records unsigned integers as strings.
        let think = i64::from(event.so_far.think_tokens);
        let output = i64::from(event.so_far.output_tokens);
        let elapsed_ms = event.so_far.started().elapsed().as_secs_f64() * 1e3;
        let span = &self.span;
        // Literal keys: `tracing`'s macros cannot parse dotted names after `parent:`.
        match which {
            THINK_START => tracing::event!(target: TARGET, parent: span, Level::INFO,
                "meridian.think_tokens" = think, "meridian.elapsed_ms" = elapsed_ms, "think_start"),
            THINK_END => tracing::event!(target: TARGET, parent: span, Level::INFO,
                "meridian.think_tokens" = think, "meridian.elapsed_ms" = elapsed_ms, "think_end"),
            _ => tracing::event!(target: TARGET, parent: span, Level::INFO,
                "meridian.think_tokens" = think, "meridian.output_tokens" = output,
                "meridian.elapsed_ms" = elapsed_ms, "first_visible_token"),
        }
    }
}

/// The request's measurements: budgets reached as they happen, then its timings in the
/// metrics, and its end ([`End::Answered`]).
struct Record {
    metrics: Arc<Metrics>,
    ctx: Arc<RequestCtx>,
}

impl Watcher for Record {
    fn on_event(&mut self, event: &Event<'_>) {
        let reached = |e: &PhaseEvent| matches!(e, PhaseEvent::ForceBudget { .. });
        for _ in event.parts.iter().flat_map(|p| p.events.iter()).filter(|e| reached(e)) {
            self.metrics.count_budget_reached(self.ctx.family_name());
        }
    }

    fn on_end(&mut self, ended: &Ended<'_>) {
        let timings = ended.timings;
        self.metrics.record_timings(ended.family, timings);
        // Counted by the outcome layer once the response is over.
        let upstream = self.ctx.progress.upstream();
        self.ctx.arrival.finish(End::Answered {
            outcome: ended.outcome,
            upstream: upstream.as_deref().unwrap_or_default(),
            family: ended.family,
            timings,
        });
    }
}
