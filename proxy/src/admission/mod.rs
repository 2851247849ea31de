//! Admission control: while every upstream that serves a request's model is saturated, a
//! new request waits here, in the proxy, instead of in vLLM's queue, and waiters are let
//! through highest class first (output-phase starts, then interactive, then batch), so
//! the latency-sensitive work is the first to get an engine when one frees up, and
//! tenants (`[tenants]`) share fairly within each class. Streams
//! already running are never held back: admission acts only before a request is sent.
//!
//! An upstream is saturated while the requests open to it through this proxy reach
//! `admission.max_streams`, or its engine's own gauges (scraped from its `/metrics` by
//! the health loop) exceed `max_waiting` / `max_kv_usage`. The queue policy is plain code
//! in [`queue`]; this module wires it to the pool, the clock and the metrics.

pub mod queue;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::{AdmissionConfig, PlacesFrom};
use crate::hook::HookChannel;
use tokio::sync::oneshot;

use crate::share::{Fleet, Roster};
pub use queue::{ClassQueue, Ticket};

use crate::ctx::Class;

use crate::error::ProxyError;
use crate::telemetry::Metrics;
use crate::upstream::places::RENEW_EVERY;
use crate::upstream::{
    Claimed, EnginePlaces, InFlight, NoPick, PlaceTerms, Turn, Upstream, UpstreamPool, Want,
};
use meridian_core::route::Work;

/// When an upstream counts as saturated.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub max_streams: Option<u32>,
    pub max_waiting: Option<f64>,
    pub max_kv_usage: Option<f64>,
    /// The replicas that share each engine's `max_streams` (`admission.replicas`).
    pub fleet: Fleet,
    /// With `admission.places = "engine"` (and `max_streams`): what this replica's claims
    /// on each engine's places state.
    pub places: Option<Arc<PlaceTerms>>,
}

impl Limits {
    pub fn from_config(cfg: &AdmissionConfig) -> Self {
        Limits {
            max_streams: cfg.max_streams,
            max_waiting: cfg.max_waiting.map(f64::from),
            max_kv_usage: cfg.max_kv_usage,
            fleet: Fleet::of(cfg),
            places: None,
        }
    }

    /// Claims on each engine's places go over `channel` as `holder`, when the config
    /// asks the engines (`admission.places = "engine"`) and sets `max_streams`.
    fn with_places(
        mut self,
        cfg: &AdmissionConfig,
        channel: HookChannel,
        holder: String,
        metrics: Arc<Metrics>,
        roster: Arc<Roster>,
    ) -> Self {
        self.places = match (cfg.places, self.max_streams) {
            (PlacesFrom::Engine, Some(limit)) => {
                Some(Arc::new(PlaceTerms { channel, holder, limit, metrics, waits: cfg.place_waits, roster }))
            }
            _ => None,
        };
        self
    }

    /// Whether `u`'s engine grants its places itself: this replica asks it, and only
    /// holds back while its own requests there reach the limit or the engine refused a
    /// place a moment ago.
    fn engine_grants(&self, u: &Upstream) -> bool {
        self.places.is_some() && u.hook.is_some() && !u.places.alone()
    }

    /// Whether `u` should take no new request now. Unknown engine gauges (no scrape yet,
    /// or the last one failed) do not saturate.
    pub fn saturated(&self, u: &Upstream) -> bool {
        let (waiting, kv) = u.engine_load();
        let own = u32::try_from(u.in_flight()).unwrap_or(u32::MAX);
        let full = match self.max_streams {
            None => false,
            Some(m) if self.engine_grants(u) => own >= m || u.places.held_back(),
            Some(m) => !self.fleet.has_room(m, own, u.engine.now().map(|n| n.requests)),
        };
        full || matches!((self.max_waiting, waiting), (Some(m), Some(w)) if w > m)
            || matches!((self.max_kv_usage, kv), (Some(m), Some(k)) if k > m)
    }

    /// Whether the engines' `/metrics` must be scraped: for the engine gauges, and for
    /// `max_streams`, vLLM's own count of the requests an engine without the hook holds.
    pub fn reads_engine_metrics(&self) -> bool {
        self.max_streams.is_some() || self.max_waiting.is_some() || self.max_kv_usage.is_some()
    }
}

