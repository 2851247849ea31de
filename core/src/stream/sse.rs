//! The `data:` payloads of an SSE byte stream that arrives in arbitrary pieces, for
//! readers that hold no `Bytes` (the load tester): lines from [`LineReader::feed`],
//! borrowed in place unless one spans pieces. Each `data:` line is handed out on its own,
//! as OpenAI-style servers send one JSON object per line.

use super::lines::{LineReader, SseLine, sse_line};

#[derive(Debug, Default)]
pub struct SseDecoder {
    lines: LineReader,
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
    pub fn feed(&mut self, chunk: &[u8], mut on_data: impl FnMut(&[u8])) {
        let done = &mut self.done;
        // No line limit here: the proxy, which must bound memory, limits its own reader.
        let _ = self.lines.feed(chunk, |line| match sse_line(line) {
            SseLine::Data(payload) => on_data(payload),
            SseLine::Done => *done = true,
            SseLine::Blank | SseLine::Other => {}
        });
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
