//! The relay as a pipeline of stages behind one small trait ([`RelayStage`]). What the
//! upstream sends goes down the pipeline a block at a time; each stage does one job and
//! hands what it made to the next:
//!
//! 1. framing ([`super::framing`]): whole lines only, each within
//!    `upstream.max_response_bytes`, UTF-8 checked;
//! 2. the tracking stage, one of two:
//!    - [`Tracked`], every stream's: each line goes on as it came, and each `data:`
//!      payload is read once by the request's observer, which hands it to the request's
//!      watchers;
//!    - the continuation (`crate::ending::continuation`), a stream whose thinking may be
//!      cut and continued: each chunk is tracked once, rewritten for the client, and at a
//!      cut the relay reads the second leg in place of the first;
//! 3. termination ([`super::termination`]): a stream ends whole only with its terminator,
//!    a broken one ends with the API's error event, and the request's outcome is set;
//! 4. heartbeats ([`super::heartbeat`]): a comment to the client after a silence.
//!
//! The relay itself ([`super::RelayBody`]) only reads the upstream (with its idle timeout
//! and the drain's grace) and sends what comes out of the last stage. No stage knows of
//! sockets, so each is tested by handing it bytes.

use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use meridian_core::stream::{SseLine, lines, sse_line};

use super::observer::RequestObserver;
use crate::error::ProxyError;
use crate::upstream::InFlight;

/// An upstream response's body as the relay reads it: bytes, or the error that ends the
/// client's stream.
pub type LegStream = BoxStream<'static, Result<Bytes, ProxyError>>;

/// A leg the relay reads from in place of the current one: its body, and, for a leg on
/// another upstream (an answer handed over at the end of its thought), its place counted
/// there, which takes over from the current leg's.
pub struct Leg {
    pub stream: LegStream,
    pub held: Option<InFlight>,
}

impl From<LegStream> for Leg {
    /// A leg on the same upstream.
    fn from(stream: LegStream) -> Self {
        Leg { stream, held: None }
    }
}

/// What every stage may look at: the request's observer, and what it read of the end.
pub struct Relayed<'a> {
    pub observer: &'a mut RequestObserver,
    /// The upstream sent `[DONE]`.
    pub saw_done: &'a mut bool,
}

impl Relayed<'_> {
    /// The upstream has ended its answer: `[DONE]`, or a `finish_reason` for every choice.
    pub fn answer_ended(&self) -> bool {
        *self.saw_done || self.observer.every_choice_finished()
    }
}

/// How the stream ends, as it passes down the stages.
pub enum End {
    /// The upstream's stream ended (whole, unless a stage finds it was cut short).
    Whole,
    /// The stream is broken: it ends with this error's event.
    Broken(ProxyError),
    /// The error event has been made; nothing more goes out.
    Closed,
}

/// What a stage made of what it was handed.
#[derive(Default)]
pub struct Flow {
    /// What goes on to the next stage (from the last one, to the client); `None`: nothing.
    pub out: Option<Bytes>,
    /// The leg to read from now on, in place of the current one, which is dropped with
    /// what it has not yet delivered (dropping it cancels its request in the engine).
    pub switch_to: Option<Leg>,
    /// The stream ends, once `out` has gone.
    pub end: Option<End>,
}

impl Flow {
    /// `bytes` go on.
    pub fn pass(bytes: Bytes) -> Self {
        Flow { out: Some(bytes), ..Flow::default() }
    }

    /// The stream ends as `end` says, with nothing more from this stage.
    pub fn ending(end: End) -> Self {
        Flow { end: Some(end), ..Flow::default() }
    }

    /// This flow, then `later`'s: the bytes of both, in order, and `later`'s end.
    fn then(self, later: Flow) -> Flow {
        let out = match (self.out, later.out) {
            (Some(a), Some(b)) => {
                // Only where a stream ends with bytes still due before its end: rare.
                let mut both = BytesMut::with_capacity(a.len() + b.len());
                both.extend_from_slice(&a);
                both.extend_from_slice(&b);
                Some(both.freeze())
            }
            (a, b) => a.or(b),
        };
        Flow { out, switch_to: later.switch_to.or(self.switch_to), end: later.end.or(self.end) }
    }
}

