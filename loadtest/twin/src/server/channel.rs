//! The part of Meridian's policy channel an engine twin serves (`meridian-sim serve
//! --channel-token-env`): the hello with the engine's requests by phase, and the places of
//! its limit granted to proxy replicas (`meridian_core::channel::places`), decided by the
//! same table the hook keeps, with the waits of refused replicas answered as places free.
//! Directives are not taken: the hello says the twin cannot
//! end thinking, so a proxy drives it through its HTTP API, as an engine whose hook
//! cannot (the twin reads vLLM's `thinking_token_budget` field).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use meridian_core::channel::{self, Claim, Hello, PROTOCOL_HEADER, PlacesFreed, PlacesWait};

use super::Shared;

/// Refuses what the hook's listener would refuse: a wrong bearer, another protocol.
fn check(shared: &Shared, headers: &HeaderMap) -> Result<(), (StatusCode, String)> {
    let Some(secret) = shared.opts.channel_secret.as_deref() else {
        return Err((StatusCode::NOT_FOUND, "this twin serves no policy channel".into()));
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    channel::check_bearer(header("authorization"), secret)
        .map_err(|e| (StatusCode::UNAUTHORIZED, e.to_string()))?;
    channel::check_version(header(PROTOCOL_HEADER)).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(())
}

pub(super) async fn hello(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(refused) = check(&s, &headers) {
        return refused.into_response();
    }
    let core = s.lock();
    axum::Json(Hello {
        protocol: channel::PROTOCOL_VERSION,
        min_protocol: channel::PROTOCOL_VERSION,
        hook_version: format!("meridian-sim {}", env!("CARGO_PKG_VERSION")),
        policy: core.engine.policy_name().to_owned(),
        entropy: false,
        can_end_thinking: false,
        engine: Some(core.engine.requests_by_phase()),
    })
    .into_response()
}

/// An authenticated message's body, or the answer that refuses it (boxed: a response
/// is large beside the message).
fn message<T: serde::de::DeserializeOwned>(
    s: &Shared,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<T, Box<Response>> {
    check(s, headers).map_err(|refused| Box::new(refused.into_response()))?;
    serde_json::from_slice(body)
        .map_err(|e| Box::new((StatusCode::BAD_REQUEST, format!("bad {what}: {e}")).into_response()))
}

pub(super) async fn places(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let claim: Claim = match message(&s, &headers, &body, "claim") {
        Ok(c) => c,
        Err(refused) => return *refused,
    };
    // Leases run on the wall clock: replicas renew them in real time, whatever the
    // twin's speed.
    let now_s = s.started.elapsed().as_secs_f64();
    let granted = s.places.lock().map(|mut p| p.claim(&claim, now_s));
    match granted {
        Ok(mut g) => {
            s.places_freed.send_if_modified(|seen| std::mem::replace(seen, g.freed) != g.freed);
            if !s.opts.place_waits {
                // As a hook that predates the waits, which counts no openings: a replica
                // takes a count in a grant as a hook that holds waits.
                g.freed = 0;
            }
            axum::Json(g).into_response()
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "place table unavailable").into_response(),
    }
}

/// How often a held wait looks at the table with no claim to prompt it (lapsed leases,
/// stale waiters), as the hook's listener does.
const TIDY_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// A refused replica waits for a place: answered once the place is there for it
/// (`Places::wakes`: a claim that gives places back, a lease that lapses, the waiters
/// before it served or gone), or when its wait is up.
pub(super) async fn place_wait(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let wait: PlacesWait = match message(&s, &headers, &body, "wait") {
        Ok(w) => w,
        Err(refused) => return *refused,
    };
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs_f64(wait.held_s());
    let mut changed = s.places_freed.subscribe();
    loop {
        let now_s = s.started.elapsed().as_secs_f64();
        let Ok((freed, woken)) = s.places.lock().map(|mut p| {
            p.tidy(now_s);
            (p.freed(), p.wakes(&wait))
        }) else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "place table unavailable").into_response();
        };
        if woken || tokio::time::Instant::now() >= until {
            if woken {
                s.lock().metrics.place_waits_woken += 1;
            }
            return axum::Json(PlacesFreed { freed, woken: Some(woken) }).into_response();
        }
        let look = until.min(tokio::time::Instant::now() + TIDY_EVERY);
        // A claim's change, or the next look; a closed sender cannot happen while the
        // server holds it.
        let _ = tokio::time::timeout_at(look, changed.changed()).await;
    }
}
