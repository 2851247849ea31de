//! The proxy's metrics, recorded through the `metrics` facade and rendered by
//! `metrics-exporter-prometheus` on the proxy's own `/metrics` route.
//!
//! Each [`Metrics`] owns its recorder rather than installing a global one, so in-process
//! tests can run several proxies side by side. Handles are registered once and kept: the
//! relay touches a handle per chunk and per request without building a label set or
//! looking anything up by name. Label values are bounded: fixed sets (phases, admission
//! classes, continuation reasons, …) are registered at start, so their series exist at 0
//! from the first scrape; model families and upstreams come from the model files and the
//! configuration, and route × outcome from the code.

mod catalogue;
mod lazy;

use std::sync::OnceLock;
use std::time::Duration;

use meridian_core::Phase;
use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

use catalogue::Def;
use lazy::Lazy;

/// What registrations carry; the exporter ignores it, the facade requires it.
static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Why the proxy cut a stream's thinking and continued it.
const CONTINUATION_REASONS: [&str; 4] = ["budget_tokens", "budget_seconds", "rpdi", "eat"];
/// The admission classes, so every class has a sample from the start.
const ADMISSION_CLASSES: [&str; 3] = ["output", "interactive", "batch"];
const EAT_OUTCOMES: [&str; 2] = ["ok", "failed"];
const ENTROPY_SIGNALS: [&str; 2] = ["eat", "rpdi"];
const PLACE_OUTCOMES: [&str; 3] = ["granted", "refused", "unanswered"];
const PLACE_WAIT_OUTCOMES: [&str; 3] = ["woken", "expired", "failed"];
/// The routes whose budgets only an engine's hook can enforce.
const HOOK_ONLY_ROUTES: [&str; 2] = ["responses", "messages"];
/// In the order `crate::streams::OpenStreams::streams_by_phase` counts them.
const PHASES: [Phase; 3] = [Phase::Pending, Phase::Think, Phase::Output];

/// What became of an answer of a `think` upstream at the end of its thought
/// (`meridian_handovers_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoverOutcome {
    /// Handed over to an answer upstream with room (and a place its engine granted).
    Moved,
    /// Left where it was: no answer upstream had room, or its engine granted no place.
    NoRoom,
    /// The stream ended (the answer finished where it was, or the client went) while the
    /// answer upstream's engine had not yet answered the claim on a place.
    Ended,
}

impl HandoverOutcome {
    pub const ALL: [HandoverOutcome; 3] =
        [HandoverOutcome::Moved, HandoverOutcome::NoRoom, HandoverOutcome::Ended];

    pub fn label(self) -> &'static str {
        match self {
            HandoverOutcome::Moved => "moved",
            HandoverOutcome::NoRoom => "no_room",
            HandoverOutcome::Ended => "ended",
        }
    }
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

/// One admission class's series.
struct ClassSeries {
    queued: Gauge,
    wait: Histogram,
    admitted: Counter,
    timed_out: Counter,
    rejected: Counter,
}

/// One tenant's series, registered when the proxy starts (tenants are listed in the
/// config, so their number is bounded) and kept by the tenant (`crate::tenants`).
#[derive(Clone)]
pub struct TenantSeries {
    pub admitted: Counter,
    /// Refusals at `max_streams`, then at `tokens_per_minute`.
    pub refused: [Counter; 2],
    pub open: Gauge,
    pub tokens: Counter,
}

/// One model family's series, each registered when first recorded (a family that never
/// thought has no TTOT series, as before).
#[derive(Default)]
struct FamilySeries {
    histograms: [OnceLock<Histogram>; 6],
    output_itl: OnceLock<Histogram>,
    budget_reached: OnceLock<Counter>,
}

const FAMILY_HISTOGRAMS: [Def; 6] = [
    catalogue::TTFT,
    catalogue::TTFO,
    catalogue::TTOT,
    catalogue::E2E,
    catalogue::THINK_TOKENS,
    catalogue::OUTPUT_TOKENS,
];

struct UpstreamSeries {
    in_flight: Gauge,
    healthy: Gauge,
    hook_ready: Gauge,
}

