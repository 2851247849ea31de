use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::config::EndpointConfig;
use meridian_core::Phase;
use meridian_core::route::{EngineView, Role, RouteRequest, RoutingPolicy, Work};

use super::{EnginePlaces, EngineReading, Place};
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
    /// Which work it takes (`upstream.endpoints[].role`).
    pub role: Role,
    /// The hook answered the last protocol check.
    hook_ready: AtomicBool,
    /// Served model names: from the config (fixed), else the last good `/v1/models`
    /// answer; `None` until known.
    models: RwLock<Option<Arc<[String]>>>,
    /// The names came from the config; discovery leaves them alone.
    models_configured: bool,
    /// The engine's `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` from its
    /// last `/metrics` scrape, as f64 bits; NaN while unknown.
    engine_waiting: AtomicU64,
    engine_kv_usage: AtomicU64,
    /// Streams through this proxy currently in the output phase (the observer keeps it).
    output_streams: AtomicUsize,
    /// The engine's own count of its requests (every replica's), from its hook's hello or
    /// vLLM's own gauges.
    pub engine: EngineReading,
    /// The places this replica holds in the engine's limit, granted by its hook
    /// (`admission.places = "engine"`).
    pub places: EnginePlaces,
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
            role: cfg.role,
            hook_ready: AtomicBool::new(false),
            models: RwLock::new(cfg.models.as_deref().map(Arc::from)),
            models_configured: cfg.models.is_some(),
            engine_waiting: AtomicU64::new(f64::NAN.to_bits()),
            engine_kv_usage: AtomicU64::new(f64::NAN.to_bits()),
            output_streams: AtomicUsize::new(0),
            engine: EngineReading::default(),
            places: EnginePlaces::default(),
        }
    }

    /// What the routing policy reads of this upstream: this replica's own streams, or the
    /// engine's count of every replica's where it reports one and it is higher.
    pub fn view(&self) -> EngineView<'_> {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let engine_answering = self.engine.now().map_or(0, |e| e.answering);
        EngineView {
            name: &self.name,
            answering: count(self.output_streams()).max(engine_answering),
            in_flight: count(self.requests_held()),
            kv_usage: self.engine_load().1,
        }
    }

    /// Requests the engine holds, as admission counts them against `max_streams` and
    /// routing reads them: the engine's own count (every replica's, from its hook or
    /// vLLM's gauges) brought up to date, never below the requests this replica has open
    /// there; those alone when the engine reports nothing.
    pub fn requests_held(&self) -> usize {
        let own = self.in_flight();
        self.engine.now().map_or(own, |e| (e.requests as usize).max(own))
    }

    /// Streams to this upstream that are answering (output phase) right now.
    pub fn output_streams(&self) -> usize {
        self.output_streams.load(Ordering::Relaxed)
    }

    /// Moves one stream of this upstream between phases (`None`: not open).
    pub fn move_stream(&self, from: Option<Phase>, to: Option<Phase>) {
        match (from == Some(Phase::Output), to == Some(Phase::Output)) {
            (false, true) => {
                self.output_streams.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                // Never below zero, whatever order the updates arrive in.
                let _ = self
                    .output_streams
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(1)));
            }
            _ => {}
        }
    }

    /// Records the engine's own load gauges (`None`: unknown, e.g. the scrape failed).
    pub fn set_engine_load(&self, waiting: Option<f64>, kv_usage: Option<f64>) {
        self.engine_waiting.store(waiting.unwrap_or(f64::NAN).to_bits(), Ordering::Relaxed);
        self.engine_kv_usage.store(kv_usage.unwrap_or(f64::NAN).to_bits(), Ordering::Relaxed);
    }

    /// The engine's requests waiting and KV cache usage (0-1), as last scraped.
    pub fn engine_load(&self) -> (Option<f64>, Option<f64>) {
        let read = |a: &AtomicU64| Some(f64::from_bits(a.load(Ordering::Relaxed))).filter(|v| !v.is_nan());
        (read(&self.engine_waiting), read(&self.engine_kv_usage))
    }

    /// The served model names, when known (configured or discovered).
    pub fn models(&self) -> Option<Arc<[String]>> {
        self.models.read().map(|m| m.clone()).unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Whether the names come from `upstream.endpoints[].models` rather than discovery.
    pub fn models_configured(&self) -> bool {
        self.models_configured
    }

    /// Whether this upstream serves `model`: `None` while its list is unknown.
    pub fn serves(&self, model: &str) -> Option<bool> {
        self.models().map(|list| list.iter().any(|m| m == model))
    }

    /// Records a list learned from `/v1/models`; ignored when the config fixes the list.
    /// Returns whether the list changed.
    pub fn set_discovered_models(&self, list: Vec<String>) -> bool {
        if self.models_configured {
            return false;
        }
        let mut slot = self.models.write().unwrap_or_else(|e| e.into_inner());
        if slot.as_deref() == Some(list.as_slice()) {
            return false;
        }
        *slot = Some(Arc::from(list));
        true
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
    released: Arc<Notify>,
    /// The place the engine granted this request, given back with the guard.
    place: Option<Place>,
}

impl InFlight {
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }

    /// The request holds `place` in its engine's limit until the guard drops.
    pub fn with_place(mut self, place: Place) -> Self {
        debug_assert!(self.place.is_none(), "a request holds one place");
        self.place = Some(place);
        self
    }

    /// The error for an answer this upstream broke (see [`broken_answer`]).
    pub fn broken(&self, reason: String) -> crate::error::ProxyError {
        broken_answer(&self.upstream.name, reason)
    }
}

