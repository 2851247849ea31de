//! The streaming response body: each upstream chunk goes to the client the moment it
//! arrives, and the same bytes feed the phase tracker (on a continued stream's first leg,
//! the bytes as the upstream sent them, before what the client did not ask for is taken
//! out). Upstream failure or silence ends
//! the client's stream with an OpenAI-style error event instead of a hang, as do bytes
//! that are not UTF-8 and a line longer than `upstream.max_response_bytes`; a client that
//! goes away drops this body, which drops the upstream response and so cancels the
//! request in the engine. A stream that ends without its terminator (`[DONE]` or a
//! `finish_reason` for every choice; `response.completed` on the Responses API,
//! `message_stop` on Messages) ends with an `upstream_truncated` error event.
//!
//! Bytes are forwarded up to the last complete line of what has arrived. A half line is
//! useless to an SSE client (it cannot act before the newline), and holding it back means
//! an upstream that dies mid-line leaves the client a well-formed stream that ends in an
//! error event, not a JSON fragment its parser chokes on. In the usual case, one event per
//! network read, nothing is held and nothing is copied; a line split across reads is
//! copied once.
//!
//! What the lines then become is the stream's stage's to say ([`super::stage`]): the
//! tracked stage relays them as they came while the observer reads each event; a stream
//! whose thinking may be cut and continued goes through the continuation's stage
//! instead, which rewrites its chunks and at a cut hands the relay the second leg to
//! read in place of the first.
//!
//! When a drain's grace runs out, the stream ends with a `server_shutting_down` error
//! event; dropping the body then aborts the upstream request.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::observer::RequestObserver;
use super::stage::{Flow, LegStream, RelayStage, Relayed, Tracked};
use super::tail::Tail;
use crate::error::ProxyError;
use crate::telemetry::Metrics;
use crate::upstream::InFlight;
use meridian_core::stream::LineReader;

#[derive(PartialEq)]
enum State {
    Open,
    Done,
}

pin_project_lite::pin_project! {
    #[project = Projected]
    pub struct RelayBody {
        upstream: LegStream,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        // Whole lines of the upstream's stream, at most `upstream.max_response_bytes` each.
        lines: LineReader,
        saw_done: bool,
        observer: RequestObserver,
        metrics: std::sync::Arc<Metrics>,
        in_flight: InFlight,
        state: State,
        // An error to end the stream with, once the lines before it are sent.
        failing: Option<ProxyError>,
        // The last bytes sent, to know whether the client is between events.
        tail: Tail,
        // A drain's grace running out ends the stream (see `crate::drain`).
        #[pin]
        grace_over: WaitForCancellationFutureOwned,
        // What the lines become for the client (see `super::stage`).
        stage: Box<dyn RelayStage>,
    }
}

impl RelayBody {
    /// Relays `upstream`, whose errors end the client's stream with an error event.
    pub fn new(
        upstream: LegStream,
        idle_timeout: Duration,
        observer: RequestObserver,
        metrics: std::sync::Arc<Metrics>,
        in_flight: InFlight,
        grace_over: WaitForCancellationFutureOwned,
        max_line: usize,
    ) -> Self {
        RelayBody {
            upstream,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            lines: LineReader::new(max_line),
            saw_done: false,
            observer,
            metrics,
            in_flight,
            state: State::Open,
            failing: None,
            tail: Tail::default(),
            grace_over,
            stage: Box::new(Tracked),
        }
    }

    /// Relays through `stage` instead of the tracked one (a continuation's: the first
    /// leg's thinking may be cut and the rest of the answer read from a second request,
    /// spliced into one stream).
    pub fn through(mut self, stage: Box<dyn RelayStage>) -> Self {
        self.stage = stage;
        self
    }
}

/// What one turn of the relay comes to.
enum Next {
    /// These bytes go to the client.
    Send(Bytes),
    /// Nothing to send from this turn: turn again.
    Again,
    /// The stream ends with the API's error event for this.
    Fail(ProxyError),
    /// The stream ended whole.
    Done,
    /// Nothing to do until the upstream, the idle timer or the drain wakes the task.
    Pending,
}

impl Stream for RelayBody {
    type Item = Result<Bytes, Infallible>;

    /// Each turn either switches legs between events (the stage's word) or reads the
    /// upstream once; what came of it is sent, ends the stream, or calls for another turn.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        if *this.state == State::Done {
            return Poll::Ready(None);
        }
        if let Some(err) = this.failing.take() {
            return Poll::Ready(Some(Ok(close_with(this.tail, this.observer, this.state, err))));
        }
        loop {
            let next = match this.between_events(cx) {
                Some(next) => next,
                None => match this.upstream.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(chunk))) => this.chunk(chunk),
                    Poll::Ready(Some(Err(err))) => Next::Fail(err),
                    Poll::Ready(None) => this.upstream_ended(),
                    Poll::Pending => this.waiting(cx),
                },
            };
            match next {
                Next::Send(bytes) => return Poll::Ready(Some(Ok(bytes))),
                Next::Again => continue,
                Next::Fail(err) => {
                    return Poll::Ready(Some(Ok(close_with(this.tail, this.observer, this.state, err))));
                }
                Next::Done => {
                    this.observer.complete();
                    *this.state = State::Done;
                    return Poll::Ready(None);
                }
                Next::Pending => return Poll::Pending,
            }
        }
    }
}

