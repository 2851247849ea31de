//! The continuation as a stage of the relay: the relay reads the first leg's lines and
//! tracks each event once; this stage lends the event to its think watch, rewrites the
//! chunk for the client ([`Splicer`]), and, when a cut is due, hands the relay the second
//! leg to read from instead. Everything runs in the relay's own poll: a client that goes
//! away drops the relay, which drops whichever leg is open and so cancels it in the
//! engine.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use meridian_core::stream::{SseLine, lines, sse_line};
use serde_json::{Map, Value};
use tokio::sync::Notify;
use tokio::time::Sleep;
use tracing::Instrument;

use super::handover::{HandOver, KvExport, PlaceClaim};
use super::legs::{ClientAsked, SoFar, second_leg_body};
use super::splice::{Emit, Splicer};
use super::watch::{Cut, ThinkWatch};
use super::{Delimiters, Route};
use crate::ctx::{Ending, RequestCtx};
use crate::error::ProxyError;
use crate::relay::{Flow, Leg, LegStream, RelayStage, Relayed, RequestObserver};
use crate::telemetry::{HandoverOutcome, Metrics, spans};
use crate::upstream::InFlight;

/// Where the continuation goes: the upstream that served the first leg (whose prefix
/// cache holds the conversation), unless its answer is handed over ([`HandOver`]).
#[derive(Clone)]
pub struct Upstream {
    pub client: reqwest::Client,
    /// The route's full URL.
    pub url: String,
    /// Headers for the continuation: the first leg's, with its own request id.
    pub headers: HeaderMap,
    pub name: String,
    pub first_byte_timeout: Duration,
}

/// What a continued stream is set up with (see [`super::ContinuationPlan`]).
pub struct Setup {
    pub upstream: Upstream,
    pub route: Route,
    pub delimiters: Delimiters,
    /// The first leg's request body.
    pub first_body: Map<String, Value>,
    pub asked: ClientAsked,
    pub watch: ThinkWatch,
    pub splicer: Splicer,
    /// Rung by the EAT prober when its signal says stop.
    pub end_now: Arc<Notify>,
    pub metrics: Arc<Metrics>,
    /// The request: its progress is marked when thinking is cut, and the leg after the
    /// cut gets a span under its span, whose context goes upstream (`Span::none()`:
    /// untraced, headers as they are).
    pub ctx: Arc<RequestCtx>,
    /// Where the answer may move at the end of the thought (the first leg is on a
    /// `think` upstream); `None`: it is continued where it is.
    pub handoff: Option<HandOver>,
}

pub struct Continuation {
    setup: Setup,
    /// The continuation was sent: its chunks are relayed spliced, and nothing is cut.
    second: bool,
    /// A cut waiting for the answer upstream's engine to grant the answer a place
    /// ([`HandOver::claim`]); the first leg is relayed meanwhile, and no other cut made.
    claiming: Option<(Cut, PlaceClaim)>,
    /// Waiting for the EAT prober's word (made when first polled while thinking).
    eat: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The thinking-time deadline, once thinking has started.
    timer: Option<(Instant, Pin<Box<Sleep>>)>,
    /// The client's stream as the legs' lines become it.
    pub out: Spliced,
}

impl Continuation {
    pub fn new(setup: Setup) -> Self {
        Continuation { setup, second: false, claiming: None, eat: None, timer: None, out: Spliced::default() }
    }

