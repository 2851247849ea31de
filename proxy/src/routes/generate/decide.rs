//! A generation request's context decided from its body, once: its model family, think
//! budgets (its tenant's caps applied), whether its own vLLM priority stands, its
//! admission class and affinity key (see `crate::ctx`).

use std::sync::Arc;

use axum::http::HeaderMap;
use bytes::Bytes;
use meridian_core::Phase;

use crate::body::{ClientClass, GenerationRequest};
use crate::ctx::Class;
use crate::ctx::{Arrival, Progress, RequestCtx, unix_ms};
use crate::state::AppState;
use crate::tenants::TenantLease;

/// The request's context, from its arrival, its headers, its body parsed once and its
/// tenant's lease (`[tenants]` on).
pub fn context(
    state: &AppState,
    arrival: Arrival,
    headers: &HeaderMap,
    body: &Bytes,
    request: &GenerationRequest<'_>,
    tenant: Option<TenantLease>,
) -> Arc<RequestCtx> {
    let family = state.family_for(&request.model);
    let asked_tokens = request.extension.and_then(|e| e.think_budget_tokens).or(request.client_budget);
    let asked_seconds = request.extension.and_then(|e| e.think_budget_s);
    let own = tenant.as_ref().map(|l| l.tenant());
    // A tenant's budget is its requests' default and their ceiling.
    let think_budget = capped(asked_tokens, own.and_then(|t| t.think_budget_tokens))
        .or_else(|| state.config.budget.for_family(family.as_deref().map(|f| f.name())));
    let think_seconds =
        capped(asked_seconds, own.and_then(|t| t.think_budget_s)).or(state.config.budget.think_seconds);
    let priority_allowed = own.is_none_or(|t| t.allow_priority);
    Arc::new(RequestCtx {
        started_unix_ms: unix_ms(arrival.started),
        arrival,
        body: body.clone(),
        model: request.model.clone().into_owned(),
        family,
        initial_phase: request.initial_phase,
        think_budget,
        client_budget: request.client_budget,
        think_seconds,
        client_priority: request.client_priority && priority_allowed,
        class: admission_class(request),
        streaming: request.stream,
        affinity_key: affinity_key(headers, &state.config.upstream.affinity_header),
        progress: Progress::default(),
        tenant,
    })
}

/// What a request asked for, at most `ceiling`; the ceiling when it asked for nothing.
fn capped<T: PartialOrd + Copy>(asked: Option<T>, ceiling: Option<T>) -> Option<T> {
    match (asked, ceiling) {
        (Some(a), Some(c)) if c < a => Some(c),
        (Some(a), _) => Some(a),
        (None, c) => c,
    }
}

/// Output-phase starts first (a user waits for visible text), batch last.
fn admission_class(req: &GenerationRequest<'_>) -> Class {
    if req.initial_phase == Some(Phase::Output) {
        Class::Output
    } else if req.extension.and_then(|e| e.class) == Some(ClientClass::Batch) {
        Class::Batch
    } else {
        Class::Interactive
    }
}

/// The key routing may keep on one engine: the `header`'s value, when it is present,
/// printable and not blank (a longer one is cut to 256 bytes: a key only has to tell
/// conversations apart).
fn affinity_key(headers: &HeaderMap, header: &str) -> Option<String> {
    let value = headers.get(header)?.to_str().ok()?.trim();
    if value.is_empty() {
        return None;
    }
    let mut end = value.len().min(256);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Some(value[..end].to_owned())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::{affinity_key, capped};

    #[test]
    fn a_tenants_budget_is_the_default_and_the_ceiling() {
        assert_eq!(capped(Some(500), Some(2000)), Some(500), "less than the ceiling stands");
        assert_eq!(capped(Some(5000), Some(2000)), Some(2000), "more is cut");
        assert_eq!(capped(None, Some(2000)), Some(2000), "none asked: the tenant's");
        assert_eq!(capped(Some(5000), None), Some(5000));
        assert_eq!(capped::<f64>(None, None), None);
    }

    #[test]
    fn the_affinity_key_is_the_headers_trimmed_value_when_it_has_one() {
        let mut h = HeaderMap::new();
        assert_eq!(affinity_key(&h, "x-session-id"), None);
        h.insert("x-session-id", HeaderValue::from_static("  chat-7 "));
        assert_eq!(affinity_key(&h, "x-session-id").as_deref(), Some("chat-7"));
        assert_eq!(affinity_key(&h, "x-conversation"), None, "another header");
        h.insert("x-session-id", HeaderValue::from_static("   "));
        assert_eq!(affinity_key(&h, "x-session-id"), None, "blank");
        h.insert("x-session-id", HeaderValue::from_str(&"k".repeat(1000)).unwrap());
        assert_eq!(affinity_key(&h, "x-session-id").map(|k| k.len()), Some(256));
    }
}
