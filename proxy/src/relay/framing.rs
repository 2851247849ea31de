//! The relay's first stage: the upstream's reads become whole lines, each within
//! `upstream.max_response_bytes`, checked to be UTF-8.
//!
//! Bytes go on up to the last complete line of what has arrived. A half line is useless
//! to an SSE client (it cannot act before the newline), and holding it back means an
//! upstream that dies mid-line leaves the client a well-formed stream that ends in an
//! error event, not a JSON fragment its parser chokes on. In the usual case, one event
//! per network read, nothing is held and nothing is copied; a line split across reads is
//! copied once.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use meridian_core::stream::LineReader;

use super::stage::{End, Flow, RelayStage, Relayed};
use crate::upstream::broken_answer;

pub struct Framing {
    lines: LineReader,
    /// The upstream's name, for the error that ends a stream it broke.
    upstream: Arc<str>,
}

impl Framing {
    pub fn new(max_line: usize, upstream: Arc<str>) -> Self {
        Framing { lines: LineReader::new(max_line), upstream }
    }

    /// The end of an answer the upstream broke (`reason` completes "upstream X …").
    fn broken(&self, reason: String) -> End {
        End::Broken(broken_answer(&self.upstream, reason))
    }
}

impl RelayStage for Framing {
    fn on_bytes(&mut self, chunk: Bytes, _at: Instant, _relayed: &mut Relayed<'_>) -> Flow {
        let mut block = match self.lines.push(&chunk) {
            Ok(Some(block)) => block,
            Ok(None) => return Flow::default(),
            Err(e) => return Flow::ending(self.broken(format!("sent {e} (upstream.max_response_bytes)"))),
        };
        // Whole lines never end inside a UTF-8 sequence, so this checks exactly the
        // characters the client will decode. An engine never sends invalid UTF-8 (vLLM
        // sends U+FFFD for a partial character); relaying it would fail the client's JSON
        // decoder at a random spot. The whole lines before the bad one still go on.
        let Err(e) = std::str::from_utf8(&block) else { return Flow::pass(block) };
        let end =
            self.broken(format!("sent bytes that are not UTF-8 (at byte {} of a chunk)", e.valid_up_to()));
        match memchr::memrchr(b'\n', &block[..e.valid_up_to()]) {
            Some(nl) => {
                block.truncate(nl + 1);
                Flow { out: Some(block), switch_to: None, end: Some(end) }
            }
            None => Flow::ending(end),
        }
    }

    fn on_end(&mut self, end: End, _relayed: &mut Relayed<'_>) -> Flow {
        match end {
            End::Whole if self.lines.has_partial() => {
                Flow::ending(self.broken("ended the stream mid-line".into()))
            }
            end => Flow::ending(end),
        }
    }

    fn switched(&mut self) {
        // A half line of the leg that was left will never be completed.
        self.lines.take_partial();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ProxyError;
    use crate::relay::stage::tests::observer;

    fn framing() -> Framing {
        Framing::new(64, "engine".into())
    }

    fn reason(flow: &Flow) -> Option<String> {
        match &flow.end {
            Some(End::Broken(ProxyError::UpstreamFailed { reason, .. })) => Some(reason.clone()),
            _ => None,
        }
    }

    #[test]
    fn only_whole_lines_go_on_and_a_line_split_across_reads_is_joined() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let mut f = framing();
        let flow = f.on_bytes(Bytes::from_static(b"data: {\"a\""), Instant::now(), &mut relayed);
        assert!(flow.out.is_none() && flow.end.is_none(), "half a line waits");
        let flow = f.on_bytes(Bytes::from_static(b":1}\n\ndata: {"), Instant::now(), &mut relayed);
        assert_eq!(flow.out.as_deref(), Some(&b"data: {\"a\":1}\n\n"[..]));
        let flow = f.on_end(End::Whole, &mut relayed);
        assert!(reason(&flow).is_some_and(|r| r.contains("mid-line")), "a stream cut mid-line is broken");
    }

    #[test]
    fn a_switch_forgets_the_half_line_of_the_leg_that_was_left() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let mut f = framing();
        f.on_bytes(Bytes::from_static(b"data: {\"cut"), Instant::now(), &mut relayed);
        f.switched();
        let flow = f.on_bytes(Bytes::from_static(b"data: {}\n"), Instant::now(), &mut relayed);
        assert_eq!(flow.out.as_deref(), Some(&b"data: {}\n"[..]));
        assert!(matches!(f.on_end(End::Whole, &mut relayed).end, Some(End::Whole)));
    }

    #[test]
    fn bytes_that_are_not_utf8_end_the_stream_after_the_whole_lines_before_them() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let flow =
            framing().on_bytes(Bytes::from_static(b"data: ok\n\ndata: \xff\n"), Instant::now(), &mut relayed);
        assert_eq!(flow.out.as_deref(), Some(&b"data: ok\n\n"[..]), "the good lines still go on");
        assert!(reason(&flow).is_some_and(|r| r.contains("not UTF-8")));
        let flow = framing().on_bytes(Bytes::from_static(b"data: \xff\n"), Instant::now(), &mut relayed);
        assert!(flow.out.is_none() && reason(&flow).is_some());
    }

    #[test]
    fn a_line_past_the_limit_ends_the_stream() {
        let (mut obs, mut done) = (observer(), false);
        let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
        let long = Bytes::from(vec![b'x'; 100]);
        let flow = framing().on_bytes(long, Instant::now(), &mut relayed);
        assert!(reason(&flow).is_some_and(|r| r.contains("max_response_bytes")));
    }
}