    /// What may cut the first leg between its events: the EAT prober's word and the
    /// thinking-time deadline. Only polled while thinking, as only then can either cut.
    pub fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<Cut> {
        if self.second || !self.setup.watch.thinking() {
            return Poll::Pending;
        }
        let end_now = &self.setup.end_now;
        let eat = self.eat.get_or_insert_with(|| {
            let n = end_now.clone();
            Box::pin(async move { n.notified().await })
        });
        if eat.as_mut().poll(cx).is_ready() {
            self.eat = None;
            return Poll::Ready(Cut::Eat);
        }
        let Some(deadline) = self.setup.watch.deadline() else { return Poll::Pending };
        let timer = match &mut self.timer {
            Some((at, sleep)) if *at == deadline => sleep,
            slot => &mut slot.insert((deadline, Box::pin(tokio::time::sleep_until(deadline.into())))).1,
        };
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Cut::Seconds);
        }
        Poll::Pending
    }

    /// One chunk (`data:` payload) of the leg being relayed, arrived at `at`: tracked by
    /// the relay's `observer` (the first leg's as the upstream sent it, for the think
    /// watch reads its usage and logprobs; the continuation's as the client gets it, its
    /// text relabelled as answer), and what the client gets instead.
    pub fn chunk(&mut self, payload: &[u8], at: Instant, observer: &mut RequestObserver) -> Emit {
        if !self.second {
            observer.on_payload_also(payload, at, &mut self.setup.watch);
            return self.setup.splicer.first_leg(payload);
        }
        let emit = self.setup.splicer.second_leg(payload);
        match &emit {
            Emit::Same => observer.on_payload(payload, at),
            Emit::Changed(chunk) => observer.on_payload(chunk, at),
            Emit::Drop => {}
        }
        emit
    }

    /// The cut the last chunk made due, if any (none while a cut waits for its place).
    pub fn take_cut(&mut self) -> Option<Cut> {
        if self.second {
            return None;
        }
        let cut = self.setup.watch.take_cut();
        if self.claiming.is_some() { None } else { cut }
    }

    /// Carries out a cut: the continuation's stream, for the relay to read from in place
    /// of the first leg (dropping it aborts the first leg in the engine), on an answer
    /// upstream when the answer is handed over; or `None`, and no more cuts, when the
    /// request has no room left to answer in, or a thought that ended by itself finds no
    /// answer upstream with room (its answer goes on where it is). An answer upstream
    /// whose engine must grant the answer a place first defers the cut until it answers
    /// ([`claimed`](Self::claimed)): `None` now.
    pub fn cut(&mut self, cut: Cut, observer: &mut RequestObserver) -> Option<Leg> {
        let moved = self.setup.handoff.as_ref().and_then(|h| h.pick(&self.setup.ctx));
        match (&self.setup.handoff, moved) {
            (Some(h), Some(to)) if h.needs_place(&to) => {
                tracing::debug!(parent: self.setup.ctx.span(), reason = cut.label(), upstream = %to.upstream().name,
                    "claiming the answer's place before the cut");
                self.claiming = Some((cut, h.claim(to, &self.setup.ctx)));
                None
            }
            (Some(h), moved) => {
                let moved = moved.map(|to| h.unclaimed(to));
                self.carry_out(cut, moved, observer)
            }
            (None, moved) => self.carry_out(cut, moved, observer),
        }
    }

    /// The deferred `cut`, once the answer upstream's engine answered the claim: with the
    /// place, the answer moves there (with what the first leg sent meanwhile); refused,
    /// an answer already under way stays where it is, and a thought cut short goes on
    /// where it was, as when no answer upstream has room.
    fn claimed(&mut self, cut: Cut, placed: Option<InFlight>, observer: &mut RequestObserver) -> Option<Leg> {
        if placed.is_none() && self.setup.watch.thought_ended() {
            return self.carry_out(Cut::Handoff, None, observer);
        }
        self.carry_out(cut, placed, observer)
    }

    fn carry_out(
        &mut self,
        cut: Cut,
        moved: Option<InFlight>,
        observer: &mut RequestObserver,
    ) -> Option<Leg> {
        if self.setup.handoff.is_some() && moved.is_none() {
            self.setup.metrics.count_handover(HandoverOutcome::NoRoom);
        }
        if cut == Cut::Handoff && moved.is_none() {
            tracing::debug!(parent: self.setup.ctx.span(), "no answer upstream has room; the answer stays");
            self.setup.watch.settle();
            return None;
        }
        let watch = &self.setup.watch;
        let tokens = self.setup.splicer.cut(watch.tokens(), watch.answer_tokens());
        let so_far =
            SoFar { text: watch.text(), tokens, closed: watch.thought_ended(), answer: watch.answer() };
        let Some(body) = second_leg_body(
            &self.setup.first_body,
            self.setup.route,
            &self.setup.delimiters,
            so_far,
            self.setup.asked,
        ) else {
            tracing::debug!(parent: self.setup.ctx.span(), reason = cut.label(), "no room left to continue; thinking goes on");
            self.setup.watch.settle();
            return None;
        };
        self.second = true;
        if moved.is_some() {
            // Counted once the answer has somewhere to go and room left to be given.
            self.setup.metrics.count_handover(HandoverOutcome::Moved);
        }
        // The client's event ends here; what the first leg left pending (a blank line to
        // drop after a dropped chunk) does not carry over to the second.
        self.out.end_leg();
        self.count(cut);
        // The first leg's token counts described a response that is no longer the one
        // the client gets.
        observer.forget_usage();
        self.setup.ctx.progress.set_ending(Ending::Continued);
        let (target, export) = match (&self.setup.handoff, &moved) {
            (Some(h), Some(to)) => (
                h.target(&self.setup.upstream, to.upstream()),
                h.export(&self.setup.upstream, &self.setup.ctx),
            ),
            _ => (self.setup.upstream.clone(), None),
        };
        tracing::debug!(parent: self.setup.ctx.span(), reason = cut.label(), upstream = %target.name, "thinking cut; continuing");
        let leg = spans::leg_span(self.setup.ctx.span(), cut.label(), &target.name);
        Some(Leg { stream: second_leg(target, export, body, leg), held: moved })
    }

    /// Gives up a claim still out when the stream ends (the first leg finished, or the
    /// client went): the hand-over it was for is counted as neither moved nor refused.
    fn drop_claim(&mut self) {
        if self.claiming.take().is_some() {
            self.setup.metrics.count_handover(HandoverOutcome::Ended);
        }
    }

    fn count(&self, cut: Cut) {
        if cut == Cut::Handoff {
            return; // counted as a hand-over
        }
        self.setup.metrics.count_continuation(cut.label());
        match cut {
            Cut::Tokens | Cut::Handoff => {} // the relay's own tracker counts budgets reached
            Cut::Seconds => self.setup.metrics.count_budget_reached(self.setup.ctx.family_name()),
            Cut::Rpdi | Cut::Eat => self.setup.metrics.count_entropy_exit(cut.label()),
        }
    }
}

