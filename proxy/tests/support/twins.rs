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

/// A claim sent straight to `twin`'s places as another proxy replica would, with the
/// channel's secret in `token_env`: `held` places held, `want` asked for, of a limit of
/// one.
pub async fn claim_as_replica(
    twin: &TwinServer,
    token_env: &str,
    holder: &str,
    held: u32,
    want: u32,
) -> meridian_core::channel::Granted {
    let hook = meridian_core::config::HookConfig { token_env: token_env.into(), ..Default::default() };
    let channel = meridian_proxy::hook::HookChannel::new(&hook, reqwest::Client::new());
    let claim = meridian_core::channel::Claim {
        holder: holder.into(),
        held,
        want,
        limit: 1,
        lease_s: 30.0,
        waited_s: 0.0,
        class: 1,
        withdraw: false,
    };
    channel.claim(&twin.addr.to_string(), &claim, std::time::Duration::from_secs(2)).await.unwrap()
}

/// A hook address that takes connections and never answers: a message sent there stays
/// out until its timeout.
pub async fn silent_hook() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}
