//! Reading OpenAI-style streamed responses: the SSE framing ([`SseDecoder`]) and the few
//! fields of each chunk that phase tracking and latency measurement need
//! ([`parse_payload`]). Shared by the proxy's relay and the load tester, so both measure
//! from the same reading of the same bytes.

mod chunk;
mod sse;

pub use chunk::{ChoiceDelta, TokenIds, Usage, parse_payload};
pub use sse::SseDecoder;
