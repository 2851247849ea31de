//! `POST /v1/chat/completions` and `POST /v1/completions`: the tracked data path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};

use meridian_core::Phase;

use super::body::{ClientClass, GenerationRequest, hook_body, read_body, upstream_body};
use super::forcing;
use crate::admission::Class;
use crate::error::ProxyError;
use crate::exits::EndThinking;
use crate::headers::{client_response_headers, upstream_request_headers};
use crate::relay::{
    Heartbeats, RelayBody, RequestInfo, RequestObserver, Sent, UpstreamRequest, early_response, read_whole,
    require_json, send_with_retries,
};
use crate::request_id::{REQUEST_ID, STREAM_ID, mint_stream_id, request_id};
use crate::state::AppState;
use crate::streams::{Ending, NewStream, Stage};
use crate::telemetry::spans;
use tracing::Instrument;

pub async fn chat_completions(State(state): State<Arc<AppState>>, req: Request) -> Response {
    generate(state, "chat_completions", req).await
}

pub async fn completions(State(state): State<Arc<AppState>>, req: Request) -> Response {
    generate(state, "completions", req).await
}

async fn generate(state: Arc<AppState>, route: &'static str, req: Request) -> Response {
    let started = Instant::now();
    let id = request_id(req.headers());
    // What the engine's hook knows this stream by (see `request_id`).
    let stream_id = mint_stream_id();
    let streamed = Arc::new(AtomicBool::new(false));
    // The request's span: it lives as long as the response, in the relay's observer.
    let span = spans::request_span(route, req.uri().path(), req.headers());
    if !span.is_none() {
        span.record("meridian.request_id", String::from_utf8_lossy(id.as_bytes()).as_ref());
        span.record("meridian.stream_id", stream_id.as_str());
    }
    let ids = Ids { id: id.clone(), stream_id: stream_id.clone(), span: span.clone() };
    let answer = answer(state.clone(), route, req, ids, started, streamed.clone()).instrument(span);
    let heartbeat = state.config.server.sse_heartbeat_s;
    if heartbeat <= 0.0 {
        return answer.await;
    }
    // A streamed request still without a response after one heartbeat interval gets its
    // headers now, and heartbeats until the response comes (see `relay::heartbeat`).
    let every = Duration::from_secs_f64(heartbeat);
    let mut answer = Box::pin(answer);
    loop {
        tokio::select! {
            biased;
            resp = &mut answer => return resp,
            _ = tokio::time::sleep(every) => {
                if streamed.load(Ordering::Acquire) {
                    let mut headers = HeaderMap::new();
                    headers.insert(REQUEST_ID, id);
                    if let Ok(v) = HeaderValue::from_str(&stream_id) {
                        headers.insert(STREAM_ID, v);
                    }
                    return early_response(answer, every, headers);
                }
            }
        }
    }
}

/// Who a generation request is: its client's id, the proxy's stream id, its span.
struct Ids {
    id: HeaderValue,
    stream_id: String,
    span: tracing::Span,
}

/// The response to a generation request, its failures counted and answered in
/// OpenAI's error shape; a drain's grace running out ends the wait with one.
async fn answer(
    state: Arc<AppState>,
    route: &'static str,
    req: Request,
    ids: Ids,
    started: Instant,
    streamed: Arc<AtomicBool>,
) -> Response {
    let mut left = LeftEarly { state: &state, route, ids: &ids, started, answered: false };
    let (id, span) = (&ids.id, &ids.span);
    let relayed = async {
        if state.drain.draining() {
            return Err(ProxyError::ShuttingDown);
        }
        tokio::select! {
            r = relay_generation(&state, route, req, &ids, started, &streamed) => r,
            _ = state.drain.grace_over() => Err(ProxyError::ShuttingDown),
        }
    };
    let resp = match relayed.await {
        Ok(resp) => resp,
        Err(e) => {
            spans::fail(span, e.outcome());
            span.record("meridian.outcome", e.outcome());
            span.record("http.response.status_code", i64::from(e.status().as_u16()));
            tracing::info!(request_id = ?id, route, outcome = e.outcome(), error = %e, "request failed");
            state.metrics.count_request(route, e.outcome());
            e.into_response_with_id(id)
        }
    };
    left.answered = true;
    resp
}

/// Records a client that left before it had a response: while its request waited for
/// admission or for the upstream's response headers. The server drops the handler as
/// soon as the connection closes, and with it everything the request held (its place in
/// the admission queue, its upstream request, which is then aborted); this guard, dropped
/// with them, counts the outcome. From the response on, the relay's observer does.
struct LeftEarly<'a> {
    state: &'a AppState,
    route: &'static str,
    ids: &'a Ids,
    started: Instant,
    answered: bool,
}

