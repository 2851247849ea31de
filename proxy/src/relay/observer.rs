//! Watches one request's response go by: runs a phase router per choice, timestamps the
//! transitions where the bytes arrived, and on drop (completion, failure or client
//! disconnect alike) records the request's measurements exactly once.

use std::sync::Arc;
use std::time::Instant;

use meridian_core::models::ModelFamily;
use meridian_core::{Delta, Phase, PhaseEvent, PhaseRouter};

use crate::telemetry::spans::TARGET;
use crate::telemetry::{Metrics, RequestTimings};
use crate::upstream::Upstream;
use meridian_core::stream::{ChoiceDelta, Dialect, Usage};
use tracing::Level;

/// More choices than this (`n` > 16) are relayed but not tracked: bounded memory
/// whatever an upstream sends.
const MAX_TRACKED_CHOICES: usize = 16;

/// Who a request is: fixed when it is sent upstream.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    pub route: &'static str,
    /// The API the response speaks, which decides how its events are read.
    pub dialect: Dialect,
    pub family: Option<Arc<ModelFamily>>,
    /// Overrides the family's starting phase (a request that turned thinking off).
    pub initial_phase: Option<Phase>,
    /// The client's `X-Request-Id`, for logs.
    pub request_id: String,
    /// The proxy's id for this stream, which the hook's directives name.
    pub stream_id: String,
    pub upstream: String,
    pub started: Instant,
    /// The think budget applied to this request, if any.
    pub think_budget: Option<u32>,
    /// The upstream serving it, whose per-phase stream counts this stream moves in.
    pub upstream_ref: Option<Arc<Upstream>>,
    /// A thinking-time budget, enforced through the upstream's hook.
    pub think_deadline: Option<crate::ending::ThinkDeadline>,
    /// Its entry in the open-stream registry, kept up to date as chunks arrive; the
    /// request stays listed while this is held.
    pub live: Option<Arc<crate::streams::StreamGuard>>,
    /// The request's span (`Span::none()` untraced): phase events and the final counts
    /// land on it, and it ends with the response.
    pub span: tracing::Span,
    /// The upstream attempt serving the response, ended with it.
    pub attempt: tracing::Span,
}

impl RequestInfo {
    /// A request known only by route and family (benchmarks, tests, tools).
    pub fn new(route: &'static str, family: Option<Arc<ModelFamily>>) -> Self {
        RequestInfo {
            route,
            dialect: Dialect::Chat,
            family,
            initial_phase: None,
            request_id: String::new(),
            stream_id: String::new(),
            upstream: String::new(),
            started: Instant::now(),
            think_budget: None,
            upstream_ref: None,
            think_deadline: None,
            live: None,
            span: tracing::Span::none(),
            attempt: tracing::Span::none(),
        }
    }
}

pub struct RequestObserver {
    metrics: Arc<Metrics>,
    info: RequestInfo,
    routers: Vec<PhaseRouter>,
    first_token: Option<Instant>,
    /// Arrival of the last chunk that carried thinking (a think token or the end marker).
    last_think: Option<Instant>,
    first_output: Option<Instant>,
    /// Arrival of the first thinking token.
    think_started: Option<Instant>,
    deadline_fired: bool,
    /// EAT probing of this stream, with the reasoning text so far (kept only then).
    eat: Option<(crate::ending::EatProber, String)>,
    /// The hook told (or that may be told) about this request, to forget it at the end.
    forget_on_drop: Option<crate::hook::HookTarget>,
    usage: Option<Usage>,
    /// The phase this request is counted under in `meridian_open_streams`.
    open_as: Option<Phase>,
    outcome: &'static str,
    /// The choices seen and those whose `finish_reason` came (bit i: choice i, the
    /// first 64).
    choices_seen: u64,
    choices_finished: u64,
    /// Per tracked choice: arrival of its last chunk of visible output, for output ITL.
    last_output: Vec<Option<Instant>>,
    /// This family's output-ITL histogram, looked up at the first gap and kept, so a
    /// chunk costs one record and no lookup.
    output_itl: Option<metrics::Histogram>,
    /// The phase events already put on the request span (each goes on once).
    traced: u8,
}

