//! The priority a generation request goes upstream with: vLLM's `priority` for its
//! admission class, when the proxy sets priorities and the client set none.

use axum::http::{HeaderMap, HeaderValue};

use crate::ctx::Class;
use crate::ctx::RequestCtx;
use crate::headers::VLLM_PRIORITY;
use crate::state::AppState;

/// `headers` with the request's priority, and the priority a continuation's later leg
/// (all answer) would go with: the output class's, when the proxy set one here.
pub fn with_priority(state: &AppState, ctx: &RequestCtx, mut headers: HeaderMap) -> (HeaderMap, Option<i32>) {
    let pr = &state.config.priority;
    if !pr.enabled || ctx.client_priority || headers.contains_key(VLLM_PRIORITY) {
        return (headers, None);
    }
    let value = match ctx.class {
        Class::Output => pr.output,
        Class::Interactive => pr.interactive,
        Class::Batch => pr.batch,
    };
    headers.insert(VLLM_PRIORITY, HeaderValue::from(value));
    (headers, Some(pr.output))
}
