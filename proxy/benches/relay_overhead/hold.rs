//! Memory per open stream: many streams held open through one proxy at once, each
//! dripping an event every couple of seconds, and the proxy's resident memory then
//! against its memory idle.
//!
//! Clients speak HTTP/2 to the proxy, 100 streams per connection (as from a load
//! balancer), because this machine's hard limit of 20,000 file descriptors per process
//! cannot be raised here and 10,000 HTTP/1.1 streams need 20,000 in the proxy (one socket
//! from the client, one to the upstream). The proxy reaches the mock over HTTP/1.1, one
//! connection per stream, as it reaches vLLM.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::load::Shape;
use super::procs::rss_kib;

pub const STREAMS: usize = 10_000;
const PER_CONNECTION: usize = 100;
/// A 27-event stream at one event per 2 s lasts 54 s: longer than the ramp and the
/// sampling together.
const INTERVAL_MS: u64 = 2_000;

pub struct Held {
    pub idle_kib: u64,
    pub held_kib: u64,
    /// Streams that had their first event when memory was sampled.
    pub open: u64,
    pub ramp_s: f64,
}

impl Held {
    pub fn per_stream_kib(&self) -> f64 {
        self.held_kib.saturating_sub(self.idle_kib) as f64 / self.open.max(1) as f64
    }
}

/// Holds `STREAMS` streams open through `h2_url`, whose processes are `pids`, and samples
/// their memory. `idle_kib` is read first, after a few hundred warm-up requests.
pub async fn measure(h2_url: &str, pids: &[u32]) -> Result<Held, String> {
    let warm = reqwest::Client::builder().no_proxy().build().map_err(|e| e.to_string())?;
    for _ in 0..200 {
        let _ = super::load::one(&warm, h2_url, &Shape::plain()).await;
    }
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_kib = rss_kib(pids);

    let open = Arc::new(AtomicU64::new(0));
    let shape = Shape::spaced(INTERVAL_MS);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(STREAMS);
    for c in 0..STREAMS.div_ceil(PER_CONNECTION) {
        let client = reqwest::Client::builder()
            .no_proxy()
            .http2_prior_knowledge()
            .build()
            .map_err(|e| e.to_string())?;
        for _ in 0..PER_CONNECTION.min(STREAMS - c * PER_CONNECTION) {
            let (client, url, shape, open) = (client.clone(), h2_url.to_owned(), shape.clone(), open.clone());
            tasks.push(tokio::spawn(async move { hold_one(&client, &url, &shape, &open).await }));
        }
        // Let each connection's streams start before the next connection opens, so
        // the proxies see a ramp rather than 10,000 connects in one instant.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = started + Duration::from_secs(40);
    while open.load(Ordering::Relaxed) < STREAMS as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ramp_s = started.elapsed().as_secs_f64();
    // Let buffers settle, then take the median of a few samples.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut samples = Vec::new();
    for _ in 0..5 {
        samples.push(rss_kib(pids));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    samples.sort_unstable();
    let held =
        Held { idle_kib, held_kib: samples[samples.len() / 2], open: open.load(Ordering::Relaxed), ramp_s };
    // The clients go away; the proxy cancels the upstream requests.
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    if held.open < STREAMS as u64 * 99 / 100 {
        return Err(format!("only {} of {STREAMS} streams opened in {ramp_s:.0} s", held.open));
    }
    Ok(held)
}

/// One stream, counted open from its first body bytes, read until aborted.
async fn hold_one(client: &reqwest::Client, url: &str, shape: &Shape, open: &AtomicU64) {
    let Ok(resp) = shape.request(client, url).send().await else { return };
    let mut body = resp.bytes_stream();
    let mut counted = false;
    while let Some(Ok(chunk)) = body.next().await {
        if !counted && !chunk.is_empty() {
            open.fetch_add(1, Ordering::Relaxed);
            counted = true;
        }
    }
}
