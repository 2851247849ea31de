//! What the proxy adds, measured side by side: the same recorded vLLM stream fetched from
//! the mock upstream directly and through `meridian`, interleaved request by request so
//! both see the same machine noise, at rising request rates up to saturation. Also the
//! proxy's CPU time per relayed chunk (from /proc) and the tracking work per chunk
//! in-process. Prints a table and writes docs/src/benchmarks/proxy-overhead.md.
//!
//!   scripts/bench-proxy.sh       (builds the release binaries, then runs this)

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{FIXTURE, cpu_seconds, one_request, spawn, target_dir};
use hdrhistogram::Histogram;

const RATES: [u32; 6] = [200, 800, 1600, 2400, 3200, 4000];
const SECONDS_PER_RATE: f64 = 3.0;
/// Runs per rate; the report takes the median of each figure across them, so one VM
/// hiccup does not decide a p99.
const REPETITIONS: usize = 3;

#[derive(Default)]
struct Side {
    ttfb: Option<Histogram<u64>>,
    e2e: Option<Histogram<u64>>,
    errors: u64,
    done: u64,
}

impl Side {
    fn new() -> Self {
        Side {
            ttfb: Some(Histogram::new(3).unwrap()),
            e2e: Some(Histogram::new(3).unwrap()),
            errors: 0,
            done: 0,
        }
    }
}

struct RateResult {
    achieved: f64,
    direct: Side,
    proxied: Side,
}

