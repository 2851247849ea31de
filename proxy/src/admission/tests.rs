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