impl Projected<'_> {
    /// Reads the next leg in place of the current one; dropping the current leg's
    /// response cancels it in the engine.
    fn switch_to(&mut self, next: LegStream) {
        *self.upstream = next;
        self.lines.take_partial();
    }

    /// A switch between events (a continuation's cut on the thinking-time deadline or
    /// the EAT prober's word), unless the answer already ended (a model that stopped
    /// while thinking); `None` when the stage has nothing to say now.
    fn between_events(&mut self, cx: &mut Context<'_>) -> Option<Next> {
        let relayed =
            Relayed { observer: &mut *self.observer, tail: &mut *self.tail, saw_done: &mut *self.saw_done };
        if relayed.answer_ended() {
            return None;
        }
        let Poll::Ready(flow) = self.stage.poll_between(cx, relayed) else { return None };
        if let Some(next) = flow.switch_to {
            self.switch_to(next);
        }
        Some(flow.out.map_or(Next::Again, Next::Send))
    }

    /// A chunk from the upstream: its whole lines, checked and through the stage.
    fn chunk(&mut self, chunk: Bytes) -> Next {
        let at = Instant::now();
        self.metrics.count_chunk();
        let deadline = tokio::time::Instant::from_std(at) + *self.idle_timeout;
        self.idle.as_mut().reset(deadline);
        let mut out = match self.lines.push(&chunk) {
            Ok(Some(block)) => block,
            Ok(None) => return Next::Again,
            Err(e) => {
                return Next::Fail(self.in_flight.broken(format!("sent {e} (upstream.max_response_bytes)")));
            }
        };
        // Whole lines never end inside a UTF-8 sequence, so this checks exactly the
        // characters the client will decode. An engine never sends invalid UTF-8 (vLLM
        // sends U+FFFD for a partial character); relaying it would fail the client's JSON
        // decoder at a random spot. The whole lines before the bad one still go out.
        if let Err(e) = std::str::from_utf8(&out) {
            let err = self
                .in_flight
                .broken(format!("sent bytes that are not UTF-8 (at byte {} of a chunk)", e.valid_up_to()));
            match memchr::memrchr(b'\n', &out[..e.valid_up_to()]) {
                Some(nl) => {
                    out.truncate(nl + 1);
                    *self.failing = Some(err);
                }
                None => return Next::Fail(err),
            }
        }
        let relayed =
            Relayed { observer: &mut *self.observer, tail: &mut *self.tail, saw_done: &mut *self.saw_done };
        let Flow { out, switch_to } = self.stage.block(out, at, relayed);
        if let Some(next) = switch_to {
            self.switch_to(next);
            // Bad bytes after the switch were dropped with the leg they came on.
            *self.failing = None;
        }
        match (out, self.failing.take()) {
            (Some(bytes), failing) => {
                // The error due goes out on the next poll, after these lines.
                *self.failing = failing;
                Next::Send(bytes)
            }
            // Every line was dropped: an error due goes out now, not later.
            (None, Some(err)) => Next::Fail(err),
            (None, None) => Next::Again,
        }
    }

    /// The upstream's stream ended: whole only with its terminator.
    fn upstream_ended(&mut self) -> Next {
        if self.lines.has_partial() {
            return Next::Fail(self.in_flight.broken("ended the stream mid-line".into()));
        }
        // A stream that just stops (a close-delimited body's clean close, a chunked body
        // properly ended) without `[DONE]` or a finish_reason for every choice is cut
        // short: its answer must not pass for whole.
        if !(*self.saw_done || self.observer.every_choice_finished()) {
            let upstream = self.in_flight.upstream().name.clone();
            tracing::warn!(parent: self.observer.span(), %upstream, "upstream ended a stream without [DONE] or finish_reason");
            return Next::Fail(ProxyError::UpstreamTruncated { upstream });
        }
        Next::Done
    }

    /// Nothing from the upstream yet: unless the drain's grace or the idle timeout ran
    /// out, wait.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Next {
        if self.grace_over.as_mut().poll(cx).is_ready() {
            let upstream = &self.in_flight.upstream().name;
            tracing::info!(parent: self.observer.span(), %upstream, "ending a stream still open when the shutdown grace ran out");
            return Next::Fail(ProxyError::ShuttingDown);
        }
        if self.idle.as_mut().poll(cx).is_ready() {
            let upstream = self.in_flight.upstream().name.clone();
            tracing::warn!(parent: self.observer.span(), %upstream, "upstream stream went silent");
            return Next::Fail(ProxyError::UpstreamTimeout {
                upstream,
                after_s: self.idle_timeout.as_secs_f64(),
            });
        }
        Next::Pending
    }
}

/// The bytes that end a broken stream: the API's error event (see
/// [`crate::error::error_event`]), so SSE clients raise instead of waiting. An event left
/// open with data gets its blank line first; one left open with only its `event:` line
/// (the Responses and Messages APIs name each event before its data) is continued
/// instead, since a blank line would dispatch it without data, which clients fail to
/// parse: the error event's own `event: error` line takes its place.
fn close_with(tail: &Tail, observer: &mut RequestObserver, state: &mut State, err: ProxyError) -> Bytes {
    observer.fail(err.outcome());
    *state = State::Done;
    let event = err.sse_event(observer.dialect(), observer.next_sequence());
    if tail.mid_event_with_data() {
        let mut b = Vec::with_capacity(event.len() + 1);
        b.push(b'\n');
        b.extend_from_slice(&event);
        Bytes::from(b)
    } else {
        event
    }
}
