//! The data path: send a request upstream (with retries before the first byte), then
//! relay the response to the client chunk by chunk, through the stream's [`stage`]
//! (unchanged, or a continuation's), while the phase tracker reads each event once and
//! its watchers ([`watch`]) act on what it tracked.

mod body;
mod forward;
mod heartbeat;
mod observer;
pub mod stage;
mod tail;
pub mod watch;
mod whole;

pub use body::RelayBody;
pub use forward::{Sent, UpstreamRequest, send_with_retries};
pub use heartbeat::{Heartbeats, early_response};
pub use meridian_core::stream::SseDecoder;
pub use observer::{RequestObserver, Served};
pub use stage::{Flow, LegStream, RelayStage, Relayed};
#[cfg(test)]
pub(crate) use tail::Tail;
pub use whole::{read_whole, require_json};