/// The span events of a stream's phases, first occurrence only (bits of `traced`).
const THINK_START: u8 = 1;
const THINK_END: u8 = 2;
const FIRST_VISIBLE: u8 = 4;

impl RequestObserver {
    /// Starts observing; `streaming` requests are counted in the open-stream gauges.
    pub fn new(metrics: Arc<Metrics>, info: RequestInfo, streaming: bool) -> Self {
        let open_as = streaming.then_some(Phase::Pending);
        if let Some(u) = &info.upstream_ref {
            u.move_stream(None, open_as);
        }
        RequestObserver {
            metrics,
            info,
            routers: Vec::new(),
            first_token: None,
            last_think: None,
            first_output: None,
            think_started: None,
            deadline_fired: false,
            eat: None,
            forget_on_drop: None,
            usage: None,
            open_as,
            // Until told otherwise, a request that goes away was abandoned by its client.
            outcome: "client_disconnected",
            choices_seen: 0,
            choices_finished: 0,
            last_output: Vec::new(),
            output_itl: None,
            traced: 0,
        }
    }

    /// Probes this stream for EAT (see [`crate::ending::eat`]); `hook`, when the signal acts
    /// through one, is told to forget the request at the end.
    pub fn with_eat(
        mut self,
        prober: crate::ending::EatProber,
        hook: Option<crate::hook::HookTarget>,
    ) -> Self {
        self.eat = Some((prober, String::new()));
        self.forget_on_drop = hook;
        self
    }

    /// Feeds one `data:` payload (or a whole non-streaming body) that arrived at `at`.
    pub fn on_payload(&mut self, payload: &[u8], at: Instant) {
        let dialect = self.info.dialect;
        if let Some(Some(mut usage)) = dialect.parse(payload, |choice| self.on_choice(choice, at)) {
            // Messages reports the prompt's count first, the output's at the end.
            if usage.prompt_tokens.is_none() {
                usage.prompt_tokens = self.usage.and_then(|u| u.prompt_tokens);
            }
            self.usage = Some(usage);
        }
        self.update_open_phase();
        self.check_deadline(at);
    }

    /// Past the thinking-time budget and still thinking: tell the hook, once.
    fn check_deadline(&mut self, at: Instant) {
        let (Some(deadline), Some(started)) = (&self.info.think_deadline, self.think_started) else { return };
        if self.deadline_fired
            || self.open_as != Some(Phase::Think)
            || at.duration_since(started) < deadline.after
        {
            return;
        }
        self.deadline_fired = true;
        deadline.hook.end_thinking(&self.info.stream_id);
        self.metrics.count_budget_reached(self.info.family.as_ref().map_or("unknown", |f| f.name()));
    }

    fn on_choice(&mut self, c: ChoiceDelta<'_>, at: Instant) {
        if let Some(bit) = 1u64.checked_shl(u32::try_from(c.index).unwrap_or(u32::MAX)) {
            self.choices_seen |= bit;
            if c.finished {
                self.choices_finished |= bit;
            }
        }
        if c.index >= MAX_TRACKED_CHOICES {
            return;
        }
        while self.routers.len() <= c.index {
            let mut r = PhaseRouter::new(self.info.family.clone());
            if let Some(p) = self.info.initial_phase {
                r = r.with_initial_phase(p);
            }
            if let Some(b) = self.info.think_budget {
                r = r.with_think_budget(b);
            }
            self.routers.push(r);
            self.last_output.push(None);
        }
        let has_token = c.reasoning.as_deref().is_some_and(|s| !s.is_empty())
            || c.content.as_deref().is_some_and(|s| !s.is_empty())
            || c.token_ids.as_deref().is_some_and(|t| !t.is_empty());
        if has_token {
            self.first_token.get_or_insert(at);
        }
        let router = &mut self.routers[c.index];
        let (think_before, output_before) = (router.think_tokens(), router.output_tokens());
        let events = router.observe(Delta {
            reasoning: c.reasoning.as_deref(),
            content: c.content.as_deref(),
            token_ids: c.token_ids.as_deref(),
        });
        let output_grew = router.output_tokens() > output_before;
        if router.think_tokens() > think_before && self.first_output.is_none() {
            self.last_think = Some(at);
            self.think_started.get_or_insert(at);
            if let (Some((prober, text)), 0) = (self.eat.as_mut(), c.index) {
                text.push_str(c.reasoning.as_deref().unwrap_or_default());
                prober.on_thinking(router.think_tokens(), text);
            }
        }
        if output_grew {
            self.on_output_chunk(c.index, at);
        }
        self.on_events(&events, at);
    }

