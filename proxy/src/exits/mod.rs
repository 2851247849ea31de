//! Entropy-gated ends of thinking driven by the proxy. EAT (arXiv 2509.26522): every
//! `exit.eat_probe_every_tokens` thinking tokens, ask the engine for the next-token
//! distribution right after an end-of-thinking delimiter appended to the reasoning so far
//! (a one-token probe request that reuses the stream's prefix cache), track the EMA and
//! EMA variance of its entropy, and once the variance settles end thinking: through the
//! upstream's hook, or (without one) by cutting and continuing the stream. The API returns only the top 20 logprobs, so the entropy fed to EAT is
//! the lower bound those allow (`meridian_core::signals::entropy_from_top_logprobs`);
//! thresholds tuned on full-vocabulary entropies do not carry over unchanged.

mod eat;

use std::sync::Arc;

use tokio::sync::Notify;

pub use eat::{EatProber, ProbeTarget};

/// How an exit signal ends a stream's thinking.
#[derive(Clone, Debug)]
pub enum EndThinking {
    /// Tell the upstream's hook, by request id.
    Hook(crate::hook::HookTarget),
    /// Wake the stream's continuation driver (`crate::continuation`).
    Continuation(Arc<Notify>),
}

impl EndThinking {
    pub fn now(&self, request_id: &str) {
        match self {
            EndThinking::Hook(h) => h.end_thinking(request_id),
            // A stored permit: the driver acts on its next turn even if it is busy now.
            EndThinking::Continuation(n) => n.notify_one(),
        }
    }
}
