//! Runs the mock upstream as a process, for tests written in other languages and for the
//! relay benchmark. Prints `listening on http://ADDR` once ready.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use meridian_mock_upstream::{MockOptions, MockUpstream};

#[derive(Parser)]
#[command(about = "Replays recorded vLLM streams as an OpenAI-compatible server")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Model ids listed by /v1/models (repeatable).
    #[arg(long = "model", default_value = "Qwen/Qwen3-8B")]
    models: Vec<String>,
    /// Extra directory of *.sse fixtures.
    #[arg(long)]
    fixtures: Option<PathBuf>,
    #[arg(long, default_value = "qwen3-reasoning")]
    default_fixture: String,
    /// Record requests without their bodies (for benchmarks that send large prompts).
    #[arg(long)]
    no_bodies: bool,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let mock = MockUpstream::start(MockOptions {
        listen: args.listen,
        models: args.models,
        fixtures_dir: args.fixtures,
        default_fixture: args.default_fixture,
        keep_bodies: !args.no_bodies,
    })
    .await?;
    println!("listening on {}", mock.url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
