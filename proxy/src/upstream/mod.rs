//! The servers behind the proxy: who is healthy, who is least loaded, and the guard that
//! counts a request as in flight for exactly as long as it lives.

mod health;
mod pool;

pub use health::{HealthChecks, model_ids};
pub use pool::{InFlight, NoPick, Upstream, UpstreamPool};
