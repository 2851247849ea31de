//! Prometheus metrics, logs, and traces over OTLP.

mod json_log;
mod logging;
mod metrics;
mod otel;
pub mod outcomes;
pub mod spans;
mod tracing_layer;

pub use logging::init_logging;
pub use metrics::{HandoverOutcome, Metrics, RequestTimings, TenantSeries, spawn_upkeep};
pub use otel::{TracePipeline, TracingError};
pub use tracing_layer::TraceGuard;
