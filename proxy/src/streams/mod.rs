//! The live registry of open generation requests: one entry from the moment a request is
//! parsed until its response ends (completed, failed, or its client left), readable at
//! any time without stopping the streams it describes.
//!
//! Each request's entry is shared between the registry and the request's own code: the
//! request writes its progress (stage, phase, token counts, how its thinking will end)
//! with relaxed atomic stores, a few per chunk at most, and readers (the admin listener,
//! the open-stream gauge, the drain, the hook channel) take a snapshot. A [`dashmap`]
//! shards the map, so thousands of streams entering and leaving do not contend on one
//! lock with a reader walking it.

pub mod admin;

pub use admin::{AdminError, PhaseCounts, StreamList, admin_router, serve_admin};

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use meridian_core::Phase;
use serde::{Deserialize, Serialize};

use crate::admission::Class;

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

/// One open request, as its own code keeps it up to date.
#[derive(Debug)]
pub struct StreamEntry {
    pub stream_id: String,
    pub request_id: String,
    pub model: String,
    pub route: &'static str,
    pub class: Class,
    pub streaming: bool,
    pub think_budget: Option<u32>,
    started: Instant,
    started_unix_ms: u64,
    upstream: OnceLock<String>,
    stage: AtomicU8,
    phase: AtomicU8,
    ending: AtomicU8,
    think_tokens: AtomicU32,
    output_tokens: AtomicU32,
}

/// What is known of a request when it is registered.
pub struct NewStream<'a> {
    pub stream_id: &'a str,
    pub request_id: &'a str,
    pub model: &'a str,
    pub route: &'static str,
    pub class: Class,
    pub streaming: bool,
    pub think_budget: Option<u32>,
    pub started: Instant,
}

impl StreamEntry {
    pub fn set_stage(&self, stage: Stage) {
        self.stage.store(stage as u8, Ordering::Relaxed);
    }

    /// The upstream chosen for it (the first attempt's; set once).
    pub fn set_upstream(&self, name: &str) {
        let _ = self.upstream.set(name.to_owned());
    }

    /// Its phase and token counts so far: called as chunks arrive.
    pub fn set_progress(&self, phase: Phase, think_tokens: u32, output_tokens: u32) {
        self.phase.store(phase_code(phase), Ordering::Relaxed);
        self.think_tokens.store(think_tokens, Ordering::Relaxed);
        self.output_tokens.store(output_tokens, Ordering::Relaxed);
    }

    pub fn set_ending(&self, ending: Ending) {
        self.ending.store(ending as u8, Ordering::Relaxed);
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

    /// A consistent-enough copy for readers (each field read once).
    pub fn view(&self, now: Instant) -> StreamView {
        StreamView {
            stream_id: self.stream_id.clone(),
            request_id: self.request_id.clone(),
            model: self.model.clone(),
            route: self.route.to_owned(),
            upstream: self.upstream.get().cloned(),
            stage: self.stage(),
            phase: self.phase().as_str().to_owned(),
            age_s: now.saturating_duration_since(self.started).as_secs_f64(),
            started_unix_ms: self.started_unix_ms,
            think_tokens: self.think_tokens.load(Ordering::Relaxed),
            output_tokens: self.output_tokens.load(Ordering::Relaxed),
            class: self.class.as_str().to_owned(),
            streaming: self.streaming,
            think_budget: self.think_budget,
            ending: self.ending(),
        }
    }
}

/// Where `p` is counted in [`OpenStreams::streams_by_phase`].
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

/// One open request as the admin listener shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StreamView {
    pub stream_id: String,
    pub request_id: String,
    pub model: String,
    pub route: String,
    pub upstream: Option<String>,
    pub stage: Stage,
    pub phase: String,
    pub age_s: f64,
    pub started_unix_ms: u64,
    pub think_tokens: u32,
    pub output_tokens: u32,
    pub class: String,
    pub streaming: bool,
    pub think_budget: Option<u32>,
    pub ending: Ending,
}

/// Every open request, by stream id.
#[derive(Default)]
pub struct OpenStreams {
    map: DashMap<String, Arc<StreamEntry>>,
}

