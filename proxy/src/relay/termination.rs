//! The relay's stage that ends the stream: whole only with its terminator (`[DONE]` or a
//! `finish_reason` for every choice; `response.completed` on the Responses API,
//! `message_stop` on Messages), else with an `upstream_truncated` error event; a broken
//! stream ends with the API's error event (see [`crate::error::error_event`]), so SSE
//! clients raise instead of waiting. It sets the request's outcome either way.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::stage::{End, Flow, RelayStage, Relayed};
use super::tail::Tail;
use crate::error::ProxyError;

pub struct Termination {
    /// Where the client's stream stands, to place an error event.
    tail: Tail,
    /// The upstream's name, for the error that ends a stream it cut short.
    upstream: Arc<str>,
}

impl Termination {
    pub fn new(upstream: Arc<str>) -> Self {
        Termination { tail: Tail::default(), upstream }
    }

    /// The bytes that end a broken stream: the API's error event. An event left open with
    /// data gets its blank line first; one left open with only its `event:` line (the
    /// Responses and Messages APIs name each event before its data) is continued
    /// instead, since a blank line would dispatch it without data, which clients fail to
    /// parse: the error event's own `event: error` line takes its place.
    fn close_with(&mut self, err: ProxyError, relayed: &mut Relayed<'_>) -> Flow {
        relayed.observer.fail(err.outcome());
        let event = err.sse_event(relayed.observer.dialect(), relayed.observer.next_sequence());
        let out = if self.tail.mid_event_with_data() {
            let mut b = Vec::with_capacity(event.len() + 1);
            b.push(b'\n');
            b.extend_from_slice(&event);
            Bytes::from(b)
        } else {
            event
        };
        self.tail.sent(&out);
        Flow { out: Some(out), switch_to: None, end: Some(End::Closed) }
    }
}

impl RelayStage for Termination {
    fn on_bytes(&mut self, bytes: Bytes, _at: Instant, _relayed: &mut Relayed<'_>) -> Flow {
        self.tail.sent(&bytes);
        Flow::pass(bytes)
    }

    fn on_end(&mut self, end: End, relayed: &mut Relayed<'_>) -> Flow {
        match end {
            // A stream that just stops (a close-delimited body's clean close, a chunked
            // body properly ended) without its terminator is cut short: its answer must
            // not pass for whole.
            End::Whole if !relayed.answer_ended() => {
                tracing::warn!(parent: relayed.observer.span(), upstream = %self.upstream,
                    "upstream ended a stream without [DONE] or finish_reason");
                let err = ProxyError::UpstreamTruncated { upstream: self.upstream.to_string() };
                self.close_with(err, relayed)
            }
            End::Whole => {
                relayed.observer.complete();
                Flow::ending(End::Whole)
            }
            End::Broken(err) => self.close_with(err, relayed),
            End::Closed => Flow::ending(End::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use meridian_core::Outcome;

    use super::*;
    use crate::relay::stage::tests::{chunk, observer};
    use crate::relay::stage::{RelayStage, Tracked};

    fn text(flow: &Flow) -> String {
        String::from_utf8_lossy(flow.out.as_deref().unwrap_or_default()).into_owned()
    }

    #[test]
    fn a_stream_without_its_terminator_ends_in_a_truncation_error_event() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let mut t = Termination::new("engine".into());
        let block = Bytes::from(chunk("content", "Hi", None));
        Tracked.on_bytes(block.clone(), Instant::now(), &mut relayed);
        t.on_bytes(block, Instant::now(), &mut relayed);
        let flow = t.on_end(End::Whole, &mut relayed);
        let out = text(&flow);
        assert!(out.starts_with("data: ") && out.contains("upstream_truncated"), "{out}");
        assert!(matches!(flow.end, Some(End::Closed)));
        assert_eq!(obs.outcome(), Outcome::UpstreamTruncated);
    }

    #[test]
    fn a_stream_with_its_terminator_ends_whole() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let block = Bytes::from(format!("{}data: [DONE]\n\n", chunk("content", "Hi", Some("stop"))));
        Tracked.on_bytes(block.clone(), Instant::now(), &mut relayed);
        let mut t = Termination::new("engine".into());
        t.on_bytes(block, Instant::now(), &mut relayed);
        let flow = t.on_end(End::Whole, &mut relayed);
        assert!(flow.out.is_none() && matches!(flow.end, Some(End::Whole)));
        assert_eq!(obs.outcome(), Outcome::Ok);
    }

    #[test]
    fn an_error_event_closes_an_open_event_that_has_data_but_continues_one_only_named() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let broken =
            || End::Broken(ProxyError::UpstreamFailed { upstream: "e".into(), reason: "gone".into() });
        let mut t = Termination::new("engine".into());
        t.on_bytes(Bytes::from_static(b"data: {}\n"), Instant::now(), &mut relayed);
        let out = text(&t.on_end(broken(), &mut relayed));
        assert!(out.starts_with("\ndata: "), "the open event's blank line first: {out:?}");

        let mut t = Termination::new("engine".into());
        t.on_bytes(
            Bytes::from_static(b"data: {}\n\nevent: response.output_text.delta\n"),
            Instant::now(),
            &mut relayed,
        );
        let out = text(&t.on_end(broken(), &mut relayed));
        assert!(
            !out.starts_with('\n'),
            "an event with only its name is continued, not dispatched empty: {out:?}"
        );
    }
}
