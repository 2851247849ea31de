//! The data path: send a request upstream (with retries before the first byte), then
//! relay the response to the client as it streams, through the relay's stages
//! ([`stage`]: framing, the tracking stage or a continuation's, termination, heartbeats),
//! while the phase tracker reads each event once and its watchers ([`watch`]) act on
//! what it tracked.

mod body;
mod forward;
mod framing;
mod heartbeat;
mod observer;
mod silence;
pub mod stage;
mod tail;
mod termination;
pub mod watch;
mod whole;

pub use body::{RelayBody, stages};
pub use forward::{Sent, UpstreamRequest, send_with_retries};
pub use heartbeat::{Heartbeats, early_response};
pub use meridian_core::stream::SseDecoder;
pub use observer::{RequestObserver, Served};
pub use stage::{End, Flow, Leg, LegStream, RelayStage, Relayed, Tracked};
pub use whole::{read_whole, require_json};