    /// Output ITL: the gap since this choice's previous chunk of visible output.
    fn on_output_chunk(&mut self, choice: usize, at: Instant) {
        let Some(slot) = self.last_output.get_mut(choice) else { return };
        let Some(prev) = slot.replace(at) else { return };
        let family = self.info.family.as_ref().map_or("unknown", |f| f.name());
        let metrics = &self.metrics;
        let itl = self.output_itl.get_or_insert_with(|| metrics.output_itl(family));
        itl.record(at.saturating_duration_since(prev).as_secs_f64());
    }

    fn on_events(&mut self, events: &[PhaseEvent], at: Instant) {
        for e in events {
            match e {
                PhaseEvent::EnterThink => self.trace_phase(THINK_START),
                PhaseEvent::ExitThink { .. } => self.trace_phase(THINK_END),
                PhaseEvent::FirstOutput { .. } => {
                    self.first_output.get_or_insert(at);
                    self.trace_phase(FIRST_VISIBLE);
                }
                PhaseEvent::ForceBudget { .. } => {
                    self.metrics
                        .count_budget_reached(self.info.family.as_ref().map_or("unknown", |f| f.name()));
                }
            }
        }
    }

    /// Puts a phase boundary on the request span, with the token counts so far; only at
    /// boundaries, never per chunk, and not at all untraced.
    fn trace_phase(&mut self, which: u8) {
        if self.info.span.is_none() || self.traced & which != 0 {
            return;
        }
        self.traced |= which;
        // As i64: the OpenTelemetry bridge records unsigned integers as strings.
        let think: i64 = self.routers.iter().map(|r| i64::from(r.think_tokens())).sum();
        let output: i64 = self.routers.iter().map(|r| i64::from(r.output_tokens())).sum();
        let elapsed_ms = self.info.started.elapsed().as_secs_f64() * 1e3;
        let span = &self.info.span;
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

    /// The request's outcome and counts, as attributes of its span.
    fn trace_end(&self, timings: &RequestTimings, family: &str) {
        let span = &self.info.span;
        if span.is_none() {
            return;
        }
        span.record("meridian.outcome", self.outcome);
        span.record("meridian.family", family);
        if let (Some(think), Some(output)) = (timings.think_tokens, timings.output_tokens) {
            span.record("gen_ai.usage.output_tokens", i64::from(think) + i64::from(output));
            span.record("gen_ai.usage.reasoning.output_tokens", i64::from(think));
            span.record("meridian.think_tokens", i64::from(think));
        }
        if let Some(n) = self.usage.as_ref().and_then(|u| u.prompt_tokens) {
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
        if !matches!(self.outcome, "ok" | "client_disconnected") {
            crate::telemetry::spans::fail(span, self.outcome);
            crate::telemetry::spans::fail(&self.info.attempt, self.outcome);
        }
        crate::telemetry::spans::end_now(&self.info.attempt);
        crate::telemetry::spans::end_now(span);
    }

    fn current_phase(&self) -> Phase {
        let phases = self.routers.iter().map(PhaseRouter::phase);
        if phases.clone().any(|p| p == Phase::Output) {
            Phase::Output
        } else if phases.clone().any(|p| p == Phase::Think) {
            Phase::Think
        } else {
            Phase::Pending
        }
    }

    fn update_open_phase(&mut self) {
        if let Some(live) = &self.info.live {
            let think = self.routers.iter().map(PhaseRouter::think_tokens).sum();
            let output = self.routers.iter().map(PhaseRouter::output_tokens).sum();
            live.entry().set_progress(self.current_phase(), think, output);
        }
        if self.open_as.is_some() {
            let now = Some(self.current_phase());
            if let Some(u) = &self.info.upstream_ref {
                u.move_stream(self.open_as, now);
            }
            self.open_as = now;
        }
    }

    /// The response ended normally.
    /// Whether every choice the stream started has had its `finish_reason` (some
    /// OpenAI-compatible servers end a complete stream so, without `[DONE]`).
    pub fn every_choice_finished(&self) -> bool {
        self.choices_seen != 0 && self.choices_seen & !self.choices_finished == 0
    }

    pub fn complete(&mut self) {
        let at = Instant::now();
        for i in 0..self.routers.len() {
            let events = self.routers[i].finish();
            self.on_events(&events, at);
        }
        self.outcome = "ok";
    }

    /// The response ended badly; `outcome` names how.
    pub fn fail(&mut self, outcome: &'static str) {
        self.outcome = outcome;
    }

    /// The API the response speaks.
    pub fn dialect(&self) -> Dialect {
        self.info.dialect
    }

    /// The request's span, for log lines written about it while it streams.
    pub fn span(&self) -> &tracing::Span {
        &self.info.span
    }

    pub fn phase(&self) -> Phase {
        self.current_phase()
    }

    /// Think and output token counts: the server's `usage` when it sent one (split by the
    /// tracker when the server does not count reasoning itself), else the tracker's counts.
    fn token_counts(&self) -> (Option<u32>, Option<u32>) {
        let think: u32 = self.routers.iter().map(PhaseRouter::think_tokens).sum();
        let output: u32 = self.routers.iter().map(PhaseRouter::output_tokens).sum();
        match self.usage {
            Some(Usage { completion_tokens, reasoning_tokens: Some(r), .. }) => {
                (Some(r), Some(completion_tokens.saturating_sub(r)))
            }
            Some(Usage { completion_tokens, reasoning_tokens: None, .. }) => {
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
        let hook =
            self.forget_on_drop.take().or_else(|| self.info.think_deadline.as_ref().map(|d| d.hook.clone()));
        if let Some(hook) = hook {
            hook.forget(&self.info.stream_id);
        }
        if let Some(u) = &self.info.upstream_ref {
            u.move_stream(self.open_as, None);
        }
        let since = |t: Option<Instant>| t.map(|t| t.duration_since(self.info.started));
        let (think_tokens, output_tokens) = self.token_counts();
        // TTOT: from the last chunk of thinking to the first visible output.
        let gap = match (self.last_think, self.first_output) {
            (Some(end), Some(out)) => Some(out.saturating_duration_since(end)),
            _ => None,
        };
        let timings = RequestTimings {
            time_to_first_token: since(self.first_token),
            time_to_first_output: since(self.first_output),
            think_to_output_gap: gap,
            end_to_end: self.info.started.elapsed(),
            think_tokens,
            output_tokens,
        };
        let family = self.info.family.as_ref().map_or("unknown", |f| f.name());
        self.metrics.record_timings(family, &timings);
        self.trace_end(&timings, family);
        self.metrics.count_request(self.info.route, self.outcome);
        // Its parent is the request span, so a JSON log line carries the trace's ids.
        tracing::info!(
            parent: &self.info.span,
            request_id = %self.info.request_id,
            stream_id = %self.info.stream_id,
            upstream = %self.info.upstream,
            route = self.info.route,
            family,
            outcome = self.outcome,
            ttft_ms = timings.time_to_first_token.map(|d| d.as_secs_f64() * 1e3),
            ttfo_ms = timings.time_to_first_output.map(|d| d.as_secs_f64() * 1e3),
            ttot_ms = timings.think_to_output_gap.map(|d| d.as_secs_f64() * 1e3),
            e2e_ms = timings.end_to_end.as_secs_f64() * 1e3,
            think_tokens,
            output_tokens,
            "request finished"
        );
    }
}
