//! What the engine gives back: each step's report and its sampled tokens, why a request
//! was refused, and the running requests counted over the steps.

use meridian_core::Phase;

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub seq: u64,
    /// 0-based position in the generation.
    pub index: u32,
    pub phase: Phase,
    /// The end-of-thought delimiter (phase `Think`): it costs a step like any token, but
    /// the reasoning parser swallows it, so a client sees nothing for it.
    pub ends_thought: bool,
    /// Engine time at the end of the step that produced it.
    pub at_s: f64,
    /// This token ends the generation.
    pub last: bool,
}

/// What one step did. An idle step schedules nothing, samples nothing, and lasts until
/// the policy may let a request run again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReport {
    pub started_s: f64,
    pub duration_s: f64,
    /// (seq, tokens computed this step) in schedule order.
    pub scheduled: Vec<(u64, u32)>,
    pub tokens: Vec<Token>,
    pub preempted: Vec<u64>,
    /// (seq, prompt and earlier tokens found in the prefix cache) for each request taken
    /// from the waiting queue this step, when the prefix cache is on.
    pub prefix_hits: Vec<(u64, u32)>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(
        "prompt of {prompt} tokens plus {generated} generated cannot fit in {blocks} KV blocks of {block_size}"
    )]
    TooLong { prompt: u32, generated: u32, blocks: u32, block_size: u32 },
    #[error("a request must generate at least one token")]
    Empty,
}

/// Running requests summed over steps, and those that sat the step out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestSteps {
    pub running: u64,
    pub sat_out: u64,
}
