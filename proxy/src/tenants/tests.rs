use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use super::*;

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
    Tenants::new(&cfg, &Metrics::new()).expect("enabled")
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
    assert!(Tenants::new(&TenantsConfig::default(), &Metrics::new()).is_none());
}
