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

/// The places every replica holds at `twin`, as the engine counts them: asked by a
/// replica holding none, with the channel's secret in `token_env`.
pub async fn places_counted(twin: &TwinServer, token_env: &str) -> u32 {
    claim_as_replica(twin, token_env, "observer", 0, 0).await.total
}

/// Waits until `twin` counts `n` places held, for at most `within`.
pub async fn counts_places(
    twin: &TwinServer,
    token_env: &str,
    n: u32,
    within: std::time::Duration,
    what: &str,
) {
    let what = format!("{what}: places the engine counts held");
    super::reaches(&what, n, within, || places_counted(twin, token_env)).await;
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

/// A relay in front of a hook's address that can be cut and mended, as a hook that goes
/// away and comes back: cut, it closes every connection, those open and those it takes
/// (a message sent through it fails at once); mended, it relays again.
pub struct HookRelay {
    pub addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl HookRelay {
    /// A relay to the hook at `to`, relaying.
    pub async fn start(to: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, is_cut) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut is_cut = is_cut.clone();
                if *is_cut.borrow() {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = is_cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        HookRelay { addr, cut }
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn mend(&self) {
        self.cut.send_replace(false);
    }
}