impl Drop for LeftEarly<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let waited_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.ids.span.record("meridian.outcome", "client_disconnected");
        tracing::info!(parent: &self.ids.span, request_id = ?self.ids.id, route = self.route,
            outcome = "client_disconnected", waited_ms, "client left before the response");
        self.state.metrics.count_request(self.route, "client_disconnected");
    }
}

async fn relay_generation(
    state: &Arc<AppState>,
    route: &'static str,
    req: Request,
    ids: &Ids,
    started: Instant,
    streamed: &AtomicBool,
) -> Result<Response, ProxyError> {
    let (id, span, stream_id) = (&ids.id, &ids.span, &ids.stream_id);
    let (parts, body) = req.into_parts();
    let body = read_body(body, &parts.headers, &state.config.server).await?;
    let gen_req = GenerationRequest::parse(&body)?;
    streamed.store(gen_req.stream, Ordering::Release);
    spans::name_request(span, route, &gen_req.model);
    let family = state.family_for(&gen_req.model);
    let initial_phase = gen_req.initial_phase;
    // Budget: the request's extension, else the client's own field, else the config.
    let think_budget = gen_req
        .extension
        .and_then(|e| e.think_budget_tokens)
        .or(gen_req.client_budget)
        .or_else(|| state.config.budget.for_family(family.as_deref().map(|f| f.name())));
    let id_str = String::from_utf8_lossy(id.as_bytes()).into_owned();
    let for_hook = match state.pool.all().iter().any(|u| u.hook_ready()) {
        true => Some(hook_body(&body, &gen_req, think_budget, stream_id)?),
        false => None,
    };
    let class = admission_class(&gen_req);
    // Listed for operators until the response ends (the observer, or this function on
    // an early failure, drops the last hold).
    let live = state.streams.register(NewStream {
        stream_id,
        request_id: &id_str,
        model: &gen_req.model,
        route,
        class,
        streaming: gen_req.stream,
        think_budget,
        started,
    });
    let continuable = forcing::plan(state, route, &body, &gen_req, family.as_ref(), think_budget);
    // Token budgets the proxy forces itself do not go to the engine as well.
    let engine_budget = match &continuable {
        Some(c) if c.triggers.tokens.is_some() => gen_req.client_budget,
        _ => think_budget,
    };
    let body = upstream_body(&body, &gen_req, engine_budget)?;
    let mut continuation = continuable.map(|c| c.with_first_leg(&body)).transpose()?;
    let body = continuation.as_ref().map_or(body, |c| c.body.clone());
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let first = match state.admission.enabled() {
        true => {
            let waiting = spans::admission_span(span, class.as_str());
            let admitted = state.admission.admit(&gen_req.model, class).instrument(waiting.clone()).await;
            let outcome = admitted.as_ref().map_or_else(ProxyError::outcome, |_| "admitted");
            waiting.record("meridian.outcome", outcome);
            if admitted.is_err() {
                spans::fail(&waiting, outcome);
            }
            Some(admitted?)
        }
        false => None,
    };
    live.entry().set_stage(Stage::AwaitingUpstream);
    let mut headers = upstream_request_headers(&parts.headers, state.config.upstream.forward_authorization);
    let pr = &state.config.priority;
    if pr.enabled && !gen_req.client_priority && !headers.contains_key(VLLM_PRIORITY) {
        let value = match class {
            Class::Output => pr.output,
            Class::Interactive => pr.interactive,
            Class::Batch => pr.batch,
        };
        headers.insert(VLLM_PRIORITY, HeaderValue::from(value));
        if let Some(c) = continuation.as_mut() {
            c.output_priority = Some(pr.output);
        }
    }
    let continuation_headers = continuation.as_ref().map(|_| headers.clone());
    let Sent { in_flight, response: resp, via_hook, attempt } = send_with_retries(
        state,
        UpstreamRequest {
            method: Method::POST,
            path_and_query: path,
            headers,
            body: body.clone(),
            hook_body: for_hook,
            request_id: id,
            model: Some(&gen_req.model),
            first,
            span: span.clone(),
        },
    )
    .await?;

    let status = resp.status();
    if !span.is_none() {
        span.record("http.response.status_code", i64::from(status.as_u16()));
        span.record("meridian.upstream", in_flight.upstream().name.as_str());
        if let Some(b) = think_budget {
            span.record("meridian.think_budget_tokens", i64::from(b));
        }
    }
    let mut headers = client_response_headers(resp.headers());
    headers.insert(REQUEST_ID, id.clone());
    if let Ok(v) = HeaderValue::from_str(stream_id) {
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
    let metrics = state.metrics.clone();
    let info = RequestInfo {
        route,
        family: family.clone(),
        initial_phase,
        request_id: id_str.clone(),
        stream_id: stream_id.clone(),
        upstream: upstream_name.clone(),
        started,
        think_budget,
        upstream_ref: Some(in_flight.upstream().clone()),
        think_deadline: think_deadline(state, &gen_req, hook_used(state, &in_flight, via_hook, span)),
        live: Some(live.clone()),
        span: span.clone(),
        attempt,
    };
    let hook_acts = think_budget.is_some()
        || info.think_deadline.is_some()
        || state.config.exit.signal != meridian_core::config::ExitSignal::Off;

    if status.is_success() && is_sse {
        // The relay may append an error event, so the upstream's length cannot stand.
        headers.remove(header::CONTENT_LENGTH);
        let continuation = continuation.filter(|_| !via_hook);
        let end = match &continuation {
            Some(c) => Some(EndThinking::Continuation(c.end_now.clone())),
            None => hook_used(state, &in_flight, via_hook, span).map(EndThinking::Hook),
        };
        match &end {
            Some(EndThinking::Continuation(_)) => live.entry().set_ending(Ending::Continuation),
            Some(EndThinking::Hook(_)) if hook_acts => live.entry().set_ending(Ending::Hook),
            _ => {}
        }
        let eat =
            end.and_then(|end| eat_prober(state, &info, &body, &in_flight, end.clone()).map(|p| (p, end)));
        let mut observer = RequestObserver::new(metrics.clone(), info, true);
        if let Some((prober, end)) = eat {
            let forget = match end {
                EndThinking::Hook(h) => Some(h),
                EndThinking::Continuation(_) => None,
            };
            observer = observer.with_eat(prober, forget);
        }
        let stream = match (continuation, continuation_headers) {
            (Some(c), Some(h)) => c.start(
                state,
                &in_flight,
                path,
                h,
                &id_str,
                family,
                initial_phase,
                live.clone(),
                resp.bytes_stream().boxed(),
                span.clone(),
            ),
            _ => {
                let (name, span) = (upstream_name.clone(), span.clone());
                resp.bytes_stream()
                    .map_err(move |e| {
                        tracing::warn!(parent: &span, upstream = %name, error = %e, "upstream stream failed");
                        ProxyError::UpstreamFailed {
                            upstream: name.clone(),
                            reason: "the stream broke off".into(),
                        }
                    })
                    .boxed()
            }
        };
        let idle = Duration::from_secs_f64(state.config.upstream.idle_timeout_s);
        let max_line = usize::try_from(state.config.upstream.max_response_bytes).unwrap_or(usize::MAX);
        let grace_over = state.drain.grace_over();
        let relay = RelayBody::new(stream, idle, observer, metrics, in_flight, grace_over, max_line);
        let body = match state.config.server.sse_heartbeat_s {
            s if s > 0.0 => Body::from_stream(Heartbeats::new(relay, Duration::from_secs_f64(s))),
            _ => Body::from_stream(relay),
        };
        return Ok(build(status, headers, body));
    }

    // Non-streaming answers and upstream errors arrive whole; read them once, then look.
    // A failure here is counted by the caller, with the error it answers; the observer
    // records only answers that arrived.
    let timeout = Duration::from_secs_f64(state.config.upstream.first_byte_timeout_s);
    let content_type =
        resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let bytes = read_whole(resp, &in_flight, state.config.upstream.max_response_bytes, timeout).await?;
    require_json(&bytes, status, content_type.as_deref(), &in_flight)?;
    let mut observer = RequestObserver::new(metrics, info, false);
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

/// The hook of the upstream serving a request, if the request went through it.
fn hook_used(
    state: &AppState,
    in_flight: &crate::upstream::InFlight,
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
    in_flight: &crate::upstream::InFlight,
    end: EndThinking,
) -> Option<crate::exits::EatProber> {
    let cfg = &state.config.exit;
    if cfg.signal != meridian_core::config::ExitSignal::Eat || info.route != "chat_completions" {
        return None;
    }
    let upstream = in_flight.upstream();
    let tags = info.family.as_ref()?.file.tags.as_ref()?;
    let target = crate::exits::ProbeTarget {
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
    crate::exits::EatProber::start(cfg, target)
}

/// The thinking-time budget of a request (its own, else the config's), when it went to
/// an upstream's hook to enforce it.
fn think_deadline(
    state: &AppState,
    req: &GenerationRequest<'_>,
    hook: Option<crate::hook::HookTarget>,
) -> Option<crate::hook::ThinkDeadline> {
    let seconds = forcing::think_seconds(state, req)?;
    Some(crate::hook::ThinkDeadline { after: Duration::from_secs_f64(seconds), hook: hook? })
}

/// vLLM's per-request priority header (lower runs first).
pub(super) const VLLM_PRIORITY: &str = "x-vllm-priority";

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

fn build(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}
