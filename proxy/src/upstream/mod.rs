//! The servers behind the proxy: who is healthy, who is least loaded, and the guard that
//! counts a request as in flight for exactly as long as it lives.

mod health;
mod pool;

pub use health::spawn_health_checks;
pub use pool::{InFlight, Upstream, UpstreamPool};
