//! The streaming response body: reads the upstream and sends the client what comes out
//! of the relay's stages ([`super::stage`]), each upstream read the moment it arrives.
//! Upstream failure or silence ends the client's stream with an OpenAI-style error event
//! instead of a hang (the termination stage makes it); a client that goes away drops
//! this body, which drops the upstream response and so cancels the request in the
//! engine (unless the answer's end had already gone out: then it counts as
//! completed). When a drain's grace runs out, the stream ends with a `server_shutting_down`
//! error event; dropping the body then aborts the upstream request.
//!
//! The body knows how to read an upstream and nothing of what its bytes mean: whole
//! lines, tracking, a continuation's cut, the terminator, heartbeats are the stages'.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::framing::Framing;
use super::heartbeat::Heartbeat;
use super::observer::RequestObserver;
use super::silence::Silence;
use super::stage::{End, Flow, LegStream, RelayStage, Relayed, Then};
use super::termination::Termination;
use crate::error::ProxyError;
use crate::telemetry::Metrics;
use crate::upstream::InFlight;

/// The stages a streamed answer goes through, in order: framing, `tracking` (the
/// tracked stage, or a continuation's), termination, and heartbeats every `heartbeat`
/// of silence (`None`: none).
pub fn stages(
    tracking: Box<dyn RelayStage>,
    max_line: usize,
    upstream: &str,
    heartbeat: Option<Duration>,
) -> Box<dyn RelayStage> {
    let upstream: Arc<str> = Arc::from(upstream);
    let tracked = Then::new(Framing::new(max_line, upstream.clone()), tracking);
    let ended = Then::new(tracked, Termination::new(upstream));
    match heartbeat {
        Some(every) => Box::new(Then::new(ended, Heartbeat::new(every))),
        None => Box::new(ended),
    }
}

pin_project_lite::pin_project! {
    /// What the body reads: the current leg, with the idle timeout and the drain's grace.
    #[project = Reading]
    struct Reader {
        upstream: LegStream,
        // The upstream's silence that ends the stream (`upstream.idle_timeout_s`).
        idle: Silence,
        // A drain's grace running out ends the stream (see `crate::drain`).
        #[pin]
        grace_over: WaitForCancellationFutureOwned,
        metrics: Arc<Metrics>,
        in_flight: InFlight,
        // The request's span, for what is logged of the stream's end.
        span: tracing::Span,
    }
}

pin_project_lite::pin_project! {
    pub struct RelayBody {
        #[pin]
        reader: Reader,
        observer: RequestObserver,
        saw_done: bool,
        stages: Box<dyn RelayStage>,
        done: bool,
    }

    /// A client that hangs up once it has its answer's end (`[DONE]`, or every
    /// choice's `finish_reason`, or the API's end-of-response event) has had the
    /// whole answer; the upstream may simply not have closed its body yet (the
    /// `openai` client closes its connection at `[DONE]`). The answer is counted as
    /// completed, not as a departure.
    impl PinnedDrop for RelayBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let relayed = Relayed { observer: this.observer, saw_done: this.saw_done };
            if !*this.done && relayed.answer_ended() {
                this.observer.complete();
            }
        }
    }
}

impl RelayBody {
    /// Relays `upstream` through `stages` (see [`stages`]).
    pub fn new(
        upstream: LegStream,
        idle_timeout: Duration,
        observer: RequestObserver,
        metrics: Arc<Metrics>,
        in_flight: InFlight,
        grace_over: WaitForCancellationFutureOwned,
        stages: Box<dyn RelayStage>,
    ) -> Self {
        let span = observer.span().clone();
        let idle = Silence::new(idle_timeout);
        let reader = Reader { upstream, idle, grace_over, metrics, in_flight, span };
        RelayBody { reader, observer, saw_done: false, stages, done: false }
    }
}

/// What one read of the upstream came to.
enum Read {
    Chunk(Bytes, Instant),
    End(End),
    Pending,
}

impl Stream for RelayBody {
    type Item = Result<Bytes, Infallible>;

    /// Each turn, the stages say what they have by themselves (a cut, a heartbeat), or
    /// else the upstream is read once and what it sent goes down the stages; what comes
    /// out goes to the client, and a stage's end ends the stream after it.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        let mut reader = this.reader.project();
        let mut relayed = Relayed { observer: this.observer, saw_done: this.saw_done };
        while !*this.done {
            let flow = match this.stages.poll_turn(cx, &mut relayed) {
                Poll::Ready(flow) => flow,
                Poll::Pending => match reader.read(cx) {
                    Read::Chunk(chunk, at) => this.stages.on_bytes(chunk, at, &mut relayed),
                    Read::End(end) => {
                        let mut flow = this.stages.on_end(end, &mut relayed);
                        flow.end.get_or_insert(End::Closed);
                        flow
                    }
                    Read::Pending => return Poll::Pending,
                },
            };
            let Flow { out, switch_to, end } = flow;
            if let Some(next) = switch_to {
                // Dropping the current leg's response cancels it in the engine.
                *reader.upstream = next.stream;
                if let Some(held) = next.held {
                    // The new leg is on another upstream: the old one's place is free.
                    relayed.observer.moved_to(held.upstream());
                    *reader.in_flight = held;
                }
                this.stages.switched();
            }
            *this.done = end.is_some();
            if let Some(bytes) = out {
                return Poll::Ready(Some(Ok(bytes)));
            }
        }
        Poll::Ready(None)
    }
}

impl Reading<'_> {
    /// One read of the upstream; while it has nothing, unless the drain's grace or the
    /// idle timeout ran out, wait.
    fn read(&mut self, cx: &mut Context<'_>) -> Read {
        match self.upstream.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let at = Instant::now();
                self.metrics.count_chunk();
                self.idle.heard(tokio::time::Instant::from_std(at));
                Read::Chunk(chunk, at)
            }
            Poll::Ready(Some(Err(err))) => Read::End(End::Broken(err)),
            Poll::Ready(None) => Read::End(End::Whole),
            Poll::Pending => self.waiting(cx).map_or(Read::Pending, |err| Read::End(End::Broken(err))),
        }
    }

    /// Why the stream ends while the upstream sends nothing, if it does.
    fn waiting(&mut self, cx: &mut Context<'_>) -> Option<ProxyError> {
        let upstream = &self.in_flight.upstream().name;
        if self.grace_over.as_mut().poll(cx).is_ready() {
            tracing::info!(parent: &*self.span, %upstream, "ending a stream still open when the shutdown grace ran out");
            return Some(ProxyError::ShuttingDown);
        }
        if self.idle.poll_over(cx).is_ready() {
            tracing::warn!(parent: &*self.span, %upstream, "upstream stream went silent");
            let after_s = self.idle.length().as_secs_f64();
            return Some(ProxyError::UpstreamTimeout { upstream: upstream.clone(), after_s });
        }
        None
    }
}
