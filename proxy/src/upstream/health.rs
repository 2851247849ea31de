use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use serde_json::Value;

use super::{Upstream, UpstreamPool};
use crate::hook::HookChannel;
use crate::telemetry::Metrics;

/// What the health loop needs.
#[derive(Clone)]
pub struct HealthChecks {
    pub pool: Arc<UpstreamPool>,
    pub client: reqwest::Client,
    /// `upstream.health_path`.
    pub path: String,
    pub interval: Duration,
    pub unhealthy_after: u32,
    pub metrics: Arc<Metrics>,
    pub hook: HookChannel,
    /// `Authorization` for the upstreams' API routes (`/v1/models`).
    pub auth: Option<HeaderValue>,
    /// Scrape each engine's `/metrics` for its load gauges (admission control needs them).
    pub engine_metrics: bool,
}

impl HealthChecks {
    /// Probes every upstream's health path on a fixed cadence until the returned handle is
    /// aborted, and learns the served models of those whose list is not configured. The
    /// first round runs before this returns, so readiness (and routing by model) is
    /// accurate from the first request on.
    pub async fn spawn(self) -> tokio::task::JoinHandle<()> {
        // The first round decides readiness; failing it once is enough to start unhealthy.
        for _ in 0..self.unhealthy_after {
            self.round().await;
            if self.pool.all().iter().all(|u| u.is_healthy()) {
                break;
            }
        }
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(self.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                self.round().await;
            }
        })
    }

    fn timeout(&self) -> Duration {
        self.interval.min(Duration::from_secs(5))
    }

    async fn round(&self) {
        let checks = self.pool.all().iter().map(|u| self.check(u));
        futures::future::join_all(checks).await;
        // Health and engine load changed: queued requests may go now.
        self.pool.capacity_changed();
    }

    async fn check(&self, u: &Arc<Upstream>) {
        let url = format!("{}{}", u.base_url, self.path);
        match self.client.get(url).timeout(self.timeout()).send().await {
            Ok(resp) if resp.status().is_success() => {
                // Models first, so an engine coming (back) into rotation does so with its
                // list already known and takes no request for another model meanwhile.
                if !u.models_configured() {
                    self.discover_models(u).await;
                }
                if self.engine_metrics {
                    self.scrape_engine(u).await;
                }
                u.record_success(&self.metrics);
            }
            Ok(resp) => u.record_failure(self.unhealthy_after, &self.metrics, resp.status().as_str()),
            Err(e) => u.record_failure(self.unhealthy_after, &self.metrics, &e.to_string()),
        }
        check_hook(u, &self.hook, &self.metrics).await;
    }

    /// `GET /v1/models`; on any failure the last good list stays.
    async fn discover_models(&self, u: &Upstream) {
        let mut req = self.client.get(format!("{}/v1/models", u.base_url)).timeout(self.timeout());
        if let Some(auth) = &self.auth {
            req = req.header(axum::http::header::AUTHORIZATION, auth.clone());
        }
        let listed = async {
            let resp = req.send().await.map_err(|e| e.to_string())?;
            let resp = resp.error_for_status().map_err(|e| e.to_string())?;
            let v: Value = resp.json().await.map_err(|e| e.to_string())?;
            model_ids(&v).ok_or_else(|| "no data[].id in the answer".to_owned())
        };
        match listed.await {
            Ok(list) => {
                if u.set_discovered_models(list.clone()) {
                    tracing::info!(upstream = %u.name, models = ?list, "upstream serves these models");
                }
            }
            Err(error) => {
                tracing::debug!(upstream = %u.name, %error, known = u.models().is_some(), "model discovery failed");
            }
        }
    }
}

impl HealthChecks {
    /// The engine's own load gauges from its `/metrics`; unknown when that fails.
    async fn scrape_engine(&self, u: &Upstream) {
        let req = self.client.get(format!("{}/metrics", u.base_url)).timeout(self.timeout());
        let text = async { req.send().await.ok()?.error_for_status().ok()?.text().await.ok() }.await;
        let load = text.as_deref().map(super::engine_metrics::parse).unwrap_or_default();
        if text.is_none() {
            tracing::debug!(upstream = %u.name, "engine metrics scrape failed");
        }
        u.set_engine_load(load.waiting, load.kv_usage);
        if u.hook.is_none() {
            // Without a hook, vLLM's own count of the requests it holds is the engine-wide
            // one (every replica's); with one, the hook's hello gives it by phase.
            u.engine.record_counts(load.running, load.waiting);
        }
    }
}

/// The ids of an OpenAI model list (`{"data": [{"id": ...}, ...]}`).
pub fn model_ids(list: &Value) -> Option<Vec<String>> {
    let data = list.get("data")?.as_array()?;
    Some(data.iter().filter_map(|m| m.get("id")?.as_str().map(str::to_owned)).collect())
}

/// Asks an upstream's hook for its hello; requests use the hook only while it answers.
async fn check_hook(u: &Upstream, hook: &HookChannel, metrics: &Metrics) {
    let Some(addr) = u.hook.as_deref() else { return };
    let result = hook.hello(addr).await;
    // The engine's own count of its requests, every replica's (none from a hook that
    // did not answer: admission and routing fall back to this replica's count).
    u.engine.record(result.as_ref().ok().and_then(|h| h.engine.clone()));
    // A hook that cannot end thinking (no logits processor, unknown delimiter, several
    // sampling ranks) would leave budgets unenforced: vLLM's own field is used instead.
    let ready = result.as_ref().is_ok_and(|h| h.can_end_thinking);
    metrics.set_hook_ready(&u.name, ready);
    if u.set_hook_ready(ready) {
        match result {
            Ok(h) if h.policy == meridian_core::channel::DISABLED_POLICY => {
                tracing::warn!(upstream = %u.name, hook = addr, version = %h.hook_version,
                    "hook disabled: the engine's vLLM is one the hook does not support (the engine's log names why); it runs as stock vLLM, and thinking is ended as for an upstream without a hook")
            }
            Ok(h) if !h.can_end_thinking => {
                tracing::warn!(upstream = %u.name, hook = addr, "hook cannot end thinking; budgets use vLLM's own field")
            }
            Ok(h) => {
                tracing::info!(upstream = %u.name, hook = addr, policy = %h.policy, version = %h.hook_version, "hook ready")
            }
            Err(e) => {
                tracing::warn!(upstream = %u.name, error = %e, "hook unavailable; using the HTTP API alone")
            }
        }
    }
}
