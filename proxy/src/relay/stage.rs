//! The stage a streamed response's lines go through on their way to the client, behind
//! one small trait ([`RelayStage`]). The relay ([`super::RelayBody`]) does what every stream needs before
//! a stage sees anything (whole lines only, UTF-8 checked, a line no longer than
//! `upstream.max_response_bytes`) and after (an error event that ends a broken stream);
//! the stage tracks each event once and says what the client gets:
//!
//! - [`Tracked`], every stream's: each line goes out as it came, each `data:` payload is
//!   read by the request's observer, which hands it to the request's watchers;
//! - the continuation (`crate::ending::continuation`), a stream whose thinking may be cut
//!   and continued: each chunk is tracked once, rewritten for the client, and at a cut the
//!   relay reads the second leg in place of the first.
//!
//! A stage knows nothing of sockets, so each is tested by handing it blocks of lines.

use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::stream::BoxStream;
use meridian_core::stream::{SseLine, lines, sse_line};

use super::observer::RequestObserver;
use super::tail::Tail;
use crate::error::ProxyError;

/// An upstream response's body as the relay reads it: bytes, or the error that ends the
/// client's stream.
pub type LegStream = BoxStream<'static, Result<Bytes, ProxyError>>;

/// What a stage works with: the request's observer, and what the client has been sent.
pub struct Relayed<'a> {
    pub observer: &'a mut RequestObserver,
    pub(crate) tail: &'a mut Tail,
    /// The upstream sent `[DONE]`.
    pub saw_done: &'a mut bool,
}

impl Relayed<'_> {
    /// The upstream has ended its answer: `[DONE]`, or a `finish_reason` for every choice.
    pub fn answer_ended(&self) -> bool {
        *self.saw_done || self.observer.every_choice_finished()
    }

    /// A `data:` line went to the client (before the block holding it is pushed).
    pub fn saw_data(&mut self) {
        self.tail.saw_data();
    }

    /// A blank line went to the client: the event before it is complete.
    pub fn saw_blank(&mut self) {
        self.tail.saw_blank();
    }

    /// These bytes went to the client.
    pub fn sent(&mut self, out: &[u8]) {
        self.tail.push(out);
    }
}

/// What a stage made of a block of lines, or of the time between two.
#[derive(Default)]
pub struct Flow {
    /// What the client gets now; `None`: nothing.
    pub out: Option<Bytes>,
    /// The leg to read from now on, in place of the current one, which is dropped with
    /// what it has not yet delivered (dropping it cancels its request in the engine).
    pub switch_to: Option<LegStream>,
}

/// A stage of the relay. Both calls run on the relay's hot path: they must not block.
pub trait RelayStage: Send {
    /// Whole lines of the upstream's stream, arrived at `at` (UTF-8, each within the
    /// limit): tracked, and what the client gets of them. What the client gets is the
    /// stage's to note in `relayed` (`saw_data`, `saw_blank`, `sent`).
    fn block(&mut self, block: Bytes, at: Instant, relayed: Relayed<'_>) -> Flow;

    /// Polled before each read of the upstream while its answer is still going: whether
    /// the stage switches legs now, between events (a deadline, a signal from elsewhere).
    fn poll_between(&mut self, _cx: &mut Context<'_>, _relayed: Relayed<'_>) -> Poll<Flow> {
        Poll::Pending
    }
}

/// Every stream's stage: each line goes out as it came, and the observer reads each
/// event exactly as the client gets it, when it gets it.
pub struct Tracked;

impl RelayStage for Tracked {
    fn block(&mut self, block: Bytes, at: Instant, mut relayed: Relayed<'_>) -> Flow {
        for line in lines(&block) {
            match sse_line(line) {
                SseLine::Data(payload) => {
                    relayed.saw_data();
                    relayed.observer.on_payload(payload, at);
                }
                SseLine::Done => {
                    relayed.saw_data();
                    *relayed.saw_done = true;
                }
                SseLine::Blank => relayed.saw_blank(),
                SseLine::Other => {}
            }
        }
        relayed.sent(&block);
        Flow { out: Some(block), switch_to: None }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ctx::{RequestCtx, Route};
    use crate::relay::Served;
    use crate::telemetry::Metrics;

    fn observer() -> RequestObserver {
        let family = meridian_core::ModelRegistry::builtin().ok().and_then(|r| r.get("qwen3").cloned());
        let ctx = Arc::new(RequestCtx::detached(Route::ChatCompletions, family));
        RequestObserver::new(Arc::new(Metrics::new()), ctx, Served::default(), true)
    }

    fn chunk(field: &str, text: &str, finish: Option<&str>) -> String {
        let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"{field}\":\"{text}\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    #[test]
    fn the_tracked_stage_relays_every_line_as_it_came_and_reads_each_event() {
        let (mut obs, mut tail, mut done) = (observer(), Tail::default(), false);
        let block = format!("{}{}", chunk("reasoning_content", "hmm", None), chunk("content", "Hi", None));
        let relayed = Relayed { observer: &mut obs, tail: &mut tail, saw_done: &mut done };
        let flow = Tracked.block(Bytes::from(block.clone()), Instant::now(), relayed);
        assert_eq!(flow.out.as_deref(), Some(block.as_bytes()), "the bytes go out untouched");
        assert!(flow.switch_to.is_none());
        assert!(!tail.mid_event_with_data(), "both events were closed by their blank lines");
        let last = chunk("content", "!", Some("stop"));
        let relayed = Relayed { observer: &mut obs, tail: &mut tail, saw_done: &mut done };
        Tracked.block(Bytes::from(format!("{last}data: [DONE]\n")), Instant::now(), relayed);
        let relayed = Relayed { observer: &mut obs, tail: &mut tail, saw_done: &mut done };
        assert!(relayed.answer_ended(), "the finish_reason and [DONE] were read");
        assert!(done);
        assert!(tail.mid_event_with_data(), "[DONE] still waits for its blank line");
    }
}
