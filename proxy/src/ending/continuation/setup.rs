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
    ClientAsked, Continuation, ContinuationUpstream, Delimiters, HandOver, Route, Setup, Splicer, ThinkWatch,
    Triggers, first_leg_body,
};
use crate::body::GenerationRequest;
use crate::ctx::RequestCtx;
use crate::error::ProxyError;
use crate::headers::VLLM_PRIORITY;
use crate::request_id::REQUEST_ID;
use crate::state::AppState;
use crate::upstream::Upstream;
use meridian_core::route::{Role, Work};

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

/// Whether a request would be continued, and on what triggers: `None` for an API the
/// continuation does not speak, unknown delimiters, thinking switched off, shapes that
/// cannot be continued (not streamed, `n` > 1), or nothing that would cut. With
/// `forcing = "engine"` only a hand-over to an answer upstream (some upstreams are
/// `think` servers) may cut.
pub fn continuable(state: &AppState, ctx: &RequestCtx, req: &GenerationRequest<'_>) -> Option<Continuable> {
    if ctx.initial_phase == Some(Phase::Output) {
        return None;
    }
    let route = Route::of(ctx.route())?;
    let delimiters = Delimiters::of(ctx.family.as_ref()?)?;
    let (forcing, exit) = (state.config.budget.forcing, &state.config.exit);
    let mut triggers = Triggers {
        tokens: ctx.think_budget.filter(|_| forcing == Forcing::Continuation),
        seconds: ctx.think_seconds.map(Duration::from_secs_f64),
        rpdi: (exit.signal == ExitSignal::Rpdi).then(|| (exit.rpdi(), exit.min_think_tokens)),
        eat: exit.signal == ExitSignal::Eat && route == Route::Chat,
        handoff: state.pool.hands_over() && ctx.work() == Work::Think,
    };
    if forcing == Forcing::Engine {
        triggers = triggers.handoff_only();
    }
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

    /// The answer may be handed over at the end of the thought (the pool has `think`
    /// servers).
    pub fn hands_over(&self) -> bool {
        self.triggers.handoff
    }

    /// Only the hand-over at the end of the thought: for a first leg whose upstream's hook
    /// ends thinking itself; `None` when no hand-over applies.
    pub fn handoff_only(mut self) -> Option<Self> {
        self.triggers = self.triggers.handoff_only();
        self.triggers.handoff.then_some(self)
    }

    /// The relay's continuation stage for a first leg sent to `upstream` at `path`: on
    /// a `think` upstream, the answer is handed over at the end of the thought.
    pub fn start(
        self,
        state: &AppState,
        ctx: &Arc<RequestCtx>,
        upstream: &Arc<Upstream>,
        path: &str,
    ) -> Continuation {
        let mut triggers = self.triggers;
        triggers.handoff &= upstream.role == Role::Think;
        let handoff = triggers.handoff.then(|| HandOver {
            pool: state.pool.clone(),
            admission: state.admission.clone(),
            metrics: state.metrics.clone(),
            from: upstream.clone(),
            path: path.to_owned(),
            connector: state.config.upstream.handover == crate::config::Handover::Connector,
        });
        let mut headers = self.later_headers;
        if let Ok(v) = HeaderValue::from_str(&format!("{}-continued", ctx.request_id())) {
            headers.insert(REQUEST_ID, v);
        }
        if let Some(key) = &state.upstream_auth {
            headers.insert(axum::http::header::AUTHORIZATION, key.clone());
        }
        let added_logprobs = triggers.rpdi.is_some() && !self.asked.logprobs;
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
            watch: ThinkWatch::new(self.route, triggers),
            splicer: Splicer::new(self.asked, added_logprobs),
            end_now: self.end_now,
            metrics: state.metrics.clone(),
            ctx: ctx.clone(),
            handoff,
        })
    }
}
