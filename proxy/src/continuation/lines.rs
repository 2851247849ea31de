//! Splits an SSE byte stream into lines, so a stream can be cut exactly after an event.

use bytes::{Bytes, BytesMut};

#[derive(Default)]
pub struct Lines {
    partial: BytesMut,
}

impl Lines {
    /// Adds a network chunk; returns the lines it completed, each without its `\n`.
    pub fn feed(&mut self, chunk: &Bytes) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut rest = chunk.clone();
        while let Some(nl) = memchr::memchr(b'\n', &rest) {
            let line = rest.split_to(nl + 1);
            let line = line.slice(..nl);
            if self.partial.is_empty() {
                out.push(line);
            } else {
                self.partial.extend_from_slice(&line);
                out.push(self.partial.split().freeze());
            }
        }
        self.partial.extend_from_slice(&rest);
        out
    }

    /// The start of a line whose end never came.
    pub fn take_partial(&mut self) -> Bytes {
        self.partial.split().freeze()
    }
}

/// The JSON payload of a `data:` line; `None` for other lines and `[DONE]`.
pub fn data_payload(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let value = line.strip_prefix(b"data:")?;
    let value = value.strip_prefix(b" ").unwrap_or(value);
    (value != b"[DONE]").then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_survive_any_split() {
        let body = b"data: {\"a\":1}\n\ndata: [DONE]\n\n";
        for cut in 0..body.len() {
            let mut l = Lines::default();
            let mut got = l.feed(&Bytes::copy_from_slice(&body[..cut]));
            got.extend(l.feed(&Bytes::copy_from_slice(&body[cut..])));
            let got: Vec<&[u8]> = got.iter().map(|b| &b[..]).collect();
            assert_eq!(got, vec![&b"data: {\"a\":1}"[..], b"", b"data: [DONE]", b""], "cut at {cut}");
            assert!(l.take_partial().is_empty());
        }
        assert_eq!(data_payload(b"data: {\"a\":1}\r"), Some(&b"{\"a\":1}"[..]));
        assert_eq!(data_payload(b"data: [DONE]"), None);
        assert_eq!(data_payload(b": comment"), None);
    }
}
