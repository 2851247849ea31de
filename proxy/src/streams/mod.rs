//! The live registry of open generation requests: one entry from the moment a request is
//! parsed until its response ends (completed, failed, or its client left), readable at
//! any time without stopping the streams it describes.
//!
//! Each entry is the request's own context (`crate::ctx::RequestCtx`), shared with the
//! request's code, which writes its progress (stage, phase, token counts, how its
//! thinking will end) in place with relaxed atomic stores, a few per chunk at most;
//! readers (the admin listener, the open-stream gauge, the drain) take a snapshot. A [`dashmap`]
//! shards the map, so thousands of streams entering and leaving do not contend on one
//! lock with a reader walking it.

pub mod admin;

pub use admin::{AdminError, PhaseCounts, StreamList, admin_router, serve_admin};

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

pub use crate::ctx::{Ending, Stage};
use crate::ctx::{RequestCtx, phase_slot};

/// One open request as the admin listener shows it, read from its context.
pub fn view(ctx: &RequestCtx, now: Instant) -> StreamView {
    let p = &ctx.progress;
    let (think_tokens, output_tokens) = p.tokens();
    StreamView {
        stream_id: ctx.stream_id().to_owned(),
        request_id: ctx.request_id().to_owned(),
        model: ctx.model.clone(),
        route: ctx.route().as_str().to_owned(),
        upstream: p.upstream().map(|u| u.to_string()),
        stage: p.stage(),
        phase: p.phase().as_str().to_owned(),
        age_s: now.saturating_duration_since(ctx.started()).as_secs_f64(),
        started_unix_ms: ctx.started_unix_ms,
        think_tokens,
        output_tokens,
        class: ctx.class.as_str().to_owned(),
        streaming: ctx.streaming,
        think_budget: ctx.think_budget,
        ending: p.ending(),
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
    map: DashMap<String, Arc<RequestCtx>>,
}

impl OpenStreams {
    /// Lists a request; it stays listed until the returned guard is dropped (with its
    /// response, or with the handler when it fails before one).
    pub fn list(self: &Arc<Self>, ctx: &Arc<RequestCtx>) -> Listed {
        self.map.insert(ctx.stream_id().to_owned(), ctx.clone());
        Listed { registry: self.clone(), ctx: ctx.clone() }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, stream_id: &str) -> Option<Arc<RequestCtx>> {
        self.map.get(stream_id).map(|e| e.value().clone())
    }

    /// Every open request, oldest first.
    pub fn snapshot(&self) -> Vec<StreamView> {
        let now = Instant::now();
        let mut out: Vec<StreamView> = self.map.iter().map(|e| view(e.value(), now)).collect();
        out.sort_by(|a, b| b.age_s.total_cmp(&a.age_s));
        out
    }

    /// Open streamed responses by phase (Pending, Think, Output): what
    /// `meridian_open_streams` reports. Requests still queued or awaiting their upstream,
    /// and whole (non-streamed) answers, are not streams yet.
    pub fn streams_by_phase(&self) -> [u64; 3] {
        let mut counts = [0u64; 3];
        for e in self.map.iter() {
            let ctx = e.value();
            if ctx.streaming && ctx.progress.stage() == Stage::Relaying {
                counts[phase_slot(ctx.progress.phase())] += 1;
            }
        }
        counts
    }
}

/// A request's place in the registry; dropping it removes the request.
#[derive(Debug)]
pub struct Listed {
    registry: Arc<OpenStreams>,
    ctx: Arc<RequestCtx>,
}

impl std::fmt::Debug for OpenStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStreams").field("open", &self.map.len()).finish()
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        // Only this request's entry: stream ids are minted unique, but a test may reuse one.
        self.registry.map.remove_if(self.ctx.stream_id(), |_, listed| Arc::ptr_eq(listed, &self.ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Route;
    use meridian_core::Phase;

    fn request(id: &str) -> Arc<RequestCtx> {
        let mut ctx = RequestCtx::detached(Route::ChatCompletions, None);
        ctx.arrival.stream_id = id.into();
        ctx.think_budget = Some(64);
        Arc::new(ctx)
    }

    #[test]
    fn a_request_is_listed_until_its_guard_drops() {
        let reg = Arc::new(OpenStreams::default());
        let ctx = request("a");
        let listed = reg.list(&ctx);
        assert_eq!(reg.len(), 1);
        let held_elsewhere = ctx.clone();
        drop(listed);
        assert!(reg.is_empty(), "a context held elsewhere (an EAT probe) does not keep it listed");
        drop(held_elsewhere);
    }

    #[test]
    fn progress_written_by_the_request_is_what_readers_see() {
        let reg = Arc::new(OpenStreams::default());
        let ctx = request("a");
        let _listed = reg.list(&ctx);
        assert_eq!(reg.streams_by_phase(), [0, 0, 0], "queued requests are not streams yet");
        let p = &ctx.progress;
        p.set_upstream("vllm-0");
        p.set_upstream("vllm-1");
        p.set_stage(Stage::Relaying);
        p.set_phase(Phase::Think, 12, 0);
        p.set_ending(Ending::Hook);
        assert_eq!(reg.streams_by_phase(), [0, 1, 0]);
        let v = &reg.snapshot()[0];
        assert_eq!(
            v.upstream.as_deref(),
            Some("vllm-1"),
            "the upstream answering it now (a hand-over moves it)"
        );
        assert_eq!((v.phase.as_str(), v.think_tokens, v.output_tokens), ("think", 12, 0));
        assert_eq!((v.stage, v.ending, v.class.as_str()), (Stage::Relaying, Ending::Hook, "interactive"));
        assert_eq!(v.think_budget, Some(64));
        p.set_phase(Phase::Output, 40, 3);
        assert_eq!(reg.streams_by_phase(), [0, 0, 1]);
    }
}