impl Drop for Continuation {
    fn drop(&mut self) {
        self.drop_claim();
    }
}

/// The continuation as the relay's stage: each chunk of a block is tracked once (lent
/// to the think watch on the first leg) and rewritten for the client; a cut the watch
/// makes due on a chunk ends the first leg right after it, and one due between events
/// (the thinking-time deadline, the EAT prober's word) ends it there.
impl RelayStage for Continuation {
    fn on_bytes(&mut self, block: Bytes, at: Instant, relayed: &mut Relayed<'_>) -> Flow {
        let mut switch_to = None;
        for line in lines(&block) {
            match sse_line(line) {
                SseLine::Data(payload) => {
                    let emit = self.chunk(payload, at, relayed.observer);
                    self.out.chunk(emit, line);
                    // Not once the first leg has ended (a model that stopped while thinking).
                    let cut = self.take_cut().filter(|_| !relayed.answer_ended());
                    if let Some(second) = cut.and_then(|cut| self.cut(cut, relayed.observer)) {
                        switch_to = Some(second);
                        break;
                    }
                }
                SseLine::Done => {
                    *relayed.saw_done = true;
                    self.out.other(line);
                }
                SseLine::Blank | SseLine::Other => {
                    self.out.other(line);
                }
            }
        }
        Flow { out: self.out.take(), switch_to, end: None }
    }

