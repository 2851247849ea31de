//! The proxy's own tracking work per event, in-process: SSE line split, JSON look, phase
//! router. It tells how much of the per-event CPU is the tracking rather than the HTTP
//! relay around it.

use std::sync::Arc;
use std::time::Instant;

use meridian_proxy::ctx::{RequestCtx, Route};
use meridian_proxy::relay::{RequestObserver, Served, SseDecoder};

/// Nanoseconds per event over many passes of `fixture`, and its number of events.
pub fn cost_ns(fixture: &[u8]) -> (f64, usize) {
    let metrics = Arc::new(meridian_proxy::Metrics::new());
    let family = meridian_core::ModelRegistry::builtin().ok().and_then(|r| r.get("qwen3").cloned());
    let events: Vec<&[u8]> = fixture.split_inclusive(|b| *b == b'\n').collect();
    let rounds = 2000;
    let start = Instant::now();
    for _ in 0..rounds {
        let mut obs = RequestObserver::new(
            metrics.clone(),
            Arc::new(RequestCtx::detached(Route::ChatCompletions, family.clone())),
            Served::default(),
            true,
        );
        let mut dec = SseDecoder::new();
        for e in &events {
            let at = Instant::now();
            dec.feed(e, |p| obs.on_payload(p, at));
        }
        obs.complete();
    }
    let chunks = events.iter().filter(|e| e.starts_with(b"data:")).count();
    (start.elapsed().as_nanos() as f64 / (rounds * chunks) as f64, chunks)
}
