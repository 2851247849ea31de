//! The tracking work on the hot path allocates (almost) nothing per streamed chunk: the
//! SSE split works in place, the JSON look borrows, and the phase router's state is fixed
//! size. Counted with a counting global allocator over recorded vLLM streams.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use meridian_core::ModelRegistry;
use meridian_proxy::Metrics;
use meridian_proxy::ctx::{RequestCtx, Route};
use meridian_proxy::relay::{RelayStage, Relayed, RequestObserver, Served, SseDecoder, Tracked, stages};

struct Counting;

thread_local! {
    // Per thread, so tests running side by side do not count each other.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per `data:` chunk while observing a whole recorded stream.
fn allocations_per_chunk(fixture: &str, family: &str) -> f64 {
    let path = format!("{}/../mock-upstream/fixtures/{fixture}.sse", env!("CARGO_MANIFEST_DIR"));
    let body = std::fs::read(path).unwrap();
    let events: Vec<&[u8]> = body.split_inclusive(|b| *b == b'\n').collect();
    let chunks = events.iter().filter(|e| e.starts_with(b"data: {")).count();
    let metrics = Arc::new(Metrics::new());
    let fam = ModelRegistry::builtin().unwrap().get(family).cloned();
    // Warm the metric families so first-use allocations are not counted.
    drop(RequestObserver::new(
        metrics.clone(),
        Arc::new(RequestCtx::detached(Route::ChatCompletions, fam.clone())),
        Served::default(),
        true,
    ));
    let mut obs = RequestObserver::new(
        metrics.clone(),
        Arc::new(RequestCtx::detached(Route::ChatCompletions, fam)),
        Served::default(),
        true,
    );
    let mut dec = SseDecoder::new();
    // The first chunk sizes the per-choice router vector: a per-request cost.
    dec.feed(events[0], |p| obs.on_payload(p, Instant::now()));
    let before = allocs();
    for e in &events[1..] {
        let at = Instant::now();
        dec.feed(e, |p| obs.on_payload(p, at));
    }
    let after = allocs();
    (after - before) as f64 / (chunks - 1) as f64
}

#[test]
fn observing_a_stream_allocates_almost_nothing_per_chunk() {
    for (fixture, family) in [
        ("qwen3-reasoning", "qwen3"),
        ("qwen3-inline-tags", "qwen3-thinking-2507"),
        ("gpt-oss-harmony", "gpt-oss"),
    ] {
        let per_chunk = allocations_per_chunk(fixture, family);
        // Only deltas whose JSON strings contain escapes (\n, \u…) need an owned copy.
        assert!(per_chunk < 0.5, "{fixture}: {per_chunk:.2} allocations per chunk");
    }
}

#[test]
fn token_id_chunks_keep_their_ids_inline() {
    let per_chunk = allocations_per_chunk("qwen3-token-ids", "qwen3");
    assert!(per_chunk < 0.5, "{per_chunk:.2} allocations per chunk");
}

/// Allocations per upstream read while the relay's every stage (framing, tracking,
/// termination, heartbeats) handles a recorded stream, one event per read as vLLM sends.
fn relayed_allocations_per_read(fixture: &str, family: &str) -> f64 {
    let path = format!("{}/../mock-upstream/fixtures/{fixture}.sse", env!("CARGO_MANIFEST_DIR"));
    let body = Bytes::from(std::fs::read(path).unwrap());
    let mut reads = Vec::new();
    let mut start = 0;
    for end in memchr::memmem::find_iter(&body, b"\n\n") {
        reads.push(body.slice(start..end + 2));
        start = end + 2;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let _in_runtime = rt.enter();
    let metrics = Arc::new(Metrics::new());
    let fam = ModelRegistry::builtin().unwrap().get(family).cloned();
    // Warm the metric families so first-use allocations are not counted.
    let ctx = || Arc::new(RequestCtx::detached(Route::ChatCompletions, fam.clone()));
    drop(RequestObserver::new(metrics.clone(), ctx(), Served::default(), true));
    let mut obs = RequestObserver::new(metrics, ctx(), Served::default(), true);
    let mut pipe = stages(Box::new(Tracked), 1 << 20, "engine", Some(std::time::Duration::from_secs(15)));
    let mut done = false;
    // The first read sizes the per-choice router vector: a per-request cost.
    let mut relayed = Relayed { observer: &mut obs, saw_done: &mut done };
    let first = pipe.on_bytes(reads[0].clone(), Instant::now(), &mut relayed);
    assert_eq!(first.out.as_ref(), Some(&reads[0]), "whole events go out as they came");
    let before = allocs();
    for read in &reads[1..] {
        let flow = pipe.on_bytes(read.clone(), Instant::now(), &mut relayed);
        assert!(flow.end.is_none() && flow.out.is_some());
    }
    let after = allocs();
    (after - before) as f64 / (reads.len() - 1) as f64
}

#[test]
fn relaying_a_stream_through_every_stage_allocates_almost_nothing_per_read() {
    for (fixture, family) in [("qwen3-reasoning", "qwen3"), ("gpt-oss-harmony", "gpt-oss")] {
        let (per_read, observing) =
            (relayed_allocations_per_read(fixture, family), allocations_per_chunk(fixture, family));
        // The stages around the observer (framing, termination, heartbeats) add nothing
        // to what observing alone allocates.
        assert!(per_read < 0.5, "{fixture}: {per_read:.2} allocations per read");
        assert!(
            per_read <= observing + 0.05,
            "{fixture}: {per_read:.2} relayed against {observing:.2} observed"
        );
    }
}
