//! The tracking work on the hot path allocates (almost) nothing per streamed chunk: the
//! SSE split works in place, the JSON look borrows, and the phase router's state is fixed
//! size. Counted with a counting global allocator over recorded vLLM streams.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use meridian_core::ModelRegistry;
use meridian_proxy::Metrics;
use meridian_proxy::ctx::{RequestCtx, Route};
use meridian_proxy::relay::{RequestObserver, Served, SseDecoder};

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
