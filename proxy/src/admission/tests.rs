//! Admission's choice of engine with the engines' places, without a socket.

use std::time::{Duration, Instant};

use super::*;
use crate::config::{EndpointConfig, HookConfig};
use meridian_core::route::{Role, RoutingKind};

/// Admission asking the engines for places (`max_streams` 2), in front of `u0` and `u1`,
/// both with a hook, routed by the default policy (the least loaded first).
fn admission() -> Admission {
    let eps: Vec<EndpointConfig> = (0..2)
        .map(|i| EndpointConfig {
            url: format!("http://u{i}:8000"),
            name: None,
            hook: Some(format!("u{i}:9000")),
            models: None,
            role: Role::default(),
        })
        .collect();
    let pool = Arc::new(UpstreamPool::new(&eps, RoutingKind::PhaseAware.policy(1.25)));
    let cfg = AdmissionConfig {
        enabled: true,
        max_streams: Some(2),
        places: PlacesFrom::Engine,
        place_waits: true,
        ..AdmissionConfig::default()
    };
    let channel = HookChannel::new(&HookConfig::default(), reqwest::Client::new());
    Admission::new(&cfg, 1, pool, Arc::new(Metrics::new()), channel, Arc::default())
}

fn picked(admission: &Admission) -> InFlight {
    admission.pick("m", None, Work::Think).unwrap()
}

#[test]
fn a_request_goes_to_the_engine_that_keeps_a_place_for_this_replica_before_routing_decides() {
    let admission = admission();
    let (u0, u1) = (&admission.pool.all()[0], &admission.pool.all()[1]);
    // One request open at u1: routing sends the next ones to the less loaded u0.
    let at_u1 = admission
        .pool
        .pick_where(Want::model(None), std::slice::from_ref(u0), &admission.metrics, |_| true)
        .unwrap();
    assert_eq!(at_u1.upstream().name, u1.name);
    let at_u0 = picked(&admission);
    assert_eq!(at_u0.upstream().name, u0.name, "u0 is the less loaded");
    drop(at_u0);

    // A wait on u1 woke this replica: u1 keeps a place for it, and the request goes there.
    u1.places.keep_until(Some(Instant::now() + Duration::from_secs(60)));
    let kept = picked(&admission);
    assert_eq!(kept.upstream().name, u1.name, "the kept place was passed over");

    // u1 now holds this replica's limit: however kept, it takes nothing more here.
    assert!(admission.limits.saturated(u1));
    let next = picked(&admission);
    assert_eq!(next.upstream().name, u0.name);
    drop(next);

    // Asked for (a claim settled there) or gone stale, the place no longer steers.
    drop(kept);
    u1.places.keep_until(Some(Instant::now()));
    assert!(!u1.places.kept_here());
    assert_eq!(picked(&admission).upstream().name, u0.name);
    drop(at_u1);
}

/// Admission deciding alone (`max_streams` 1 per engine) in front of one engine.
fn one_slot() -> Arc<Admission> {
    let eps = [EndpointConfig {
        url: "http://u0:8000".into(),
        name: None,
        hook: None,
        models: None,
        role: Role::default(),
    }];
    let pool = Arc::new(UpstreamPool::new(&eps, RoutingKind::PhaseAware.policy(1.25)));
    let cfg = AdmissionConfig { enabled: true, max_streams: Some(1), ..AdmissionConfig::default() };
    let channel = HookChannel::new(&HookConfig::default(), reqwest::Client::new());
    Arc::new(Admission::new(&cfg, 1, pool, Arc::new(Metrics::new()), channel, Arc::default()))
}

#[tokio::test]
async fn only_a_request_that_queued_reports_a_wait_however_long_admission_took() {
    let admission = one_slot();
    let pump = Arc::clone(&admission).spawn_pump();
    let admit = || admission.admit("m", None, Work::Think, Class::Interactive, (0, 1));
    // Let straight through: no wait, whatever the clock read around the call (the hook's
    // start target must not count a busy machine's descheduling as time in line).
    let first = admit().await.unwrap();
    assert_eq!(first.queued, Duration::ZERO, "let straight through");

    // The slot is held: the next one queues until it is freed.
    let queued = tokio::spawn({
        let admission = Arc::clone(&admission);
        async move { admission.admit("m", None, Work::Think, Class::Interactive, (0, 1)).await }
    });
    // Timed from when it is seen in line, so that a busy machine's late start of the
    // task cannot make the bound exceed the wait.
    while admission.lock().is_empty() {
        tokio::task::yield_now().await;
    }
    let in_line = Instant::now();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(!queued.is_finished(), "the only slot is held");
    let held = in_line.elapsed();
    drop(first);
    let second = queued.await.unwrap().unwrap();
    assert!(second.queued >= held, "waited while the slot was held ({held:?}): {:?}", second.queued);
    drop(second);
    pump.abort();
}
