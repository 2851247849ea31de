//! Entropy-gated ends of thinking driven by the proxy. EAT (arXiv 2509.26522): every
//! `exit.eat_probe_every_tokens` thinking tokens, ask the engine for the next-token
//! distribution right after an end-of-thinking delimiter appended to the reasoning so far
//! (a one-token probe request that reuses the stream's prefix cache), track the EMA and
//! EMA variance of its entropy, and once the variance settles tell the upstream's hook to
//! end thinking. The API returns only the top 20 logprobs, so the entropy fed to EAT is
//! the lower bound those allow (`meridian_core::signals::entropy_from_top_logprobs`);
//! thresholds tuned on full-vocabulary entropies do not carry over unchanged.

mod eat;

pub use eat::{EatProber, ProbeTarget};