/// A stage of the relay. Every call runs on the relay's hot path: none may block.
pub trait RelayStage: Send {
    /// Bytes from the stage before (the first stage gets the upstream's reads), arrived
    /// at `at`.
    fn on_bytes(&mut self, bytes: Bytes, at: Instant, relayed: &mut Relayed<'_>) -> Flow;

    /// Polled on each turn of the relay, before it reads the upstream: what the stage
    /// has to say by itself between reads (a cut on a deadline, a heartbeat). What it
    /// makes goes on through the stages after it.
    fn poll_turn(&mut self, _cx: &mut Context<'_>, _relayed: &mut Relayed<'_>) -> Poll<Flow> {
        Poll::Pending
    }

    /// The stream ends as `end` says (the upstream's stream ended, or broke, or a stage
    /// before this one found it broken): what this stage adds, and how it ends now.
    fn on_end(&mut self, end: End, _relayed: &mut Relayed<'_>) -> Flow {
        Flow::ending(end)
    }

    /// The relay now reads a new leg: forget what was held of the old one.
    fn switched(&mut self) {}
}

impl<S: RelayStage + ?Sized> RelayStage for Box<S> {
    fn on_bytes(&mut self, bytes: Bytes, at: Instant, relayed: &mut Relayed<'_>) -> Flow {
        (**self).on_bytes(bytes, at, relayed)
    }

    fn poll_turn(&mut self, cx: &mut Context<'_>, relayed: &mut Relayed<'_>) -> Poll<Flow> {
        (**self).poll_turn(cx, relayed)
    }

    fn on_end(&mut self, end: End, relayed: &mut Relayed<'_>) -> Flow {
        (**self).on_end(end, relayed)
    }

    fn switched(&mut self) {
        (**self).switched();
    }
}

/// Two stages in a row: what the first makes, the second is handed.
pub struct Then<A, B> {
    first: A,
    second: B,
}

impl<A, B> Then<A, B> {
    pub fn new(first: A, second: B) -> Self {
        Then { first, second }
    }
}

impl<A: RelayStage, B: RelayStage> Then<A, B> {
    /// Hands what the first stage made to the second.
    fn carry(&mut self, made: Flow, at: Instant, relayed: &mut Relayed<'_>) -> Flow {
        let Flow { out, switch_to, end } = made;
        let mut flow = match out {
            Some(bytes) => self.second.on_bytes(bytes, at, relayed),
            None => Flow::default(),
        };
        if flow.switch_to.is_some() {
            // The second stage left the leg the first one read: an end the first came to
            // on that leg's bytes (bad bytes after a cut) went with it.
            return flow;
        }
        if switch_to.is_some() {
            flow.switch_to = switch_to;
        }
        match end {
            Some(end) if flow.end.is_none() => {
                let ended = self.second.on_end(end, relayed);
                flow.then(ended)
            }
            _ => flow,
        }
    }
}

impl<A: RelayStage, B: RelayStage> RelayStage for Then<A, B> {
    fn on_bytes(&mut self, bytes: Bytes, at: Instant, relayed: &mut Relayed<'_>) -> Flow {
        let made = self.first.on_bytes(bytes, at, relayed);
        self.carry(made, at, relayed)
    }

    fn poll_turn(&mut self, cx: &mut Context<'_>, relayed: &mut Relayed<'_>) -> Poll<Flow> {
        if let Poll::Ready(made) = self.first.poll_turn(cx, relayed) {
            return Poll::Ready(self.carry(made, Instant::now(), relayed));
        }
        self.second.poll_turn(cx, relayed)
    }

    fn on_end(&mut self, end: End, relayed: &mut Relayed<'_>) -> Flow {
        let mut made = self.first.on_end(end, relayed);
        // Every stage after it hears of the end, whatever the first made of it.
        made.end.get_or_insert(End::Closed);
        self.carry(made, Instant::now(), relayed)
    }

