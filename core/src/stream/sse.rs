//! Finds the `data:` payloads in an SSE byte stream that arrives in arbitrary pieces.
//!
//! Lines that lie whole inside one network chunk are handed out in place; only a line
//! split across chunks is copied, into a buffer reused for the life of the stream. Each
//! `data:` line is handed out on its own, as OpenAI-style servers send one JSON object per
//! line; the bytes themselves are relayed untouched either way.

use memchr::memchr;

#[derive(Debug, Default)]
pub struct SseDecoder {
    partial: Vec<u8>,
    done: bool,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `data: [DONE]` was seen.
    pub fn saw_done(&self) -> bool {
        self.done
    }

    /// Feeds one network chunk; calls `on_data` with each complete `data:` payload.
    pub fn feed(&mut self, mut chunk: &[u8], mut on_data: impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            match memchr(b'\n', chunk) {
                None => {
                    self.partial.extend_from_slice(chunk);
                    return;
                }
                Some(nl) => {
                    self.partial.extend_from_slice(&chunk[..nl]);
                    let line = std::mem::take(&mut self.partial);
                    self.line(&line, &mut on_data);
                    self.partial = line;
                    self.partial.clear();
                    chunk = &chunk[nl + 1..];
                }
            }
        }
        while let Some(nl) = memchr(b'\n', chunk) {
            self.line(&chunk[..nl], &mut on_data);
            chunk = &chunk[nl + 1..];
        }
        self.partial.extend_from_slice(chunk);
    }

    fn line(&mut self, line: &[u8], on_data: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(value) = line.strip_prefix(b"data:") else {
            return;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if value == b"[DONE]" {
            self.done = true;
        } else {
            on_data(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payloads(pieces: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for p in pieces {
            d.feed(p, |v| out.push(v.to_vec()));
        }
        out
    }

    #[test]
    fn whole_and_split_lines() {
        let body = b"data: {\"a\":1}\n\n: comment\nevent: x\ndata:{\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        let expected = vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()];
        assert_eq!(payloads(&[body]), expected);
        for cut in 1..body.len() {
            assert_eq!(payloads(&[&body[..cut], &body[cut..]]), expected, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(payloads(&bytes), expected);
    }

    #[test]
    fn done_is_reported_and_partial_lines_wait() {
        let mut d = SseDecoder::new();
        let mut n = 0;
        d.feed(b"data: [DONE]\n\ndata: {\"trunc", |_| n += 1);
        assert!(d.saw_done());
        assert_eq!(n, 0);
    }
}
