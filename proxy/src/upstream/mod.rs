//! The servers behind the proxy: who is healthy, who is least loaded, and the guard that
//! counts a request as in flight for exactly as long as it lives.

pub mod engine_metrics;
mod engine_state;
mod health;
pub mod places;
mod pool;

pub use engine_metrics::EngineLoad;
pub use engine_state::{EngineNow, EngineReading};
pub use health::{HealthChecks, model_ids};
pub use places::{Claimed, EnginePlaces, Place, PlaceTerms, Turn};
pub use pool::{InFlight, NoPick, Upstream, UpstreamPool, Want, broken_answer};
