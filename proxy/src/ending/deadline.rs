//! A thinking-time budget the proxy enforces through the upstream's hook: once a stream
//! has thought for longer than its budget, the hook is told to end its thinking.

use std::time::Duration;

use crate::hook::HookTarget;

/// A time budget the proxy enforces by telling the upstream's hook to end thinking.
#[derive(Clone, Debug)]
pub struct ThinkDeadline {
    /// Thinking time allowed.
    pub after: Duration,
    pub hook: HookTarget,
}
