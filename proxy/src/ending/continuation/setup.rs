//! How a continuation is set up for a request: whether it could be continued and on
//! what triggers, its first leg's body, and, once its first leg is sent to an upstream
//! without a ready hook, the relay's continuation stage ([`super::Continuation`]).

use std::sync::Arc;
use std::time::Duration;

use crate::config::{ExitSignal, Forcing};
use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use meridian_core::Phase;
use serde_json::{Map, Value};
use tokio::sync::Notify;

use super::{
    ClientAsked, Continuation, ContinuationUpstream, Delimiters, Route, Setup, Splicer, ThinkWatch, Triggers,
    first_leg_body,
};
use crate::body::GenerationRequest;
use crate::ctx::RequestCtx;
use crate::error::ProxyError;
use crate::headers::VLLM_PRIORITY;
use crate::request_id::REQUEST_ID;
use crate::state::AppState;
use crate::upstream::Upstream;

/// A request that would be continued, were it to reach an upstream without a ready hook.
pub struct Continuable {
    pub triggers: Triggers,
    delimiters: Delimiters,
    route: Route,
}

/// A continuable request with its first leg's body, ready to go upstream.
pub struct ContinuationPlan {
    triggers: Triggers,
    delimiters: Delimiters,
    route: Route,
    /// The first leg's body (for upstreams without a ready hook).
    pub body: Bytes,
    first_body: Map<String, Value>,
    asked: ClientAsked,
    /// Rung by the EAT prober.
    pub end_now: Arc<Notify>,
    /// The headers the later leg goes with: the first leg's, with the output class's
    /// priority when the proxy sets priorities (what follows the cut is all answer).
    pub later_headers: HeaderMap,
}

/// Whether a request would be continued, and on what triggers: `None` for
/// `forcing = "engine"`, an API the continuation does not speak, unknown delimiters,
/// thinking switched off, shapes that cannot be continued (not streamed, `n` > 1), or
/// nothing that would cut.
pub fn continuable(state: &AppState, ctx: &RequestCtx, req: &GenerationRequest<'_>) -> Option<Continuable> {
    let forcing = state.config.budget.forcing;
    if forcing == Forcing::Engine || ctx.initial_phase == Some(Phase::Output) {
        return None;
    }
    let route = Route::of(ctx.route())?;
    let delimiters = Delimiters::of(ctx.family.as_ref()?)?;
    let exit = &state.config.exit;
    let triggers = Triggers {
        tokens: ctx.think_budget.filter(|_| forcing == Forcing::Continuation),
        seconds: ctx.think_seconds.map(Duration::from_secs_f64),
        rpdi: (exit.signal == ExitSignal::Rpdi).then(|| (exit.rpdi(), exit.min_think_tokens)),
        eat: exit.signal == ExitSignal::Eat && route == Route::Chat,
    };
    if !triggers.any() {
        return None;
    }
    if !req.continuable(route == Route::Chat) {
        return None;
    }
    Some(Continuable { triggers, delimiters, route })
}

impl Continuable {
    /// The plan, with the first leg's body made from the body an upstream without a
    /// hook would get.
    pub fn with_first_leg(self, upstream_body: &Bytes) -> Result<ContinuationPlan, ProxyError> {
        let (body, first_body, asked) =
            first_leg_body(upstream_body, self.route, self.triggers.rpdi.is_some())?;
        Ok(ContinuationPlan {
            triggers: self.triggers,
            delimiters: self.delimiters,
            route: self.route,
            body,
            first_body,
            asked,
            end_now: Arc::new(Notify::new()),
            later_headers: HeaderMap::new(),
        })
    }
}

impl ContinuationPlan {
    /// The later leg's headers: the first leg's, and `output_priority` when the proxy
    /// sets one.
    pub fn later_leg_headers(&mut self, first_leg: &HeaderMap, output_priority: Option<i32>) {
        let mut headers = first_leg.clone();
        if let Some(p) = output_priority {
            headers.insert(VLLM_PRIORITY, HeaderValue::from(p));
        }
        self.later_headers = headers;
    }

    /// The relay's continuation stage for a first leg sent to `upstream` at `path`.
    pub fn start(
        self,
        state: &AppState,
        ctx: &Arc<RequestCtx>,
        upstream: &Upstream,
        path: &str,
    ) -> Continuation {
        let mut headers = self.later_headers;
        if let Ok(v) = HeaderValue::from_str(&format!("{}-continued", ctx.request_id())) {
            headers.insert(REQUEST_ID, v);
        }
        if let Some(key) = &state.upstream_auth {
            headers.insert(axum::http::header::AUTHORIZATION, key.clone());
        }
        let added_logprobs = self.triggers.rpdi.is_some() && !self.asked.logprobs;
        Continuation::new(Setup {
            upstream: ContinuationUpstream {
                client: state.client.clone(),
                url: format!("{}{path}", upstream.base_url),
                headers,
                name: upstream.name.clone(),
                first_byte_timeout: Duration::from_secs_f64(state.config.upstream.first_byte_timeout_s),
            },
            route: self.route,
            delimiters: self.delimiters,
            first_body: self.first_body,
            asked: self.asked,
            watch: ThinkWatch::new(self.route, self.triggers),
            splicer: Splicer::new(self.asked, added_logprobs),
            end_now: self.end_now,
            metrics: state.metrics.clone(),
            ctx: ctx.clone(),
        })
    }
}
