//! Prometheus metrics and logging set-up.

mod logging;
mod metrics;

pub use logging::init_logging;
pub use metrics::{Metrics, RequestTimings, spawn_upkeep};
