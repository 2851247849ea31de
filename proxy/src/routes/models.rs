//! `GET /v1/models`: the union of what the healthy upstreams serve. Each one's own answer
//! (with its metadata) when it gives one; else the names the pool knows for it (its
//! configured `models`, or the last list the health loop learned). An upstream with a
//! configured list contributes exactly those names: the proxy routes nothing else there.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use meridian_core::Outcome;
use serde_json::{Value, json};

use crate::error::ProxyError;
use crate::headers::upstream_request_headers;
use crate::request_id::{REQUEST_ID, request_id};
use crate::state::AppState;
use crate::telemetry::outcomes::OutcomeSlot;
use crate::upstream::{Upstream, model_ids};

pub async fn list_models(
    State(state): State<Arc<AppState>>,
    Extension(outcome): Extension<OutcomeSlot>,
    headers: HeaderMap,
) -> Response {
    let id = request_id(&headers);
    outcome.route("models");
    // Only a known tenant (or anyone, with a default tenant) may list the models.
    if let Some(Err(e)) = state.tenants.as_ref().map(|t| t.identify(&headers)) {
        outcome.set(e.outcome());
        return e.into_response();
    }
    let healthy: Vec<_> = state.pool.all().iter().filter(|u| u.is_healthy()).cloned().collect();
    if healthy.is_empty() {
        outcome.set(Outcome::NoUpstream);
        return ProxyError::NoHealthyUpstream.into_response();
    }
    let mut fwd = upstream_request_headers(&headers, state.config.upstream.forward_authorization);
    fwd.insert(REQUEST_ID, id.clone());
    if let Some(key) = &state.upstream_auth {
        fwd.insert(axum::http::header::AUTHORIZATION, key.clone());
    }
    let timeout = Duration::from_secs_f64(state.config.upstream.connect_timeout_s + 10.0);
    let lists = futures::future::join_all(healthy.iter().map(|u| {
        let req = state.client.get(format!("{}/v1/models", u.base_url)).headers(fwd.clone()).timeout(timeout);
        async move {
            let live =
                async { req.send().await.ok()?.error_for_status().ok()?.json::<Value>().await.ok() }.await;
            if let Some(ids) = live.as_ref().and_then(model_ids) {
                u.set_discovered_models(ids);
            }
            entries(u, live)
        }
    }))
    .await;

    let mut seen = BTreeSet::new();
    let mut data = Vec::new();
    let mut answered = 0;
    for list in lists.into_iter().flatten() {
        answered += 1;
        for model in list {
            let Some(mid) = model.get("id").and_then(Value::as_str) else { continue };
            if seen.insert(mid.to_owned()) {
                data.push(model);
            }
        }
    }
    if answered == 0 {
        outcome.set(Outcome::UpstreamError);
        let err = ProxyError::UpstreamFailed {
            upstream: "all".into(),
            reason: "no upstream listed its models".into(),
        };
        return err.into_response();
    }
    outcome.set(Outcome::Ok);
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// One upstream's model objects: its live answer (filtered to its configured names, if
/// any), else synthesised from the names the pool knows; `None` when nothing is known.
fn entries(u: &Upstream, live: Option<Value>) -> Option<Vec<Value>> {
    let live: Option<Vec<Value>> = live.and_then(|v| v.get("data")?.as_array().cloned());
    let known = u.models();
    let bare = |id: &str| json!({"id": id, "object": "model", "created": 0, "owned_by": "meridian"});
    match (live, known) {
        (Some(live), Some(names)) if u.models_configured() => {
            let id = |m: &Value| m.get("id").and_then(Value::as_str).map(str::to_owned);
            let mut out: Vec<Value> =
                live.into_iter().filter(|m| id(m).is_some_and(|i| names.contains(&i))).collect();
            for name in names.iter() {
                if !out.iter().any(|m| id(m).as_deref() == Some(name)) {
                    out.push(bare(name));
                }
            }
            Some(out)
        }
        (Some(live), _) => Some(live),
        (None, Some(names)) => Some(names.iter().map(|n| bare(n)).collect()),
        (None, None) => None,
    }
}
