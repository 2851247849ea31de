//! The answer to a generation request, once an upstream has sent its response head:
//! relayed as it streams, with the request's observer (phase tracking, metrics, budgets,
//! exits) watching, or read whole and looked at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};
use meridian_core::Outcome;

use crate::ctx::{RequestCtx, Stage};
use crate::ending::plan::Prepared;
use crate::error::ProxyError;
use crate::headers::client_response_headers;
use crate::relay::{
    RelayBody, RelayStage, RequestObserver, Sent, Served, Tracked, read_whole, require_json, stages,
};
use crate::request_id::{REQUEST_ID, STREAM_ID};
use crate::state::AppState;
use crate::streams::Listed;
use crate::upstream::InFlight;

pub async fn respond(
    state: &Arc<AppState>,
    ctx: &Arc<RequestCtx>,
    prepared: Prepared,
    sent: Sent,
    listed: Listed,
    path: &str,
) -> Result<Response, ProxyError> {
    let Sent { in_flight, response: resp, via_hook, attempt } = sent;
    let span = ctx.span();
    let status = resp.status();
    if !span.is_none() {
        span.record("http.response.status_code", i64::from(status.as_u16()));
        span.record("meridian.upstream", in_flight.upstream().name.as_str());
        if let Some(b) = ctx.think_budget {
            span.record("meridian.think_budget_tokens", i64::from(b));
        }
    }
    let mut headers = client_response_headers(resp.headers());
    headers.insert(REQUEST_ID, ctx.arrival.request_id.clone());
    if let Ok(v) = HeaderValue::from_str(ctx.stream_id()) {
        headers.insert(STREAM_ID, v);
    }
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let upstream_name = in_flight.upstream().name.clone();
    ctx.progress.set_upstream(&upstream_name);
    ctx.progress.set_stage(Stage::Relaying);
    let hook = in_flight.upstream().hook.as_deref().filter(|_| via_hook);
    let ending = prepared.decide(state, ctx, hook);
    if status.is_success() && ending.unenforced {
        // Neither the engine's body nor the continuation can carry it: counted, not
        // silently dropped.
        tracing::debug!(parent: span, route = ctx.route().as_str(), upstream = %in_flight.upstream().name,
            "a think budget or exit signal applies that nothing on this API can enforce");
        state.metrics.count_budget_unenforced(ctx.route().as_str());
    }
    let served = Served { upstream: Some(in_flight.upstream().clone()), attempt, listed: Some(listed) };
    if !(status.is_success() && is_sse) {
        let read = whole(state, &in_flight, resp, status).await?;
        let observer = RequestObserver::new(state.metrics.clone(), ctx.clone(), served, false);
        let mut observer = ending.for_whole_answer(ctx, observer);
        if status.is_success() {
            observer.on_payload(&read, Instant::now());
            observer.complete();
        } else {
            observer.fail(Outcome::UpstreamStatus);
        }
        drop(observer);
        drop(in_flight);
        return Ok(build(status, headers, Body::from(read)));
    }

    // The relay may append an error event, so the upstream's length cannot stand.
    headers.remove(header::CONTENT_LENGTH);
    let observer = RequestObserver::new(state.metrics.clone(), ctx.clone(), served, true);
    let (observer, continuation) = ending.carry_out(state, ctx, observer, in_flight.upstream(), path);
    let (name, failed_in) = (upstream_name, span.clone());
    let stream = resp
        .bytes_stream()
        .map_err(move |e| {
            tracing::warn!(parent: &failed_in, upstream = %name, error = %e, "upstream stream failed");
            ProxyError::UpstreamFailed { upstream: name.clone(), reason: "the stream broke off".into() }
        })
        .boxed();
    let idle = Duration::from_secs_f64(state.config.upstream.idle_timeout_s);
    let max_line = usize::try_from(state.config.upstream.max_response_bytes).unwrap_or(usize::MAX);
    let heartbeat =
        Some(state.config.server.sse_heartbeat_s).filter(|s| *s > 0.0).map(Duration::from_secs_f64);
    let tracking: Box<dyn RelayStage> = match continuation {
        Some(c) => Box::new(c),
        None => Box::new(Tracked),
    };
    let stages = stages(tracking, max_line, &in_flight.upstream().name, heartbeat);
    let grace_over = state.drain.grace_over();
    let relay = RelayBody::new(stream, idle, observer, state.metrics.clone(), in_flight, grace_over, stages);
    let body = Body::from_stream(relay);
    Ok(build(status, headers, body))
}

/// Non-streaming answers and upstream errors arrive whole: read once, then looked at
/// by the caller. A failure here is the handler's to record, with the error it answers;
/// the observer records only answers that arrived.
async fn whole(
    state: &AppState,
    in_flight: &InFlight,
    resp: reqwest::Response,
    status: StatusCode,
) -> Result<bytes::Bytes, ProxyError> {
    let timeout = Duration::from_secs_f64(state.config.upstream.first_byte_timeout_s);
    let content_type =
        resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let bytes = read_whole(resp, in_flight, state.config.upstream.max_response_bytes, timeout).await?;
    require_json(&bytes, status, content_type.as_deref(), in_flight)?;
    Ok(bytes)
}

fn build(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}
