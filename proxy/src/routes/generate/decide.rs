//! A generation request's context decided from its body, once: its model family, think
//! budgets and admission class (see `crate::ctx`).

use std::sync::Arc;

use bytes::Bytes;
use meridian_core::Phase;

use crate::body::{ClientClass, GenerationRequest};
use crate::ctx::Class;
use crate::ctx::{Arrival, Progress, RequestCtx, unix_ms};
use crate::state::AppState;

/// The request's context, from its arrival and its body parsed once.
pub fn context(
    state: &AppState,
    arrival: Arrival,
    body: &Bytes,
    request: &GenerationRequest<'_>,
) -> Arc<RequestCtx> {
    let family = state.family_for(&request.model);
    let think_budget = request
        .extension
        .and_then(|e| e.think_budget_tokens)
        .or(request.client_budget)
        .or_else(|| state.config.budget.for_family(family.as_deref().map(|f| f.name())));
    let think_seconds =
        request.extension.and_then(|e| e.think_budget_s).or(state.config.budget.think_seconds);
    Arc::new(RequestCtx {
        started_unix_ms: unix_ms(arrival.started),
        arrival,
        body: body.clone(),
        model: request.model.clone().into_owned(),
        family,
        initial_phase: request.initial_phase,
        think_budget,
        client_budget: request.client_budget,
        think_seconds,
        client_priority: request.client_priority,
        class: admission_class(request),
        streaming: request.stream,
        progress: Progress::default(),
    })
}

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
