//! Admission control (`[admission]`): fields, defaults and checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use meridian_core::config::Checker;

/// Admission control: new requests wait in the proxy while their upstreams are saturated,
/// and are released highest class first (output-phase starts, interactive, batch).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Admission control ([The upstream pool](architecture/upstream.md#admission-control)):
    /// while every upstream of a request's model is saturated, new requests wait in the proxy
    /// and are let through output-phase starts first, then interactive, then batch. Off: vLLM
    /// queues everything in arrival order.
    #[schemars(extend("x-range" = "needs one of the three limits below"))]
    pub enabled: bool,
    /// An upstream is saturated while it holds this many requests. With the Meridian hook in the
    /// engine the count is the engine's own (every proxy replica's requests, running and
    /// waiting, from the hook's report each health round, plus what this replica sent since);
    /// without the hook, vLLM's own `vllm:num_requests_running` and `_waiting` from its
    /// `/metrics`, the same way: a limit per engine, whatever the number of replicas; set it
    /// near the engine's `--max-num-seqs`. An engine that reports neither is counted by the
    /// requests open to it through this replica alone.
    #[schemars(range(min = 1))]
    pub max_streams: Option<u32>,
    /// Saturated while the engine's `vllm:num_requests_waiting` (its `/metrics`, read every
    /// health round, summed over label sets) is above this. `0` keeps vLLM's queue empty so
    /// ordering happens here; engine-wide, so it sees other proxies' requests too.
    pub max_waiting: Option<u32>,
    /// Saturated while the engine's `vllm:kv_cache_usage_perc` (highest over label sets) is
    /// above this. 0.9–0.95 holds new work back before vLLM starts preempting.
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub max_kv_usage: Option<f64>,
    /// Longest wait in the queue; then 503 `admission_timeout`. Keep it below your clients' own
    /// timeouts.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub queue_timeout_s: f64,
    /// Requests the queue holds; beyond it a newcomer gets 503 `admission_queue_full` at once,
    /// unless it outranks the newest waiter of a lower class, which is refused instead.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_queued: u32,
    /// How many proxy replicas stand in front of the same engines, sharing each engine's
    /// `max_streams` and each tenant's limits (`tenants.tenant[].max_streams` and
    /// `tokens_per_minute`, split the same way). Between two health rounds a replica cannot see what the others sent, so
    /// replicas that each fill the room a reading shows overfill the engines together. Told
    /// their number, each holds at most its part of every engine's limit (`max_streams /
    /// replicas`, counted by its own open requests), and together they never pass it, at
    /// the cost of the pooling: a replica whose part is full queues while another's stands
    /// idle. 1 (the default): the whole limit is this replica's. Set it to the number of
    /// replicas that run: above it leaves places unused, below it overfills the engines.
    /// Left at 1 with `places = "engine"`, the engines grant their places themselves, and
    /// the tenants' limits are split by the replicas the engines count (every replica
    /// heard within its lease, so an autoscaler's count as it moves).
    #[schemars(range(min = 1, max = 1_000))]
    pub replicas: u32,
    /// This replica's place among `replicas`, from 0: places that do not divide evenly go to
    /// the lowest places. Unset: this replica takes only the even part, and the leftovers
    /// stay unused.
    pub replica_index: Option<u32>,
    /// Who decides that an engine has room under `max_streams`. `replica` (the default): this
    /// replica, from the engine's last reading and its own traffic since (its part of the
    /// limit when told `replicas`). `engine`: before each request is sent, the engine's hook
    /// grants it one of the limit's places, counting every replica's (ADR 0013), so replicas
    /// share the places by need and together never pass the limit, however many run
    /// (autoscaled included; a retry, and an answer handed over at the end of its thought,
    /// claim one too). It costs one round trip to the hook per admitted request. Needs the
    /// hook's channel (`upstream.endpoints[].hook`, one per engine); an engine whose hook
    /// takes no claims is decided as under `replica` until it does.
    pub places: PlacesFrom,
    /// With `places = "engine"`: whether a refused replica also waits on the engine for a
    /// place (the hook answers the wait as soon as one is there for this replica) beside
    /// asking again every 25 ms, and sends its next request to the engine that woke it.
    /// Off by default: measured on the fleet bench, the waits gained nothing a user feels
    /// (TTFT p99 with them over without 1.00x to 1.29x, three of four intervals above 1 and
    /// none below; ADR 0013).
    pub place_waits: bool,
}

/// Who decides that an engine has room for one more request (`admission.places`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PlacesFrom {
    /// This replica, from the engine's reading and its own traffic.
    #[default]
    Replica,
    /// The engine's hook, which grants places to every replica in turn.
    Engine,
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
            replicas: 1,
            replica_index: None,
            places: PlacesFrom::Replica,
            place_waits: false,
        }
    }
}

impl AdmissionConfig {
    /// Every out-of-range value of this section, named by its dotted path.
    pub(super) fn check(&self, c: &mut Checker, upstream: &super::UpstreamConfig) {
        if self.max_streams == Some(0) {
            c.fail("admission.max_streams", "must be at least 1 (leave it unset for no cap)");
        }
        if let Some(kv) = self.max_kv_usage {
            c.unit_interval("admission.max_kv_usage", kv);
        }
        c.positive("admission.queue_timeout_s", self.queue_timeout_s);
        c.range_u32("admission.max_queued", self.max_queued, 1, 1_000_000);
        c.range_u32("admission.replicas", self.replicas, 1, 1_000);
        if let Some(i) = self.replica_index
            && i >= self.replicas
        {
            c.fail(
                "admission.replica_index",
                format!("must be below admission.replicas ({})", self.replicas),
            );
        }
        if let Some(m) = self.max_streams
            && m > 0
            && self.replicas > m
        {
            c.fail(
                "admission.replicas",
                format!(
                    "is more than admission.max_streams ({m}): some replica would get no place on an engine"
                ),
            );
        }
        if self.place_waits && self.places != PlacesFrom::Engine {
            c.fail(
                "admission.place_waits",
                "is true but admission.places is not \"engine\": only a replica that asks the engines for places waits on them",
            );
        }
        if self.enabled && self.places == PlacesFrom::Engine {
            if self.max_streams.is_none() {
                c.fail(
                    "admission.places",
                    "is \"engine\" but admission.max_streams is unset: no limit to grant places of",
                );
            }
            if upstream.endpoints.iter().all(|e| e.hook.is_none()) {
                c.fail(
                    "admission.places",
                    "is \"engine\" but no upstream.endpoints[].hook is set: no engine could grant a place",
                );
            }
            // Two endpoints on one hook would claim as one holder, each stating its own
            // count: the engine would count the smaller.
            let mut hooks: Vec<&str> = upstream.endpoints.iter().filter_map(|e| e.hook.as_deref()).collect();
            hooks.sort_unstable();
            if let Some(pair) = hooks.windows(2).find(|w| w[0] == w[1]) {
                c.fail(
                    "admission.places",
                    format!("is \"engine\" but two upstream.endpoints name the hook {}: each engine's places need their own", pair[0]),
                );
            }
        }
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
