//! Think/output phase tracking for one generation.
//!
//! [`PhaseRule`] is the rule itself: what start and end markers and content do to a
//! generation's phase. Two readers feed it. [`PhaseRouter`] is the proxy's per-request
//! state machine: it is fed every streamed delta (text or token ids) and reports, at most
//! once each, when thinking starts, when it ends, when the first visible output arrives
//! and when a think budget is spent; priorities, budgets and telemetry key off these
//! events. [`PhaseTracker`] follows a request inside vLLM from token ids alone (the hook's
//! scheduler and logits processor, and the step tracer through [`phase_after`]).

mod router;
mod rule;
pub mod scanner;
mod tokens;

pub use router::{Delta, PhaseEvent, PhaseEvents, PhaseRouter};
pub use rule::{Mark, Moves, PhaseRule};
pub use tokens::{PhaseTracker, ThinkMarkers, phase_after};

/// Where a generation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Nothing generated yet (prefill, or waiting in the queue).
    Pending,
    /// Reasoning tokens are being generated.
    Think,
    /// Tokens meant for the reader are being generated.
    Output,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Think => "think",
            Phase::Output => "output",
        }
    }
}