    fn switched(&mut self) {
        self.first.switched();
        self.second.switched();
    }
}

/// Every stream's tracking stage: each line goes on as it came, and the observer reads
/// each event exactly as the client gets it, when it gets it.
pub struct Tracked;

impl RelayStage for Tracked {
    fn on_bytes(&mut self, block: Bytes, at: Instant, relayed: &mut Relayed<'_>) -> Flow {
        for line in lines(&block) {
            match sse_line(line) {
                SseLine::Data(payload) => relayed.observer.on_payload(payload, at),
                SseLine::Done => *relayed.saw_done = true,
                SseLine::Blank | SseLine::Other => {}
            }
        }
        Flow::pass(block)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ctx::{RequestCtx, Route};
    use crate::relay::Served;
    use crate::telemetry::Metrics;

    pub(crate) fn observer() -> RequestObserver {
        let family = meridian_core::ModelRegistry::builtin().ok().and_then(|r| r.get("qwen3").cloned());
        let ctx = Arc::new(RequestCtx::detached(Route::ChatCompletions, family));
        RequestObserver::new(Arc::new(Metrics::new()), ctx, Served::default(), true)
    }

    pub(crate) fn chunk(field: &str, text: &str, finish: Option<&str>) -> String {
        let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"{field}\":\"{text}\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    #[test]
    fn the_tracked_stage_relays_every_line_as_it_came_and_reads_each_event() {
        let (mut obs, mut done) = (observer(), false);
        let block = format!("{}{}", chunk("reasoning_content", "hmm", None), chunk("content", "Hi", None));
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let flow = Tracked.on_bytes(Bytes::from(block.clone()), Instant::now(), &mut relayed);
        assert_eq!(flow.out.as_deref(), Some(block.as_bytes()), "the bytes go on untouched");
        assert!(flow.switch_to.is_none() && flow.end.is_none());
        assert!(!relayed.answer_ended());
        let last = chunk("content", "!", Some("stop"));
        Tracked.on_bytes(Bytes::from(format!("{last}data: [DONE]\n")), Instant::now(), &mut relayed);
        assert!(relayed.answer_ended(), "the finish_reason and [DONE] were read");
        assert!(done);
    }

    /// A stage that says what it was handed, and how many times it heard of a switch.
    #[derive(Default)]
    struct Spy {
        got: Vec<u8>,
        ends: Vec<&'static str>,
        switched: usize,
    }

    impl RelayStage for Spy {
        fn on_bytes(&mut self, bytes: Bytes, _at: Instant, _relayed: &mut Relayed<'_>) -> Flow {
            self.got.extend_from_slice(&bytes);
            Flow::pass(bytes)
        }

        fn on_end(&mut self, end: End, _relayed: &mut Relayed<'_>) -> Flow {
            self.ends.push(match end {
                End::Whole => "whole",
                End::Broken(_) => "broken",
                End::Closed => "closed",
            });
            Flow::ending(end)
        }

        fn switched(&mut self) {
            self.switched += 1;
        }
    }

    /// A first stage that passes its bytes on and then finds the stream broken, and
    /// optionally switches legs on the same bytes.
    struct PassThenBreak;

    impl RelayStage for PassThenBreak {
        fn on_bytes(&mut self, bytes: Bytes, _at: Instant, _relayed: &mut Relayed<'_>) -> Flow {
            let err = ProxyError::UpstreamTruncated { upstream: "e".into() };
            Flow { out: Some(bytes), switch_to: None, end: Some(End::Broken(err)) }
        }
    }

    /// A second stage that switches legs on whatever it is handed.
    struct Switches;

    impl RelayStage for Switches {
        fn on_bytes(&mut self, bytes: Bytes, _at: Instant, _relayed: &mut Relayed<'_>) -> Flow {
            Flow {
                out: Some(bytes),
                switch_to: Some(Leg::from(Box::pin(futures::stream::empty()) as LegStream)),
                end: None,
            }
        }
    }

    #[test]
    fn an_end_found_by_a_stage_reaches_the_stages_after_it_after_the_bytes_before_it() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let mut pipe = Then::new(PassThenBreak, Spy::default());
        let flow = pipe.on_bytes(Bytes::from_static(b"data: x\n"), Instant::now(), &mut relayed);
        assert_eq!(pipe.second.got, b"data: x\n", "the bytes before the break go on first");
        assert_eq!(pipe.second.ends, ["broken"]);
        assert!(matches!(flow.end, Some(End::Broken(_))));
        pipe.switched();
        assert_eq!(pipe.second.switched, 1, "a switch is heard by every stage");
    }

    #[test]
    fn a_switch_after_a_stage_drops_the_end_it_found_on_the_old_leg() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let mut pipe = Then::new(PassThenBreak, Then::new(Switches, Spy::default()));
        let flow = pipe.on_bytes(Bytes::from_static(b"data: x\n"), Instant::now(), &mut relayed);
        assert!(flow.switch_to.is_some());
        assert!(flow.end.is_none(), "the break belonged to the leg that was left");
        assert!(pipe.second.second.ends.is_empty());
    }

    #[test]
    fn every_stage_hears_of_the_end_even_one_a_stage_before_it_closed() {
        struct Closes;
        impl RelayStage for Closes {
            fn on_bytes(&mut self, bytes: Bytes, _: Instant, _: &mut Relayed<'_>) -> Flow {
                Flow::pass(bytes)
            }
            fn on_end(&mut self, _end: End, _: &mut Relayed<'_>) -> Flow {
                Flow { out: Some(Bytes::from_static(b"bye\n")), switch_to: None, end: None }
            }
        }
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let mut pipe = Then::new(Closes, Spy::default());
        let flow = pipe.on_end(End::Whole, &mut relayed);
        assert_eq!(pipe.second.got, b"bye\n");
        assert_eq!(pipe.second.ends, ["closed"]);
        assert_eq!(flow.out.as_deref(), Some(&b"bye\n"[..]));
    }
}
