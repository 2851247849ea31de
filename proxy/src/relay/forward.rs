//! Sends a request upstream. Attempts move to another healthy upstream only while the
//! failure is retry-safe ([`ProxyError::retry_safe`]): connection failures and 502/503
//! answers. A timeout is not retried, since the engine may well be working on the
//! request and a second copy would only add load. A request that admission let through
//! is retried only where admission finds room and, with the engine's places, a place
//! ([`Admission::retry_at`](crate::admission::Admission::retry_at)): a retry must not take
//! an engine past its limit any more than a first attempt.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method};
use bytes::Bytes;
use meridian_core::Outcome;

use crate::ctx::Class;
use crate::error::ProxyError;
use crate::request_id::REQUEST_ID;
use crate::state::AppState;
use crate::telemetry::spans;
use crate::upstream::{InFlight, NoPick, Upstream, Want};
use tracing::Instrument;

/// What to send, minus the upstream it goes to.
pub struct UpstreamRequest<'a> {
    pub method: Method,
    /// Path and query, e.g. `/v1/chat/completions`.
    pub path_and_query: &'a str,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body for upstreams whose hook is ready (see `body::hook_body`).
    pub hook_body: Option<Bytes>,
    pub request_id: &'a HeaderValue,
    /// What the request wants of an upstream: its model (only upstreams serving it are
    /// chosen; `None`: any upstream), its affinity key and its work, for the roles and the
    /// routing policy.
    pub want: Want<'a>,
    /// The upstream of the first attempt, already chosen (by admission control).
    pub first: Option<InFlight>,
    /// The admission class of a request admission let through (`first`): its retries
    /// go through admission too.
    pub admitted: Option<Class>,
    /// The request's span, parent of each attempt's (`Span::none()`: untraced).
    pub span: tracing::Span,
}

/// An answered request.
pub struct Sent {
    pub in_flight: InFlight,
    pub response: reqwest::Response,
    /// The hook body went, the upstream's hook being ready when it was sent.
    pub via_hook: bool,
    /// The attempt that was answered: its span lasts as long as the upstream's response.
    pub attempt: tracing::Span,
}

fn is_retryable_status(status: reqwest::StatusCode) -> bool {
    matches!(status.as_u16(), 502 | 503)
}

pub async fn send_with_retries(state: &AppState, mut req: UpstreamRequest<'_>) -> Result<Sent, ProxyError> {
    let cfg = &state.config.upstream;
    let first_byte_timeout = Duration::from_secs_f64(cfg.first_byte_timeout_s);
    let mut tried: Vec<Arc<Upstream>> = Vec::new();
    let mut last_error = ProxyError::NoHealthyUpstream;
    for attempt in 0..cfg.max_attempts {
        let picked = match (req.first.take(), req.admitted) {
            (Some(g), _) => Ok(g),
            (None, Some(class)) if attempt > 0 => {
                state.admission.retry_at(req.want, &mut tried, class).await.ok_or(NoPick::Saturated)
            }
            (None, _) => state.pool.pick(req.want, &tried, &state.metrics),
        };
        let guard = match picked {
            Ok(g) => g,
            Err(NoPick::ModelNotServed) if attempt == 0 => {
                return Err(ProxyError::model_not_found(req.want.model.unwrap_or_default()));
            }
            Err(_) => break,
        };
        let upstream = guard.upstream().clone();
        tried.push(upstream.clone());
        if attempt > 0 {
            state.metrics.count_retry();
        }
        let url = format!("{}{}", upstream.base_url, req.path_and_query);
        let span = spans::attempt_span(&req.span, attempt, &upstream.name, &url);
        let mut headers = req.headers.clone();
        headers.insert(REQUEST_ID, req.request_id.clone());
        if let Some(key) = &state.upstream_auth {
            headers.insert(axum::http::header::AUTHORIZATION, key.clone());
        }
        // The engine's spans, if it traces, go under this attempt.
        spans::inject(&span, &mut headers);
        let (body, via_hook) = match &req.hook_body {
            Some(b) if upstream.hook_ready() => (b.clone(), true),
            _ => (req.body.clone(), false),
        };
        span.record("meridian.via_hook", via_hook);
        let send = state.client.request(req.method.clone(), url).headers(headers).body(body).send();
        let last_attempt = attempt + 1 == cfg.max_attempts;
        let answered = tokio::time::timeout(first_byte_timeout, send).instrument(span.clone()).await;
        if let Ok(Ok(resp)) = &answered {
            span.record("http.response.status_code", i64::from(resp.status().as_u16()));
        }
        match answered {
            Err(_) => {
                spans::fail(&span, Outcome::UpstreamTimeout.as_str());
                last_error = ProxyError::UpstreamTimeout {
                    upstream: upstream.name.clone(),
                    after_s: cfg.first_byte_timeout_s,
                };
            }
            Ok(Err(e)) => {
                let reason = describe(&e);
                tracing::warn!(upstream = %upstream.name, %reason, attempt, "upstream request failed");
                upstream.record_failure(cfg.unhealthy_after, &state.metrics, &reason);
                spans::fail(&span, Outcome::UpstreamError.as_str());
                last_error = ProxyError::UpstreamUnreachable {
                    upstream: upstream.name.clone(),
                    reason,
                    source: Some(e),
                };
            }
            Ok(Ok(resp)) if is_retryable_status(resp.status()) && !last_attempt => {
                let status = resp.status();
                tracing::warn!(upstream = %upstream.name, %status, attempt, "upstream refused; trying another");
                upstream.record_failure(cfg.unhealthy_after, &state.metrics, status.as_str());
                spans::fail(&span, Outcome::UpstreamError.as_str());
                last_error = ProxyError::UpstreamUnreachable {
                    upstream: upstream.name.clone(),
                    reason: format!("answered {status}"),
                    source: None,
                };
            }
            Ok(Ok(resp)) => {
                upstream.record_success(&state.metrics);
                return Ok(Sent { in_flight: guard, response: resp, via_hook, attempt: span });
            }
        }
        // Another upstream only when this one is known not to be working on the request.
        if !last_error.retry_safe() {
            break;
        }
    }
    Err(last_error)
}

/// A short reason without reqwest's URL noise.
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connection failed"
    } else if e.is_timeout() {
        "timed out"
    } else if e.is_request() {
        "request failed"
    } else {
        "failed"
    };
    let mut source = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() { kind.to_owned() } else { format!("{kind}: {detail}") }
}
