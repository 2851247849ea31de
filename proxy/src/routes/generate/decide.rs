//! One generation request's context: what every stage of its handling needs to know,
//! decided once when its body has been read (the body parsed once, its route, model
//! family, think budget, admission class, ids) and read by every stage after.

use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use bytes::Bytes;
use meridian_core::Phase;
use meridian_core::models::ModelFamily;
use meridian_core::stream::Dialect;

use super::super::body::{ClientClass, GenerationRequest};
use crate::admission::Class;
use crate::error::ProxyError;
use crate::state::AppState;
use crate::telemetry::outcomes::Outcome;

/// The generation endpoints the proxy tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/responses`: OpenAI's Responses API.
    Responses,
    /// `POST /v1/messages`: Anthropic's Messages API, as vLLM serves it.
    Messages,
}

impl Route {
    /// The route's label in metrics, logs and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
            Route::Responses => "responses",
            Route::Messages => "messages",
        }
    }

    /// The route served at `path`, if it is one of these.
    pub fn of_path(path: &str) -> Option<Route> {
        match path {
            "/v1/chat/completions" => Some(Route::ChatCompletions),
            "/v1/completions" => Some(Route::Completions),
            "/v1/responses" => Some(Route::Responses),
            "/v1/messages" => Some(Route::Messages),
            _ => None,
        }
    }

    /// The API its requests and answers speak.
    pub fn dialect(self) -> Dialect {
        match self {
            Route::ChatCompletions | Route::Completions => Dialect::Chat,
            Route::Responses => Dialect::Responses,
            Route::Messages => Dialect::Messages,
        }
    }

    /// The route as the continuation knows it, where the proxy can end thinking itself
    /// by continuing the answer in a second request: chat and completions, whose prompt
    /// it can extend. The other APIs end thinking only through an engine's hook.
    pub fn continuation(self) -> Option<crate::ending::continuation::Route> {
        match self {
            Route::ChatCompletions => Some(crate::ending::continuation::Route::Chat),
            Route::Completions => Some(crate::ending::continuation::Route::Completions),
            Route::Responses | Route::Messages => None,
        }
    }
}

/// Who a generation request is: its client's id, the proxy's stream id, its span.
pub struct Ids {
    pub id: HeaderValue,
    pub stream_id: String,
    pub span: tracing::Span,
    /// Where its outcome is written, for the layer that counts it.
    pub outcome: Outcome,
}

/// A generation request, read and decided once.
pub struct RequestCtx<'a> {
    pub route: Route,
    pub ids: &'a Ids,
    /// The client's `X-Request-Id` as text, for logs and the open-stream registry.
    pub request_id: String,
    pub started: Instant,
    /// The body as the client sent it.
    pub body: &'a Bytes,
    /// The body parsed, once.
    pub request: GenerationRequest<'a>,
    pub family: Option<Arc<ModelFamily>>,
    /// The think budget in tokens: the request's extension, else the client's own
    /// `thinking_token_budget`, else the config's for the family.
    pub think_budget: Option<u32>,
    pub class: Class,
}

impl<'a> RequestCtx<'a> {
    pub fn new(
        state: &AppState,
        route: Route,
        ids: &'a Ids,
        started: Instant,
        body: &'a Bytes,
    ) -> Result<Self, ProxyError> {
        let request = GenerationRequest::parse(body, route.dialect())?;
        let family = state.family_for(&request.model);
        let think_budget = request
            .extension
            .and_then(|e| e.think_budget_tokens)
            .or(request.client_budget)
            .or_else(|| state.config.budget.for_family(family.as_deref().map(|f| f.name())));
        let class = admission_class(&request);
        Ok(RequestCtx {
            route,
            ids,
            request_id: String::from_utf8_lossy(ids.id.as_bytes()).into_owned(),
            started,
            body,
            request,
            family,
            think_budget,
            class,
        })
    }

    /// The phase the request starts in when it is not the family's (thinking switched off).
    pub fn initial_phase(&self) -> Option<Phase> {
        self.request.initial_phase
    }

    pub fn span(&self) -> &tracing::Span {
        &self.ids.span
    }
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
