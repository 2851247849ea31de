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
pub mod share;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::AdmissionConfig;
use tokio::sync::oneshot;

pub use queue::{ClassQueue, Ticket};
pub use share::Fleet;

use crate::ctx::Class;

use crate::error::ProxyError;
use crate::telemetry::Metrics;
use crate::upstream::{InFlight, NoPick, Upstream, UpstreamPool, Want};
use meridian_core::route::Work;

/// When an upstream counts as saturated.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub max_streams: Option<u32>,
    pub max_waiting: Option<f64>,
    pub max_kv_usage: Option<f64>,
    /// The replicas that share each engine's `max_streams` (`admission.replicas`).
    pub fleet: Fleet,
}

impl Limits {
    pub fn from_config(cfg: &AdmissionConfig) -> Self {
        Limits {
            max_streams: cfg.max_streams,
            max_waiting: cfg.max_waiting.map(f64::from),
            max_kv_usage: cfg.max_kv_usage,
            fleet: Fleet::new(cfg.replicas, cfg.replica_index),
        }
    }

    /// Whether `u` should take no new request now. Unknown engine gauges (no scrape yet,
    /// or the last one failed) do not saturate.
    pub fn saturated(&self, u: &Upstream) -> bool {
        let (waiting, kv) = u.engine_load();
        let own = u32::try_from(u.in_flight()).unwrap_or(u32::MAX);
        let engine_holds = u.engine.now().map(|n| n.requests);
        self.max_streams.is_some_and(|m| !self.fleet.has_room(m, own, engine_holds))
            || matches!((self.max_waiting, waiting), (Some(m), Some(w)) if w > m)
            || matches!((self.max_kv_usage, kv), (Some(m), Some(k)) if k > m)
    }

    /// Whether the engines' `/metrics` must be scraped: for the engine gauges, and for
    /// `max_streams`, vLLM's own count of the requests an engine without the hook holds.
    pub fn reads_engine_metrics(&self) -> bool {
        self.max_streams.is_some() || self.max_waiting.is_some() || self.max_kv_usage.is_some()
    }
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
    pub fn new(cfg: &AdmissionConfig, flows: usize, pool: Arc<UpstreamPool>, metrics: Arc<Metrics>) -> Self {
        let limits = Limits::from_config(cfg);
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
        self.pool.pick_where(want, &[], &self.metrics, |u| !self.limits.saturated(u))
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
    /// tenant's flow and weight, for the fair share within its class.
    pub async fn admit(
        self: &Arc<Self>,
        model: &str,
        affinity: Option<&str>,
        work: Work,
        class: Class,
        flow: (usize, u32),
    ) -> Result<InFlight, ProxyError> {
        let started = Instant::now();
        let (tx, rx) = oneshot::channel();
        let (ticket, evicted) = {
            let mut q = self.lock();
            // Nobody ahead: straight through when there is room.
            if q.is_empty() {
                match self.pick(model, affinity, work) {
                    Ok(guard) => {
                        self.metrics.record_admission(class.as_str(), Duration::ZERO);
                        return Ok(guard);
                    }
                    Err(NoPick::Saturated) => {}
                    Err(e) => return Err(no_pick_error(e, model)),
                }
            }
            let pushed = q.push(
                class,
                flow,
                Waiter { model: model.to_owned(), affinity: affinity.map(str::to_owned), work, tx },
            );
            self.publish(&q);
            match pushed {
                Ok(queued) => queued,
                Err(_) => {
                    self.metrics.count_admission_rejected(class.as_str());
                    return Err(ProxyError::AdmissionQueueFull);
                }
            }
        };
        if let Some(((evicted_class, _, _), w)) = evicted {
            self.metrics.count_admission_rejected(evicted_class.as_str());
            let _ = w.tx.send(Err(Refused::QueueFull));
        }
        // Someone ahead may be waiting for another model's upstreams while ours has room.
        self.pool.capacity_changed();
        let leave = LeaveOnDrop { admission: self, ticket };
        let mut rx = rx;
        let outcome = match tokio::time::timeout(self.timeout, &mut rx).await {
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
            Some(Ok(guard)) => {
                self.metrics.record_admission(class.as_str(), started.elapsed());
                Ok(guard)
            }
            Some(Err(Refused::QueueFull)) => Err(ProxyError::AdmissionQueueFull),
            Some(Err(Refused::NoPick(e))) => Err(no_pick_error(e, model)),
            None => {
                self.metrics.count_admission_timed_out(class.as_str());
                Err(ProxyError::AdmissionTimeout { after_s: self.timeout.as_secs_f64() })
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

    /// Runs [`pump`](Self::pump) whenever capacity may have freed up, until aborted.
    pub fn spawn_pump(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                self.pool.capacity_notified().await;
                self.pump();
            }
        })
    }
}

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
