use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use meridian_core::config::EndpointConfig;

use crate::telemetry::Metrics;

/// One upstream server and its live state.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    /// Base URL without a trailing slash.
    pub base_url: String,
    in_flight: AtomicUsize,
    healthy: AtomicBool,
    consecutive_failures: AtomicU32,
    /// `host:port` of the Meridian hook in this server's engine, if configured.
    pub hook: Option<String>,
    /// The hook answered the last protocol check.
    hook_ready: AtomicBool,
}

impl Upstream {
    pub fn new(cfg: &EndpointConfig) -> Self {
        let base_url = cfg.url.trim_end_matches('/').to_owned();
        let name = cfg.name.clone().unwrap_or_else(|| {
            base_url.split_once("://").map(|(_, rest)| rest).unwrap_or(&base_url).to_owned()
        });
        Upstream {
            name,
            base_url,
            in_flight: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            hook: cfg.hook.clone(),
            hook_ready: AtomicBool::new(false),
        }
    }

    /// Whether requests to this upstream go through its hook (checked by the health loop).
    pub fn hook_ready(&self) -> bool {
        self.hook_ready.load(Ordering::Relaxed)
    }

    /// Records a hook check; returns whether readiness changed.
    pub fn set_hook_ready(&self, ready: bool) -> bool {
        self.hook_ready.swap(ready, Ordering::Relaxed) != ready
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// A success (health check or request) puts the upstream back in rotation.
    pub fn record_success(&self, metrics: &Metrics) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(upstream = %self.name, "upstream healthy again");
        }
        metrics.set_upstream_healthy(&self.name, true);
    }

    /// Takes the upstream out of rotation after `threshold` failures in a row.
    pub fn record_failure(&self, threshold: u32, metrics: &Metrics, reason: &str) {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold && self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(upstream = %self.name, failures = n, reason, "upstream marked unhealthy");
        }
        if n >= threshold {
            metrics.set_upstream_healthy(&self.name, false);
        }
    }
}

/// Counts a request against its upstream until dropped.
#[derive(Debug)]
pub struct InFlight {
    upstream: Arc<Upstream>,
    metrics: Arc<Metrics>,
}

impl InFlight {
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.upstream.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.metrics.set_upstream_in_flight(&self.upstream.name, now);
    }
}

/// All upstreams, with least-loaded choice among the healthy ones.
#[derive(Debug)]
pub struct UpstreamPool {
    upstreams: Vec<Arc<Upstream>>,
    rotation: AtomicUsize,
}

impl UpstreamPool {
    pub fn new(endpoints: &[EndpointConfig]) -> Self {
        UpstreamPool {
            upstreams: endpoints.iter().map(|e| Arc::new(Upstream::new(e))).collect(),
            rotation: AtomicUsize::new(0),
        }
    }

    pub fn all(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    pub fn any_healthy(&self) -> bool {
        self.upstreams.iter().any(|u| u.is_healthy())
    }

    /// The healthy upstream with the fewest requests in flight, skipping `tried`. Ties go
    /// round-robin so equal servers share the load.
    pub fn pick(&self, tried: &[Arc<Upstream>], metrics: &Arc<Metrics>) -> Option<InFlight> {
        let n = self.upstreams.len();
        if n == 0 {
            return None;
        }
        let start = self.rotation.fetch_add(1, Ordering::Relaxed) % n;
        let chosen = (0..n)
            .map(|i| &self.upstreams[(start + i) % n])
            .filter(|u| u.is_healthy() && !tried.iter().any(|t| Arc::ptr_eq(t, u)))
            .min_by_key(|u| u.in_flight())?
            .clone();
        let now = chosen.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        metrics.set_upstream_in_flight(&chosen.name, now);
        Some(InFlight { upstream: chosen, metrics: metrics.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> UpstreamPool {
        let eps: Vec<EndpointConfig> = (0..n)
            .map(|i| EndpointConfig { url: format!("http://u{i}:8000"), name: None, hook: None })
            .collect();
        UpstreamPool::new(&eps)
    }

    #[test]
    fn picks_least_loaded_and_releases_on_drop() {
        let m = Arc::new(Metrics::new());
        let p = pool(3);
        let a = p.pick(&[], &m).unwrap();
        let b = p.pick(&[], &m).unwrap();
        let c = p.pick(&[], &m).unwrap();
        let names: std::collections::BTreeSet<_> =
            [&a, &b, &c].iter().map(|g| g.upstream().name.clone()).collect();
        assert_eq!(names.len(), 3, "each upstream gets one");
        let freed = b.upstream().clone();
        drop(b);
        assert_eq!(freed.in_flight(), 0);
        assert!(Arc::ptr_eq(p.pick(&[], &m).unwrap().upstream(), &freed));
    }

    #[test]
    fn skips_unhealthy_and_tried() {
        let m = Arc::new(Metrics::new());
        let p = pool(2);
        p.all()[0].record_failure(1, &m, "test");
        for _ in 0..4 {
            assert_eq!(p.pick(&[], &m).unwrap().upstream().name, "u1:8000");
        }
        assert!(p.pick(&[p.all()[1].clone()], &m).is_none());
        p.all()[0].record_success(&m);
        assert!(p.any_healthy());
        assert_eq!(p.pick(&[p.all()[1].clone()], &m).unwrap().upstream().name, "u0:8000");
    }
}
