//! The data path: send a request upstream (with retries before the first byte), then
//! relay the response to the client chunk by chunk, unchanged, while the phase tracker
//! reads each event once and its watchers ([`watch`]) act on what it tracked.

mod body;
mod forward;
mod heartbeat;
mod observer;
mod tail;
pub mod watch;
mod whole;

pub use body::RelayBody;
pub use forward::{Sent, UpstreamRequest, send_with_retries};
pub use heartbeat::{Heartbeats, early_response};
pub use meridian_core::stream::SseDecoder;
pub use observer::{RequestInfo, RequestObserver};
pub use whole::{read_whole, require_json};
