//! The answer to a generation request, once an upstream has sent its response head:
//! relayed as it streams, with the request's observer (phase tracking, metrics, budgets,
//! exits) watching, or read whole and looked at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};

use super::ctx::RequestCtx;
use super::outbound::Outbound;
use crate::ending::{self, DeadlineWatch, EatFeed, EndThinking, ForgetAtEnd};
use crate::error::ProxyError;
use crate::headers::client_response_headers;
use crate::relay::{Heartbeats, RelayBody, RequestInfo, RequestObserver, Sent, read_whole, require_json};
use crate::request_id::{REQUEST_ID, STREAM_ID};
use crate::state::AppState;
use crate::streams::{Ending, Stage, StreamGuard};
use crate::upstream::InFlight;

pub async fn respond(
    state: &Arc<AppState>,
    ctx: &RequestCtx<'_>,
    outbound: Outbound,
    sent: Sent,
    live: Arc<StreamGuard>,
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
    headers.insert(REQUEST_ID, ctx.ids.id.clone());
    if let Ok(v) = HeaderValue::from_str(&ctx.ids.stream_id) {
        headers.insert(STREAM_ID, v);
    }
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let upstream_name = in_flight.upstream().name.clone();
    live.entry().set_upstream(&upstream_name);
    live.entry().set_stage(Stage::Relaying);
    let hook = hook_used(state, &in_flight, via_hook, span);
    if status.is_success() && ending_unenforced(state, ctx, hook.is_some()) {
        // Neither the engine's body nor the continuation can carry it (see
        // `upstream_body`, `Route::continuation`): counted, not silently dropped.
        tracing::debug!(parent: span, route = ctx.route.as_str(), upstream = %in_flight.upstream().name,
            "a think budget or exit signal applies that nothing on this API can enforce");
        state.metrics.count_budget_unenforced(ctx.route.as_str());
    }
    let info = RequestInfo {
        route: ctx.route.as_str(),
        dialect: ctx.route.dialect(),
        family: ctx.family.clone(),
        initial_phase: ctx.initial_phase(),
        request_id: ctx.request_id.clone(),
        stream_id: ctx.ids.stream_id.clone(),
        upstream: upstream_name.clone(),
        started: ctx.started,
        think_budget: ctx.think_budget,
        upstream_ref: Some(in_flight.upstream().clone()),
        live: Some(live.clone()),
        span: span.clone(),
        attempt,
        outcome: ctx.ids.outcome.clone(),
    };
    let deadline = think_deadline(state, ctx, hook.clone());
    if !(status.is_success() && is_sse) {
        let forget = deadline.map(|d| d.hook);
        return whole(state, info, forget, in_flight, resp, status, headers).await;
    }

    // The relay may append an error event, so the upstream's length cannot stand.
    headers.remove(header::CONTENT_LENGTH);
    let hook_acts = ctx.think_budget.is_some()
        || deadline.is_some()
        || state.config.exit.signal != meridian_core::config::ExitSignal::Off;
    let Outbound { body, continuation, continuation_headers, .. } = outbound;
    let continuation = continuation.filter(|_| !via_hook);
    let end = match &continuation {
        Some(c) => Some(EndThinking::Continuation(c.end_now.clone())),
        None => hook.map(EndThinking::Hook),
    };
    match &end {
        Some(EndThinking::Continuation(_)) => live.entry().set_ending(Ending::Continuation),
        Some(EndThinking::Hook(_)) if hook_acts => live.entry().set_ending(Ending::Hook),
        _ => {}
    }
    let eat = end.and_then(|end| eat_prober(state, &info, &body, &in_flight, end.clone()).map(|p| (p, end)));
    let observer =
        plan_watchers(RequestObserver::new(state.metrics.clone(), info, true), state, ctx, deadline, eat);
    let continuation = match (continuation, continuation_headers) {
        (Some(c), Some(h)) => Some(c.start(
            state,
            &in_flight,
            path,
            h,
            &ctx.request_id,
            ctx.family.as_ref(),
            live.clone(),
            span.clone(),
        )),
        _ => None,
    };
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
    let grace_over = state.drain.grace_over();
    let mut relay =
        RelayBody::new(stream, idle, observer, state.metrics.clone(), in_flight, grace_over, max_line);
    if let Some(c) = continuation {
        relay = relay.continued(c);
    }
    let body = match state.config.server.sse_heartbeat_s {
        s if s > 0.0 => Body::from_stream(Heartbeats::new(relay, Duration::from_secs_f64(s))),
        _ => Body::from_stream(relay),
    };
    Ok(build(status, headers, body))
}

