//! Reading streamed responses: whole lines out of arbitrary network pieces
//! ([`LineReader`]), the SSE framing ([`sse_line`], [`SseDecoder`]) and the few fields of
//! each event that phase tracking and latency measurement need, one parser per API
//! ([`Dialect`]: OpenAI chat and completions chunks ([`parse_payload`]), the Responses
//! API's events, Anthropic Messages' content blocks). Shared by the proxy's relay, its
//! continuation legs and the load tester, so all read the same bytes the same way.

mod chunk;
mod dialect;
mod lines;
mod messages;
mod responses;
mod sse;

pub use chunk::{ChoiceDelta, TokenIds, Usage, parse_payload};
pub use dialect::{Dialect, Read};
pub use lines::{LineReader, LineTooLong, SseLine, lines, sse_line};
pub use sse::SseDecoder;
