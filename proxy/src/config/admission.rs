//! Admission control (`[admission]`): fields, defaults and checks.

use serde::Deserialize;

use super::validate::Checker;

/// Admission control: new requests wait in the proxy while their upstreams are saturated,
/// and are released highest class first (output-phase starts, interactive, batch).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Off: every request goes upstream at once (vLLM queues it).
    pub enabled: bool,
    /// Requests open through this proxy per upstream at which it counts as saturated.
    pub max_streams: Option<u32>,
    /// Saturated while the engine's `vllm:num_requests_waiting` is above this.
    pub max_waiting: Option<u32>,
    /// Saturated while the engine's `vllm:kv_cache_usage_perc` (0-1) is above this.
    pub max_kv_usage: Option<f64>,
    /// Longest a request waits in the proxy's queue before it gets 503.
    pub queue_timeout_s: f64,
    /// Requests the queue holds; beyond it new ones get 503 at once.
    pub max_queued: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: false,
            max_streams: None,
            max_waiting: None,
            max_kv_usage: None,
            queue_timeout_s: 30.0,
            max_queued: 1024,
        }
    }
}

impl AdmissionConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker) {
        if self.max_streams == Some(0) {
            c.fail("admission.max_streams", "must be at least 1 (leave it unset for no cap)");
        }
        if let Some(kv) = self.max_kv_usage {
            c.unit_interval("admission.max_kv_usage", kv);
        }
        c.positive("admission.queue_timeout_s", self.queue_timeout_s);
        c.range_u32("admission.max_queued", self.max_queued, 1, 1_000_000);
        if self.enabled
            && self.max_streams.is_none()
            && self.max_waiting.is_none()
            && self.max_kv_usage.is_none()
        {
            c.fail(
                "admission.enabled",
                "is true but no saturation signal is set: set max_streams, max_waiting or max_kv_usage",
            );
        }
    }
}