    fn poll_turn(&mut self, cx: &mut Context<'_>, relayed: &mut Relayed<'_>) -> Poll<Flow> {
        // A model that stopped while thinking has nothing left to cut; a place claimed for
        // its answer goes back as the claim is dropped.
        if relayed.answer_ended() {
            self.drop_claim();
            return Poll::Pending;
        }
        let second = match &mut self.claiming {
            Some((cut, claim)) => {
                let Poll::Ready(placed) = claim.as_mut().poll(cx) else { return Poll::Pending };
                let cut = *cut;
                self.claiming = None;
                self.claimed(cut, placed, relayed.observer)
            }
            None => {
                let Poll::Ready(cut) = self.poll_cut(cx) else { return Poll::Pending };
                self.cut(cut, relayed.observer)
            }
        };
        let Some(second) = second else { return Poll::Ready(Flow::default()) };
        Poll::Ready(Flow { out: self.out.take(), switch_to: Some(second), end: None })
    }
}

/// Sends the continuation (after the KV export that precedes a hand-over by connector,
/// whose answer goes with it) and reads it as an event stream; any failure, marked on the
/// leg's span, ends the client's stream with an error event.
fn second_leg(up: Upstream, export: Option<KvExport>, mut body: Value, leg: tracing::Span) -> LegStream {
    let failed = {
        let (name, leg) = (up.name.clone(), leg.clone());
        move |reason: String| {
            let e = ProxyError::UpstreamFailed { upstream: name.clone(), reason };
            spans::fail(&leg, e.outcome().as_str());
            e
        }
    };
    let on_body_error = failed.clone();
    let in_leg = leg.clone();
    let send = async move {
        if let Some(params) = match &export {
            Some(x) => x.run(&body).await,
            None => None,
        } && !params.is_null()
        {
            body["kv_transfer_params"] = params;
        }
        let mut headers = up.headers.clone();
        spans::inject(&leg, &mut headers);
        let send = up.client.post(&up.url).headers(headers).json(&body).send();
        let resp = match tokio::time::timeout(up.first_byte_timeout, send).await {
            Err(_) => {
                spans::fail(&leg, meridian_core::Outcome::UpstreamTimeout.as_str());
                return Err(ProxyError::UpstreamTimeout {
                    upstream: up.name.clone(),
                    after_s: up.first_byte_timeout.as_secs_f64(),
                });
            }
            Ok(Err(e)) => return Err(failed(format!("the continuation could not be sent: {e}"))),
            Ok(Ok(r)) => r,
        };
        leg.record("http.response.status_code", i64::from(resp.status().as_u16()));
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            let text: String = text.chars().take(300).collect();
            return Err(failed(format!("the continuation was refused ({status}): {text}")));
        }
        let streamed = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !streamed {
            return Err(failed("the continuation came back whole, not as an event stream".into()));
        }
        // The leg's span (held by the error mapping) lasts as long as its body is read.
        Ok(resp.bytes_stream().map_err(move |_| on_body_error("the continuation broke off".into())))
    };
    futures::stream::once(send.instrument(in_leg)).try_flatten().boxed()
}

/// What a leg's lines become for the client: chunks kept, rewritten or dropped (with the
/// blank line that ended a dropped one), other lines as they came.
#[derive(Default)]
pub struct Spliced {
    buf: BytesMut,
    skip_blank: bool,
    /// The client holds an event without its closing blank line.
    open_event: bool,
}

impl Spliced {
    /// A line that is not a chunk: a blank line, a comment, `[DONE]`. It goes to the
    /// client, unless it is the blank line that ended a dropped chunk.
    pub fn other(&mut self, line: &[u8]) {
        if line.is_empty() && std::mem::take(&mut self.skip_blank) {
            return;
        }
        self.push_line(line);
        self.open_event = !line.is_empty();
    }

    /// A chunk's `data:` line, as the splicer decided.
    pub fn chunk(&mut self, emit: Emit, line: &[u8]) {
        match emit {
            Emit::Same => self.push_line(line),
            Emit::Changed(chunk) => {
                self.buf.extend_from_slice(b"data: ");
                self.buf.extend_from_slice(&chunk);
                self.buf.extend_from_slice(b"\n");
            }
            Emit::Drop => {
                self.skip_blank = true;
                return;
            }
        }
        self.open_event = true;
    }