/// The proxy's metrics, one recorder per server instance.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    relayed_chunks: Counter,
    retries: Counter,
    open_streams: [Gauge; 3],
    classes: Vec<(&'static str, ClassSeries)>,
    eat_probes: Vec<(&'static str, Counter)>,
    entropy_exits: Vec<(&'static str, Counter)>,
    continuations: Vec<(&'static str, Counter)>,
    handovers: Vec<(&'static str, Counter)>,
    place_claims: Vec<(&'static str, Counter)>,
    place_waits: Vec<(&'static str, Counter)>,
    replicas_counted: Gauge,
    kv_exports: Vec<(&'static str, Counter)>,
    budgets_unenforced: Vec<(&'static str, Counter)>,
    requests: Lazy<(&'static str, &'static str), Counter>,
    families: Lazy<Box<str>, FamilySeries>,
    upstreams: Lazy<Box<str>, UpstreamSeries>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The handle registered for `value`, among those registered at start.
fn fixed<'a, H>(set: &'a [(&'static str, H)], value: &str) -> Option<&'a H> {
    set.iter().find(|(v, _)| *v == value).map(|(_, h)| h)
}

impl Metrics {
    pub fn new() -> Self {
        let recorder = catalogue::builder().build_recorder();
        for def in catalogue::ALL {
            let name = def.name.into();
            match def.kind {
                catalogue::Kind::Counter => recorder.describe_counter(name, None, def.help.into()),
                catalogue::Kind::Gauge => recorder.describe_gauge(name, None, def.help.into()),
                catalogue::Kind::Histogram(_) => recorder.describe_histogram(name, None, def.help.into()),
            }
        }
        let handle = recorder.handle();
        let counter = |def: Def, key: &'static str, value: &'static str| {
            recorder.register_counter(&labelled(def, key, value), &METADATA)
        };
        let counters = |def: Def, key: &'static str, values: &[&'static str]| {
            values.iter().map(|v| (*v, counter(def, key, v))).collect::<Vec<_>>()
        };
        Metrics {
            relayed_chunks: recorder
                .register_counter(&Key::from_static_name(catalogue::RELAYED_CHUNKS.name), &METADATA),
            retries: recorder.register_counter(&Key::from_static_name(catalogue::RETRIES.name), &METADATA),
            open_streams: PHASES.map(|p| {
                recorder.register_gauge(&labelled(catalogue::OPEN_STREAMS, "phase", p.as_str()), &METADATA)
            }),
            classes: ADMISSION_CLASSES.iter().map(|c| (*c, class_series(&recorder, c))).collect(),
            eat_probes: counters(catalogue::EAT_PROBES, "outcome", &EAT_OUTCOMES),
            entropy_exits: counters(catalogue::ENTROPY_EXITS, "signal", &ENTROPY_SIGNALS),
            continuations: counters(catalogue::CONTINUATIONS, "reason", &CONTINUATION_REASONS),
            handovers: counters(
                catalogue::HANDOVERS,
                "outcome",
                &HandoverOutcome::ALL.map(HandoverOutcome::label),
            ),
            place_claims: counters(catalogue::PLACE_CLAIMS, "outcome", &PLACE_OUTCOMES),
            place_waits: counters(catalogue::PLACE_WAITS, "outcome", &PLACE_WAIT_OUTCOMES),
            replicas_counted: {
                let g = recorder
                    .register_gauge(&Key::from_static_name(catalogue::REPLICAS_COUNTED.name), &METADATA);
                g.set(0.0);
                g
            },
            kv_exports: counters(catalogue::KV_EXPORTS, "outcome", &["ok", "failed"]),
            budgets_unenforced: counters(catalogue::BUDGET_UNENFORCED, "route", &HOOK_ONLY_ROUTES),
            requests: Lazy::default(),
            families: Lazy::default(),
            upstreams: Lazy::default(),
            handle,
            recorder,
        }
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Moves recorded histogram samples into their buckets. Rendering does it too; this
    /// keeps memory flat when nothing scrapes (see [`spawn_upkeep`]).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    fn counter(&self, def: Def, key: &'static str, value: &'static str) -> Counter {
        self.recorder.register_counter(&labelled(def, key, value), &METADATA)
    }

    pub fn count_request(&self, route: &'static str, outcome: meridian_core::Outcome) {
        let outcome = outcome.as_str();
        self.requests.with(
            &(route, outcome),
            || {
                let labels = vec![
                    Label::from_static_parts("route", route),
                    Label::from_static_parts("outcome", outcome),
                ];
                let key = Key::from_parts(catalogue::REQUESTS.name, labels);
                ((route, outcome), self.recorder.register_counter(&key, &METADATA))
            },
            |c| c.increment(1),
        );
    }

    fn with_family<R>(&self, family: &str, f: impl FnOnce(&FamilySeries) -> R) -> R {
        self.families.with(family, || (family.into(), FamilySeries::default()), f)
    }

    pub fn record_timings(&self, family: &str, t: &RequestTimings) {
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        let values = [
            secs(t.time_to_first_token),
            secs(t.time_to_first_output),
            secs(t.think_to_output_gap),
            Some(t.end_to_end.as_secs_f64()),
            t.think_tokens.map(f64::from),
            t.output_tokens.map(f64::from),
        ];
        self.with_family(family, |s| {
            for ((slot, def), value) in s.histograms.iter().zip(FAMILY_HISTOGRAMS).zip(values) {
                if let Some(v) = value {
                    slot.get_or_init(|| {
                        self.recorder.register_histogram(&family_key(def, family), &METADATA)
                    })
                    .record(v);
                }
            }
        });
    }

    pub fn count_budget_reached(&self, family: &str) {
        self.with_family(family, |s| {
            s.budget_reached
                .get_or_init(|| {
                    self.recorder.register_counter(&family_key(catalogue::BUDGET_REACHED, family), &METADATA)
                })
                .increment(1);
        });
    }

    /// The output-ITL histogram of `family`, for a stream to keep and record into per
    /// chunk without a lookup.
    pub fn output_itl(&self, family: &str) -> Histogram {
        self.with_family(family, |s| {
            s.output_itl
                .get_or_init(|| {
                    self.recorder.register_histogram(&family_key(catalogue::OUTPUT_ITL, family), &METADATA)
                })
                .clone()
        })
    }

    /// Moves one open stream from phase `from` to phase `to` (`None` = not open).
    /// Sets `meridian_open_streams` to the open streamed responses by phase (Pending,
    /// Think, Output). The registry of open streams (`crate::streams`) is where they are
    /// counted; this copies its counts in before each scrape rather than keeping a second
    /// tally that could drift from it.
    pub fn set_open_streams(&self, by_phase: [u64; 3]) {
        for (gauge, n) in self.open_streams.iter().zip(by_phase) {
            gauge.set(n as f64);
        }
    }

    fn with_upstream(&self, upstream: &str, f: impl FnOnce(&UpstreamSeries)) {
        let make = || {
            let gauge = |def: Def| {
                let key = Key::from_parts(def.name, vec![Label::new("upstream", upstream.to_owned())]);
                self.recorder.register_gauge(&key, &METADATA)
            };
            let series = UpstreamSeries {
                in_flight: gauge(catalogue::UPSTREAM_IN_FLIGHT),
                healthy: gauge(catalogue::UPSTREAM_HEALTHY),
                hook_ready: gauge(catalogue::HOOK_READY),
            };
            (upstream.into(), series)
        };
        self.upstreams.with(upstream, make, f);
    }

    pub fn set_upstream_in_flight(&self, upstream: &str, n: usize) {
        self.with_upstream(upstream, |s| s.in_flight.set(n as f64));
    }

    pub fn set_upstream_healthy(&self, upstream: &str, healthy: bool) {
        self.with_upstream(upstream, |s| s.healthy.set(f64::from(u8::from(healthy))));
    }

    /// The proxy replicas the engines count (`crate::share::Roster`).
    pub fn set_replicas_counted(&self, replicas: u32) {
        self.replicas_counted.set(f64::from(replicas));
    }

    pub fn set_hook_ready(&self, upstream: &str, ready: bool) {
        self.with_upstream(upstream, |s| s.hook_ready.set(f64::from(u8::from(ready))));
    }

    pub fn count_retry(&self) {
        self.retries.increment(1);
    }

    /// Increments the counter registered at start for `value`, or (for a value the
    /// fixed set lacks, which the callers' `&'static str`s make a code change) registers it.
    fn count_in(&self, set: &[(&'static str, Counter)], def: Def, key: &'static str, value: &'static str) {
        match fixed(set, value) {
            Some(c) => c.increment(1),
            None => self.counter(def, key, value).increment(1),
        }
    }

    pub fn count_eat_probe(&self, outcome: &'static str) {
        self.count_in(&self.eat_probes, catalogue::EAT_PROBES, "outcome", outcome);
    }

    pub fn count_entropy_exit(&self, signal: &'static str) {
        self.count_in(&self.entropy_exits, catalogue::ENTROPY_EXITS, "signal", signal);
    }

    pub fn count_continuation(&self, reason: &'static str) {
        self.count_in(&self.continuations, catalogue::CONTINUATIONS, "reason", reason);
    }

    /// An answer of a `think` upstream at the end of its thought, by what became of it.
    pub fn count_handover(&self, outcome: HandoverOutcome) {
        self.count_in(&self.handovers, catalogue::HANDOVERS, "outcome", outcome.label());
    }

    /// A place claimed from an engine's hook: `granted`, `refused` or `unanswered`; or a
    /// turn given up there: `withdrawn`.
    pub fn count_place_claim(&self, outcome: &'static str) {
        self.count_in(&self.place_claims, catalogue::PLACE_CLAIMS, "outcome", outcome);
    }

    /// A wait on a full engine for a place: `woken`, `expired` or `failed`.
    pub fn count_place_wait(&self, outcome: &'static str) {
        self.count_in(&self.place_waits, catalogue::PLACE_WAITS, "outcome", outcome);
    }

    /// A `think` upstream's KV export before a hand-over: done, or failed.
    pub fn count_kv_export(&self, ok: bool) {
        self.count_in(&self.kv_exports, catalogue::KV_EXPORTS, "outcome", if ok { "ok" } else { "failed" });
    }

    /// A request whose budget or exit signal nothing could enforce (see
    /// `catalogue::BUDGET_UNENFORCED`).
    pub fn count_budget_unenforced(&self, route: &'static str) {
        self.count_in(&self.budgets_unenforced, catalogue::BUDGET_UNENFORCED, "route", route);
    }

    fn with_class(&self, class: &'static str, f: impl FnOnce(&ClassSeries)) {
        match fixed(&self.classes, class) {
            Some(s) => f(s),
            None => f(&class_series(&self.recorder, class)),
        }
    }

    pub fn set_admission_queued(&self, class: &'static str, n: usize) {
        self.with_class(class, |s| s.queued.set(n as f64));
    }

    /// A request let through after `waited` in the queue.
    pub fn record_admission(&self, class: &'static str, waited: Duration) {
        self.with_class(class, |s| {
            s.wait.record(waited.as_secs_f64());
            s.admitted.increment(1);
        });
    }

    pub fn count_admission_timed_out(&self, class: &'static str) {
        self.with_class(class, |s| s.timed_out.increment(1));
    }

    pub fn count_admission_rejected(&self, class: &'static str) {
        self.with_class(class, |s| s.rejected.increment(1));
    }

    /// The series of tenant `name`, registered now (every one at 0).
    pub fn tenant_series(&self, name: &str) -> TenantSeries {
        let key = |def: Def, extra: Option<&'static str>| {
            let mut labels = vec![Label::new("tenant", name.to_owned())];
            if let Some(limit) = extra {
                labels.push(Label::from_static_parts("limit", limit));
            }
            Key::from_parts(def.name, labels)
        };
        let counter = |def, extra| self.recorder.register_counter(&key(def, extra), &METADATA);
        let series = TenantSeries {
            admitted: counter(catalogue::TENANT_ADMITTED, None),
            refused: [
                counter(catalogue::TENANT_REFUSED, Some("max_streams")),
                counter(catalogue::TENANT_REFUSED, Some("tokens_per_minute")),
            ],
            open: self.recorder.register_gauge(&key(catalogue::TENANT_OPEN, None), &METADATA),
            tokens: counter(catalogue::TENANT_TOKENS, None),
        };
        // Registered series render only once touched.
        series.admitted.increment(0);
        series.refused.iter().for_each(|c| c.increment(0));
        series.open.set(0.0);
        series.tokens.increment(0);
        series
    }

    /// Per relayed chunk: one atomic add on a handle registered at start.
    pub fn count_chunk(&self) {
        self.relayed_chunks.increment(1);
    }
}

fn family_key(def: Def, family: &str) -> Key {
    Key::from_parts(def.name, vec![Label::new("family", family.to_owned())])
}

fn labelled(def: Def, key: &'static str, value: &'static str) -> Key {
    Key::from_parts(def.name, vec![Label::from_static_parts(key, value)])
}

fn class_series(recorder: &PrometheusRecorder, class: &'static str) -> ClassSeries {
    let key = |def: Def| labelled(def, "class", class);
    ClassSeries {
        queued: recorder.register_gauge(&key(catalogue::ADMISSION_QUEUED), &METADATA),
        wait: recorder.register_histogram(&key(catalogue::ADMISSION_WAIT), &METADATA),
        admitted: recorder.register_counter(&key(catalogue::ADMISSION_ADMITTED), &METADATA),
        timed_out: recorder.register_counter(&key(catalogue::ADMISSION_TIMED_OUT), &METADATA),
        rejected: recorder.register_counter(&key(catalogue::ADMISSION_REJECTED), &METADATA),
    }
}

/// Every 5 s (the exporter's own default), moves histogram samples into buckets: they
/// are queued per observation until then, so without a scraper they would pile up.
pub fn spawn_upkeep(metrics: std::sync::Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            metrics.run_upkeep();
        }
    })
}

#[cfg(test)]
mod tests;