/// The error for an answer `upstream` broke (`reason` completes "upstream X …"), logged
/// once here.
pub fn broken_answer(upstream: &str, reason: String) -> crate::error::ProxyError {
    tracing::warn!(%upstream, %reason, "upstream answer broken");
    crate::error::ProxyError::UpstreamFailed { upstream: upstream.to_owned(), reason }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.upstream.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.upstream.engine.ended();
        self.metrics.set_upstream_in_flight(&self.upstream.name, now);
        // A place goes back to the engine as it drops, and tells the waiters once it has.
        if self.place.take().is_none() {
            self.released.notify_one();
        }
    }
}

/// What a request wants of an upstream.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    /// Its model (`None`: any upstream may take it).
    pub model: Option<&'a str>,
    /// Its affinity key (`upstream.affinity_header`), for the routing policy.
    pub affinity: Option<&'a str>,
    /// What it goes for, matched against the upstreams' roles.
    pub work: Work,
}

impl<'a> Want<'a> {
    /// `model`, with no affinity key, whatever work (tests, tools).
    pub fn model(model: Option<&'a str>) -> Self {
        Want { model, affinity: None, work: Work::Unknown }
    }

    /// Whether `u` may serve its model: it lists it, or its list is not known yet.
    fn served_by(&self, u: &Upstream) -> bool {
        self.model.is_none_or(|m| u.serves(m) != Some(false))
    }
}

/// Why no upstream was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPick {
    /// No upstream that may serve the request is in rotation (or all were tried).
    NoHealthy,
    /// Upstreams are in rotation, but every one of them (and every other) is known not
    /// to serve the requested model.
    ModelNotServed,
    /// Upstreams in rotation serve the model, but the caller's condition (admission's
    /// "not saturated") excluded every one of them.
    Saturated,
}

/// All upstreams, and the routing policy that picks among the healthy ones.
#[derive(Debug)]
pub struct UpstreamPool {
    upstreams: Vec<Arc<Upstream>>,
    routing: Box<dyn RoutingPolicy>,
    /// Signalled when capacity may have freed up: a request ended, a health round ran.
    released: Arc<Notify>,
}

impl UpstreamPool {
    pub fn new(endpoints: &[EndpointConfig], routing: Box<dyn RoutingPolicy>) -> Self {
        UpstreamPool {
            upstreams: endpoints.iter().map(|e| Arc::new(Upstream::new(e))).collect(),
            routing,
            released: Arc::new(Notify::new()),
        }
    }

