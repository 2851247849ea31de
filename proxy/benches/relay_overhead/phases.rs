//! The measurements, one function per target of the issue, each repeated and run side
//! by side (direct, through nginx, through meridian) on the same processes.

use super::load::{Shape, Tally, closed_loop, open_loop};
use super::procs::{Usage, machine_busy_s};
use super::stats::Reps;

/// One way to the mock: its URL and the processes that carry requests there (none for
/// direct).
pub struct Path {
    pub name: &'static str,
    pub url: String,
    pub pids: Vec<u32>,
}

/// Spacing of events in the CPU runs: each event reaches the proxy on its own.
pub const CPU_INTERVAL_MS: u64 = 2;
const CPU_RATE: u32 = 500;
const CPU_SECONDS: f64 = 4.0;
/// Of the fixture's 9 reasoning events, the budget run keeps 4, then the continuation
/// replays the answer.
pub const THINK_BUDGET: u32 = 4;

/// Proxy CPU per relayed event. `paths` are (path, shape) pairs: the plain meridian, the
/// one that continues under a budget, and nginx. Keys: `cpu {name}`, `user {name}`,
/// `system {name}`, `switches {name}`, `events {name}` (per request), `errors {name}`.
pub async fn cpu_per_event(client: &reqwest::Client, paths: &[(&Path, Shape)], reps: usize, out: &mut Reps) {
    for _ in 0..reps {
        for (path, shape) in paths {
            let (before, machine) = (Usage::of(&path.pids), machine_busy_s());
            let t = open_loop(client, &path.url, shape, CPU_RATE, CPU_SECONDS).await;
            let used = Usage::of(&path.pids).since(&before);
            out.push(
                &format!("machine {}", path.name),
                (machine_busy_s() - machine) / t.elapsed.as_secs_f64(),
            );
            let events = t.events.max(1) as f64;
            let n = path.name;
            out.push(&format!("cpu {n}"), used.cpu_s() / events * 1e6);
            out.push(&format!("user {n}"), used.user_s / events * 1e6);
            out.push(&format!("system {n}"), used.system_s / events * 1e6);
            out.push(&format!("switches {n}"), used.switches as f64 / events);
            out.push(&format!("events {n}"), t.events as f64 / t.done.max(1) as f64);
            out.push(&format!("errors {n}"), t.errors as f64);
            println!(
                "cpu {n:<24} {:>6.2} µs/event ({:.2} user, {:.2} system), {:.2} switches/event, {:.1} events/request, {} errors",
                used.cpu_s() / events * 1e6,
                used.user_s / events * 1e6,
                used.system_s / events * 1e6,
                used.switches as f64 / events,
                t.events as f64 / t.done.max(1) as f64,
                t.errors
            );
        }
    }
}

/// Runs `run` once per path per repetition, the order of the paths rotated each time so
/// none always goes first, and records its figures with what the proxies add against
/// the direct run of the same repetition. `prefix` names the figures.
async fn side_by_side<F, Fut>(paths: &[&Path], reps: usize, prefix: &str, out: &mut Reps, mut run: F)
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Tally>,
{
    for rep in 0..reps {
        let mut tallies: Vec<(&Path, Tally, Usage)> = Vec::new();
        for i in 0..paths.len() {
            let path = paths[(i + rep) % paths.len()];
            let (before, machine) = (Usage::of(&path.pids), machine_busy_s());
            let t = run(path.url.clone()).await;
            out.push(
                &format!("{prefix} {} machine cores", path.name),
                (machine_busy_s() - machine) / t.elapsed.as_secs_f64(),
            );
            tallies.push((path, t, Usage::of(&path.pids).since(&before)));
        }
        let direct = tallies.iter().find(|(p, _, _)| p.pids.is_empty()).map(|(_, t, _)| t);
        for (path, t, used) in &tallies {
            let n = path.name;
            let figures = [
                ("ttfb p50", t.ttfb_ms(0.5)),
                ("ttfb p99", t.ttfb_ms(0.99)),
                ("e2e p50", t.e2e_ms(0.5)),
                ("e2e p99", t.e2e_ms(0.99)),
            ];
            for (what, v) in figures {
                out.push(&format!("{prefix} {n} {what}"), v);
            }
            if let (Some(d), false) = (direct, path.pids.is_empty()) {
                out.push(&format!("{prefix} {n} added ttfb p50"), t.ttfb_ms(0.5) - d.ttfb_ms(0.5));
                out.push(&format!("{prefix} {n} added ttfb p99"), t.ttfb_ms(0.99) - d.ttfb_ms(0.99));
                out.push(&format!("{prefix} {n} added e2e p50"), t.e2e_ms(0.5) - d.e2e_ms(0.5));
                out.push(&format!("{prefix} {n} added e2e p99"), t.e2e_ms(0.99) - d.e2e_ms(0.99));
            }
            out.push(&format!("{prefix} {n} req/s"), t.per_second());
            out.push(&format!("{prefix} {n} errors"), t.errors as f64);
            // How much of a core the proxy kept busy while its run lasted.
            out.push(&format!("{prefix} {n} cores"), used.cpu_s() / t.elapsed.as_secs_f64());
            println!(
                "{prefix:<10} {n:<9} {:>8.0} req/s  ttfb p50 {:>7.3} p99 {:>7.3}  e2e p50 {:>7.3} p99 {:>7.3} ms  {:.2} cores  {} errors",
                t.per_second(),
                t.ttfb_ms(0.5),
                t.ttfb_ms(0.99),
                t.e2e_ms(0.5),
                t.e2e_ms(0.99),
                used.cpu_s() / t.elapsed.as_secs_f64(),
                t.errors
            );
        }
    }
}

pub const LATENCY_RATE: u32 = 2_000;
pub const LATENCY_SECONDS: f64 = 3.0;

/// Latency at a fixed request rate, open-loop, plain streams back to back.
pub async fn latency_at_rate(client: &reqwest::Client, paths: &[&Path], reps: usize, out: &mut Reps) {
    let shape = Shape::plain();
    side_by_side(paths, reps, "rate", out, |url| {
        let (client, shape) = (client.clone(), shape.clone());
        async move { open_loop(&client, &url, &shape, LATENCY_RATE, LATENCY_SECONDS).await }
    })
    .await;
}

pub const SATURATION_WORKERS: usize = 64;
pub const SATURATION_SECONDS: f64 = 3.0;

/// Throughput with as many requests as `SATURATION_WORKERS` clients can keep going.
pub async fn saturation(client: &reqwest::Client, paths: &[&Path], reps: usize, out: &mut Reps) {
    let shape = Shape::plain();
    side_by_side(paths, reps, "saturation", out, |url| {
        let (client, shape) = (client.clone(), shape.clone());
        async move { closed_loop(&client, &url, &shape, SATURATION_WORKERS, SATURATION_SECONDS).await }
    })
    .await;
}

pub const BIG_PROMPT_BYTES: usize = 220_000;
pub const BIG_PROMPT_CONCURRENCY: usize = 150;
pub const BIG_PROMPT_SECONDS: f64 = 3.0;

/// 220 KB prompts from 150 concurrent clients.
pub async fn big_prompts(client: &reqwest::Client, paths: &[&Path], reps: usize, out: &mut Reps) {
    let shape = Shape::big_prompt(BIG_PROMPT_BYTES);
    side_by_side(paths, reps, "big", out, |url| {
        let (client, shape) = (client.clone(), shape.clone());
        async move { closed_loop(&client, &url, &shape, BIG_PROMPT_CONCURRENCY, BIG_PROMPT_SECONDS).await }
    })
    .await;
}
