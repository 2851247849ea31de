//! Where a request is right now: its stage, phase, token counts and how its thinking will
//! end, written by the request's own code with relaxed atomic stores (a few per chunk at
//! most) and read at any time by the admin listener, the open-stream gauge and the drain,
//! without stopping the stream.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use meridian_core::Phase;
use serde::{Deserialize, Serialize};

/// Where a request is on its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Stage {
    /// Waiting in the proxy's admission queue.
    Queued = 0,
    /// Sent upstream, no response head yet (the engine queues and prefills).
    AwaitingUpstream = 1,
    /// The response is being relayed.
    Relaying = 2,
}

/// How a request's thinking will be ended, if anything but the model ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Ending {
    /// Nothing in play: the model ends thinking, or the engine's own budget does.
    None = 0,
    /// Through the engine's hook (budget, time budget or entropy exit).
    Hook = 1,
    /// By continuation: the proxy cuts the think stream and continues it.
    Continuation = 2,
    /// A directive to end thinking has gone to the hook.
    HookDirectiveSent = 3,
    /// The proxy has cut the stream and continues it.
    Continued = 4,
}

/// A request's progress, kept up to date in place.
#[derive(Debug)]
pub struct Progress {
    /// Where it is being answered: the first attempt's upstream, and the answer upstream
    /// once a `think` upstream handed it over.
    upstream: Mutex<Option<Arc<str>>>,
    stage: AtomicU8,
    phase: AtomicU8,
    ending: AtomicU8,
    think_tokens: AtomicU32,
    output_tokens: AtomicU32,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            upstream: Mutex::new(None),
            stage: AtomicU8::new(Stage::Queued as u8),
            phase: AtomicU8::new(phase_code(Phase::Pending)),
            ending: AtomicU8::new(Ending::None as u8),
            think_tokens: AtomicU32::new(0),
            output_tokens: AtomicU32::new(0),
        }
    }
}

impl Progress {
    pub fn set_stage(&self, stage: Stage) {
        self.stage.store(stage as u8, Ordering::Relaxed);
    }

    /// The upstream answering it: the one that sent the response head, then the one an
    /// answer was handed over to.
    pub fn set_upstream(&self, name: &str) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(name));
    }

    /// Its phase and token counts so far: called as chunks arrive.
    pub fn set_phase(&self, phase: Phase, think_tokens: u32, output_tokens: u32) {
        self.phase.store(phase_code(phase), Ordering::Relaxed);
        self.think_tokens.store(think_tokens, Ordering::Relaxed);
        self.output_tokens.store(output_tokens, Ordering::Relaxed);
    }

    pub fn set_ending(&self, ending: Ending) {
        self.ending.store(ending as u8, Ordering::Relaxed);
    }

    pub fn upstream(&self) -> Option<Arc<str>> {
        self.upstream.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn phase(&self) -> Phase {
        phase_from(self.phase.load(Ordering::Relaxed))
    }

    pub fn stage(&self) -> Stage {
        match self.stage.load(Ordering::Relaxed) {
            0 => Stage::Queued,
            1 => Stage::AwaitingUpstream,
            _ => Stage::Relaying,
        }
    }

    pub fn ending(&self) -> Ending {
        match self.ending.load(Ordering::Relaxed) {
            1 => Ending::Hook,
            2 => Ending::Continuation,
            3 => Ending::HookDirectiveSent,
            4 => Ending::Continued,
            _ => Ending::None,
        }
    }

    /// Thinking and answer tokens so far.
    pub fn tokens(&self) -> (u32, u32) {
        (self.think_tokens.load(Ordering::Relaxed), self.output_tokens.load(Ordering::Relaxed))
    }
}

/// Where `p` is counted in `OpenStreams::streams_by_phase` (Pending, Think, Output).
pub fn phase_slot(p: Phase) -> usize {
    usize::from(phase_code(p))
}

fn phase_code(p: Phase) -> u8 {
    match p {
        Phase::Pending => 0,
        Phase::Think => 1,
        Phase::Output => 2,
    }
}

fn phase_from(code: u8) -> Phase {
    match code {
        1 => Phase::Think,
        2 => Phase::Output,
        _ => Phase::Pending,
    }
}
