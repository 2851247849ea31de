//! Soak: many concurrent streams held through the proxy for minutes, against the mock
//! upstream, watching what an operator would: the proxy's memory per open stream, its
//! memory and file descriptors after the streams end, and the latency it adds to new
//! requests over time. Prints as it goes and writes docs/src/benchmarks/soak.md.
//!
//!   scripts/bench-soak.sh                          10,000 streams for 10 minutes
//!   SOAK_STREAMS=2000 SOAK_MINUTES=2 scripts/bench-soak.sh
//!
//! Each stream replays a recorded vLLM answer (27 events) at one event every
//! `SOAK_INTERVAL_MS` (2,000 ms: a 54-second stream), and its client opens the next one
//! when it ends, so the count stays at its target. Clients reach the proxy over HTTP/2,
//! `SOAK_STREAMS_PER_CONN` streams per connection (as from a load balancer speaking h2):
//! this machine's per-process limit of 20,000 file descriptors cannot hold 10,000
//! HTTP/1.1 streams, which take two each in the proxy (client and upstream side). The
//! proxy reaches the mock over HTTP/1.1, one connection per stream, as it reaches vLLM.
//!
//! Added latency is measured by probes: five times a second, one short streamed request
//! straight to the mock and one through the proxy, on fresh HTTP/1.1 connections, and
//! the difference in time to first byte, per minute.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    chat_request, malloc_held, one_request, open_fds, port_of, rss_kib, sockets_by_side, spawn, target_dir,
};
use futures::StreamExt;
use hdrhistogram::Histogram;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Settings {
    streams: usize,
    minutes: f64,
    interval_ms: u64,
    per_conn: usize,
}

/// Counters the stream tasks share.
#[derive(Default)]
struct Live {
    open: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    stop: AtomicBool,
}