    /// The routing policy's name (`upstream.routing`).
    pub fn routing(&self) -> &'static str {
        self.routing.name()
    }

    /// The notice [`capacity_notified`](Self::capacity_notified) waits on, for a task
    /// that outlives its caller.
    pub fn capacity_notice(&self) -> Arc<Notify> {
        Arc::clone(&self.released)
    }

    /// Wakes whoever waits for capacity (admission control).
    pub fn capacity_changed(&self) {
        self.released.notify_one();
    }

    /// Completes when capacity may have freed up since the last call (one waiter).
    pub async fn capacity_notified(&self) {
        self.released.notified().await;
    }

    pub fn all(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    pub fn any_healthy(&self) -> bool {
        self.upstreams.iter().any(|u| u.is_healthy())
    }

    /// Among the healthy upstreams that serve `model` (any upstream when `model` is
    /// `None`), skipping `tried`, those whose role takes `work` (all of them when none in
    /// rotation does): the one the routing policy picks for a request with this
    /// `affinity` key (by default the fewest answering streams, the latency-sensitive
    /// ones, then the emptiest KV cache, then the fewest in flight; see
    /// `meridian_core::route`). An upstream whose model list is not known yet may serve
    /// anything.
    pub fn pick(
        &self,
        want: Want<'_>,
        tried: &[Arc<Upstream>],
        metrics: &Arc<Metrics>,
    ) -> Result<InFlight, NoPick> {
        self.pick_where(want, tried, metrics, |_| true)
    }

    /// [`pick`](Self::pick) among the upstreams that also satisfy `ok`; when `ok` rules
    /// out every candidate, [`NoPick::Saturated`].
    pub fn pick_where(
        &self,
        want: Want<'_>,
        tried: &[Arc<Upstream>],
        metrics: &Arc<Metrics>,
        ok: impl Fn(&Upstream) -> bool,
    ) -> Result<InFlight, NoPick> {
        let candidate = |u: &Arc<Upstream>| {
            u.is_healthy() && !tried.iter().any(|t| Arc::ptr_eq(t, u)) && want.served_by(u)
        };
        let meant = self.upstreams.iter().any(|u| candidate(u) && u.role.takes(want.work));
        self.choose(want, metrics, |u| candidate(u) && (!meant || u.role.takes(want.work)), ok)
    }

    /// An answer handed over by `from` at the end of its thought (`from`'s role is
    /// `think`): among the healthy upstreams other than `from` that serve `model`, take
    /// answers, and satisfy `ok` (admission's "not saturated"), the one the routing policy
    /// picks; none, and the answer stays where it is.
    pub fn hand_over(
        &self,
        model: &str,
        affinity: Option<&str>,
        from: &Upstream,
        metrics: &Arc<Metrics>,
        ok: impl Fn(&Upstream) -> bool,
    ) -> Option<InFlight> {
        let want = Want { model: Some(model), affinity, work: Work::Answer };
        let candidate = |u: &Arc<Upstream>| {
            u.is_healthy()
                && !std::ptr::eq(Arc::as_ptr(u), from)
                && u.role.takes(Work::Answer)
                && want.served_by(u)
        };
        self.choose(want, metrics, candidate, ok).ok()
    }

    /// Whether any upstream takes handed-over answers (some are `think` servers).
    pub fn hands_over(&self) -> bool {
        self.upstreams.iter().any(|u| u.role == Role::Think)
    }

    /// The routing policy's pick among the `candidate`s that satisfy `ok`, counted in
    /// flight there.
    fn choose(
        &self,
        want: Want<'_>,
        metrics: &Arc<Metrics>,
        candidate: impl Fn(&Arc<Upstream>) -> bool,
        ok: impl Fn(&Upstream) -> bool,
    ) -> Result<InFlight, NoPick> {
        if self.upstreams.is_empty() {
            return Err(NoPick::NoHealthy);
        }
        let mut any_candidate = false;
        // Two short lists per request (not per chunk): the pool is a handful of engines.
        let mut open: Vec<&Arc<Upstream>> = Vec::new();
        for u in &self.upstreams {
            if candidate(u) {
                any_candidate = true;
                if ok(u) {
                    open.push(u);
                }
            }
        }
        let views: Vec<EngineView<'_>> = open.iter().map(|u| u.view()).collect();
        let chosen =
            self.routing.choose(&RouteRequest { affinity_key: want.affinity }, &views).map(|i| open[i]);
        let Some(chosen) = chosen.cloned() else {
            if any_candidate {
                return Err(NoPick::Saturated);
            }
            let someone_serves = self.upstreams.iter().any(|u| want.served_by(u));
            return Err(if !someone_serves && self.any_healthy() {
                NoPick::ModelNotServed
            } else {
                NoPick::NoHealthy
            });
        };
        let now = chosen.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        chosen.engine.sent();
        metrics.set_upstream_in_flight(&chosen.name, now);
        Ok(InFlight {
            upstream: chosen,
            metrics: metrics.clone(),
            released: self.released.clone(),
            place: None,
        })
    }

    /// The union of the known model lists, in pool order without duplicates, and whether
    /// every upstream's list is known.
    pub fn known_models(&self) -> (Vec<String>, bool) {
        let mut out: Vec<String> = Vec::new();
        let mut all_known = true;
        for u in &self.upstreams {
            match u.models() {
                Some(list) => {
                    for m in list.iter() {
                        if !out.contains(m) {
                            out.push(m.clone());
                        }
                    }
                }
                None => all_known = false,
            }
        }
        (out, all_known)
    }
}

#[cfg(test)]
mod tests;
