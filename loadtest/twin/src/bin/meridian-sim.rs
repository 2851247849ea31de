//! Runs the engine twin as a standalone OpenAI-compatible server.

use std::net::SocketAddr;

use clap::Parser;
use meridian_core::sched::Fcfs;
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;

#[derive(Parser)]
#[command(about = "The Meridian engine twin: a simulated vLLM server")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Cost-model profile from loadtest/twin/profiles.toml.
    #[arg(long, default_value = "h100-qwen3-8b")]
    profile: String,
    /// Model name served on /v1/models.
    #[arg(long, default_value = "Qwen/Qwen3-8B")]
    served_model: String,
    /// Simulated seconds per wall second.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let profile = meridian_sim::profile(&args.profile).map_err(|e| e.to_string())?;
    if !(args.speed.is_finite() && args.speed > 0.0) {
        return Err(format!("--speed must be a positive number; got {}", args.speed));
    }
    let opts = TwinOptions {
        listen: args.listen,
        profile,
        workload: WorkloadSpec::default(),
        seed: args.seed,
        speed: args.speed,
        served_model: args.served_model,
    };
    let twin = TwinServer::start(opts, Box::new(Fcfs)).await.map_err(|e| e.to_string())?;
    println!("listening on {} (engine twin, policy {})", twin.url(), twin.policy_name());
    tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
    Ok(())
}
