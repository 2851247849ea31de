//! Ending a request's thinking early: everything that decides it and everything that
//! does it, in one place.
//!
//! What may end thinking: a think budget in tokens, a thinking-time budget, or an
//! entropy-gated exit (EAT, probed by the proxy: [`eat`]; RPDI over streamed logprobs).
//! How it ends, decided per request when it is sent ([`plan`]): by the upstream's hook
//! in place ([`EndThinking::Hook`], told over the policy channel in `crate::hook`), by
//! vLLM's own `thinking_token_budget` field (token budgets on chat and completions), or
//! by the proxy cutting the stream and continuing it past the end-of-thinking delimiter
//! ([`continuation`], for any OpenAI-compatible engine). While a response streams, the
//! relay's watchers act on the tracked phase: the thinking-time deadline
//! ([`deadline`]) and the EAT prober's feed.

pub mod continuation;
pub mod deadline;
pub mod eat;
pub mod plan;

use std::sync::Arc;

use tokio::sync::Notify;

pub use deadline::{DeadlineWatch, ThinkDeadline};
pub use eat::{EatFeed, EatProber, ProbeTarget};

use crate::ctx::RequestCtx;
use crate::hook::HookTarget;
use crate::relay::watch::{Ended, Watcher};

/// How an exit signal ends a stream's thinking.
#[derive(Clone, Debug)]
pub enum EndThinking {
    /// Tell the upstream's hook, by request id.
    Hook(crate::hook::HookTarget),
    /// Wake the stream's continuation stage in its relay ([`continuation`]).
    Continuation(Arc<Notify>),
}

impl EndThinking {
    pub fn now(&self, request_id: &str) {
        match self {
            EndThinking::Hook(h) => h.end_thinking(request_id),
            // A stored permit: the relay acts on its next turn even if it is busy now.
            EndThinking::Continuation(n) => n.notify_one(),
        }
    }
}

/// Tells the hook a stream it may have been told about is over, so a later request
/// reusing its id (ids come from clients) does not inherit what this one was told.
pub struct ForgetAtEnd {
    pub hook: HookTarget,
    /// The request: its stream id is what the hook was told about.
    pub ctx: Arc<RequestCtx>,
}

impl Watcher for ForgetAtEnd {
    fn on_end(&mut self, _: &Ended<'_>) {
        self.hook.forget(self.ctx.stream_id());
    }
}