/// What this request's plan watches besides the built-ins: its thinking-time deadline,
/// its EAT probes, and, when either may have told the hook something, the hook's
/// `forget` at the end.
fn plan_watchers(
    mut observer: RequestObserver,
    state: &AppState,
    ctx: &RequestCtx<'_>,
    deadline: Option<crate::ending::ThinkDeadline>,
    eat: Option<(crate::ending::EatProber, EndThinking)>,
) -> RequestObserver {
    let stream_id = &ctx.ids.stream_id;
    let family = ctx.family.as_ref().map_or("unknown", |f| f.name()).to_owned();
    let mut forget = None;
    if let Some(d) = deadline {
        forget = Some(d.hook.clone());
        observer =
            observer.watch(Box::new(DeadlineWatch::new(d, stream_id.clone(), state.metrics.clone(), family)));
    }
    if let Some((prober, end)) = eat {
        if let EndThinking::Hook(h) = end {
            forget = Some(h);
        }
        observer = observer.watch(Box::new(EatFeed::new(prober)));
    }
    if let Some(hook) = forget {
        observer = observer.watch(Box::new(ForgetAtEnd { hook, stream_id: stream_id.clone() }));
    }
    observer
}

/// Non-streaming answers and upstream errors arrive whole; read them once, then look.
/// A failure here is counted by the caller, with the error it answers; the observer
/// records only answers that arrived.
async fn whole(
    state: &AppState,
    info: RequestInfo,
    forget: Option<crate::hook::HookTarget>,
    in_flight: InFlight,
    resp: reqwest::Response,
    status: StatusCode,
    headers: HeaderMap,
) -> Result<Response, ProxyError> {
    let timeout = Duration::from_secs_f64(state.config.upstream.first_byte_timeout_s);
    let content_type =
        resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let bytes = read_whole(resp, &in_flight, state.config.upstream.max_response_bytes, timeout).await?;
    require_json(&bytes, status, content_type.as_deref(), &in_flight)?;
    let stream_id = info.stream_id.clone();
    let mut observer = RequestObserver::new(state.metrics.clone(), info, false);
    if let Some(hook) = forget {
        observer = observer.watch(Box::new(ForgetAtEnd { hook, stream_id }));
    }
    if status.is_success() {
        observer.on_payload(&bytes, Instant::now());
        observer.complete();
    } else {
        observer.fail("upstream_status");
    }
    drop(observer);
    drop(in_flight);
    Ok(build(status, headers, Body::from(bytes)))
}

/// Whether a request of a reasoning family on an API the continuation does not speak
/// (Responses, Messages) has something to end its thinking early that nothing can carry
/// out: a think budget the engine does not already enforce from the client's own field,
/// a thinking-time budget or an exit signal, with no ready hook; or EAT, whose probes
/// are chat requests, hook or not.
fn ending_unenforced(state: &AppState, ctx: &RequestCtx<'_>, hook_ready: bool) -> bool {
    use meridian_core::config::ExitSignal;
    if ctx.route.continuation().is_some()
        || ctx.family.is_none()
        || ctx.initial_phase() == Some(meridian_core::Phase::Output)
    {
        return false;
    }
    let signal = state.config.exit.signal;
    if signal == ExitSignal::Eat {
        return true;
    }
    let own_budget = ctx.think_budget.is_some() && ctx.think_budget != ctx.request.client_budget;
    !hook_ready
        && (own_budget
            || ending::plan::think_seconds(state, &ctx.request).is_some()
            || signal != ExitSignal::Off)
}

/// The hook of the upstream serving a request, if the request went through it.
fn hook_used(
    state: &AppState,
    in_flight: &InFlight,
    via_hook: bool,
    span: &tracing::Span,
) -> Option<crate::hook::HookTarget> {
    let addr = in_flight.upstream().hook.as_ref().filter(|_| via_hook)?;
    Some(crate::hook::HookTarget { channel: state.hook.clone(), addr: addr.clone(), span: span.clone() })
}

/// EAT probing for a streamed chat that can be acted on (`end`: a ready hook or a
/// continuation) and whose model family names its think delimiters.
fn eat_prober(
    state: &AppState,
    info: &RequestInfo,
    body: &bytes::Bytes,
    in_flight: &InFlight,
    end: EndThinking,
) -> Option<crate::ending::EatProber> {
    let cfg = &state.config.exit;
    if cfg.signal != meridian_core::config::ExitSignal::Eat || info.route != "chat_completions" {
        return None;
    }
    let upstream = in_flight.upstream();
    let tags = info.family.as_ref()?.file.tags.as_ref()?;
    let target = crate::ending::ProbeTarget {
        client: state.client.clone(),
        base_url: upstream.base_url.clone(),
        auth: state.upstream_auth.clone(),
        body: body.clone(),
        request_id: info.request_id.clone(),
        stream_id: info.stream_id.clone(),
        think_open: tags.start.first()?.clone(),
        think_close: tags.end.first()?.clone(),
        end,
        metrics: state.metrics.clone(),
    };
    crate::ending::EatProber::start(cfg, target)
}

/// The thinking-time budget of a request (its own, else the config's), when it went to
/// an upstream's hook to enforce it.
fn think_deadline(
    state: &AppState,
    ctx: &RequestCtx<'_>,
    hook: Option<crate::hook::HookTarget>,
) -> Option<crate::ending::ThinkDeadline> {
    let seconds = ending::plan::think_seconds(state, &ctx.request)?;
    Some(crate::ending::ThinkDeadline { after: Duration::from_secs_f64(seconds), hook: hook? })
}

fn build(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}
