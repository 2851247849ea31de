//! Streaming search for boundary markers (`<think>`, `</think>`, harmony's `<|channel|>`, …)
//! in text that arrives in arbitrary pieces.
//!
//! A marker may be split across any number of deltas (an upstream is free to cut a token's
//! text, and a proxy sees TCP reads, not tokens). The scanner holds back only the shortest
//! tail that could still become a marker, so plain text is released immediately and a
//! marker is reported exactly once whatever the split. State is a fixed-size array: feeding
//! never allocates.

use arrayvec::ArrayVec;

/// Longest marker the scanner accepts, in bytes. Held-back tails are shorter than this.
pub const MAX_MARKER_LEN: usize = 64;

/// What a marker stands for in the phase state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// Opens a think block (`<think>`).
    ThinkStart,
    /// Closes a think block (`</think>`).
    ThinkEnd,
    /// Harmony `<|start|>`: a new message header begins.
    HarmonyStart,
    /// Harmony `<|channel|>`: the channel name follows.
    HarmonyChannel,
    /// Harmony `<|message|>`: the message body follows.
    HarmonyMessage,
    /// Harmony `<|end|>`, `<|return|>` or `<|call|>`: the message body ended.
    HarmonyEnd,
}

/// An immutable, shareable set of markers compiled for fast scanning.
#[derive(Debug, Clone)]
pub struct MarkerSet {
    markers: Vec<(Box<[u8]>, MarkerKind)>,
    first_byte: [bool; 256],
}

/// A piece of scanned text: plain bytes, or one whole marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a [u8]),
    Marker(MarkerKind),
}

/// Why a marker set could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkerError {
    #[error("boundary marker must not be empty")]
    Empty,
    #[error("boundary marker {0:?} is longer than {MAX_MARKER_LEN} bytes")]
    TooLong(String),
}

enum Match {
    Full(usize),
    Partial,
    None,
}

impl MarkerSet {
    pub fn new<'a>(markers: impl IntoIterator<Item = (&'a str, MarkerKind)>) -> Result<Self, MarkerError> {
        let mut set = MarkerSet { markers: Vec::new(), first_byte: [false; 256] };
        for (text, kind) in markers {
            let bytes = text.as_bytes();
            if bytes.is_empty() {
                return Err(MarkerError::Empty);
            }
            if bytes.len() > MAX_MARKER_LEN {
                return Err(MarkerError::TooLong(text.to_owned()));
            }
            set.first_byte[bytes[0] as usize] = true;
            set.markers.push((bytes.into(), kind));
        }
        // Longest first, so a marker that extends another one wins.
        set.markers.sort_by_key(|m| std::cmp::Reverse(m.0.len()));
        Ok(set)
    }

    pub fn is_empty(&self) -> bool {
        self.markers.is_empty()
    }

    /// Whether any marker occurs whole in `text`.
    pub fn occurs_in(&self, text: &[u8]) -> bool {
        text.iter().enumerate().any(|(i, b)| {
            self.first_byte[*b as usize] && self.markers.iter().any(|(m, _)| text[i..].starts_with(m))
        })
    }

    fn match_at(&self, rest: &[u8]) -> Match {
        let mut partial = false;
        for (i, (m, _)) in self.markers.iter().enumerate() {
            if rest.starts_with(m) {
                return Match::Full(i);
            }
            if rest.len() < m.len() && m.starts_with(rest) {
                partial = true;
            }
        }
        if partial { Match::Partial } else { Match::None }
    }
}

/// Per-stream scanner state: the held-back tail of the previous delta.
#[derive(Debug, Default, Clone)]
pub struct Scanner {
    carry: ArrayVec<u8, MAX_MARKER_LEN>,
}

