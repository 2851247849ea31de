//! A tenant that floods: do the other tenants' answers still start and stream as fast?
//! Writes docs/src/benchmarks/tenant-flood.md and its data beside it.
//!
//!   scripts/bench-tenants.sh                         3 rounds, 500 victim requests each
//!   FLOOD_ROUNDS=1 FLOOD_VICTIMS=200 scripts/bench-tenants.sh       a quick look
//!
//! The proxy (`meridian serve --twin`, the release build) runs in front of its embedded
//! engine twin (the H100 Qwen3-8B profile, real time) with admission on, the engine's
//! limit `FLOOD_STREAMS` streams. Two tenants send open-loop Poisson arrivals through it:
//! the victim at `FLOOD_VICTIM_LOAD` of the capacity measured first, the flood at
//! `FLOOD_LOAD` of it. Every request thinks `think` tokens (its `thinking_token_budget`)
//! and answers `answer` tokens (its `max_tokens`), drawn per request from the seed, so the
//! victim's requests are the same in every condition of a round. Conditions, in an order
//! rotated each round, each on a fresh proxy and twin:
//!
//! - `alone`: the victim alone, tenants on (the baseline);
//! - `fair`: victim and flood, tenants on, equal weights, no per-tenant limits: only the
//!   fair queue protects the victim;
//! - `capped`: as `fair`, the flood's tenant held to `max_streams = FLOOD_CAP` (a quarter of
//!   the engine's limit unless set): the slots the victim's traffic needs stay free;
//! - `off`: victim and flood, tenants off: one queue, first come first served.
//!
//! The headline is the victim's p99 TTFO and p99 TTOT flooded over alone, per round on the
//! same requests, with a 90% interval from resampling the victim's requests (the same ones
//! in both runs) and the rounds; a request that failed counts as slower than any. Target:
//! within 10% (ratio at most 1.10): met when the whole interval is at or below it, missed
//! when the whole interval is above, else unresolved.

use std::fmt::Write as _;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use meridian_core::ModelRegistry;
use meridian_loadtest::arrivals::{Rate, schedule};
use meridian_loadtest::client::{Api, Target};
use meridian_loadtest::dataset::{self, RandomLengths};
use meridian_loadtest::record::RequestRecord;
use meridian_loadtest::run::{Plan, run};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const VICTIM_KEY: &str = "sk-victim";
const FLOOD_KEY: &str = "sk-flood";
/// The victim's flooded tails over its unflooded ones, at most.
const TARGET_RATIO: f64 = 1.10;
const BOOTSTRAP: usize = 1000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Settings {
    rounds: usize,
    victims: usize,
    victim_load: f64,
    flood_load: f64,
    streams: u32,
    /// The flood tenant's `max_streams` in the `capped` condition.
    cap: u32,
    /// `upstream.health_interval_s`: how often the proxy reads the engine's own count.
    health_s: f64,
    lengths: RandomLengths,
}

