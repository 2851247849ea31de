//! What a generation request sends upstream: the body for an upstream whose hook is
//! ready, the body for one without (the continuation's first leg when the proxy would
//! end thinking itself), and the priority header its class gets.

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;

use super::ctx::RequestCtx;
use crate::admission::Class;
use crate::ending::plan::{self, ContinuationPlan};
use crate::error::ProxyError;
use crate::headers::VLLM_PRIORITY;
use crate::routes::body::{hook_body, upstream_body};
use crate::state::AppState;

pub struct Outbound {
    /// For an upstream without a ready hook.
    pub body: Bytes,
    /// For an upstream whose hook is ready (taken when the request is sent).
    pub hook_body: Option<Bytes>,
    /// How the proxy would end thinking itself, should the request reach an upstream
    /// without a ready hook.
    pub continuation: Option<ContinuationPlan>,
    /// The headers the continuation's later leg goes with: the first leg's.
    pub continuation_headers: Option<HeaderMap>,
}

impl Outbound {
    pub fn plan(state: &AppState, ctx: &RequestCtx<'_>) -> Result<Self, ProxyError> {
        let req = &ctx.request;
        let hook_body = match state.pool.all().iter().any(|u| u.hook_ready()) {
            true => Some(hook_body(ctx.body, req, ctx.think_budget, &ctx.ids.stream_id)?),
            false => None,
        };
        let continuable =
            plan::plan(state, ctx.route.continuation(), req, ctx.family.as_ref(), ctx.think_budget);
        // Token budgets the proxy forces itself do not go to the engine as well.
        let engine_budget = match &continuable {
            Some(c) if c.triggers.tokens.is_some() => req.client_budget,
            _ => ctx.think_budget,
        };
        let body = upstream_body(ctx.body, req, engine_budget)?;
        // A body the continuation cannot rebuild (a number beyond serde_json's range, a
        // lone surrogate: valid JSON all the same) goes as it is, without one.
        let continuation = continuable.and_then(|c| c.with_first_leg(&body).ok());
        let body = continuation.as_ref().map_or(body, |c| c.body.clone());
        Ok(Outbound { body, hook_body, continuation, continuation_headers: None })
    }

    /// `headers` with vLLM's priority for the request's class, when the proxy sets
    /// priorities and the client set none; the continuation keeps a copy for its later
    /// leg, which (all answer) goes with the output class's priority.
    pub fn with_priority(
        &mut self,
        state: &AppState,
        ctx: &RequestCtx<'_>,
        mut headers: HeaderMap,
    ) -> HeaderMap {
        let pr = &state.config.priority;
        if pr.enabled && !ctx.request.client_priority && !headers.contains_key(VLLM_PRIORITY) {
            let value = match ctx.class {
                Class::Output => pr.output,
                Class::Interactive => pr.interactive,
                Class::Batch => pr.batch,
            };
            headers.insert(VLLM_PRIORITY, HeaderValue::from(value));
            if let Some(c) = self.continuation.as_mut() {
                c.output_priority = Some(pr.output);
            }
        }
        self.continuation_headers = self.continuation.as_ref().map(|_| headers.clone());
        headers
    }
}
