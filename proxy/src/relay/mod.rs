//! The data path: send a request upstream (with retries before the first byte), then
//! relay the response to the client chunk by chunk, unchanged, while the phase tracker
//! watches the stream go by.

mod body;
mod chunk;
mod forward;
mod observer;
mod sse;

pub use body::RelayBody;
pub use chunk::{ChoiceDelta, Usage, parse_payload};
pub use forward::{UpstreamRequest, send_with_retries};
pub use observer::{RequestInfo, RequestObserver};
pub use sse::SseDecoder;