impl Settings {
    fn from_env() -> Self {
        Settings {
            rounds: env_or("FLOOD_ROUNDS", 3),
            victims: env_or("FLOOD_VICTIMS", 500),
            victim_load: env_or("FLOOD_VICTIM_LOAD", 0.4),
            flood_load: env_or("FLOOD_LOAD", 3.0),
            streams: env_or("FLOOD_STREAMS", 32),
            cap: env_or("FLOOD_CAP", env_or("FLOOD_STREAMS", 32u32) / 4),
            health_s: env_or("FLOOD_HEALTH_S", 0.25),
            lengths: RandomLengths { input: 200, output: 100, think: Some(300), range_ratio: 0.5 },
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Condition {
    Alone,
    Fair,
    Capped,
    Off,
}

impl Condition {
    const ALL: [Condition; 4] = [Condition::Alone, Condition::Fair, Condition::Capped, Condition::Off];

    fn name(self) -> &'static str {
        match self {
            Condition::Alone => "alone",
            Condition::Fair => "fair",
            Condition::Capped => "capped",
            Condition::Off => "off",
        }
    }

    fn flooded(self) -> bool {
        self != Condition::Alone
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn sha256_hex(key: &str) -> String {
    let out =
        Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(key.as_bytes())?;
            c.wait_with_output()
        });
    let out = out.expect("sha256sum (coreutils)");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_owned()
}

/// The proxy's config for one condition.
fn config(cond: Condition, s: &Settings, dir: &Path) -> PathBuf {
    // Natural lengths far above any request's: each request's budget and max_tokens say
    // where its thought and its answer end.
    let workload = dir.join("workload.toml");
    std::fs::write(
        &workload,
        "prompt = { kind = \"fixed\", value = 200 }\n\
         think = { kind = \"fixed\", value = 100000 }\n\
         answer = { kind = \"fixed\", value = 100000 }\n",
    )
    .unwrap();
    let flood_cap =
        if cond == Condition::Capped { format!("max_streams = {}\n", s.cap) } else { String::new() };
    let text = format!(
        r#"[server]
listen = "127.0.0.1:0"
[upstream]
health_interval_s = {health}
idle_timeout_s = 120.0
first_byte_timeout_s = 120.0
[twin]
enabled = true
profile = "h100-qwen3-8b"
speed = 1.0
workload = "{workload}"
[admission]
enabled = true
max_streams = {streams}
queue_timeout_s = 60.0
max_queued = 4096
[tenants]
enabled = {enabled}
[[tenants.tenant]]
name = "victim"
api_key_sha256 = ["{victim}"]
[[tenants.tenant]]
name = "flood"
api_key_sha256 = ["{flood}"]
{flood_cap}"#,
        workload = workload.display(),
        streams = s.streams,
        health = s.health_s,
        enabled = cond != Condition::Off,
        victim = sha256_hex(VICTIM_KEY),
        flood = sha256_hex(FLOOD_KEY),
    );
    let path = dir.join(format!("{}.toml", cond.name()));
    std::fs::write(&path, text).unwrap();
    path
}

fn start_proxy(config: &Path) -> (Proc, String) {
    let bin = target_dir().join("meridian");
    let mut child = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(config)
        .env("MERIDIAN_LOG_LEVEL", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{} ({e}): run scripts/bench-tenants.sh, which builds it", bin.display()));
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("the proxy exited before listening").unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), url)
}

fn target(client: &reqwest::Client, url: &str, key: &str) -> Target {
    let registry = ModelRegistry::builtin().unwrap();
    Target {
        client: client.clone(),
        url: format!("{url}/v1/chat/completions"),
        model: "Qwen/Qwen3-8B".into(),
        api: Api::Chat,
        stream: true,
        api_key: Some(key.into()),
        extra_body: None,
        family: registry.get("qwen3").cloned(),
        ignore_eos: false,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().tcp_nodelay(true).pool_max_idle_per_host(4096).build().unwrap()
}

/// Requests a second the engine completes at its limit of streams (closed loop).
async fn capacity(s: &Settings, dir: &Path) -> f64 {
    let (_proxy, url) = start_proxy(&config(Condition::Alone, s, dir));
    let n = s.streams as usize * 8;
    let plan = Plan {
        prompts: dataset::random(n, s.lengths, 99),
        offsets: vec![0.0; n],
        max_concurrency: Some(s.streams as usize),
        duration_s: None,
        progress: false,
        label: "capacity".into(),
    };
    let out = run(&target(&client(), &url, VICTIM_KEY), &plan).await;
    let ok = out.records.iter().filter(|r| r.ok).count();
    assert!(ok == n, "capacity run: {} of {n} failed", n - ok);
    // The last requests run with a shrinking batch: count those finished while it was full.
    let mut ends: Vec<f64> = out.records.iter().filter_map(|r| r.e2e.map(|e| r.sent_at + e)).collect();
    ends.sort_by(f64::total_cmp);
    let full = ends.len() - s.streams as usize;
    full as f64 / ends[full - 1]
}

struct Run {
    cond: Condition,
    victims: Vec<RequestRecord>,
    /// The flood's requests sent, and what the proxy counted of them (tenants on).
    flood: Flood,
}

#[derive(Default)]
struct Flood {
    sent: usize,
    admitted: f64,
    refused: f64,
}

/// A sample of the proxy's metrics text.
fn sample(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn one_run(cond: Condition, round: u64, s: &Settings, cap: f64, dir: &Path) -> Run {
    let (_proxy, url) = start_proxy(&config(cond, s, dir));
    let c = client();
    let victim_rate = cap * s.victim_load;
    let victims = Plan {
        prompts: dataset::random(s.victims, s.lengths, 1000 + round),
        offsets: schedule(s.victims, Rate::Constant(victim_rate), 1.0, 2000 + round),
        max_concurrency: None,
        duration_s: None,
        progress: false,
        label: "victim".into(),
    };
    let span = victims.offsets.last().copied().unwrap_or(0.0);
    let n_flood = if cond.flooded() { (cap * s.flood_load * span).ceil() as usize } else { 0 };
    let flood = Plan {
        prompts: dataset::random(n_flood, s.lengths, 3000 + round),
        offsets: schedule(n_flood, Rate::Constant(cap * s.flood_load), 1.0, 4000 + round),
        max_concurrency: None,
        duration_s: None,
        progress: false,
        label: "flood".into(),
    };
    let (victim_target, flood_target) = (target(&c, &url, VICTIM_KEY), target(&c, &url, FLOOD_KEY));
    // The flood runs until the victim's last request ends; then it is dropped (its open
    // requests cancelled): what it does after that measures nothing.
    let v = {
        let flooding = run(&flood_target, &flood);
        tokio::pin!(flooding);
        let victims_run = run(&victim_target, &victims);
        tokio::pin!(victims_run);
        if n_flood == 0 {
            victims_run.await
        } else {
            tokio::select! {
                v = &mut victims_run => v,
                _ = &mut flooding => victims_run.await,
            }
        }
    };
    let metrics = c.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    let sent = flood.offsets.iter().filter(|o| **o <= v.duration_s).count().min(n_flood);
    let flood = Flood {
        sent,
        admitted: sample(&metrics, "meridian_tenant_admitted_total", "tenant=\"flood\""),
        refused: sample(&metrics, "meridian_tenant_refused_total", "tenant=\"flood\""),
    };
    Run { cond, victims: v.records, flood }
}

// ---------- statistics ----------

/// Nearest-rank percentile of values where a failure is `INFINITY`.
fn pct(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

type Metric = fn(&RequestRecord) -> Option<f64>;

const METRICS: [(&str, Metric); 6] = [
    ("TTFT", |r| r.ttft),
    ("TTFO", |r| r.ttfo),
    ("TTOT", |r| r.think_to_output),
    ("answer's largest gap", |r| r.max_output_gap),
    ("time per output token", |r| r.tpot),
    ("end to end", |r| r.e2e),
];

fn value(r: &RequestRecord, m: Metric) -> f64 {
    if r.ok { m(r).unwrap_or(f64::INFINITY) } else { f64::INFINITY }
}

/// The victim's percentile `p` of metric `m` over the requests `idx` of a run.
fn stat(run: &[RequestRecord], idx: &[usize], m: Metric, p: f64) -> f64 {
    let mut v: Vec<f64> = idx.iter().map(|&i| value(&run[i], m)).collect();
    pct(&mut v, p)
}

/// Paired ratio (cond over alone) across rounds, with its 90% bootstrap interval.
struct Effect {
    point: f64,
    lo: f64,
    hi: f64,
}

fn effect(pairs: &[(&[RequestRecord], &[RequestRecord])], m: Metric, p: f64) -> Effect {
    let ratio = |rounds: &[(usize, Vec<usize>)]| {
        let mut num = 0.0;
        let mut den = 0.0;
        for (r, idx) in rounds {
            let (base, cond) = pairs[*r];
            num += stat(cond, idx, m, p).ln();
            den += stat(base, idx, m, p).ln();
        }
        ((num - den) / rounds.len() as f64).exp()
    };
    let all: Vec<(usize, Vec<usize>)> =
        (0..pairs.len()).map(|r| (r, (0..pairs[r].0.len()).collect())).collect();
    let point = ratio(&all);
    let mut rng = StdRng::seed_from_u64(7);
    let mut draws: Vec<f64> = (0..BOOTSTRAP)
        .map(|_| {
            let rounds: Vec<(usize, Vec<usize>)> = (0..pairs.len())
                .map(|_| {
                    let r = rng.random_range(0..pairs.len());
                    let n = pairs[r].0.len();
                    (r, (0..n).map(|_| rng.random_range(0..n)).collect())
                })
                .collect();
            ratio(&rounds)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| draws[((q * BOOTSTRAP as f64) as usize).min(BOOTSTRAP - 1)];
    Effect { point, lo: at(0.05), hi: at(0.95) }
}

fn verdict(e: &Effect) -> &'static str {
    if e.hi <= TARGET_RATIO {
        "met"
    } else if e.lo > TARGET_RATIO {
        "missed"
    } else {
        "unresolved"
    }
}

fn ratio_text(x: f64) -> String {
    if x.is_finite() { format!("{x:.2}") } else { "∞".into() }
}

fn ms(x: f64) -> String {
    if x.is_finite() { format!("{:.0}", x * 1000.0) } else { "failed".into() }
}

fn outcomes(records: &[RequestRecord]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for r in records {
        *counts.entry(if r.ok { "ok" } else { r.outcome.as_str() }).or_default() += 1;
    }
    counts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

/// What the page's figures are made of, per request (not every token's time).
fn slim(r: &RequestRecord) -> serde_json::Value {
    json!({
        "index": r.index, "sent_at": r.sent_at, "ok": r.ok, "outcome": r.outcome, "ttft": r.ttft,
        "ttfo": r.ttfo, "think_to_output": r.think_to_output, "max_output_gap": r.max_output_gap,
        "tpot": r.tpot, "e2e": r.e2e,
    })
}

fn flood_text(f: &Flood, cond: Condition) -> String {
    match cond {
        Condition::Alone => "—".into(),
        Condition::Off => format!("{} sent", f.sent),
        _ => format!("{} sent, {:.0} let in, {:.0} refused (429)", f.sent, f.admitted, f.refused),
    }
}

fn main() {
    let s = Settings::from_env();
    assert_eq!(
        sha256_hex("test"),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "sha256sum gives SHA-256"
    );
    let dir = std::env::temp_dir().join(format!("tenant-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let started = Instant::now();
    let cap = rt.block_on(capacity(&s, &dir));
    println!("capacity at {} streams: {cap:.2} req/s", s.streams);
    let mut rounds: Vec<Vec<Run>> = Vec::new();
    for round in 0..s.rounds {
        let wanted = std::env::var("FLOOD_CONDITIONS").unwrap_or_default();
        let mut order: Vec<Condition> = Condition::ALL
            .into_iter()
            .filter(|c| {
                *c == Condition::Alone || wanted.is_empty() || wanted.split(',').any(|w| w == c.name())
            })
            .collect();
        let turn = round % order.len();
        order.rotate_left(turn);
        let mut runs = Vec::new();
        for cond in order {
            let r = rt.block_on(one_run(cond, round as u64, &s, cap, &dir));
            println!(
                "round {round} {:>6}: victim p99 TTFO {} ms, p99 TTOT {} ms ({}); flood: {}",
                cond.name(),
                ms(stat(&r.victims, &(0..r.victims.len()).collect::<Vec<_>>(), |r| r.ttfo, 99.0)),
                ms(stat(&r.victims, &(0..r.victims.len()).collect::<Vec<_>>(), |r| r.think_to_output, 99.0)),
                outcomes(&r.victims),
                flood_text(&r.flood, r.cond),
            );
            runs.push(r);
        }
        runs.sort_by_key(|r| r.cond as usize);
        rounds.push(runs);
    }
    let wall = started.elapsed().as_secs_f64();
    let page = report(&s, cap, &rounds, wall);
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/benchmarks");
    std::fs::write(out.join("tenant-flood.md"), page).unwrap();
    let data = json!({
        "settings": {
            "rounds": s.rounds, "victims": s.victims, "victim_load": s.victim_load,
            "flood_load": s.flood_load, "streams": s.streams, "capacity_rps": cap,
            "lengths": {"input": s.lengths.input, "think": s.lengths.think, "answer": s.lengths.output,
                        "range_ratio": s.lengths.range_ratio},
        },
        "rounds": rounds.iter().map(|runs| runs.iter().map(|r| json!({
            "condition": r.cond.name(),
            "victims": r.victims.iter().map(slim).collect::<Vec<_>>(),
            "flood": {"sent": r.flood.sent, "let_in": r.flood.admitted, "refused_429": r.flood.refused},
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(out.join("tenant-flood")).unwrap();
    std::fs::write(out.join("tenant-flood/runs.json"), serde_json::to_string(&data).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    println!("wrote docs/src/benchmarks/tenant-flood.md ({wall:.0} s)");
}

fn victims_of(runs: &[Run], c: Condition) -> &[RequestRecord] {
    runs.iter().find(|r| r.cond == c).map_or(&[], |r| r.victims.as_slice())
}

fn report(s: &Settings, cap: f64, rounds: &[Vec<Run>], wall_s: f64) -> String {
    let mut md = String::new();
    let cmd = format!(
        "FLOOD_ROUNDS={} FLOOD_VICTIMS={} FLOOD_VICTIM_LOAD={} FLOOD_LOAD={} FLOOD_STREAMS={} scripts/bench-tenants.sh",
        s.rounds, s.victims, s.victim_load, s.flood_load, s.streams
    );
    let think = s.lengths.think.unwrap_or(0);
    let _ = write!(
        md,
        "# A tenant that floods\n\n\
         Generated by `loadtest/tester/benches/tenant_flood.rs`; do not edit by hand. Reproduce with\n\n\
         ```text\n{cmd}\n```\n\n\
         Does a tenant that sends {flood:.1}× what the engine can serve slow another tenant's \
         answers down? The proxy (release build) runs in front of its embedded engine twin \
         (the `h100-qwen3-8b` profile, in real time) with admission on and the engine's limit \
         at {streams} streams; its capacity there, measured first in a closed loop, is \
         **{cap:.2} requests/s**. The victim tenant sends {victims} requests at {vl:.0}% of \
         that (Poisson arrivals), the flood tenant {flood:.1}× it over the same span. Every \
         request has a prompt of about {inp} tokens, thinks about {think} tokens (its \
         `thinking_token_budget`) and answers about {out} (each drawn ±{rr:.0}% per request \
         from the round's seed, so the victim's requests are the same in every condition of a \
         round). {rounds} round(s), conditions in an order rotated each round, each on a fresh \
         proxy and twin; {wall:.0} s in all.\n\n\
         - `alone`: the victim alone, tenants on: the baseline.\n\
         - `fair`: victim and flood, tenants on, equal weights, no per-tenant limit: only the \
         fair queue (and its fair eviction) stands between them.\n\
         - `capped`: as `fair`, and the flood's tenant held to `max_streams = {half}` of the engine's {streams}.\n\
         - `off`: victim and flood, `[tenants]` off: one queue, first come first served, as \
         before tenants existed.\n\n",
        flood = s.flood_load,
        streams = s.streams,
        victims = s.victims,
        vl = s.victim_load * 100.0,
        inp = s.lengths.input,
        out = s.lengths.output,
        rr = s.lengths.range_ratio * 100.0,
        rounds = s.rounds,
        wall = wall_s,
        half = s.cap,
    );
    let pairs = |c: Condition| -> Vec<(&[RequestRecord], &[RequestRecord])> {
        rounds.iter().map(|runs| (victims_of(runs, Condition::Alone), victims_of(runs, c))).collect()
    };
    let tail_ok = s.victims >= 500;
    let _ = writeln!(
        md,
        "## The headline: the victim's tails, flooded over alone\n\n\
         Paired per round on the same requests; 90% interval from resampling the victim's \
         requests and the rounds; a failed request counts as slower than any. Target: at \
         most {TARGET_RATIO:.2}.{}\n\n\
         | condition | p99 TTFO | verdict | p99 TTOT | verdict |\n|---|---:|---|---:|---|",
        if tail_ok {
            ""
        } else {
            " **With fewer than 500 victim requests a run's p99 is set by fewer than 5 requests: \
             these p99s are not tails to quote, and the verdicts are shown for the record only.**"
        }
    );
    let flooded: Vec<Condition> = [Condition::Fair, Condition::Capped, Condition::Off]
        .into_iter()
        .filter(|c| !victims_of(&rounds[0], *c).is_empty())
        .collect();
    for &c in &flooded {
        let p = pairs(c);
        let ttfo = effect(&p, METRICS[1].1, 99.0);
        let ttot = effect(&p, METRICS[2].1, 99.0);
        let _ = writeln!(
            md,
            "| `{}` | {} ({}–{}) | {} | {} ({}–{}) | {} |",
            c.name(),
            ratio_text(ttfo.point),
            ratio_text(ttfo.lo),
            ratio_text(ttfo.hi),
            verdict(&ttfo),
            ratio_text(ttot.point),
            ratio_text(ttot.lo),
            ratio_text(ttot.hi),
            verdict(&ttot),
        );
    }
    let _ = writeln!(
        md,
        "\n## Every metric the victim feels\n\n\
         Flooded over alone, paired as above: p50 and p99, with 90% intervals.\n"
    );
    let mut head = String::from("| metric |");
    let mut rule = String::from("|---|");
    for c in &flooded {
        let _ = write!(head, " `{0}` p50 | `{0}` p99 |", c.name());
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for (name, m) in METRICS {
        let mut row = format!("| {name} |");
        for &c in &flooded {
            for p in [50.0, 99.0] {
                let e = effect(&pairs(c), m, p);
                let _ = write!(row, " {} ({}–{}) |", ratio_text(e.point), ratio_text(e.lo), ratio_text(e.hi));
            }
        }
        let _ = writeln!(md, "{row}");
    }
    let _ = writeln!(
        md,
        "\n## Each run\n\n\
         The victim's own figures in ms (its p50 / p99) and how its requests ended; the \
         flood's requests sent while the victim's ran, and (tenants on) how many its \
         tenant's limits let in or refused with 429. The flood's open requests are dropped \
         when the victim's last one ends.\n\n\
         | round | condition | TTFO | TTOT | end to end | victim | flood |\n|---:|---|---:|---:|---:|---|---|"
    );
    for (i, runs) in rounds.iter().enumerate() {
        for r in runs {
            let all: Vec<usize> = (0..r.victims.len()).collect();
            let fig = |m: Metric| {
                format!("{} / {}", ms(stat(&r.victims, &all, m, 50.0)), ms(stat(&r.victims, &all, m, 99.0)))
            };
            let _ = writeln!(
                md,
                "| {i} | `{}` | {} | {} | {} | {} | {} |",
                r.cond.name(),
                fig(|r| r.ttfo),
                fig(|r| r.think_to_output),
                fig(|r| r.e2e),
                outcomes(&r.victims),
                flood_text(&r.flood, r.cond),
            );
        }
    }
    let _ = writeln!(
        md,
        "\n## Reading it\n\n\
         The fair queue acts only while requests wait in the proxy, that is while the engine \
         is at its limit, which a flood guarantees. A victim's request then waits for the next \
         free slot and for at most one of the flood's waiters (equal weights), instead of \
         behind the whole flood (`off`, where the victim's requests wait as long as the \
         flood's, up to `admission.queue_timeout_s`, or are refused at a full queue). What the \
         fair queue cannot take away is the wait for a slot itself (the victim's TTFT) and the \
         engine's larger batch: with the flood the engine always runs {streams} streams, and the \
         victim's steps are those of a full batch (its time per output token). `capped` keeps \
         {free} of the engine's slots out of the flood's reach, so the victim finds a free one at \
         once, and the batch stays smaller; its verdict holds for this cap, which leaves the \
         victim the slots its own traffic needs, and a looser cap moves it. The twin's H100 \
         profile charges every token of a step (6 ms plus 33 µs a token), while a measured H100 \
         step costs the same up to ~192 tokens ([GPU step-time curve](gpu-step-curve.md)): on a \
         GPU the batch part of the flood's cost should be smaller than here, and the wait for a \
         slot remains.\n\n\
         These are the twin's figures: the proxy, its queue and the tenants' limits are the \
         real ones (the release binary), the engine is simulated. Limits and fair shares are \
         per proxy replica ([Tenants](../architecture/tenants.md)).",
        streams = s.streams,
        free = s.streams - s.cap,
    );
    md
}
