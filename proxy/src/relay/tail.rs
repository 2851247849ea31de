//! Where a client's SSE stream stands between writes: whether an event it was sent is
//! still open. Whatever the proxy adds on its own (an error event, a heartbeat) must not
//! land inside an upstream event.

use meridian_core::stream::{SseLine, lines, sse_line};

/// The last three bytes sent to the client, and whether the event it has open carries
/// data yet.
#[derive(Default)]
pub(crate) struct Tail {
    bytes: [u8; 3],
    len: usize,
    open_has_data: bool,
}

impl Tail {
    /// These bytes went to the client: only their last three are kept.
    pub(crate) fn push(&mut self, out: &[u8]) {
        for &b in out.iter().rev().take(3).rev() {
            self.bytes = [self.bytes[1], self.bytes[2], b];
            self.len = (self.len + 1).min(3);
        }
    }

    /// These whole lines went to the client: where it stands, and whether the event they
    /// leave open has a `data:` line. The lines are read only when they leave an event
    /// open, which a stream of whole events (one per read, the usual case) never does.
    pub(crate) fn sent(&mut self, out: &[u8]) {
        self.push(out);
        if !self.mid_event() {
            self.open_has_data = false;
            return;
        }
        for line in lines(out) {
            match sse_line(line) {
                SseLine::Data(_) | SseLine::Done => self.open_has_data = true,
                SseLine::Blank => self.open_has_data = false,
                SseLine::Other => {}
            }
        }
    }

    /// Whether the client has an event open that already carries data: ending it needs a
    /// blank line first. One open with only its `event:` line (the Responses and
    /// Messages APIs name each event before its data) is better continued: a blank line
    /// would dispatch it without data, which clients fail to parse.
    pub(crate) fn mid_event_with_data(&self) -> bool {
        self.mid_event() && self.open_has_data
    }

    /// Whether the client has a started event that still needs its blank line.
    pub(crate) fn mid_event(&self) -> bool {
        let b = &self.bytes[3 - self.len..];
        !(self.len == 0 || b.ends_with(b"\n\n") || b.ends_with(b"\n\r\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::Tail;

    #[test]
    fn an_event_is_open_until_its_blank_line() {
        let mut t = Tail::default();
        assert!(!t.mid_event(), "nothing sent yet");
        t.sent(b"data: {}\n");
        assert!(t.mid_event() && t.mid_event_with_data());
        t.sent(b"\n");
        assert!(!t.mid_event());
        t.sent(b"data: {}\r\n\r\n");
        assert!(!t.mid_event());
        t.sent(b"event: x\n");
        assert!(t.mid_event());
        assert!(!t.mid_event_with_data(), "named, no data yet");
        t.sent(b"data: {}\n");
        assert!(t.mid_event_with_data(), "its data came in a later write");
        // A write that ends one event and names the next: the open one has no data.
        t.sent(b"\nevent: z\n");
        assert!(t.mid_event() && !t.mid_event_with_data());
        t.sent(b"data: [DONE]\r\n");
        assert!(t.mid_event_with_data());
        t.sent(b"\n");
        assert!(!t.mid_event_with_data());
    }
}