/// One client's stream after stream until told to stop.
async fn hold_streams(client: reqwest::Client, url: String, interval_ms: u64, live: Arc<Live>) {
    while !live.stop.load(Ordering::Relaxed) {
        live.open.fetch_add(1, Ordering::Relaxed);
        let ok = async {
            let resp = chat_request(&client, &url)
                .header("x-mock-interval-ms", interval_ms.to_string())
                .send()
                .await
                .ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let mut body = resp.bytes_stream();
            let mut last = bytes::Bytes::new();
            while let Some(chunk) = body.next().await {
                // HTTP/2 may end the body with an empty frame.
                let chunk = chunk.ok()?;
                if !chunk.is_empty() {
                    last = chunk;
                }
            }
            last.ends_with(b"data: [DONE]\n\n").then_some(())
        }
        .await;
        live.open.fetch_sub(1, Ordering::Relaxed);
        match ok {
            Some(()) => live.completed.fetch_add(1, Ordering::Relaxed),
            None => live.failed.fetch_add(1, Ordering::Relaxed),
        };
        if ok.is_none() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Time to first byte of one short streamed request on a fresh connection.
async fn probe(url: &str) -> Option<Duration> {
    let client = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build().ok()?;
    one_request(&client, url).await.ok().map(|(first_byte, _)| first_byte)
}

struct Minute {
    index: usize,
    open: u64,
    rss_mib: f64,
    fds: usize,
    direct_p50: f64,
    direct_p99: f64,
    proxied_p50: f64,
    proxied_p99: f64,
    probes: u64,
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(soak());
}

async fn soak() {
    let s = Settings {
        streams: env_or("SOAK_STREAMS", 10_000),
        minutes: env_or("SOAK_MINUTES", 10.0),
        interval_ms: env_or("SOAK_INTERVAL_MS", 2_000),
        per_conn: env_or("SOAK_STREAMS_PER_CONN", 100),
    };
    let dir = target_dir();
    let mock = spawn(&dir.join("meridian-mock-upstream"), &[]);
    let proxy = spawn(&dir.join("meridian"), &["serve", "--listen", "127.0.0.1:0", "--upstream", &mock.url]);
    let pid = proxy.child.id();

    // Baseline: after a few hundred requests, before any stream is held.
    for _ in 0..200 {
        let _ = probe(&proxy.url).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss0, fds0) = (rss_kib(pid), open_fds(pid));
    let heap0 = malloc_held(pid);
    println!("baseline: proxy RSS {:.1} MiB, {fds0} fds", rss0 as f64 / 1024.0);

    let live = Arc::new(Live::default());
    let mut tasks = Vec::new();
    let ramp = Duration::from_secs(30);
    let conns = s.streams.div_ceil(s.per_conn);
    for c in 0..conns {
        let client =
            reqwest::Client::builder().no_proxy().tcp_nodelay(true).http2_prior_knowledge().build().unwrap();
        for _ in 0..s.per_conn.min(s.streams - c * s.per_conn) {
            tasks.push(tokio::spawn(hold_streams(
                client.clone(),
                proxy.url.clone(),
                s.interval_ms,
                live.clone(),
            )));
        }
        tokio::time::sleep(ramp / conns as u32).await;
    }
    println!("ramped up: {} streams open", live.open.load(Ordering::Relaxed));

    // Hold, probing and sampling; one row per minute.
    let started = Instant::now();
    let hold = Duration::from_secs_f64(s.minutes * 60.0);
    let mut minutes: Vec<Minute> = Vec::new();
    let mut rss_samples = Vec::new();
    let mut min_open = u64::MAX;
    while started.elapsed() < hold {
        let mut direct = Histogram::<u64>::new(3).unwrap();
        let mut proxied = Histogram::<u64>::new(3).unwrap();
        let minute_end = Instant::now() + Duration::from_secs(60).min(hold.saturating_sub(started.elapsed()));
        let mut probes = 0;
        while Instant::now() < minute_end {
            let (d, p) = tokio::join!(probe(&mock.url), probe(&proxy.url));
            if let (Some(d), Some(p)) = (d, p) {
                direct.record(d.as_micros() as u64).unwrap();
                proxied.record(p.as_micros() as u64).unwrap();
                probes += 1;
            }
            let open = live.open.load(Ordering::Relaxed);
            min_open = min_open.min(open);
            rss_samples.push(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let row = Minute {
            index: minutes.len() + 1,
            open: live.open.load(Ordering::Relaxed),
            rss_mib: rss_kib(pid) as f64 / 1024.0,
            fds: open_fds(pid),
            direct_p50: ms(&direct, 0.5),
            direct_p99: ms(&direct, 0.99),
            proxied_p50: ms(&proxied, 0.5),
            proxied_p99: ms(&proxied, 0.99),
            probes,
        };
        println!(
            "minute {:>2}: {} streams open, RSS {:.1} MiB, {} fds, TTFB p50 {:.2} -> {:.2} ms, p99 {:.2} -> {:.2} ms ({} probes), {} streams completed, {} failed",
            row.index,
            row.open,
            row.rss_mib,
            row.fds,
            row.direct_p50,
            row.proxied_p50,
            row.direct_p99,
            row.proxied_p99,
            row.probes,
            live.completed.load(Ordering::Relaxed),
            live.failed.load(Ordering::Relaxed)
        );
        minutes.push(row);
    }

    // End every stream (the clients leave, as at a client-side restart), then look again.
    live.stop.store(true, Ordering::Relaxed);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    // Idle upstream connections leave the proxy's pool after 90 s idle, found by a sweep
    // that runs every 90 s: wait for both.
    let settle = env_or("SOAK_SETTLE_S", 200u64);
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let (rss1, fds1) = (rss_kib(pid), open_fds(pid));
    let heap1 = malloc_held(pid);
    let sides = sockets_by_side(pid, port_of(&proxy.url), port_of(&mock.url));
    println!(
        "after {settle} s: proxy RSS {:.1} MiB, {fds1} fds (sockets: {} from clients, {} to the upstream, {} other)",
        rss1 as f64 / 1024.0,
        sides.0,
        sides.1,
        sides.2
    );

    rss_samples.sort_unstable();
    let rss_hold = rss_samples[rss_samples.len() / 2];
    let per_stream_kib = (rss_hold.saturating_sub(rss0)) as f64 / s.streams as f64;
    let completed = live.completed.load(Ordering::Relaxed);
    let failed = live.failed.load(Ordering::Relaxed);
    let after = After { settle, rss: rss1, fds: fds1, sides, heap: heap0.zip(heap1) };
    write_report(&s, rss0, fds0, rss_hold, &after, per_stream_kib, min_open, completed, failed, &minutes);
}

/// What the allocator says about memory after the streams: in use (held minus free)
/// against the baseline's, which tells a leak from memory kept for reuse.
fn heap_line(heap: Option<((u64, u64), (u64, u64))>) -> String {
    let Some(((held0, free0), (held1, free1))) = heap else {
        return "(gdb was not found, so the allocator's own account could not be read.)".into();
    };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let (used0, used1) = (held0.saturating_sub(free0), held1.saturating_sub(free1));
    format!(
        "The allocator's own account (glibc `malloc_info`, read through gdb) tells why: of the {:.1} MiB \
         it holds, {:.1} MiB is free and kept for reuse, and the heap in use is {:.2} MiB against {:.2} MiB \
         before the streams; heap in use back to baseline (within 1 MiB): **{}**. {}",
        mib(held1),
        mib(free1),
        mib(used1),
        mib(used0),
        if used1 <= used0 + 1024 * 1024 { "met" } else { "missed" },
        if used1 <= used0 + 1024 * 1024 {
            "The memory of ended streams is freed; glibc keeps it for reuse rather than returning it \
             to the system, so RSS stays near the high-water mark."
        } else {
            "Memory of ended streams is still in use: a leak to find."
        }
    )
}

/// The proxy once every stream had ended and `settle` seconds passed.
struct After {
    settle: u64,
    rss: u64,
    fds: usize,
    /// Sockets from clients, to the upstream, other.
    sides: (usize, usize, usize),
    /// glibc's (bytes held, bytes free) before the streams and after them.
    heap: Option<((u64, u64), (u64, u64))>,
}

#[allow(clippy::too_many_arguments)]
fn write_report(
    s: &Settings,
    rss0: u64,
    fds0: usize,
    rss_hold: u64,
    after: &After,
    per_stream_kib: f64,
    min_open: u64,
    completed: u64,
    failed: u64,
    minutes: &[Minute],
) {
    let mib = |k: u64| k as f64 / 1024.0;
    let (rss1, fds1, settle) = (after.rss, after.fds, after.settle);
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    let added_p99: Vec<f64> = minutes.iter().map(|m| m.proxied_p99 - m.direct_p99).collect();
    let worst_added = added_p99.iter().copied().fold(f64::MIN, f64::max);
    let first_added = added_p99.first().copied().unwrap_or(0.0);
    let last_added = added_p99.last().copied().unwrap_or(0.0);
    let rss_back = mib(rss1) - mib(rss0);
    let first_rss = minutes.first().map_or(0.0, |m| m.rss_mib);
    let last_rss = minutes.last().map_or(0.0, |m| m.rss_mib);
    let growth = 100.0 * (last_rss - first_rss) / first_rss.max(0.001);
    let mut md = format!(
        "# Soak: {streams} streams for {minutes} minutes\n\n\
         Generated by `scripts/bench-soak.sh` (`proxy/benches/soak.rs`) on the development machine \
         ({cpus} cores), the mock upstream and the proxy as release binaries. {streams} streams are held \
         through the proxy for {minutes} minutes: each replays a recorded vLLM answer (27 events) at one \
         event every {interval} ms, and its client opens the next when it ends. Clients reach the proxy \
         over HTTP/2, {per_conn} streams per connection; the proxy reaches the mock over HTTP/1.1, one \
         connection per stream, as it reaches vLLM. (This machine's limit of 20,000 file descriptors \
         per process cannot hold {streams} HTTP/1.1 streams, which take two each in the proxy.)\n\n\
         ## Memory and file descriptors\n\n\
         | | proxy RSS (MiB) | proxy fds |\n|---|---:|---:|\n\
         | before the streams (after 200 warm-up requests) | {b:.1} | {fds0} |\n\
         | while {streams} streams were open (median of samples) | {h:.1} | {fdh} |\n\
         | {settle} s after every stream ended | {a:.1} | {fds1} |\n\n\
         - memory per open stream: **{per:.1} KiB** (median RSS while held minus the baseline, over \
         {streams} streams); goal at most 64 KiB: **{v1}**\n\
         - file descriptors after the streams ended: {fds1} against {fds0} before, back to \
         baseline: **{v2}** (open sockets then: {from_clients} from clients, {to_upstream} to the \
         upstream, {other_sockets} other)\n\
         - memory while streams ended and reopened (every stream lasts {stream_s:.0} s, so about \
         {generations:.0} generations of {streams} went through): {first_rss:.1} MiB in the first minute, \
         {last_rss:.1} MiB in the last ({growth:+.1}%): {v4}\n\
         - memory after the streams ended: RSS {rb:+.1} MiB against the baseline ({v3}). {heap_line}\n\
         - lowest count of open streams sampled during the hold: {min_open}; streams completed: \
         {completed}; failed: {failed}\n\n\
         ## Latency added to new requests, per minute\n\n\
         Five times a second one short streamed request goes straight to the mock and one through \
         the proxy, each on a fresh HTTP/1.1 connection; time to first byte in ms.\n\n\
         | minute | open streams | proxy RSS (MiB) | proxy fds | direct p50 | proxied p50 | direct p99 | proxied p99 | added p99 | probes |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        streams = s.streams,
        minutes = s.minutes,
        cpus = std::thread::available_parallelism().map_or(0, |n| n.get()),
        interval = s.interval_ms,
        per_conn = s.per_conn,
        b = mib(rss0),
        h = mib(rss_hold),
        a = mib(rss1),
        fdh = minutes.iter().map(|m| m.fds).max().unwrap_or(0),
        per = per_stream_kib,
        v1 = verdict(per_stream_kib <= 64.0),
        v2 = verdict(fds1 <= fds0 + 2),
        from_clients = after.sides.0,
        to_upstream = after.sides.1,
        other_sockets = after.sides.2,
        rb = rss_back,
        v3 = if rss1 <= rss0 + rss0 / 10 {
            "back to within 10% of the baseline".to_owned()
        } else {
            format!(
                "not back to baseline, {:.0}% of what the streams took is still resident",
                100.0 * rss_back / (mib(rss_hold) - mib(rss0)).max(0.001)
            )
        },
        heap_line = heap_line(after.heap),
        stream_s = 27.0 * s.interval_ms as f64 / 1000.0,
        generations = s.minutes * 60.0 / (27.0 * s.interval_ms as f64 / 1000.0),
        first_rss = first_rss,
        last_rss = last_rss,
        growth = growth,
        v4 = if growth <= 5.0 { "flat, no leak per stream" } else { "it grew over the run" },
    );
    for (m, added) in minutes.iter().zip(&added_p99) {
        md.push_str(&format!(
            "| {} | {} | {:.1} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:+.2} | {} |\n",
            m.index,
            m.open,
            m.rss_mib,
            m.fds,
            m.direct_p50,
            m.proxied_p50,
            m.direct_p99,
            m.proxied_p99,
            added,
            m.probes
        ));
    }
    md.push_str(&format!(
        "\nAdded p99 in the first minute {first_added:+.2} ms, in the last {last_added:+.2} ms, worst {worst_added:+.2} ms: \
         {}.\n\nReproduce: `scripts/bench-soak.sh` (or `SOAK_STREAMS=2000 SOAK_MINUTES=2 scripts/bench-soak.sh`).\n",
        if last_added <= first_added + 1.0 { "no growth over the run" } else { "it grew over the run" }
    ));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/benchmarks/soak.md");
    std::fs::write(path, &md).unwrap();
    println!("{md}\nwrote {path}");
}
