//! Think/output phase tracking for one generation.
//!
//! [`PhaseRouter`] is the per-request state machine: it is fed every streamed delta (or
//! token id) and reports, at most once each, when thinking starts, when it ends, when the
//! first visible output arrives and when a think budget is spent. Everything else in
//! Meridian — priorities, budgets, telemetry — keys off these events.

mod router;
pub mod scanner;

pub use router::{Delta, PhaseEvent, PhaseEvents, PhaseRouter};

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
