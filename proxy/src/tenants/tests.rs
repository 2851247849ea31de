use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use super::*;
use crate::share::{Fleet, Roster};

fn digest(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn tenant(name: &str, keys: &[&str]) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        api_key_sha256: keys.iter().map(|k| digest(k)).collect(),
        ..Default::default()
    }
}

fn tenants(cfg: TenantsConfig) -> Tenants {
    tenants_at(cfg, Fleet::alone())
}

fn tenants_at(cfg: TenantsConfig, fleet: Fleet) -> Tenants {
    Tenants::new(&cfg, Split::Told(fleet), &Metrics::new()).expect("enabled")
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (axum::http::HeaderName::from_static(k), HeaderValue::from_str(v).unwrap()))
        .collect()
}

fn named(t: &Tenants, h: &[(&'static str, &str)]) -> Result<String, &'static str> {
    t.identify(&headers(h)).map(|t| t.name.clone()).map_err(|e| match e {
        ProxyError::Unauthorized { .. } => "401",
        _ => "other",
    })
}

#[test]
fn a_request_is_its_keys_tenant_in_either_header_else_the_default_else_refused() {
    let mut cfg = TenantsConfig {
        enabled: true,
        tenant: vec![tenant("acme", &["sk-acme", "sk-acme-2"]), tenant("free", &[])],
        ..Default::default()
    };
    let t = tenants(cfg.clone());
    assert_eq!(named(&t, &[("authorization", "Bearer sk-acme")]), Ok("acme".into()));
    assert_eq!(named(&t, &[("authorization", "bearer  sk-acme-2 ")]), Ok("acme".into()));
    assert_eq!(named(&t, &[("x-api-key", "sk-acme")]), Ok("acme".into()), "Anthropic's header");
    assert_eq!(named(&t, &[("authorization", "Bearer sk-other")]), Err("401"));
    assert_eq!(named(&t, &[("authorization", "Basic sk-acme")]), Err("401"), "not a bearer token");
    assert_eq!(named(&t, &[]), Err("401"));
    cfg.default_tenant = Some("free".into());
    let t = tenants(cfg);
    assert_eq!(named(&t, &[("authorization", "Bearer sk-other")]), Ok("free".into()));
    assert_eq!(named(&t, &[]), Ok("free".into()));
}

#[test]
fn a_trusted_header_names_a_listed_tenant_and_nothing_else() {
    let cfg = TenantsConfig {
        enabled: true,
        identify_by: IdentifyBy::Header,
        tenant: vec![tenant("acme", &["sk-acme"]), tenant("free", &[])],
        default_tenant: Some("free".into()),
        ..Default::default()
    };
    let t = tenants(cfg);
    assert_eq!(named(&t, &[("x-meridian-tenant", "acme")]), Ok("acme".into()));
    assert_eq!(named(&t, &[("x-meridian-tenant", "nobody")]), Ok("free".into()), "unlisted: the default");
    assert_eq!(named(&t, &[("authorization", "Bearer sk-acme")]), Ok("free".into()), "keys are not read");
}

#[test]
fn a_tenant_at_its_stream_limit_is_refused_until_one_of_its_requests_ends() {
    let cfg = TenantsConfig {
        enabled: true,
        tenant: vec![TenantConfig { max_streams: Some(2), ..tenant("acme", &["k"]) }],
        default_tenant: Some("acme".into()),
        ..Default::default()
    };
    let t = tenants(cfg);
    let acme = t.identify(&HeaderMap::new()).unwrap().clone();
    let now = Instant::now();
    let a = acme.lease(now).unwrap();
    let _b = acme.lease(now).unwrap();
    let refused = acme.lease(now).unwrap_err();
    assert!(matches!(refused, ProxyError::RateLimited { limit: TenantLimit::MaxStreams, .. }), "{refused:?}");
    assert_eq!(refused.status(), 429);
    drop(a);
    assert_eq!(acme.open(), 1);
    assert!(acme.lease(now).is_ok());
}

#[test]
fn a_tenant_that_spent_its_tokens_waits_for_the_bucket_and_is_told_how_long() {
    let cfg = TenantsConfig {
        enabled: true,
        tenant: vec![TenantConfig { tokens_per_minute: Some(60), ..tenant("acme", &["k"]) }],
        default_tenant: Some("acme".into()),
        ..Default::default()
    };
    let t = tenants(cfg);
    let acme = t.identify(&HeaderMap::new()).unwrap().clone();
    let now = Instant::now();
    let lease = acme.lease(now).unwrap();
    lease.spend(90); // 30 owed, at 1 a second
    drop(lease);
    match acme.lease(now) {
        Err(ProxyError::RateLimited { limit: TenantLimit::TokensPerMinute, retry_after_s, .. }) => {
            assert!((30..=32).contains(&retry_after_s), "{retry_after_s}")
        }
        other => panic!("{other:?}"),
    }
    assert!(acme.lease(now + Duration::from_secs(32)).is_ok());
}

#[test]
fn off_means_no_tenants() {
    assert!(Tenants::new(&TenantsConfig::default(), Split::Told(Fleet::alone()), &Metrics::new()).is_none());
}

/// The default tenant `acme`, held to 5 streams and 180 tokens a minute.
fn acme_held_to_five_streams_and_180_tokens_a_minute() -> TenantsConfig {
    TenantsConfig {
        enabled: true,
        tenant: vec![TenantConfig {
            max_streams: Some(5),
            tokens_per_minute: Some(180),
            ..tenant("acme", &["k"])
        }],
        default_tenant: Some("acme".into()),
        ..Default::default()
    }
}

#[test]
fn replicas_told_their_number_each_hold_their_part_of_a_tenants_limits() {
    let cfg = acme_held_to_five_streams_and_180_tokens_a_minute();
    // Five streams over three replicas: 2, 2 and 1, adding up to the tenant's limit; a
    // replica that does not know its place takes only the even part.
    let parts: Vec<Option<u32>> = [Some(0), Some(1), Some(2), None]
        .map(|i| tenants_at(cfg.clone(), Fleet::new(3, i)).identify(&HeaderMap::new()).unwrap().max_streams())
        .to_vec();
    assert_eq!(parts, [Some(2), Some(2), Some(1), Some(1)]);
    let t = tenants_at(cfg, Fleet::new(3, Some(2)));
    let acme = t.identify(&HeaderMap::new()).unwrap().clone();
    let now = Instant::now();
    let lease = acme.lease(now).unwrap();
    assert!(acme.lease(now).is_err(), "its one stream of the five is taken");
    // A third of 180 tokens a minute: 60, so 90 spent leaves it 30 owed, at 1 a second.
    lease.spend(90);
    drop(lease);
    match acme.lease(now) {
        Err(ProxyError::RateLimited { limit: TenantLimit::TokensPerMinute, retry_after_s, .. }) => {
            assert!((30..=32).contains(&retry_after_s), "{retry_after_s}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn replicas_not_told_their_number_split_a_tenants_limits_by_the_replicas_the_engines_count() {
    let cfg = acme_held_to_five_streams_and_180_tokens_a_minute();
    let roster = Arc::new(Roster::default());
    let t = Tenants::new(&cfg, Split::Counted(roster.clone()), &Metrics::new()).expect("enabled");
    let acme = t.identify(&HeaderMap::new()).unwrap().clone();
    // No engine has told yet: the whole limits, as a replica alone.
    assert_eq!(acme.max_streams(), Some(5));
    let now = Instant::now();
    let lease = Duration::from_secs(5);
    // Two engines count three replicas, this one last by name: its part is 1 of the 5.
    roster.heard("e1:9000", 3, 2, lease, now);
    assert_eq!(roster.heard("e2:9000", 3, 2, lease, now), 3);
    assert_eq!(acme.max_streams(), Some(1));
    let first = acme.lease(now).unwrap();
    assert!(
        matches!(acme.lease(now), Err(ProxyError::RateLimited { limit: TenantLimit::MaxStreams, .. })),
        "its one stream is taken"
    );
    // A third of 180 tokens a minute: 60 held, so 90 spent leaves it owing.
    first.spend(90);
    drop(first);
    assert!(matches!(
        acme.lease(now),
        Err(ProxyError::RateLimited { limit: TenantLimit::TokensPerMinute, .. })
    ));
    // An engine that heard a fourth replica first splits tighter until the other agrees.
    roster.heard("e1:9000", 4, 3, lease, now);
    assert_eq!(roster.counted(now), Some(Fleet::new(4, Some(3))));
    // The autoscaler took two away: once the engines' word is of one replica, and the
    // older word lapsed, this replica holds the whole limits again.
    let later = now + Duration::from_secs(6);
    roster.heard("e1:9000", 1, 0, lease, later);
    roster.heard("e2:9000", 1, 0, lease, later);
    assert_eq!(roster.counted(later), Some(Fleet::alone()));
    assert!(acme.lease(later).is_err(), "still owing: 24 tokens at the third's rate till now");
    // The whole rate from then on (3 a second): paid off within 20 s, and all five
    // streams are this replica's.
    let paid = later + Duration::from_secs(20);
    roster.heard("e1:9000", 1, 0, lease, paid);
    let open: Vec<_> = (0..5).map(|_| acme.lease(paid)).collect();
    assert!(open.iter().all(Result::is_ok));
    assert!(acme.lease(paid).is_err());
    // A word that was not renewed counts for nothing.
    assert_eq!(roster.counted(paid + Duration::from_secs(6)), None);
}
