//! The load generator: one shape of streamed chat request, sent open-loop at a fixed
//! rate or closed-loop by a fixed number of workers, timed from the client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use hdrhistogram::Histogram;

use super::common::FIXTURE;

/// What each request asks for.
#[derive(Clone)]
pub struct Shape {
    body: Bytes,
    /// The mock's pause between SSE events (`x-mock-interval-ms`); none sends them back
    /// to back.
    interval_ms: Option<u64>,
}

const MODEL: &str = "Qwen/Qwen3-8B";

impl Shape {
    /// The recorded answer, every event as soon as the mock can write it.
    pub fn plain() -> Self {
        let body =
            format!(r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#);
        Shape { body: body.into(), interval_ms: None }
    }

    /// The recorded answer with a pause between events, so each event reaches the proxy
    /// on its own, as tokens from an engine do, rather than several per read.
    pub fn spaced(interval_ms: u64) -> Self {
        Shape { interval_ms: Some(interval_ms), ..Shape::plain() }
    }

    /// As `spaced`, under a think budget of `tokens`: a proxy with
    /// `budget.forcing = "continuation"` cuts the thinking there and continues the answer
    /// on a second upstream request.
    pub fn budget(interval_ms: u64, tokens: u32) -> Self {
        let body = format!(
            r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"hi"}}],"meridian":{{"think_budget_tokens":{tokens}}}}}"#
        );
        Shape { body: body.into(), interval_ms: Some(interval_ms) }
    }

    /// A prompt of about `bytes` bytes (one user message of plain words).
    pub fn big_prompt(bytes: usize) -> Self {
        let words = "the quick brown fox jumps over the lazy dog ".repeat(bytes / 44 + 1);
        let body = format!(
            r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
            &words[..bytes]
        );
        Shape { body: body.into(), interval_ms: None }
    }

    pub fn body_len(&self) -> usize {
        self.body.len()
    }

    pub fn request(&self, client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
        let mut r = client
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-mock-fixture", FIXTURE)
            .body(self.body.clone());
        if let Some(ms) = self.interval_ms {
            r = r.header("x-mock-interval-ms", ms.to_string());
        }
        r
    }
}

/// One streamed request read to its end.
pub struct Timing {
    pub ttfb: Duration,
    pub e2e: Duration,
    /// SSE events received (`data:` lines).
    pub events: u64,
}

pub async fn one(client: &reqwest::Client, url: &str, shape: &Shape) -> Result<Timing, String> {
    let start = Instant::now();
    let resp = shape.request(client, url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(resp.status().to_string());
    }
    let mut stream = resp.bytes_stream();
    let mut ttfb = None;
    let mut body = Vec::with_capacity(8192);
    while let Some(c) = stream.next().await {
        let c = c.map_err(|e| e.to_string())?;
        ttfb.get_or_insert_with(|| start.elapsed());
        body.extend_from_slice(&c);
    }
    if !body.ends_with(b"data: [DONE]\n\n") {
        return Err("stream ended before [DONE]".into());
    }
    let events = memchr::memmem::find_iter(&body, b"data:").count() as u64;
    Ok(Timing { ttfb: ttfb.unwrap_or_default(), e2e: start.elapsed(), events })
}

/// What a run measured from the client.
pub struct Tally {
    pub ttfb: Histogram<u64>,
    pub e2e: Histogram<u64>,
    pub done: u64,
    pub errors: u64,
    pub events: u64,
    pub elapsed: Duration,
}

impl Tally {
    fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds");
        Tally { ttfb: h(), e2e: h(), done: 0, errors: 0, events: 0, elapsed: Duration::ZERO }
    }

    fn record(&mut self, r: Result<Timing, String>) {
        match r {
            Ok(t) => {
                self.ttfb.saturating_record(t.ttfb.as_micros() as u64);
                self.e2e.saturating_record(t.e2e.as_micros() as u64);
                self.events += t.events;
                self.done += 1;
            }
            Err(_) => self.errors += 1,
        }
    }

    /// A quantile in ms.
    pub fn ttfb_ms(&self, q: f64) -> f64 {
        self.ttfb.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn e2e_ms(&self, q: f64) -> f64 {
        self.e2e.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn per_second(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64()
    }
}

type Shared = Arc<Mutex<Tally>>;

fn record(tally: &Shared, r: Result<Timing, String>) {
    tally.lock().unwrap_or_else(|e| e.into_inner()).record(r);
}

fn finish(tally: Shared, started: Instant) -> Tally {
    let mut t = std::mem::replace(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()), Tally::new());
    t.elapsed = started.elapsed();
    t
}

/// Requests started at `rate` per second for `seconds`, each on its own schedule whether
/// or not earlier ones have finished (so a slow proxy shows as latency, not as a lower
/// rate). `elapsed` runs to the last completion.
pub async fn open_loop(client: &reqwest::Client, url: &str, shape: &Shape, rate: u32, seconds: f64) -> Tally {
    let tally: Shared = Arc::new(Mutex::new(Tally::new()));
    let n = (f64::from(rate) * seconds) as u32;
    let gap = Duration::from_secs_f64(1.0 / f64::from(rate));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + gap * i)).await;
        let (client, url, shape, tally) = (client.clone(), url.to_owned(), shape.clone(), tally.clone());
        tasks.push(tokio::spawn(async move { record(&tally, one(&client, &url, &shape).await) }));
    }
    for t in tasks {
        let _ = t.await;
    }
    finish(tally, started)
}

/// `workers` clients each sending one request after another for `seconds`.
pub async fn closed_loop(
    client: &reqwest::Client,
    url: &str,
    shape: &Shape,
    workers: usize,
    seconds: f64,
) -> Tally {
    let tally: Shared = Arc::new(Mutex::new(Tally::new()));
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (client, url, shape, tally) = (client.clone(), url.to_owned(), shape.clone(), tally.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    record(&tally, one(&client, &url, &shape).await);
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    finish(tally, started)
}
