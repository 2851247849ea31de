//! Reading OpenAI-style streamed responses: whole lines out of arbitrary network pieces
//! ([`LineReader`]), the SSE framing ([`sse_line`], [`SseDecoder`]) and the few fields of
//! each chunk that phase tracking and latency measurement need ([`parse_payload`]).
//! Shared by the proxy's relay, its continuation legs and the load tester, so all read
//! the same bytes the same way.

mod chunk;
mod lines;
mod sse;

pub use chunk::{ChoiceDelta, TokenIds, Usage, parse_payload};
pub use lines::{LineReader, LineTooLong, SseLine, lines, sse_line};
pub use sse::SseDecoder;
