//! Every metric the proxy exports: its name as scraped, type, help text and, for
//! histograms, bucket bounds. `docs/src/metrics.md` catalogues the same names, and
//! `tests/docs/test_book.py` reads the `Def::…("name", …)` lines below to check it.
//!
//! Names, help texts and buckets are those the proxy exported through `prometheus-client`
//! (help texts end with the full stop that crate added), so dashboards and alerts written
//! against earlier releases keep working. Counters carry their `_total` here because the
//! exporter writes names as given.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    Counter,
    Gauge,
    Histogram(Buckets),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Buckets {
    /// 1 ms doubling to ~9 min.
    Latency,
    /// 1 doubling to 131072 tokens.
    Tokens,
}

impl Buckets {
    /// The upper bounds, computed as `prometheus_client::exponential_buckets` did (`start *
    /// factor^i`), so each bound is the same `f64` as before.
    pub(super) fn bounds(self) -> Vec<f64> {
        let (start, factor, len) = match self {
            Buckets::Latency => (0.001, 2.0_f64, 20),
            Buckets::Tokens => (1.0, 2.0_f64, 18),
        };
        (0..len).map(|i| start * factor.powf(f64::from(i))).collect()
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Def {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Def {
    const fn counter(name: &'static str, help: &'static str) -> Def {
        Def { name, kind: Kind::Counter, help }
    }
    const fn gauge(name: &'static str, help: &'static str) -> Def {
        Def { name, kind: Kind::Gauge, help }
    }
    const fn histogram(name: &'static str, buckets: Buckets, help: &'static str) -> Def {
        Def { name, kind: Kind::Histogram(buckets), help }
    }
}

use Buckets::{Latency, Tokens};

pub(super) const REQUESTS: Def = Def::counter("meridian_requests_total", "Requests by route and outcome.");
pub(super) const TTFT: Def = Def::histogram(
    "meridian_time_to_first_token_seconds",
    Latency,
    "Request start to the first generated token of any kind (reasoning included).",
);
pub(super) const TTFO: Def = Def::histogram(
    "meridian_time_to_first_output_token_seconds",
    Latency,
    "Request start to the first visible (non-reasoning, non-whitespace) token.",
);
pub(super) const TTOT: Def = Def::histogram(
    "meridian_think_to_output_gap_seconds",
    Latency,
    "TTOT: end of thinking to the first visible token, for requests that thought.",
);
pub(super) const OUTPUT_ITL: Def = Def::histogram(
    "meridian_output_inter_token_latency_seconds",
    Latency,
    "Output ITL: gaps between consecutive chunks of visible output in a stream.",
);
pub(super) const E2E: Def =
    Def::histogram("meridian_request_duration_seconds", Latency, "Request start to the last byte.");
pub(super) const THINK_TOKENS: Def =
    Def::histogram("meridian_think_tokens", Tokens, "Reasoning tokens per request (usage when reported).");
pub(super) const OUTPUT_TOKENS: Def = Def::histogram(
    "meridian_output_tokens",
    Tokens,
    "Visible output tokens per request (usage when reported).",
);
pub(super) const OPEN_STREAMS: Def =
    Def::gauge("meridian_open_streams", "Streams being relayed, by current phase.");
pub(super) const UPSTREAM_IN_FLIGHT: Def =
    Def::gauge("meridian_upstream_in_flight", "Requests in flight per upstream.");
pub(super) const UPSTREAM_HEALTHY: Def =
    Def::gauge("meridian_upstream_healthy", "1 when the upstream is in rotation.");
pub(super) const HOOK_READY: Def = Def::gauge(
    "meridian_upstream_hook_ready",
    "1 while the upstream's Meridian hook answers the policy channel.",
);
pub(super) const RETRIES: Def = Def::counter(
    "meridian_upstream_retries_total",
    "Attempts moved to another upstream before the first byte.",
);
pub(super) const RELAYED_CHUNKS: Def =
    Def::counter("meridian_relayed_chunks_total", "Upstream body chunks relayed to clients.");
pub(super) const BUDGET_REACHED: Def = Def::counter(
    "meridian_think_budget_reached_total",
    "Requests whose thinking reached the think budget applied to them.",
);
pub(super) const ADMISSION_QUEUED: Def =
    Def::gauge("meridian_admission_queued", "Requests waiting in the proxy's admission queue, by class.");
pub(super) const ADMISSION_WAIT: Def = Def::histogram(
    "meridian_admission_wait_seconds",
    Latency,
    "Time admitted requests spent in the admission queue (0 when let through at once).",
);
pub(super) const ADMISSION_ADMITTED: Def =
    Def::counter("meridian_admission_admitted_total", "Requests let through by admission control, by class.");
pub(super) const ADMISSION_TIMED_OUT: Def = Def::counter(
    "meridian_admission_timed_out_total",
    "Requests that waited admission.queue_timeout_s and got 503, by class.",
);
pub(super) const ADMISSION_REJECTED: Def = Def::counter(
    "meridian_admission_rejected_total",
    "Requests refused because the admission queue was full, by class.",
);
pub(super) const PLACE_CLAIMS: Def = Def::counter(
    "meridian_admission_place_claims_total",
    "Places claimed from engines' hooks before sending (`admission.places = \"engine\"`): `granted`, `refused` (the engine's limit is held, or a place is kept for a request at another replica that goes first; the request waits on), `unanswered` (the hook did not answer), or `withdrawn` (a turn given up at an engine that had refused a request since granted a place elsewhere).",
);
pub(super) const PLACE_WAITS: Def = Def::counter(
    "meridian_admission_place_waits_total",
    "Waits on a full engine for a place to free (`admission.places = \"engine\"` with `admission.place_waits`, one at a time per engine): `woken` (the engine said a place is there for this replica, and the waiting requests asked at once), `expired` (none was in the wait's time), or `failed` (the hook did not hold the wait; the replica asks again on its timer).",
);
pub(super) const REPLICAS_COUNTED: Def = Def::gauge(
    "meridian_admission_replicas_counted",
    "Proxy replicas as the engines count them, from their answers to this replica's claims on their places (`admission.places = \"engine\"`): every replica heard within its lease, the largest count any engine gave; 0 until one has. Replicas not told `admission.replicas` split each tenant's limits by it.",
);
pub(super) const EAT_PROBES: Def =
    Def::counter("meridian_eat_probes_total", "EAT probe requests the proxy sent, by outcome.");
pub(super) const ENTROPY_EXITS: Def = Def::counter(
    "meridian_entropy_exits_total",
    "Ends of thinking the proxy caused on an entropy signal (through a hook or by continuation), by signal.",
);
pub(super) const HANDOVERS: Def = Def::counter(
    "meridian_handovers_total",
    "Answers of `think` upstreams at the end of their thought: handed over to an answer upstream (`moved`), left in place because none had room or its engine granted no place (`no_room`), or the stream ended (the answer finished in place, or the client went) before the answer engine answered the claim on a place (`ended`).",
);
pub(super) const KV_EXPORTS: Def = Def::counter(
    "meridian_handover_kv_exports_total",
    "KV exports a `think` upstream was asked for before a hand-over (`upstream.handover = \"connector\"`): `ok`, or `failed` (the answer upstream then prefilled it again).",
);
pub(super) const CONTINUATIONS: Def = Def::counter(
    "meridian_continuations_total",
    "Streams whose thinking the proxy cut and continued past the end-of-thinking delimiter (upstreams without a ready hook), by reason.",
);

pub(super) const BUDGET_UNENFORCED: Def = Def::counter(
    "meridian_think_budget_unenforced_total",
    "Requests with a think budget or exit signal that nothing could enforce: an API the engine takes no budget on and the continuation does not speak (Responses, Messages), sent to an upstream without a ready hook; by route.",
);

pub(super) const TENANT_ADMITTED: Def = Def::counter(
    "meridian_tenant_admitted_total",
    "Requests a tenant sent that its limits let in ([tenants]), by tenant.",
);
pub(super) const TENANT_REFUSED: Def = Def::counter(
    "meridian_tenant_refused_total",
    "Requests refused with 429 because their tenant was at a limit, by tenant and limit (max_streams, tokens_per_minute).",
);
pub(super) const TENANT_OPEN: Def =
    Def::gauge("meridian_tenant_open_streams", "Requests open through this replica, by tenant.");
pub(super) const TENANT_TOKENS: Def = Def::counter(
    "meridian_tenant_generated_tokens_total",
    "Tokens generated for a tenant's requests (thinking and answer), as its token-rate limit counts them, by tenant.",
);

pub(super) const ALL: [Def; 33] = [
    REQUESTS,
    TTFT,
    TTFO,
    TTOT,
    OUTPUT_ITL,
    E2E,
    THINK_TOKENS,
    OUTPUT_TOKENS,
    OPEN_STREAMS,
    UPSTREAM_IN_FLIGHT,
    UPSTREAM_HEALTHY,
    HOOK_READY,
    RETRIES,
    RELAYED_CHUNKS,
    BUDGET_REACHED,
    ADMISSION_QUEUED,
    ADMISSION_WAIT,
    ADMISSION_ADMITTED,
    ADMISSION_TIMED_OUT,
    ADMISSION_REJECTED,
    PLACE_CLAIMS,
    PLACE_WAITS,
    REPLICAS_COUNTED,
    EAT_PROBES,
    ENTROPY_EXITS,
    CONTINUATIONS,
    HANDOVERS,
    KV_EXPORTS,
    BUDGET_UNENFORCED,
    TENANT_ADMITTED,
    TENANT_REFUSED,
    TENANT_OPEN,
    TENANT_TOKENS,
];

/// The exporter's builder with each histogram's buckets set by its full name: a histogram
/// without buckets would be rendered as a summary.
pub(super) fn builder() -> PrometheusBuilder {
    ALL.iter().fold(PrometheusBuilder::new(), |b, def| match def.kind {
        // `set_buckets_for_metric` fails only on an empty slice, which `bounds()` never
        // is. Were it to, every histogram would render as a summary, which the unit test
        // `every_histogram_renders_its_buckets_type_and_help` catches.
        Kind::Histogram(buckets) => b
            .set_buckets_for_metric(Matcher::Full(def.name.into()), &buckets.bounds())
            .unwrap_or_else(|_| PrometheusBuilder::new()),
        Kind::Counter | Kind::Gauge => b,
    })
}
