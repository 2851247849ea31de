//! One generation request's context, owned and shared (`Arc<RequestCtx>`) by everything
//! that handles the request: decided once in the route when its body has been read, then
//! seen by admission, the send, the relay and its watchers, the continuation, the EAT
//! prober and the open-stream registry, for as long as any of them runs. Nothing copies
//! what it holds: each stage keeps the `Arc` and reads what it needs.
//!
//! What is known before the body arrives (who the request is, its span, where its
//! outcome is written) is its [`Arrival`]; what its body decides (model family, budgets,
//! admission class) is in [`RequestCtx`] beside it; where it is right now (stage, phase,
//! token counts) is its [`Progress`], written in place as it streams; how it ended is
//! recorded once, by [`Arrival::finish`] ([`finish`]).

mod class;
mod finish;
mod progress;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::HeaderValue;
use bytes::Bytes;
use meridian_core::Phase;
use meridian_core::models::ModelFamily;
use meridian_core::stream::Dialect;

pub use class::Class;
pub use finish::End;
pub use progress::{Ending, Progress, Stage, phase_slot};

use crate::telemetry::outcomes::OutcomeSlot;
use crate::tenants::TenantLease;
use meridian_core::route::Work;

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
}

/// A generation request as it arrives, before its body is read: who it is, its span, and
/// where its outcome is written.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub route: Route,
    /// The client's `X-Request-Id` (one is minted when it sent none).
    pub request_id: HeaderValue,
    /// The same, as text, for logs and the open-stream registry.
    pub request_id_text: String,
    /// What the engine's hook knows this stream by (see `crate::request_id`).
    pub stream_id: String,
    /// The request's span (`Span::none()` untraced); it ends with the response.
    pub span: tracing::Span,
    pub started: Instant,
    /// Where its outcome is written, for the layer that counts it.
    pub outcome: OutcomeSlot,
}

/// A generation request, decided once from its body.
#[derive(Debug)]
pub struct RequestCtx {
    pub arrival: Arrival,
    /// The body as the client sent it.
    pub body: Bytes,
    pub model: String,
    pub family: Option<Arc<ModelFamily>>,
    /// The phase it starts in when not the family's (the request turned thinking off).
    pub initial_phase: Option<Phase>,
    /// The think budget in tokens: the request's extension, else the client's own
    /// `thinking_token_budget`, else the config's for the family.
    pub think_budget: Option<u32>,
    /// The client's own think budget, which vLLM enforces itself.
    pub client_budget: Option<u32>,
    /// The thinking-time budget in seconds: the request's own, else the config's.
    pub think_seconds: Option<f64>,
    /// The client set vLLM's `priority` itself, and may (its tenant is allowed it, or
    /// `[tenants]` is off).
    pub client_priority: bool,
    pub class: Class,
    /// The client asked for a streamed answer.
    pub streaming: bool,
    /// Its affinity key (`upstream.affinity_header`), which routing may keep on one
    /// engine (`upstream.routing = "prefix-affinity"`).
    pub affinity_key: Option<String>,
    /// Wall-clock start, for operators (`started` is monotonic).
    pub started_unix_ms: u64,
    pub progress: Progress,
    /// Its tenant's lease (`[tenants]` on): its open slot, handed back, and its generated
    /// tokens charged, when the context goes.
    pub tenant: Option<TenantLease>,
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        if let Some(lease) = &self.tenant {
            let (think, output) = self.progress.tokens();
            lease.spend(u64::from(think) + u64::from(output));
        }
    }
}

impl RequestCtx {
    /// A request known only by its route and family, not sent by any client: for
    /// benchmarks, tests and tools that drive the relay's parts directly.
    pub fn detached(route: Route, family: Option<Arc<ModelFamily>>) -> Self {
        let arrival = Arrival {
            route,
            request_id: HeaderValue::from_static("detached"),
            request_id_text: "detached".into(),
            stream_id: String::new(),
            span: tracing::Span::none(),
            started: Instant::now(),
            outcome: OutcomeSlot::default(),
        };
        RequestCtx {
            started_unix_ms: unix_ms(arrival.started),
            arrival,
            body: Bytes::new(),
            model: String::new(),
            family,
            initial_phase: None,
            think_budget: None,
            client_budget: None,
            think_seconds: None,
            client_priority: false,
            class: Class::Interactive,
            streaming: true,
            affinity_key: None,
            progress: Progress::default(),
            tenant: None,
        }
    }

    pub fn route(&self) -> Route {
        self.arrival.route
    }

    pub fn request_id(&self) -> &str {
        &self.arrival.request_id_text
    }

    pub fn stream_id(&self) -> &str {
        &self.arrival.stream_id
    }

    pub fn span(&self) -> &tracing::Span {
        &self.arrival.span
    }

    pub fn started(&self) -> Instant {
        self.arrival.started
    }

    /// The client may not set vLLM's priority (`[tenants]` on, and its tenant is not
    /// allowed it): any it set, in the body or as `X-Vllm-Priority`, is taken out before
    /// the request goes upstream.
    pub fn drop_client_priority(&self) -> bool {
        self.tenant.as_ref().is_some_and(|l| !l.tenant().allow_priority)
    }

    /// Its tenant's admission flow and weight (`[tenants]`); one flow when off.
    pub fn flow(&self) -> (usize, u32) {
        self.tenant.as_ref().map_or((0, 1), |l| (l.tenant().flow, l.tenant().weight))
    }

    /// What it goes to an engine for, matched against the upstreams' roles: thinking when
    /// its family is known and it did not turn thinking off, an answer when it did, and
    /// unknown without a family (no phases to track, so no hand-over).
    pub fn work(&self) -> Work {
        match (&self.family, self.initial_phase) {
            (None, _) => Work::Unknown,
            (Some(_), Some(Phase::Output)) => Work::Answer,
            (Some(_), _) => Work::Think,
        }
    }

    /// The model family's name, the label of its metrics.
    pub fn family_name(&self) -> &str {
        self.family.as_ref().map_or("unknown", |f| f.name())
    }
}

/// Milliseconds since the Unix epoch at the monotonic instant `at` (in the past).
pub fn unix_ms(at: Instant) -> u64 {
    SystemTime::now()
        .checked_sub(at.elapsed())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
