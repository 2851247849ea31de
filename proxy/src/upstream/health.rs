use std::sync::Arc;
use std::time::Duration;

use super::{Upstream, UpstreamPool};
use crate::hook::HookChannel;
use crate::telemetry::Metrics;

/// Probes every upstream's health path on a fixed cadence until the returned handle is
/// aborted. The first round runs before this returns, so readiness is accurate from the
/// first request on.
pub async fn spawn_health_checks(
    pool: Arc<UpstreamPool>,
    client: reqwest::Client,
    path: String,
    interval: Duration,
    unhealthy_after: u32,
    metrics: Arc<Metrics>,
    hook: HookChannel,
) -> tokio::task::JoinHandle<()> {
    let timeout = interval.min(Duration::from_secs(5));
    let round = {
        let (pool, client, path, metrics) = (pool.clone(), client.clone(), path.clone(), metrics.clone());
        move || {
            let (pool, client, path, metrics) = (pool.clone(), client.clone(), path.clone(), metrics.clone());
            let hook = hook.clone();
            async move {
                let checks = pool.all().iter().map(|u| {
                    let url = format!("{}{}", u.base_url, path);
                    let req = client.get(url).timeout(timeout).send();
                    let (u, metrics, hook) = (u.clone(), metrics.clone(), hook.clone());
                    async move {
                        match req.await {
                            Ok(resp) if resp.status().is_success() => u.record_success(&metrics),
                            Ok(resp) => u.record_failure(unhealthy_after, &metrics, resp.status().as_str()),
                            Err(e) => u.record_failure(unhealthy_after, &metrics, &e.to_string()),
                        }
                        check_hook(&u, &hook, &metrics).await;
                    }
                });
                futures::future::join_all(checks).await;
            }
        }
    };
    // The first round decides readiness; failing it once is enough to start unhealthy.
    for _ in 0..unhealthy_after {
        round().await;
        if pool.all().iter().all(|u| u.is_healthy()) {
            break;
        }
    }
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            round().await;
        }
    })
}

/// Asks an upstream's hook for its hello; requests use the hook only while it answers.
async fn check_hook(u: &Upstream, hook: &HookChannel, metrics: &Metrics) {
    let Some(addr) = u.hook.as_deref() else { return };
    let result = hook.hello(addr).await;
    let ready = result.is_ok();
    metrics.set_hook_ready(&u.name, ready);
    if u.set_hook_ready(ready) {
        match result {
            Ok(h) => {
                tracing::info!(upstream = %u.name, hook = addr, policy = %h.policy, version = %h.hook_version, "hook ready")
            }
            Err(e) => {
                tracing::warn!(upstream = %u.name, error = %e, "hook unavailable; using the HTTP API alone")
            }
        }
    }
}