async fn run_rate(client: &reqwest::Client, direct: &str, proxied: &str, rate: u32) -> RateResult {
    let results = Arc::new(tokio::sync::Mutex::new((Side::new(), Side::new())));
    let n = (f64::from(rate) * SECONDS_PER_RATE) as u64;
    let gap = Duration::from_secs_f64(1.0 / f64::from(rate));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let target = if i % 2 == 0 { direct.to_owned() } else { proxied.to_owned() };
        let (client, results) = (client.clone(), results.clone());
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + gap * i as u32)).await;
        tasks.push(tokio::spawn(async move {
            let r = one_request(&client, &target).await;
            let mut g = results.lock().await;
            let side = if i % 2 == 0 { &mut g.0 } else { &mut g.1 };
            match r {
                Ok((ttfb, e2e)) => {
                    side.ttfb.as_mut().unwrap().record(ttfb.as_micros() as u64).ok();
                    side.e2e.as_mut().unwrap().record(e2e.as_micros() as u64).ok();
                    side.done += 1;
                }
                Err(_) => side.errors += 1,
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (d, p) = std::mem::take(&mut *results.lock().await);
    RateResult { achieved: (d.done + p.done) as f64 / elapsed, direct: d, proxied: p }
}

/// One run's figures (ms): TTFB p50 direct, proxied; TTFB p99 direct, proxied; E2E p50
/// direct, proxied; E2E p99 direct, proxied.
#[derive(Clone)]
struct Summary {
    achieved: f64,
    errors: f64,
    v: [f64; 8],
}

impl Summary {
    fn of(r: &RateResult) -> Self {
        let (d, p) = (&r.direct, &r.proxied);
        Summary {
            achieved: r.achieved,
            errors: (d.errors + p.errors) as f64,
            v: [
                q(&d.ttfb, 0.5),
                q(&p.ttfb, 0.5),
                q(&d.ttfb, 0.99),
                q(&p.ttfb, 0.99),
                q(&d.e2e, 0.5),
                q(&p.e2e, 0.5),
                q(&d.e2e, 0.99),
                q(&p.e2e, 0.99),
            ],
        }
    }

    fn median(reps: &[Summary]) -> Self {
        let col = |f: &dyn Fn(&Summary) -> f64| median(&reps.iter().map(f).collect::<Vec<_>>());
        let mut v = [0.0; 8];
        for (i, slot) in v.iter_mut().enumerate() {
            *slot = col(&|s| s.v[i]);
        }
        Summary { achieved: col(&|s| s.achieved), errors: col(&|s| s.errors), v }
    }
}

fn q(h: &Option<Histogram<u64>>, quantile: f64) -> f64 {
    h.as_ref().map_or(0.0, |h| h.value_at_quantile(quantile) as f64 / 1000.0)
}

/// Tracking work per chunk, in-process: SSE line split, JSON look, phase router.
fn tracking_cost_ns(fixture: &[u8]) -> (f64, usize) {
    use meridian_proxy::relay::{RequestInfo, RequestObserver, SseDecoder};
    let metrics = Arc::new(meridian_proxy::Metrics::new());
    let family = meridian_core::ModelRegistry::builtin().unwrap().get("qwen3").cloned();
    let events: Vec<&[u8]> = fixture.split_inclusive(|b| *b == b'\n').collect();
    let rounds = 2000;
    let start = Instant::now();
    for _ in 0..rounds {
        let mut obs = RequestObserver::new(metrics.clone(), RequestInfo::new("bench", family.clone()), true);
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

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let dir = target_dir();
    let mock = spawn(&dir.join("meridian-mock-upstream"), &[]);
    let proxy = spawn(&dir.join("meridian"), &["serve", "--listen", "127.0.0.1:0", "--upstream", &mock.url]);
    let proxy_pid = proxy.child.id();
    let client =
        reqwest::Client::builder().no_proxy().tcp_nodelay(true).pool_max_idle_per_host(4096).build().unwrap();
    // Warm up connections and caches.
    for _ in 0..200 {
        let _ = one_request(&client, &mock.url).await;
        let _ = one_request(&client, &proxy.url).await;
    }
    let fixture =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../mock-upstream/fixtures/qwen3-reasoning.sse"))
            .unwrap();
    let (tracking_ns, chunks_per_stream) = tracking_cost_ns(&fixture);

    let mut rows = Vec::new();
    let mut cpu_per_chunk_us = Vec::new();
    for rate in RATES {
        let mut reps = Vec::new();
        for _ in 0..REPETITIONS {
            let metrics_before = scrape_chunks(&client, &proxy.url).await;
            let cpu_before = cpu_seconds(proxy_pid);
            let r = run_rate(&client, &mock.url, &proxy.url, rate).await;
            let cpu = cpu_seconds(proxy_pid) - cpu_before;
            let chunks = scrape_chunks(&client, &proxy.url).await - metrics_before;
            if chunks > 0.0 {
                cpu_per_chunk_us.push(cpu / chunks * 1e6);
            }
            reps.push(Summary::of(&r));
        }
        let m = Summary::median(&reps);
        let saturated = m.errors > 0.0 || m.achieved < 0.9 * f64::from(rate);
        println!(
            "rate {rate:>5}/s achieved {:>7.1}/s  ttfb p50 {:>7.3} -> {:>7.3} ms  p99 {:>7.3} -> {:>7.3} ms  e2e p50 {:>7.3} -> {:>7.3} ms  p99 {:>7.3} -> {:>7.3} ms  errors {}",
            m.achieved, m.v[0], m.v[1], m.v[2], m.v[3], m.v[4], m.v[5], m.v[6], m.v[7], m.errors
        );
        rows.push((rate, m, saturated));
        if saturated {
            break;
        }
    }
    write_report(&rows, tracking_ns, chunks_per_stream, &cpu_per_chunk_us);
    drop(proxy);
    drop(mock);
}

async fn scrape_chunks(client: &reqwest::Client, proxy: &str) -> f64 {
    let text = client.get(format!("{proxy}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with("meridian_relayed_chunks_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

fn write_report(rows: &[(u32, Summary, bool)], tracking_ns: f64, chunks: usize, cpu_us: &[f64]) {
    let mut md = String::new();
    md.push_str("# Proxy overhead\n\n");
    md.push_str(
        "Generated by `scripts/bench-proxy.sh` (`proxy/benches/relay_overhead.rs`) on the development\n",
    );
    md.push_str("machine: 2 cores, shared by the load generator, the mock upstream and the proxy.\n\n");
    let size = std::fs::metadata(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mock-upstream/fixtures/qwen3-reasoning.sse"
    ))
    .map(|m| m.len())
    .unwrap_or(0);
    md.push_str(&format!(
        "Each request streams the recorded `{FIXTURE}` vLLM response ({chunks} SSE chunks, {size} bytes) from\n\
         the mock upstream, alternately direct and through `meridian`, open-loop at each offered rate for\n\
         {SECONDS_PER_RATE} s, {REPETITIONS} times; each figure is the median over the repetitions. TTFB: request\n\
         sent to the first body byte. E2E: to the last byte. Times in ms; \"added\" is the proxied\n\
         figure minus the direct one from the same runs.\n\n"
    ));
    md.push_str("| offered req/s | achieved | TTFB p50 direct | proxied | added | TTFB p99 direct | proxied | added | E2E p50 added | E2E p99 added | errors |\n");
    md.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (rate, m, saturated) in rows {
        let v = &m.v;
        md.push_str(&format!(
            "| {rate}{} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
            if *saturated { " (saturated)" } else { "" },
            m.achieved,
            v[0],
            v[1],
            v[1] - v[0],
            v[2],
            v[3],
            v[3] - v[2],
            v[5] - v[4],
            v[7] - v[6],
            m.errors,
        ));
    }
    if let Some((rate, m, _)) = rows.iter().rev().find(|(_, _, saturated)| !saturated) {
        let ttfb = m.v[3] - m.v[2];
        let e2e = m.v[7] - m.v[6];
        md.push_str(&format!(
            "\nHighest rate sustained (achieved within 10% of offered, no errors): **{rate} req/s**, half of them\n\
             through the proxy. There the proxy adds **{ttfb:.3} ms** to p99 TTFB and **{e2e:.3} ms** to p99 E2E:\n\
             the 1 ms target is **{}**. Near saturation the three processes queue for the two cores, and\n\
             the proxied path, which crosses one more process, queues longest.\n",
            if ttfb.max(e2e) < 1.0 { "met" } else { "missed at this rate" },
        ));
    }
    md.push_str(&format!(
        "\nRelay cost per chunk:\n\n\
         - proxy CPU time per relayed chunk (all of its work: HTTP in and out, relay, tracking), median\n  over the runs: **{:.1} µs**\n\
         - of which phase tracking (SSE split, JSON look, phase router), in-process: **{:.2} µs**\n",
        median(cpu_us),
        tracking_ns / 1000.0
    ));
    md.push_str("\nTargets (issue 2): p99 added latency under 1 ms at the highest sustained rate; about 20 µs of\nrelay cost per chunk.\n");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/benchmarks/proxy-overhead.md");
    std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    std::fs::write(path, md).unwrap();
    println!(
        "tracking per chunk: {:.2} µs; proxy CPU per chunk (median): {:.1} µs",
        tracking_ns / 1000.0,
        median(cpu_us)
    );
    println!("wrote {path}");
}