impl OpenStreams {
    /// Registers a request; it stays listed until the returned guard (and every clone of
    /// it) is dropped.
    pub fn register(self: &Arc<Self>, new: NewStream<'_>) -> Arc<StreamGuard> {
        let started_unix_ms = SystemTime::now()
            .checked_sub(new.started.elapsed())
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let entry = Arc::new(StreamEntry {
            stream_id: new.stream_id.to_owned(),
            request_id: new.request_id.to_owned(),
            model: new.model.to_owned(),
            route: new.route,
            class: new.class,
            streaming: new.streaming,
            think_budget: new.think_budget,
            started: new.started,
            started_unix_ms,
            upstream: OnceLock::new(),
            stage: AtomicU8::new(Stage::Queued as u8),
            phase: AtomicU8::new(phase_code(Phase::Pending)),
            ending: AtomicU8::new(Ending::None as u8),
            think_tokens: AtomicU32::new(0),
            output_tokens: AtomicU32::new(0),
        });
        self.map.insert(entry.stream_id.clone(), entry.clone());
        Arc::new(StreamGuard { registry: self.clone(), entry })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, stream_id: &str) -> Option<Arc<StreamEntry>> {
        self.map.get(stream_id).map(|e| e.value().clone())
    }

    /// Every open request, oldest first.
    pub fn snapshot(&self) -> Vec<StreamView> {
        let now = Instant::now();
        let mut out: Vec<StreamView> = self.map.iter().map(|e| e.value().view(now)).collect();
        out.sort_by(|a, b| b.age_s.total_cmp(&a.age_s));
        out
    }

    /// Open streamed responses by phase (Pending, Think, Output): what
    /// `meridian_open_streams` reports. Requests still queued or awaiting their upstream,
    /// and whole (non-streamed) answers, are not streams yet.
    pub fn streams_by_phase(&self) -> [u64; 3] {
        let mut counts = [0u64; 3];
        for e in self.map.iter() {
            let e = e.value();
            if e.streaming && e.stage() == Stage::Relaying {
                counts[usize::from(phase_code(e.phase()))] += 1;
            }
        }
        counts
    }
}

/// A request's place in the registry; dropping the last clone removes it.
#[derive(Debug)]
pub struct StreamGuard {
    registry: Arc<OpenStreams>,
    entry: Arc<StreamEntry>,
}

impl StreamGuard {
    pub fn entry(&self) -> &StreamEntry {
        &self.entry
    }
}

impl std::fmt::Debug for OpenStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStreams").field("open", &self.map.len()).finish()
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.registry.map.remove(&self.entry.stream_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_stream(id: &str) -> NewStream<'_> {
        NewStream {
            stream_id: id,
            request_id: "req",
            model: "m",
            route: "chat_completions",
            class: Class::Interactive,
            streaming: true,
            think_budget: Some(64),
            started: Instant::now(),
        }
    }

    #[test]
    fn a_request_is_listed_until_its_last_guard_drops() {
        let reg = Arc::new(OpenStreams::default());
        let guard = reg.register(new_stream("a"));
        let clone = guard.clone();
        assert_eq!(reg.len(), 1);
        drop(guard);
        assert_eq!(reg.len(), 1, "a clone still holds it");
        drop(clone);
        assert!(reg.is_empty());
    }

    #[test]
    fn progress_written_by_the_request_is_what_readers_see() {
        let reg = Arc::new(OpenStreams::default());
        let guard = reg.register(new_stream("a"));
        assert_eq!(reg.streams_by_phase(), [0, 0, 0], "queued requests are not streams yet");
        let e = guard.entry();
        e.set_upstream("vllm-0");
        e.set_upstream("vllm-1");
        e.set_stage(Stage::Relaying);
        e.set_progress(Phase::Think, 12, 0);
        e.set_ending(Ending::Hook);
        assert_eq!(reg.streams_by_phase(), [0, 1, 0]);
        let v = &reg.snapshot()[0];
        assert_eq!(v.upstream.as_deref(), Some("vllm-0"), "the first attempt's upstream stays");
        assert_eq!((v.phase.as_str(), v.think_tokens, v.output_tokens), ("think", 12, 0));
        assert_eq!((v.stage, v.ending, v.class.as_str()), (Stage::Relaying, Ending::Hook, "interactive"));
        e.set_progress(Phase::Output, 40, 3);
        assert_eq!(reg.streams_by_phase(), [0, 0, 1]);
    }
}
