//! A thinking-time budget the proxy enforces through the upstream's hook: once a stream
//! has thought for longer than its budget and still thinks, the hook is told, once, to
//! end its thinking.

use std::sync::Arc;
use std::time::Duration;

use meridian_core::Phase;

use crate::ctx::RequestCtx;
use crate::hook::HookTarget;
use crate::relay::watch::{Event, Watcher};
use crate::telemetry::Metrics;

/// A time budget the proxy enforces by telling the upstream's hook to end thinking.
#[derive(Clone, Debug)]
pub struct ThinkDeadline {
    /// Thinking time allowed.
    pub after: Duration,
    pub hook: HookTarget,
}

/// Watches a stream's thinking time against its deadline.
pub struct DeadlineWatch {
    deadline: ThinkDeadline,
    ctx: Arc<RequestCtx>,
    metrics: Arc<Metrics>,
    fired: bool,
}

impl DeadlineWatch {
    pub fn new(deadline: ThinkDeadline, ctx: Arc<RequestCtx>, metrics: Arc<Metrics>) -> Self {
        DeadlineWatch { deadline, ctx, metrics, fired: false }
    }
}

impl Watcher for DeadlineWatch {
    fn on_event(&mut self, event: &Event<'_>) {
        let so_far = event.so_far;
        if self.fired
            || event.last
            || so_far.phase != Phase::Think
            || so_far.timeline.first_think().is_none()
            || so_far.thinking_for(event.at) < self.deadline.after
        {
            return;
        }
        self.fired = true;
        self.deadline.hook.end_thinking(self.ctx.stream_id());
        self.metrics.count_budget_reached(self.ctx.family_name());
    }
}
