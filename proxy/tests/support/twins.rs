//! Engine twins for the tests that need an engine that thinks: the H100 profile at a
//! scaled speed, seeded, FCFS.

use meridian_core::sched::Fcfs;
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;

/// A twin of `workload`, running `speed` times real time.
pub async fn twin_with(workload: WorkloadSpec, speed: f64) -> TwinServer {
    let opts = TwinOptions {
        seed: 0,
        ..TwinOptions::local(meridian_sim::profile("h100-qwen3-8b").unwrap(), workload, speed)
    };
    TwinServer::start(opts, Box::new(Fcfs)).await.unwrap()
}

/// 40 thinking tokens, then a 6-token answer, 50 times real time.
pub async fn twin() -> TwinServer {
    twin_with(WorkloadSpec::fixed(20, 40, 6), 50.0).await
}
