//! Ending thinking on an engine the proxy cannot reach inside: budget forcing and
//! entropy exits by continuation, for any OpenAI-compatible server.
//!
//! While the upstream thinks, its stream is relayed as usual, and the relay's tracker lends
//! each event to a think watch ([`watch`]): think tokens against the budget, thinking
//! time against the deadline, RPDI over the streamed `top_logprobs`, and an EAT decision
//! from the prober. The continuation is a stage of the relay ([`stage`], a `crate::relay::RelayStage`), so each event
//! is parsed once for all of them. When one of them says
//! stop, the proxy drops the upstream stream (which cancels the request in the engine)
//! and sends a second request ([`legs`]): the conversation, plus an assistant message
//! holding the reasoning so far closed by the model's end-of-thinking delimiter, with
//! `continue_final_message` so the engine answers from there. The second stream is
//! spliced into the first ([`splice`]): same response id, its text relabelled as
//! answer (vLLM's reasoning parser never sees the end tag in the continuation's own
//! tokens, so it calls everything reasoning), and one `usage` that adds both legs up.
//!
//! This costs a second prefill of the prompt plus the reasoning; prefix caching makes
//! most of it a cache hit. A ready hook ends thinking in place instead, so the proxy
//! uses continuation only where there is none.

mod handover;
mod legs;
mod setup;
mod splice;
mod stage;
mod watch;

pub use handover::HandOver;
pub use legs::{ClientAsked, first_leg_body, with_usage_in_every_chunk};
pub use setup::{Continuable, ContinuationPlan, continuable};
pub use splice::{Emit, Splicer};
pub use stage::{Continuation, Setup, Spliced, Upstream as ContinuationUpstream};
pub use watch::{Cut, ThinkWatch, Triggers};

/// The text that closes a thought for a model family, and the one that opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delimiters {
    pub open: String,
    pub close: String,
}

impl Delimiters {
    /// The family's first start and end tags; `None` for families without text tags
    /// (gpt-oss channels), which cannot be continued this way.
    pub fn of(family: &meridian_core::models::ModelFamily) -> Option<Self> {
        let tags = family.file.tags.as_ref()?;
        Some(Delimiters {
            open: tags.start.first().cloned().unwrap_or_default(),
            close: tags.end.first()?.clone(),
        })
    }
}

/// Which API the stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
}

impl Route {
    /// The API a request's route speaks, where the proxy can end thinking itself by
    /// continuing the answer in a second request: chat and completions, whose prompt it
    /// can extend. The other APIs end thinking only through an engine's hook.
    pub fn of(route: crate::ctx::Route) -> Option<Route> {
        match route {
            crate::ctx::Route::ChatCompletions => Some(Route::Chat),
            crate::ctx::Route::Completions => Some(Route::Completions),
            crate::ctx::Route::Responses | crate::ctx::Route::Messages => None,
        }
    }
}