impl Scanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held back because they may be the start of a marker.
    pub fn pending(&self) -> &[u8] {
        &self.carry
    }

    /// Scans one delta, reporting text and markers in order.
    pub fn feed(&mut self, set: &MarkerSet, chunk: &[u8], mut sink: impl FnMut(Piece<'_>)) {
        let mut resume_at = 0;
        if !self.carry.is_empty() {
            match self.resolve_carry(set, chunk, &mut sink) {
                Some(offset) => resume_at = offset,
                None => return,
            }
        }
        self.scan(set, &chunk[resume_at..], false, &mut sink);
    }

    /// Ends the stream: whatever was held back is plain text after all.
    pub fn finish(&mut self, set: &MarkerSet, mut sink: impl FnMut(Piece<'_>)) {
        let carry = std::mem::take(&mut self.carry);
        self.scan(set, &carry, true, &mut sink);
    }

    /// Joins the held-back tail with the head of `chunk` and settles it. Returns where the
    /// scan of `chunk` resumes, or `None` when the whole chunk was absorbed into a longer
    /// held-back tail.
    fn resolve_carry(
        &mut self,
        set: &MarkerSet,
        chunk: &[u8],
        sink: &mut impl FnMut(Piece<'_>),
    ) -> Option<usize> {
        let carried = self.carry.len();
        let mut joint: ArrayVec<u8, { 2 * MAX_MARKER_LEN }> = ArrayVec::new();
        joint.extend(self.carry.iter().copied());
        let head = chunk.len().min(MAX_MARKER_LEN);
        joint.extend(chunk[..head].iter().copied());
        self.carry.clear();

        for i in 0..carried {
            if !set.first_byte[joint[i] as usize] {
                continue;
            }
            match set.match_at(&joint[i..]) {
                Match::Full(m) => {
                    if i > 0 {
                        sink(Piece::Text(&joint[..i]));
                    }
                    sink(Piece::Marker(set.markers[m].1));
                    return Some(i + set.markers[m].0.len() - carried);
                }
                Match::Partial => {
                    // Still ambiguous: the chunk was too short to decide. Keep waiting.
                    if i > 0 {
                        sink(Piece::Text(&joint[..i]));
                    }
                    self.carry.extend(joint[i..].iter().copied());
                    return None;
                }
                Match::None => {}
            }
        }
        sink(Piece::Text(&joint[..carried]));
        Some(0)
    }

    fn scan(&mut self, set: &MarkerSet, buf: &[u8], at_end: bool, sink: &mut impl FnMut(Piece<'_>)) {
        let mut text_start = 0;
        let mut i = 0;
        while i < buf.len() {
            if !set.first_byte[buf[i] as usize] {
                i += 1;
                continue;
            }
            match set.match_at(&buf[i..]) {
                Match::Full(m) => {
                    if i > text_start {
                        sink(Piece::Text(&buf[text_start..i]));
                    }
                    sink(Piece::Marker(set.markers[m].1));
                    i += set.markers[m].0.len();
                    text_start = i;
                }
                Match::Partial if !at_end => {
                    if i > text_start {
                        sink(Piece::Text(&buf[text_start..i]));
                    }
                    self.carry.extend(buf[i..].iter().copied());
                    return;
                }
                Match::Partial | Match::None => i += 1,
            }
        }
        if buf.len() > text_start {
            sink(Piece::Text(&buf[text_start..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think_set() -> MarkerSet {
        MarkerSet::new([("<think>", MarkerKind::ThinkStart), ("</think>", MarkerKind::ThinkEnd)]).unwrap()
    }

    fn collect(set: &MarkerSet, pieces: &[&[u8]]) -> (Vec<u8>, Vec<(usize, MarkerKind)>) {
        let mut sc = Scanner::new();
        let mut text = Vec::new();
        let mut markers = Vec::new();
        let mut sink = |p: Piece<'_>| match p {
            Piece::Text(t) => text.extend_from_slice(t),
            Piece::Marker(k) => markers.push((text.len(), k)),
        };
        for p in pieces {
            sc.feed(set, p, &mut sink);
        }
        sc.finish(set, &mut sink);
        (text, markers)
    }

    #[test]
    fn finds_markers_in_one_piece() {
        let (text, markers) = collect(&think_set(), &[b"<think>abc</think>def"]);
        assert_eq!(text, b"abcdef");
        assert_eq!(markers, vec![(0, MarkerKind::ThinkStart), (3, MarkerKind::ThinkEnd)]);
    }

    #[test]
    fn near_miss_is_text() {
        let (text, markers) = collect(&think_set(), &[b"a <thin", b"king> </thin", b"k"]);
        assert_eq!(text, b"a <thinking> </think");
        assert!(markers.is_empty());
    }

    #[test]
    fn marker_split_over_many_tiny_pieces() {
        let pieces: Vec<&[u8]> = b"x</think>y".chunks(1).collect();
        let (text, markers) = collect(&think_set(), &pieces);
        assert_eq!(text, b"xy");
        assert_eq!(markers, vec![(1, MarkerKind::ThinkEnd)]);
    }

    #[test]
    fn rejects_empty_and_oversized_markers() {
        assert_eq!(MarkerSet::new([("", MarkerKind::ThinkEnd)]).unwrap_err(), MarkerError::Empty);
        let long = "x".repeat(MAX_MARKER_LEN + 1);
        assert!(matches!(
            MarkerSet::new([(long.as_str(), MarkerKind::ThinkEnd)]),
            Err(MarkerError::TooLong(_))
        ));
    }
}
