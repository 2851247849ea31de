//! Where a client's SSE stream stands between writes: whether an event it was sent is
//! still open. Whatever the proxy adds on its own (an error event, a heartbeat) must not
//! land inside an upstream event.

/// The last three bytes sent to the client, and whether the event it has open carries
/// data yet.
#[derive(Default)]
pub(crate) struct Tail {
    bytes: [u8; 3],
    len: usize,
    open_has_data: bool,
}

impl Tail {
    pub(crate) fn push(&mut self, out: &[u8]) {
        for &b in out.iter().rev().take(3).rev() {
            self.bytes = [self.bytes[1], self.bytes[2], b];
            self.len = (self.len + 1).min(3);
        }
        if !self.mid_event() {
            self.open_has_data = false;
        }
    }

    /// A `data:` line of the event being sent (called for the lines of a block, in
    /// order, before the block is pushed).
    pub(crate) fn saw_data(&mut self) {
        self.open_has_data = true;
    }

    /// A blank line: the event before it is complete.
    pub(crate) fn saw_blank(&mut self) {
        self.open_has_data = false;
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
        t.push(b"data: {}\n");
        assert!(t.mid_event());
        t.push(b"\n");
        assert!(!t.mid_event());
        t.push(b"data: {}\r\n\r\n");
        assert!(!t.mid_event());
        t.push(b"event: x\n");
        assert!(t.mid_event());
        assert!(!t.mid_event_with_data(), "named, no data yet");
        t.saw_data();
        t.push(b"event: y\ndata: {}\n");
        assert!(t.mid_event_with_data());
        // A block that ends one event and names the next: the open one has no data.
        t.saw_blank();
        t.push(b"\nevent: z\n");
        assert!(t.mid_event() && !t.mid_event_with_data());
        t.saw_data();
        t.push(b"\n");
        assert!(!t.mid_event_with_data());
    }
}
