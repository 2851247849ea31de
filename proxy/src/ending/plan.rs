//! How a request's thinking gets ended when a budget or an exit signal says so: by the
//! upstream's hook when it is ready, else by vLLM's `thinking_token_budget` or by the
//! proxy's continuation (`crate::continuation`), as `budget.forcing` chooses.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use meridian_core::Phase;
use meridian_core::config::{ExitSignal, Forcing};
use meridian_core::models::ModelFamily;
use serde_json::{Map, Value};
use tokio::sync::Notify;

use super::continuation::{
    ClientAsked, Continuation, ContinuationUpstream, Delimiters, Route, Setup, Splicer, ThinkWatch, Triggers,
    first_leg_body,
};
use crate::error::ProxyError;
use crate::headers::VLLM_PRIORITY;
use crate::request_id::REQUEST_ID;
use crate::routes::GenerationRequest;
use crate::state::AppState;
use crate::upstream::InFlight;

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
    /// The priority the continuation (all answer) is sent with, when the proxy sets
    /// priorities for this request.
    pub output_priority: Option<i32>,
}

/// Whether a request would be continued, and on what triggers: `None` for
/// `forcing = "engine"`, an API the continuation does not speak (`route` `None`),
/// unknown delimiters, thinking switched off, shapes that cannot be continued (not
/// streamed, `n` > 1), or nothing that would cut.
pub fn plan(
    state: &AppState,
    route: Option<Route>,
    req: &GenerationRequest<'_>,
    family: Option<&Arc<ModelFamily>>,
    think_budget: Option<u32>,
) -> Option<Continuable> {
    let forcing = state.config.budget.forcing;
    if forcing == Forcing::Engine || req.initial_phase == Some(Phase::Output) {
        return None;
    }
    let route = route?;
    let delimiters = Delimiters::of(family?)?;
    let exit = &state.config.exit;
    let triggers = Triggers {
        tokens: think_budget.filter(|_| forcing == Forcing::Continuation),
        seconds: think_seconds(state, req).map(Duration::from_secs_f64),
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

/// The request's thinking-time budget: its own, else the config's.
pub fn think_seconds(state: &AppState, req: &GenerationRequest<'_>) -> Option<f64> {
    req.extension.and_then(|e| e.think_budget_s).or(state.config.budget.think_seconds)
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
            output_priority: None,
        })
    }
}

impl ContinuationPlan {
    /// The relay's continuation stage for a first leg sent to `in_flight`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        self,
        state: &AppState,
        in_flight: &InFlight,
        path: &str,
        mut headers: HeaderMap,
        request_id: &str,
        family: Option<&Arc<ModelFamily>>,
        live: Arc<crate::streams::StreamGuard>,
        span: tracing::Span,
    ) -> Continuation {
        let upstream = in_flight.upstream();
        if let Ok(v) = HeaderValue::from_str(&format!("{request_id}-continued")) {
            headers.insert(REQUEST_ID, v);
        }
        if let Some(key) = &state.upstream_auth {
            headers.insert(axum::http::header::AUTHORIZATION, key.clone());
        }
        // What follows the cut is all answer: it gets the output class's priority.
        if let Some(p) = self.output_priority {
            headers.insert(VLLM_PRIORITY, HeaderValue::from(p));
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
            live: Some(live),
            watch: ThinkWatch::new(self.route, self.triggers),
            splicer: Splicer::new(self.asked, added_logprobs),
            end_now: self.end_now,
            metrics: state.metrics.clone(),
            family: family.map_or("unknown", |f| f.name()).to_owned(),
            span,
        })
    }
}
