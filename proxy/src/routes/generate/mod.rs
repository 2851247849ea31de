//! `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses` and `/v1/messages`:
//! the tracked data path, the same for every API (each read by its own parser). One
//! request reads top-down in [`serve`]: its tenant's limits first (`crate::tenants`), its
//! body read and decided once into its context (`crate::ctx::RequestCtx`, shared by
//! every stage after), the bodies it may go upstream with prepared by the ending of its
//! thinking (`crate::ending::plan`), admission, the send with its retries at its
//! class's [`priority`], and the answer relayed ([`respond`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::Response;

mod decide;
mod priority;
mod respond;

use crate::body::{GenerationRequest, read_body};
use crate::ctx::{Arrival, End, RequestCtx, Route};
use crate::ending::plan::Prepared;
use crate::error::ProxyError;
use crate::headers::{VLLM_PRIORITY, upstream_request_headers};
use crate::relay::{UpstreamRequest, early_response, send_with_retries};
use crate::request_id::{REQUEST_ID, STREAM_ID, mint_stream_id, request_id};
use crate::state::AppState;
use crate::streams::Stage;
use crate::telemetry::outcomes::OutcomeSlot;
use crate::telemetry::spans;
use crate::upstream::Want;
use tracing::Instrument;

pub async fn chat_completions(State(state): State<Arc<AppState>>, req: Request) -> Response {
    generate(state, Route::ChatCompletions, req).await
}

pub async fn completions(State(state): State<Arc<AppState>>, req: Request) -> Response {
    generate(state, Route::Completions, req).await
}

pub async fn responses(State(state): State<Arc<AppState>>, req: Request) -> Response {
    generate(state, Route::Responses, req).await
}

pub async fn messages(State(state): State<Arc<AppState>>, req: Request) -> Response {
    generate(state, Route::Messages, req).await
}

async fn generate(state: Arc<AppState>, route: Route, req: Request) -> Response {
    let started = Instant::now();
    let id = request_id(req.headers());
    let id_text = String::from_utf8_lossy(id.as_bytes()).into_owned();
    // What the engine's hook knows this stream by (see `request_id`).
    let stream_id = mint_stream_id();
    let streamed = Arc::new(AtomicBool::new(false));
    // The request's span: it lives as long as the response, in the relay's observer.
    let span = spans::request_span(route.as_str(), req.uri().path(), req.headers());
    if !span.is_none() {
        span.record("meridian.request_id", id_text.as_str());
        span.record("meridian.stream_id", stream_id.as_str());
    }
    let outcome = req.extensions().get::<OutcomeSlot>().cloned().unwrap_or_default();
    outcome.route(route.as_str());
    let arrival = Arrival {
        route,
        request_id: id.clone(),
        request_id_text: id_text,
        stream_id: stream_id.clone(),
        span: span.clone(),
        started,
        outcome,
    };
    let answer = answer(state.clone(), req, arrival, streamed.clone()).instrument(span);
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
                    return early_response(answer, every, headers, route.dialect());
                }
            }
        }
    }
}

/// The response to a generation request, its failures counted and answered in
/// OpenAI's error shape; a drain's grace running out ends the wait with one.
async fn answer(state: Arc<AppState>, req: Request, arrival: Arrival, streamed: Arc<AtomicBool>) -> Response {
    let mut left = LeftEarly { arrival: &arrival, answered: false };
    let relayed = async {
        if state.drain.draining() {
            return Err(ProxyError::ShuttingDown);
        }
        tokio::select! {
            r = serve(&state, req, arrival.clone(), &streamed) => r,
            _ = state.drain.grace_over() => Err(ProxyError::ShuttingDown),
        }
    };
    let resp = match relayed.await {
        Ok(resp) => resp,
        Err(e) => {
            arrival.finish(End::Failed(&e));
            e.into_response_in(arrival.route.dialect())
        }
    };
    left.answered = true;
    resp
}

/// Notices a client that left before it had a response: while its request waited for
/// admission or for the upstream's response headers. The server drops the handler as
/// soon as the connection closes, and with it everything the request held (its place in
/// the admission queue, its upstream request, which is then aborted); this guard, dropped
/// with them, finishes the request. From the response on, the relay's observer does.
struct LeftEarly<'a> {
    arrival: &'a Arrival,
    answered: bool,
}

impl Drop for LeftEarly<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.arrival.finish(End::LeftEarly);
    }
}

/// One generation request, top to bottom.
async fn serve(
    state: &Arc<AppState>,
    req: Request,
    arrival: Arrival,
    streamed: &AtomicBool,
) -> Result<Response, ProxyError> {
    let (parts, body) = req.into_parts();
    // Its tenant's limits answer first, before its body is read.
    let tenant = state.tenant_lease(&parts.headers)?;
    let body = read_body(body, &state.config.server).await?;
    let request = GenerationRequest::parse(&body, arrival.route.dialect())?;
    let ctx = decide::context(state, arrival, &parts.headers, &body, &request, tenant);
    streamed.store(ctx.streaming, Ordering::Release);
    spans::name_request(ctx.span(), ctx.route().as_str(), &ctx.model);
    let mut prepared = Prepared::new(state, &ctx, &body, &request)?;
    // Listed for operators until the response ends (the observer, or this function on
    // an early failure, drops it).
    let listed = state.streams.list(&ctx);
    let first = match state.admission.enabled() {
        true => {
            let admitted = admit(state, &ctx).await?;
            prepared.waited_in_admission(&ctx, &body, &request, admitted.queued)?;
            Some(admitted.guard)
        }
        false => None,
    };
    ctx.progress.set_stage(Stage::AwaitingUpstream);
    let mut headers = upstream_request_headers(&parts.headers, state.config.upstream.forward_authorization);
    if ctx.drop_client_priority() {
        headers.remove(VLLM_PRIORITY);
    }
    let (headers, output_priority) = priority::with_priority(state, &ctx, headers);
    prepared.first_leg_headers(&headers, output_priority);
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let sent = send_with_retries(
        state,
        UpstreamRequest {
            method: Method::POST,
            path_and_query: path,
            headers,
            body: prepared.body.clone(),
            hook_body: prepared.hook_body.take(),
            request_id: &ctx.arrival.request_id,
            want: Want { model: Some(&ctx.model), affinity: ctx.affinity_key.as_deref(), work: ctx.work() },
            admitted: first.is_some().then_some(ctx.class),
            first,
            span: ctx.span().clone(),
        },
    )
    .await?;
    respond::respond(state, &ctx, prepared, sent, listed, path).await
}

/// Waits for the request's turn at an upstream of its model (admission control on).
async fn admit(state: &AppState, ctx: &RequestCtx) -> Result<crate::admission::Admitted, ProxyError> {
    let waiting = spans::admission_span(ctx.span(), ctx.class.as_str());
    let admitted = state
        .admission
        .admit(&ctx.model, ctx.affinity_key.as_deref(), ctx.work(), ctx.class, ctx.flow())
        .instrument(waiting.clone())
        .await;
    let outcome = admitted.as_ref().map_or_else(|e| e.outcome().as_str(), |_| "admitted");
    waiting.record("meridian.outcome", outcome);
    if admitted.is_err() {
        spans::fail(&waiting, outcome);
    }
    admitted
}