/// What a request waits for: an upstream of its model (with its affinity key, for the
/// routing policy, and its work, for the upstreams' roles), in its class and tenant flow.
#[derive(Clone, Copy)]
struct Wanted<'a> {
    model: &'a str,
    affinity: Option<&'a str>,
    work: Work,
    class: Class,
    flow: (usize, u32),
}

/// A request let through admission: its in-flight guard, and how long it waited in line.
pub struct Admitted {
    pub guard: InFlight,
    /// Zero when it was let straight through: the time spent deciding that (or being
    /// descheduled meanwhile) is no wait, and must not read as one to the hook's start
    /// target. Otherwise the whole time since it arrived at admission.
    pub queued: Duration,
}

/// Why a queued request was let go without an upstream.
#[derive(Debug)]
enum Refused {
    NoPick(NoPick),
    QueueFull,
}

struct Waiter {
    model: String,
    /// The request's affinity key (`upstream.affinity_header`), for the routing policy.
    affinity: Option<String>,
    /// What it goes for (the upstreams' roles).
    work: Work,
    tx: oneshot::Sender<Result<InFlight, Refused>>,
}

pub struct Admission {
    enabled: bool,
    limits: Limits,
    timeout: Duration,
    queue: Mutex<ClassQueue<Waiter>>,
    pool: Arc<UpstreamPool>,
    metrics: Arc<Metrics>,
}

impl Admission {
    /// `flows`: the tenants the queue shares fairly between (1 without `[tenants]`).
    /// `channel`: the policy channel, for claims on the engines' places; `roster`, what
    /// their answers say of the fleet (read by the tenants' split).
    pub fn new(
        cfg: &AdmissionConfig,
        flows: usize,
        pool: Arc<UpstreamPool>,
        metrics: Arc<Metrics>,
        channel: HookChannel,
        roster: Arc<Roster>,
    ) -> Self {
        let limits =
            Limits::from_config(cfg).with_places(cfg, channel, holder_name(), Arc::clone(&metrics), roster);
        if let Some(terms) = limits.places.as_ref().filter(|_| cfg.enabled) {
            tracing::info!(holder = %terms.holder, max_streams = terms.limit,
                "admission: each engine's hook grants the places of its max_streams");
        }
        if let (true, Some(limit)) = (cfg.enabled && cfg.replicas > 1, limits.max_streams) {
            tracing::info!(
                replicas = cfg.replicas,
                replica_index = ?cfg.replica_index,
                part = limits.fleet.part(limit),
                max_streams = limit,
                "admission: this replica holds its part of each engine's max_streams"
            );
        }
        Admission {
            enabled: cfg.enabled,
            limits,
            timeout: Duration::from_secs_f64(cfg.queue_timeout_s),
            queue: Mutex::new(ClassQueue::new(cfg.max_queued as usize, flows)),
            pool,
            metrics,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn lock(&self) -> MutexGuard<'_, ClassQueue<Waiter>> {
        // The queue stays consistent whatever panicked while holding it.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pick(&self, model: &str, affinity: Option<&str>, work: Work) -> Result<InFlight, NoPick> {
        let want = Want { model: Some(model), affinity, work };
        let open = |u: &Upstream| !self.limits.saturated(u);
        // An engine that woke this replica keeps a place for it: the request goes there
        // whatever the routing policy would prefer (`EnginePlaces::kept_here`).
        if self.limits.places.is_some() && self.pool.all().iter().any(|u| u.places.kept_here()) {
            let kept = self.pool.pick_where(want, &[], &self.metrics, |u| u.places.kept_here() && open(u));
            if kept.is_ok() {
                return kept;
            }
        }
        self.pool.pick_where(want, &[], &self.metrics, open)
    }

    /// Whether `u` has room for one more request (answers handed over at the end of a
    /// thought go only where there is).
    pub fn has_room(&self, u: &Upstream) -> bool {
        !self.enabled || !self.limits.saturated(u)
    }

    fn publish(&self, q: &ClassQueue<Waiter>) {
        for class in Class::ALL {
            self.metrics.set_admission_queued(class.as_str(), q.count(class));
        }
    }

    /// Waits until an upstream serving `model` (of a role that takes `work`, where one is
    /// in rotation) has room, then returns the request's
    /// in-flight guard on it. Fails with 503 after `queue_timeout_s`, at once when the
    /// queue is full, and like an unqueued request when no upstream can serve the model.
    /// A caller that goes away (its future is dropped) leaves the queue. `flow`: its
    /// tenant's flow and weight, for the fair share within its class. With
    /// `admission.places = "engine"` the upstream's engine grants the request a place
    /// first; refused, it waits again at its place in line.
    pub async fn admit(
        self: &Arc<Self>,
        model: &str,
        affinity: Option<&str>,
        work: Work,
        class: Class,
        flow: (usize, u32),
    ) -> Result<Admitted, ProxyError> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.timeout;
        let wanted = Wanted { model, affinity, work, class, flow };
        let mut in_line = None;
        // Whether it had to wait: queued behind others, or refused a place by its engine.
        let mut waited = false;
        loop {
            let guard = self.turn(&wanted, &mut in_line, deadline).await?;
            let turn = Turn { class: class as u8, waited: started.elapsed() };
            // The claim counts against the same deadline as the wait in line.
            match tokio::time::timeout_at(deadline, self.claim_place(guard, turn)).await {
                Ok(Some(guard)) => {
                    let elapsed = started.elapsed();
                    self.metrics.record_admission(class.as_str(), elapsed);
                    let waited = waited || in_line.is_some();
                    return Ok(Admitted { guard, queued: if waited { elapsed } else { Duration::ZERO } });
                }
                Ok(None) => waited = true,
                Err(_) => return Err(self.timed_out(class)),
            }
        }
    }

