//! Whole lines out of a byte stream that arrives in arbitrary pieces: the one line reader
//! behind the proxy's relay, its continuation legs, and the load tester (through
//! [`super::SseDecoder`]).
//!
//! Lines that lie whole inside one network chunk are handed out in place; only a line
//! split across chunks is copied, into a buffer reused for the life of the stream. A line
//! may grow to a set limit, past which the stream is refused instead of buffered without
//! bound.

use bytes::{Bytes, BytesMut};
use memchr::{memchr, memrchr};

/// A line grew past the reader's limit without its newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a line longer than {limit} bytes")]
pub struct LineTooLong {
    pub limit: usize,
}

#[derive(Debug)]
pub struct LineReader {
    /// The start of a line whose newline has not arrived.
    partial: BytesMut,
    max_line: usize,
    /// A line passed the limit after the lines before it were handed out: the next call
    /// reports it.
    overflowed: bool,
}

impl Default for LineReader {
    fn default() -> Self {
        LineReader::new(usize::MAX)
    }
}

impl LineReader {
    /// A reader that refuses a line longer than `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        LineReader { partial: BytesMut::new(), max_line, overflowed: false }
    }

    /// Adds a chunk; returns the whole lines it completes as one block ending in `\n`
    /// (`None` when it completes none). Zero-copy unless a line spans chunks.
    pub fn push(&mut self, chunk: &Bytes) -> Result<Option<Bytes>, LineTooLong> {
        self.check()?;
        let Some(last_nl) = memrchr(b'\n', chunk) else {
            self.hold(chunk)?;
            return Ok(None);
        };
        let block = if self.partial.is_empty() {
            chunk.slice(..=last_nl)
        } else {
            self.partial.extend_from_slice(&chunk[..=last_nl]);
            self.partial.split().freeze()
        };
        // The whole lines go out even when the rest is already too long; the next call
        // says so.
        self.overflowed = self.hold(&chunk[last_nl + 1..]).is_err();
        Ok(Some(block))
    }

    /// Adds a chunk; calls `on_line` with each whole line it completes (without its
    /// `\n`), borrowed from `chunk` unless the line spans chunks.
    pub fn feed(&mut self, mut chunk: &[u8], mut on_line: impl FnMut(&[u8])) -> Result<(), LineTooLong> {
        self.check()?;
        if !self.partial.is_empty() {
            let Some(nl) = memchr(b'\n', chunk) else { return self.hold(chunk) };
            self.partial.extend_from_slice(&chunk[..nl]);
            on_line(&self.partial);
            self.partial.clear();
            chunk = &chunk[nl + 1..];
        }
        while let Some(nl) = memchr(b'\n', chunk) {
            on_line(&chunk[..nl]);
            chunk = &chunk[nl + 1..];
        }
        self.hold(chunk)
    }

    /// Whether part of a line is waiting for its newline.
    pub fn has_partial(&self) -> bool {
        !self.partial.is_empty()
    }

    /// The start of a line whose end never came (at the end of a stream).
    pub fn take_partial(&mut self) -> Bytes {
        self.partial.split().freeze()
    }

    fn check(&self) -> Result<(), LineTooLong> {
        if self.overflowed { Err(LineTooLong { limit: self.max_line }) } else { Ok(()) }
    }

    fn hold(&mut self, bytes: &[u8]) -> Result<(), LineTooLong> {
        if self.partial.len() + bytes.len() > self.max_line {
            return Err(LineTooLong { limit: self.max_line });
        }
        self.partial.extend_from_slice(bytes);
        Ok(())
    }
}

/// The lines of a block from [`LineReader::push`], each without its `\n`, borrowed from
/// the block.
pub fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = block;
    std::iter::from_fn(move || {
        let nl = memchr(b'\n', rest)?;
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        Some(line)
    })
}

/// What one SSE line is, for a reader of OpenAI-style streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseLine<'a> {
    /// A `data:` line's payload (one JSON chunk, as OpenAI-style servers send).
    Data(&'a [u8]),
    /// `data: [DONE]`.
    Done,
    /// The blank line that ends an event.
    Blank,
    /// A comment, `event:`, `id:`, `retry:` or anything else.
    Other,
}

/// Reads one line (with or without its `\r`).
pub fn sse_line(line: &[u8]) -> SseLine<'_> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return SseLine::Blank;
    }
    let Some(value) = line.strip_prefix(b"data:") else { return SseLine::Other };
    let value = value.strip_prefix(b" ").unwrap_or(value);
    if value == b"[DONE]" { SseLine::Done } else { SseLine::Data(value) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"data: {\"a\":1}\n\n: note\r\ndata: [DONE]\n\n";

    #[test]
    fn blocks_and_lines_survive_any_split() {
        for cut in 0..BODY.len() {
            let mut r = LineReader::default();
            let mut got: Vec<Bytes> = Vec::new();
            for piece in [&BODY[..cut], &BODY[cut..]] {
                if let Some(block) = r.push(&Bytes::copy_from_slice(piece)).unwrap() {
                    assert!(block.ends_with(b"\n"));
                    got.extend(lines(&block).map(Bytes::copy_from_slice));
                }
            }
            let got: Vec<&[u8]> = got.iter().map(|b| &b[..]).collect();
            assert_eq!(
                got,
                vec![&b"data: {\"a\":1}"[..], b"", b": note\r", b"data: [DONE]", b""],
                "cut {cut}"
            );
            assert!(!r.has_partial());
            let mut fed = Vec::new();
            let mut r = LineReader::default();
            r.feed(&BODY[..cut], |l| fed.push(l.to_vec())).unwrap();
            r.feed(&BODY[cut..], |l| fed.push(l.to_vec())).unwrap();
            assert_eq!(fed, got, "feed agrees with push, cut {cut}");
        }
    }

    #[test]
    fn whole_lines_are_not_copied() {
        let chunk = Bytes::from_static(b"data: x\n\ndata: y");
        let mut r = LineReader::default();
        let block = r.push(&chunk).unwrap().unwrap();
        assert_eq!(block.as_ptr(), chunk.as_ptr(), "the block is the chunk itself");
        assert_eq!(r.take_partial(), Bytes::from_static(b"data: y"));
    }

    #[test]
    fn a_line_past_the_limit_is_refused() {
        let mut r = LineReader::new(8);
        assert_eq!(r.push(&Bytes::from_static(b"12345")).unwrap(), None);
        assert_eq!(r.push(&Bytes::from_static(b"6789")), Err(LineTooLong { limit: 8 }));
        let mut r = LineReader::new(8);
        let ok = r.push(&Bytes::from_static(b"ok\n123456789")).unwrap();
        assert_eq!(ok, Some(Bytes::from_static(b"ok\n")), "the lines before still go out");
        assert!(r.push(&Bytes::from_static(b"\n")).is_err(), "then the long one is refused");
        assert!(LineReader::new(8).feed(b"123456789", |_| ()).is_err());
    }

    #[test]
    fn sse_lines_are_classified() {
        assert_eq!(sse_line(b"data: {\"a\":1}\r"), SseLine::Data(b"{\"a\":1}"));
        assert_eq!(sse_line(b"data:{}"), SseLine::Data(b"{}"));
        assert_eq!(sse_line(b"data: [DONE]"), SseLine::Done);
        assert_eq!(sse_line(b"\r"), SseLine::Blank);
        assert_eq!(sse_line(b": keep-alive"), SseLine::Other);
        assert_eq!(sse_line(b"event: x"), SseLine::Other);
    }
}
