//! Where a client's SSE stream stands between writes: whether an event it was sent is
//! still open. Whatever the proxy adds on its own (an error event, a heartbeat) must not
//! land inside an upstream event.

/// The last three bytes sent to the client.
#[derive(Default)]
pub(crate) struct Tail {
    bytes: [u8; 3],
    len: usize,
}

impl Tail {
    pub(crate) fn push(&mut self, out: &[u8]) {
        for &b in out.iter().rev().take(3).rev() {
            self.bytes = [self.bytes[1], self.bytes[2], b];
            self.len = (self.len + 1).min(3);
        }
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
    }
}