    /// One wait for an upstream with room, queued at `in_line` (the place kept from an
    /// earlier wait whose engine then refused a place) or, with nobody ahead, let through
    /// at once; the place in line it took is left in `in_line`.
    async fn turn(
        self: &Arc<Self>,
        wanted: &Wanted<'_>,
        in_line: &mut Option<Ticket>,
        deadline: tokio::time::Instant,
    ) -> Result<InFlight, ProxyError> {
        let Wanted { model, affinity, work, class, flow } = *wanted;
        let (tx, rx) = oneshot::channel();
        // Made only for a request that waits: one let straight through copies nothing.
        let waiter = || Waiter { model: model.to_owned(), affinity: affinity.map(str::to_owned), work, tx };
        let (ticket, evicted) = {
            let mut q = self.lock();
            match *in_line {
                Some(ticket) => {
                    q.put_back(ticket, flow, waiter());
                    self.publish(&q);
                    (ticket, None)
                }
                None => {
                    // Nobody ahead: straight through when there is room.
                    if q.is_empty() {
                        match self.pick(model, affinity, work) {
                            Ok(guard) => return Ok(guard),
                            Err(NoPick::Saturated) => {}
                            Err(e) => return Err(no_pick_error(e, model)),
                        }
                    }
                    let pushed = q.push(class, flow, waiter());
                    self.publish(&q);
                    match pushed {
                        Ok(queued) => queued,
                        Err(_) => {
                            self.metrics.count_admission_rejected(class.as_str());
                            return Err(ProxyError::AdmissionQueueFull);
                        }
                    }
                }
            }
        };
        *in_line = Some(ticket);
        if let Some(((evicted_class, _, _), w)) = evicted {
            self.metrics.count_admission_rejected(evicted_class.as_str());
            let _ = w.tx.send(Err(Refused::QueueFull));
        }
        // Someone ahead may be waiting for another model's upstreams while ours has room.
        self.pool.capacity_changed();
        let leave = LeaveOnDrop { admission: self, ticket };
        let mut rx = rx;
        let outcome = match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(Ok(r)) => Some(r),
            // Dropped unanswered: only if the queue lost it, which it does not; fail safe.
            Ok(Err(_)) => Some(Err(Refused::NoPick(NoPick::NoHealthy))),
            // A grant may have raced the deadline; the queue says who won.
            Err(_) => match self.remove(ticket) {
                true => None,
                false => rx.try_recv().ok(),
            },
        };
        drop(leave);
        match outcome {
            Some(Ok(guard)) => Ok(guard),
            Some(Err(Refused::QueueFull)) => Err(ProxyError::AdmissionQueueFull),
            Some(Err(Refused::NoPick(e))) => Err(no_pick_error(e, model)),
            None => Err(self.timed_out(class)),
        }
    }

    /// A request of `class` that waited `queue_timeout_s` in all, counted.
    fn timed_out(&self, class: Class) -> ProxyError {
        self.metrics.count_admission_timed_out(class.as_str());
        ProxyError::AdmissionTimeout { after_s: self.timeout.as_secs_f64() }
    }

    /// With `admission.places = "engine"`, claims the request's place from its
    /// upstream's hook: the guard, now holding the place, or `None` when the engine's
    /// places are all held, or kept for requests at other replicas that have waited longer
    /// (`turn`), or its hook did not answer for a moment (the upstream then counts as full
    /// here for a moment, and the request must wait again). Upstreams without a hook, or
    /// whose hook takes no claims, are decided by this replica alone.
    async fn claim_place(&self, guard: InFlight, turn: Turn) -> Option<InFlight> {
        let Some(terms) = &self.limits.places else { return Some(guard) };
        let upstream = Arc::clone(guard.upstream());
        let Some(addr) = upstream.hook.as_deref() else { return Some(guard) };
        if upstream.places.alone() {
            return Some(self.unclaimed(guard));
        }
        let notice = self.pool.capacity_notice();
        match EnginePlaces::claim(&upstream, addr, terms, turn, &notice).await {
            Claimed::Granted(place) => {
                self.metrics.count_place_claim("granted");
                self.withdraw_turns(Some(&upstream), terms);
                Some(guard.with_place(place))
            }
            Claimed::Refused => {
                self.metrics.count_place_claim("refused");
                None
            }
            Claimed::Behind => None,
            Claimed::Unanswered { error, alone } => {
                self.metrics.count_place_claim("unanswered");
                if alone {
                    tracing::warn!(upstream = %upstream.name, %error,
                        "admission: the engine's hook takes no claims; this replica decides its room alone until it does");
                    return Some(self.unclaimed(guard));
                }
                tracing::debug!(upstream = %upstream.name, %error, "admission: a claim went unanswered; the request waits");
                None
            }
        }
    }

    /// An upstream for another attempt at an admitted request whose attempt at `tried`'s
    /// last upstream failed before its first byte: one with room (as [`admit`](Self::admit)
    /// decides room), not tried yet, whose engine grants it a place when
    /// `admission.places = "engine"`, so a retry never takes an engine past its limit. It
    /// does not wait in line: the request waited its turn once, and its failure is one the
    /// client may retry. An engine that refuses the place counts as tried. `None`: no
    /// upstream left with room; the turns its refused claims took are given back (nobody
    /// waits for them).
    pub async fn retry_at(
        &self,
        want: Want<'_>,
        tried: &mut Vec<Arc<Upstream>>,
        class: Class,
    ) -> Option<InFlight> {
        let open = |u: &Upstream| !self.limits.saturated(u);
        while let Ok(guard) = self.pool.pick_where(want, tried, &self.metrics, open) {
            let upstream = Arc::clone(guard.upstream());
            let turn = Turn { class: class as u8, waited: Duration::ZERO };
            match self.claim_place(guard, turn).await {
                Some(guard) => return Some(guard),
                None => tried.push(upstream),
            }
        }
        if let Some(terms) = &self.limits.places {
            self.withdraw_turns(None, terms);
        }
        None
    }

    /// `guard`, holding a place taken alone ([`EnginePlaces::taken_alone`]) where its
    /// engine grants places (elsewhere `guard` as it is), so that the engine counts the
    /// request once its hook answers: for a request sent there without a claim, because
    /// this replica decides that engine's room alone (found by the caller, and not asked
    /// again: a hook that answered in between would otherwise never hear of the request).
    pub fn unclaimed(&self, guard: InFlight) -> InFlight {
        let upstream = Arc::clone(guard.upstream());
        match (&self.limits.places, upstream.hook.as_deref()) {
            (Some(terms), Some(addr)) if self.enabled => guard.with_place(EnginePlaces::taken_alone(
                &upstream,
                addr,
                terms,
                &self.pool.capacity_notice(),
            )),
            _ => guard,
        }
    }

    /// Whether a request sent to `u` needs a place granted by its engine first
    /// (`admission.places = "engine"`, and the engine's hook takes claims).
    pub fn needs_place(&self, u: &Upstream) -> bool {
        self.enabled && self.limits.engine_grants(u)
    }

    /// A place at `guard`'s upstream for an answer handed over at the end of its thought
    /// (a request of `class` that was admitted elsewhere): claimed as a retry's is,
    /// without waiting in line, since the answer can always stay where it is. `None`:
    /// refused (the turn the refusal took is given back, nobody here waits for it).
    pub async fn place_for_handover(&self, guard: InFlight, class: Class) -> Option<InFlight> {
        let turn = Turn { class: class as u8, waited: Duration::ZERO };
        let placed = self.claim_place(guard, turn).await;
        if let (None, Some(terms)) = (&placed, &self.limits.places) {
            self.withdraw_turns(None, terms);
        }
        placed
    }

    /// After a place was granted at `granted` (or a retry gave up: `None`): with nobody
    /// left waiting in this replica's queue, gives up the turns its refused claims keep at
    /// the other engines ([`EnginePlaces::withdraw`]), which would otherwise hold their
    /// next freed place for a request that no longer needs it.
    fn withdraw_turns(&self, granted: Option<&Arc<Upstream>>, terms: &Arc<PlaceTerms>) {
        let kept = |u: &&Arc<Upstream>| !granted.is_some_and(|g| Arc::ptr_eq(u, g)) && u.places.refused();
        if !self.pool.all().iter().any(|u| kept(&u)) {
            return;
        }
        // Read before the queue: a refusal after this one is a request waiting again.
        let seen: Vec<u64> = self.pool.all().iter().map(|u| u.places.refusals()).collect();
        if !self.lock().is_empty() {
            return;
        }
        for (u, refusals) in self.pool.all().iter().zip(seen) {
            if let (true, Some(addr)) = (kept(&u), u.hook.as_deref()) {
                EnginePlaces::withdraw(u, addr, terms, refusals);
            }
        }
    }

    /// Takes a waiter out; whether it was still queued.
    fn remove(&self, ticket: Ticket) -> bool {
        let mut q = self.lock();
        let removed = q.remove(ticket).is_some();
        if removed {
            self.publish(&q);
        }
        removed
    }

    /// Lets through, in class order, every waiter whose model has an upstream with room.
    pub fn pump(&self) {
        let granted = {
            let mut q = self.lock();
            if q.is_empty() {
                return;
            }
            let mut full: Vec<(String, Work)> = Vec::new();
            let granted = q.release(|w| {
                if full.iter().any(|(m, work)| *m == w.model && *work == w.work) {
                    return None;
                }
                match self.pick(&w.model, w.affinity.as_deref(), w.work) {
                    Ok(guard) => Some(Ok(guard)),
                    Err(NoPick::Saturated) => {
                        full.push((w.model.clone(), w.work));
                        None
                    }
                    Err(e) => Some(Err(Refused::NoPick(e))),
                }
            });
            self.publish(&q);
            granted
        };
        // A waiter that left meanwhile hands its guard back by dropping it, which wakes
        // the next pump.
        for (_, w, result) in granted {
            let _ = w.tx.send(result);
        }
    }

    /// Runs [`pump`](Self::pump) whenever capacity may have freed up, and with
    /// `admission.places = "engine"` restates this replica's places at every engine each
    /// [`RENEW_EVERY`] so their leases hold, until aborted.
    pub fn spawn_pump(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let pump = async {
                loop {
                    self.pool.capacity_notified().await;
                    self.pump();
                }
            };
            let renew = async {
                let Some(terms) = &self.limits.places else { return };
                // The first renewal one period in: the claims of the first requests say
                // all there is to say before that.
                let mut every =
                    tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    // Each engine in a task of its own: one slow hook must not let the
                    // others' leases lapse.
                    for (upstream, addr) in
                        self.pool.all().iter().filter_map(|u| Some((u, u.hook.as_deref()?)))
                    {
                        EnginePlaces::renew_in_background(upstream, addr, terms);
                    }
                }
            };
            tokio::join!(pump, renew);
        })
    }
}

/// This replica's name at the engines: unique among replicas (its host, as Kubernetes
/// names the pod, its process, and when it started, should a process id come round
/// again).
fn holder_name() -> String {
    // Several proxies in one process (tests) are told apart by their count.
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "meridian".into());
    let started =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{host}-{}-{:x}-{made}", std::process::id(), started & 0xffff_ffff)
}

#[cfg(test)]
mod tests;

fn no_pick_error(e: NoPick, model: &str) -> ProxyError {
    match e {
        NoPick::ModelNotServed => ProxyError::model_not_found(model),
        NoPick::NoHealthy | NoPick::Saturated => ProxyError::NoHealthyUpstream,
    }
}

/// Removes a waiter whose request went away while it was queued.
struct LeaveOnDrop<'a> {
    admission: &'a Admission,
    ticket: Ticket,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        self.admission.remove(self.ticket);
    }
}