    /// The leg is cut here: ends the event the client holds open, and forgets a blank
    /// line still to drop (it belonged to the leg that is gone).
    fn end_leg(&mut self) {
        if std::mem::take(&mut self.open_event) {
            self.buf.extend_from_slice(b"\n");
        }
        self.skip_blank = false;
    }

    pub fn take(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    fn push_line(&mut self, line: &[u8]) {
        self.buf.extend_from_slice(line);
        self.buf.extend_from_slice(b"\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::RequestCtx;
    use crate::ending::continuation::{ClientAsked, Triggers};
    use crate::relay::Served;

    /// A continuation whose first leg is cut after `budget` thinking tokens, and the
    /// relay's state it works on.
    fn continued(budget: u32) -> (Continuation, RequestObserver) {
        let family = meridian_core::ModelRegistry::builtin().ok().and_then(|r| r.get("qwen3").cloned());
        let mut ctx = RequestCtx::detached(crate::ctx::Route::ChatCompletions, family);
        // The observer's tracker says when the budget is spent, as the relay's does.
        ctx.think_budget = Some(budget);
        let ctx = Arc::new(ctx);
        let asked = ClientAsked { usage: false, continuous_usage: false, logprobs: false };
        let first_body = serde_json::json!({"model": "m", "max_tokens": 100, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        let triggers = Triggers { tokens: Some(budget), ..Default::default() };
        let setup = Setup {
            upstream: Upstream {
                client: reqwest::Client::new(),
                // Never reached: the second leg is only sent when the relay reads it.
                url: "http://127.0.0.1:9/v1/chat/completions".into(),
                headers: HeaderMap::new(),
                name: "engine".into(),
                first_byte_timeout: Duration::from_secs(1),
            },
            route: Route::Chat,
            delimiters: Delimiters { open: "<think>".into(), close: "</think>".into() },
            first_body: first_body.as_object().cloned().unwrap_or_default(),
            asked,
            watch: ThinkWatch::new(Route::Chat, triggers),
            splicer: Splicer::new(asked, false),
            end_now: Arc::new(Notify::new()),
            metrics: Arc::new(Metrics::new()),
            ctx: ctx.clone(),
            handoff: None,
        };
        let observer = RequestObserver::new(Arc::new(Metrics::new()), ctx, Served::default(), true);
        (Continuation::new(setup), observer)
    }

    fn thought(text: &str) -> String {
        format!("data: {}\n\n", serde_json::json!({"choices": [{"index": 0, "delta": {"reasoning": text}}]}))
    }

    #[tokio::test]
    async fn the_stage_switches_legs_on_the_chunk_that_spends_the_budget() {
        let (mut stage, mut observer) = continued(2);
        let mut done = false;
        let block = format!("{}{}{}", thought("a"), thought(" b"), thought(" c"));
        let mut relayed = Relayed { observer: &mut observer, saw_done: &mut done };
        let flow = stage.on_bytes(Bytes::from(block), Instant::now(), &mut relayed);
        let out = String::from_utf8(flow.out.map(|b| b.to_vec()).unwrap_or_default()).unwrap_or_default();
        assert!(flow.switch_to.is_some(), "the budget of 2 was spent: the second leg takes over");
        assert!(out.contains("\"a\"") && out.contains("\" b\""), "what came before the cut goes out: {out}");
        assert!(!out.contains("\" c\""), "what the first leg sent after the cut is dropped: {out}");
        assert!(out.ends_with("\n\n"), "the client's last event was closed before the second leg: {out:?}");
        assert_eq!(stage.setup.ctx.progress.ending(), Ending::Continued);
    }

    #[tokio::test]
    async fn a_block_within_the_budget_goes_out_as_the_client_asked_it() {
        let (mut stage, mut observer) = continued(100);
        let mut done = false;
        let block = thought("a");
        let mut relayed = Relayed { observer: &mut observer, saw_done: &mut done };
        let flow = stage.on_bytes(Bytes::from(block.clone()), Instant::now(), &mut relayed);
        assert!(flow.switch_to.is_none());
        assert_eq!(flow.out.as_deref(), Some(block.as_bytes()), "nothing to take out: the same bytes");
    }
}
