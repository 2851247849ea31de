use std::time::Duration;

use meridian_core::Phase;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    outcome: &'static str,
}

/// Per-family labels: bounded by the model files, unlike client-chosen model names.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabels {
    family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why the proxy cut a stream's thinking and continued it.
const CONTINUATION_REASONS: [&str; 4] = ["budget_tokens", "budget_seconds", "rpdi", "eat"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

/// The admission classes, so every class has a sample from the start.
const ADMISSION_CLASSES: [&str; 3] = ["output", "interactive", "batch"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~9 min
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

fn token_histogram() -> Histogram {
    // 1 .. 131072 tokens
    Histogram::new(exponential_buckets(1.0, 2.0, 18))
}

/// What one finished request contributes to the histograms.
#[derive(Debug, Default, Clone)]
pub struct RequestTimings {
    pub time_to_first_token: Option<Duration>,
    pub time_to_first_output: Option<Duration>,
    pub think_to_output_gap: Option<Duration>,
    pub end_to_end: Duration,
    pub think_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
}

/// The proxy's metrics, one registry per server instance (so in-process tests can run
/// several proxies side by side).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    ttft: HistogramFamily<FamilyLabels>,
    ttfo: HistogramFamily<FamilyLabels>,
    ttot: HistogramFamily<FamilyLabels>,
    e2e: HistogramFamily<FamilyLabels>,
    think_tokens: HistogramFamily<FamilyLabels>,
    output_tokens: HistogramFamily<FamilyLabels>,
    open_streams: Family<PhaseLabels, Gauge>,
    upstream_in_flight: Family<UpstreamLabels, Gauge>,
    upstream_healthy: Family<UpstreamLabels, Gauge>,
    hook_ready: Family<UpstreamLabels, Gauge>,
    upstream_retries: Counter,
    relayed_chunks: Counter,
    budget_reached: Family<FamilyLabels, Counter>,
    admission_queued: Family<ClassLabels, Gauge>,
    admission_wait: HistogramFamily<ClassLabels>,
    admission_admitted: Family<ClassLabels, Counter>,
    admission_timed_out: Family<ClassLabels, Counter>,
    admission_rejected: Family<ClassLabels, Counter>,
    eat_probes: Family<OutcomeLabels, Counter>,
    entropy_exits: Family<SignalLabels, Counter>,
    continuations: Family<ReasonLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let lat =
            || HistogramFamily::<FamilyLabels>::new_with_constructor(latency_histogram as fn() -> Histogram);
        let tok =
            || HistogramFamily::<FamilyLabels>::new_with_constructor(token_histogram as fn() -> Histogram);
        let (ttft, ttfo, ttot, e2e) = (lat(), lat(), lat(), lat());
        let (think_tokens, output_tokens) = (tok(), tok());
        let open_streams = Family::<PhaseLabels, Gauge>::default();
        let upstream_in_flight = Family::<UpstreamLabels, Gauge>::default();
        let upstream_healthy = Family::<UpstreamLabels, Gauge>::default();
        let hook_ready = Family::<UpstreamLabels, Gauge>::default();
        let upstream_retries = Counter::default();
        let relayed_chunks = Counter::default();
        let budget_reached = Family::<FamilyLabels, Counter>::default();

        registry.register("meridian_requests", "Requests by route and outcome", requests.clone());
        registry.register(
            "meridian_time_to_first_token_seconds",
            "Request start to the first generated token of any kind (reasoning included)",
            ttft.clone(),
        );
        registry.register(
            "meridian_time_to_first_output_token_seconds",
            "Request start to the first visible (non-reasoning, non-whitespace) token",
            ttfo.clone(),
        );
        registry.register(
            "meridian_think_to_output_gap_seconds",
            "TTOT: end of thinking to the first visible token, for requests that thought",
            ttot.clone(),
        );
        registry.register("meridian_request_duration_seconds", "Request start to the last byte", e2e.clone());
        registry.register(
            "meridian_think_tokens",
            "Reasoning tokens per request (usage when reported)",
            think_tokens.clone(),
        );
        registry.register(
            "meridian_output_tokens",
            "Visible output tokens per request (usage when reported)",
            output_tokens.clone(),
        );
        registry.register(
            "meridian_open_streams",
            "Streams being relayed, by current phase",
            open_streams.clone(),
        );
        registry.register(
            "meridian_upstream_in_flight",
            "Requests in flight per upstream",
            upstream_in_flight.clone(),
        );
        registry.register(
            "meridian_upstream_healthy",
            "1 when the upstream is in rotation",
            upstream_healthy.clone(),
        );
        registry.register(
            "meridian_upstream_hook_ready",
            "1 while the upstream's Meridian hook answers the policy channel",
            hook_ready.clone(),
        );
        registry.register(
            "meridian_upstream_retries",
            "Attempts moved to another upstream before the first byte",
            upstream_retries.clone(),
        );
        registry.register(
            "meridian_relayed_chunks",
            "Upstream body chunks relayed to clients",
            relayed_chunks.clone(),
        );
        registry.register(
            "meridian_think_budget_reached",
            "Requests whose thinking reached the think budget applied to them",
            budget_reached.clone(),
        );

        let admission_queued = Family::<ClassLabels, Gauge>::default();
        let admission_wait =
            HistogramFamily::<ClassLabels>::new_with_constructor(latency_histogram as fn() -> Histogram);
        let admission_admitted = Family::<ClassLabels, Counter>::default();
        let admission_timed_out = Family::<ClassLabels, Counter>::default();
        let admission_rejected = Family::<ClassLabels, Counter>::default();
        for class in ADMISSION_CLASSES {
            let l = ClassLabels { class };
            let _ = admission_queued.get_or_create(&l);
            let _ = admission_wait.get_or_create(&l);
            let _ = admission_admitted.get_or_create(&l);
            let _ = admission_timed_out.get_or_create(&l);
            let _ = admission_rejected.get_or_create(&l);
        }
        registry.register(
            "meridian_admission_queued",
            "Requests waiting in the proxy's admission queue, by class",
            admission_queued.clone(),
        );
        registry.register(
            "meridian_admission_wait_seconds",
            "Time admitted requests spent in the admission queue (0 when let through at once)",
            admission_wait.clone(),
        );
        registry.register(
            "meridian_admission_admitted",
            "Requests let through by admission control, by class",
            admission_admitted.clone(),
        );
        registry.register(
            "meridian_admission_timed_out",
            "Requests that waited admission.queue_timeout_s and got 503, by class",
            admission_timed_out.clone(),
        );
        registry.register(
            "meridian_admission_rejected",
            "Requests refused because the admission queue was full, by class",
            admission_rejected.clone(),
        );

        let eat_probes = Family::<OutcomeLabels, Counter>::default();
        let entropy_exits = Family::<SignalLabels, Counter>::default();
        for outcome in ["ok", "failed"] {
            let _ = eat_probes.get_or_create(&OutcomeLabels { outcome });
        }
        for signal in ["eat", "rpdi"] {
            let _ = entropy_exits.get_or_create(&SignalLabels { signal });
        }
        registry.register(
            "meridian_eat_probes",
            "EAT probe requests the proxy sent, by outcome",
            eat_probes.clone(),
        );
        registry.register(
            "meridian_entropy_exits",
            "Ends of thinking the proxy caused on an entropy signal (through a hook or by continuation), by signal",
            entropy_exits.clone(),
        );
        let continuations = Family::<ReasonLabels, Counter>::default();
        for reason in CONTINUATION_REASONS {
            let _ = continuations.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "meridian_continuations",
            "Streams whose thinking the proxy cut and continued past the end-of-thinking delimiter (upstreams without a ready hook), by reason",
            continuations.clone(),
        );

        Metrics {
            continuations,
            eat_probes,
            entropy_exits,
            admission_queued,
            admission_wait,
            admission_admitted,
            admission_timed_out,
            admission_rejected,
            registry,
            requests,
            ttft,
            ttfo,
            ttot,
            e2e,
            think_tokens,
            output_tokens,
            open_streams,
            upstream_in_flight,
            upstream_healthy,
            hook_ready,
            upstream_retries,
            relayed_chunks,
            budget_reached,
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    pub fn count_request(&self, route: &'static str, outcome: &'static str) {
        self.requests.get_or_create(&RequestLabels { route, outcome }).inc();
    }

    pub fn record_timings(&self, family: &str, t: &RequestTimings) {
        let labels = FamilyLabels { family: family.to_owned() };
        let observe = |h: &HistogramFamily<FamilyLabels>, d: Option<Duration>| {
            if let Some(d) = d {
                h.get_or_create(&labels).observe(d.as_secs_f64());
            }
        };
        observe(&self.ttft, t.time_to_first_token);
        observe(&self.ttfo, t.time_to_first_output);
        observe(&self.ttot, t.think_to_output_gap);
        observe(&self.e2e, Some(t.end_to_end));
        if let Some(n) = t.think_tokens {
            self.think_tokens.get_or_create(&labels).observe(f64::from(n));
        }
        if let Some(n) = t.output_tokens {
            self.output_tokens.get_or_create(&labels).observe(f64::from(n));
        }
    }

    /// Moves one open stream from phase `from` to phase `to` (`None` = not open).
    pub fn move_stream(&self, from: Option<Phase>, to: Option<Phase>) {
        if from == to {
            return;
        }
        if let Some(p) = from {
            self.open_streams.get_or_create(&PhaseLabels { phase: p.as_str() }).dec();
        }
        if let Some(p) = to {
            self.open_streams.get_or_create(&PhaseLabels { phase: p.as_str() }).inc();
        }
    }

    pub fn open_streams(&self, phase: Phase) -> i64 {
        self.open_streams.get_or_create(&PhaseLabels { phase: phase.as_str() }).get()
    }

    pub fn set_upstream_in_flight(&self, upstream: &str, n: usize) {
        let v = i64::try_from(n).unwrap_or(i64::MAX);
        self.upstream_in_flight.get_or_create(&UpstreamLabels { upstream: upstream.to_owned() }).set(v);
    }

    pub fn set_upstream_healthy(&self, upstream: &str, healthy: bool) {
        self.upstream_healthy
            .get_or_create(&UpstreamLabels { upstream: upstream.to_owned() })
            .set(i64::from(healthy));
    }

    pub fn set_hook_ready(&self, upstream: &str, ready: bool) {
        self.hook_ready
            .get_or_create(&UpstreamLabels { upstream: upstream.to_owned() })
            .set(i64::from(ready));
    }

    pub fn count_retry(&self) {
        self.upstream_retries.inc();
    }

    pub fn count_eat_probe(&self, outcome: &'static str) {
        self.eat_probes.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn count_entropy_exit(&self, signal: &'static str) {
        self.entropy_exits.get_or_create(&SignalLabels { signal }).inc();
    }

    pub fn count_continuation(&self, reason: &'static str) {
        self.continuations.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn count_budget_reached(&self, family: &str) {
        self.budget_reached.get_or_create(&FamilyLabels { family: family.to_owned() }).inc();
    }

    pub fn set_admission_queued(&self, class: &'static str, n: usize) {
        self.admission_queued.get_or_create(&ClassLabels { class }).set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A request let through after `waited` in the queue.
    pub fn record_admission(&self, class: &'static str, waited: Duration) {
        let l = ClassLabels { class };
        self.admission_wait.get_or_create(&l).observe(waited.as_secs_f64());
        self.admission_admitted.get_or_create(&l).inc();
    }

    pub fn count_admission_timed_out(&self, class: &'static str) {
        self.admission_timed_out.get_or_create(&ClassLabels { class }).inc();
    }

    pub fn count_admission_rejected(&self, class: &'static str) {
        self.admission_rejected.get_or_create(&ClassLabels { class }).inc();
    }

    pub fn count_chunk(&self) {
        self.relayed_chunks.inc();
    }
}
