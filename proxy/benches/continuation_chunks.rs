//! What the continuation costs per chunk in-process, beside the plain relay's tracking:
//! the work the relay does with each line of both legs of a continued stream (tracking,
//! with the think watch lent each first-leg event, and the splicer) over the recorded
//! qwen3 stream, the first leg with the per-chunk usage the
//! proxy asks for (and hides from a client that did not), the second leg relabelled from
//! reasoning to answer. Prints ns per chunk, the median of 7 runs with its range; the
//! whole-proxy figures are in docs/src/benchmarks/proxy-overhead.md.
//!
//!   cargo bench -p meridian-proxy --bench continuation_chunks

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use meridian_proxy::ctx::RequestCtx;
use meridian_proxy::ending::continuation::{ClientAsked, Emit, Route, Splicer, ThinkWatch, Triggers};
use meridian_proxy::relay::{RequestObserver, Served};
use serde_json::{Value, json};

const RUNS: usize = 7;
const ROUNDS: usize = 3000;

/// The recorded stream's payloads: as a first leg (per-chunk usage added) and as a
/// second leg (as sent).
fn legs() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../mock-upstream/fixtures/qwen3-reasoning.sse");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let payloads: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let first = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = p.clone();
            p["usage"] = json!({"prompt_tokens": 14, "completion_tokens": i + 1, "total_tokens": 15 + i});
            serde_json::to_vec(&p).unwrap_or_default()
        })
        .collect();
    let second = payloads.iter().map(|p| serde_json::to_vec(p).unwrap_or_default()).collect();
    (first, second)
}

/// Nanoseconds per chunk of `work` over `chunks` chunks a round: median, min, max.
fn measure(chunks: usize, mut work: impl FnMut() -> usize) -> (f64, f64, f64) {
    let mut runs: Vec<f64> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                black_box(work());
            }
            t.elapsed().as_nanos() as f64 / (ROUNDS * chunks) as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    (runs[RUNS / 2], runs[0], runs[RUNS - 1])
}

fn main() {
    let (first, second) = legs();
    let chunks = first.len() + second.len();
    let family = meridian_core::ModelRegistry::builtin().ok().and_then(|r| r.get("qwen3").cloned());
    let asked = ClientAsked { usage: true, continuous_usage: false, logprobs: false };
    let metrics = Arc::new(meridian_proxy::Metrics::new());
    let continuation = measure(chunks, || {
        let triggers = Triggers { tokens: Some(10_000), ..Default::default() };
        let mut ctx = RequestCtx::detached(meridian_proxy::ctx::Route::ChatCompletions, family.clone());
        ctx.think_budget = triggers.tokens;
        let mut obs = RequestObserver::new(metrics.clone(), Arc::new(ctx), Served::default(), true);
        let mut watch = ThinkWatch::new(Route::Chat, triggers);
        let mut splicer = Splicer::new(asked, false);
        let mut out = 0;
        for p in &first {
            obs.on_payload_also(p, Instant::now(), &mut watch);
            black_box(watch.take_cut());
            if let Emit::Changed(b) = splicer.first_leg(p) {
                out += b.len();
            }
        }
        splicer.cut(5, 0);
        obs.forget_usage();
        for p in &second {
            match splicer.second_leg(p) {
                Emit::Changed(b) => {
                    obs.on_payload(&b, Instant::now());
                    out += b.len();
                }
                Emit::Same => obs.on_payload(p, Instant::now()),
                Emit::Drop => {}
            }
        }
        obs.complete();
        out
    });
    let tracking = measure(chunks, || {
        let mut obs = RequestObserver::new(
            metrics.clone(),
            Arc::new(RequestCtx::detached(meridian_proxy::ctx::Route::ChatCompletions, family.clone())),
            Served::default(),
            true,
        );
        for p in first.iter().chain(&second) {
            obs.on_payload(p, Instant::now());
        }
        obs.complete();
        0
    });
    let row = |name: &str, (med, lo, hi): (f64, f64, f64)| {
        println!("{name:<40} {med:>6.0} ns/chunk ({lo:.0}-{hi:.0})")
    };
    println!(
        "{} chunks a round ({} first leg, {} second), {RUNS} runs of {ROUNDS} rounds",
        chunks,
        first.len(),
        second.len()
    );
    row("continued: tracking + think watch + splicer", continuation);
    row("plain: tracking alone", tracking);
}
