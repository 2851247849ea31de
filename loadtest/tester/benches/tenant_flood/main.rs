//! A tenant that floods: do the other tenants' answers still start and stream as fast?
//! Writes docs/src/benchmarks/tenant-flood.md and its data beside it.
//!
//!   scripts/bench-tenants.sh                         3 rounds, 500 victim requests each
//!   FLOOD_ROUNDS=1 FLOOD_VICTIMS=200 scripts/bench-tenants.sh       a quick look
//!   FLOOD_APPEND=1 FLOOD_ROUNDS=4 ... scripts/bench-tenants.sh     4 more rounds for the page
//!
//! `FLOOD_APPEND=1` adds `FLOOD_ROUNDS` rounds after the page's kept ones (`kept.rs`),
//! sent by the capacity they were sent by, with the same settings (refused otherwise);
//! `FLOOD_NOTE` says on the page what differs in them (say, the code). `FLOOD_OUT` names
//! another folder for the page and its data (default docs/src/benchmarks).
//!
//! The proxy (`meridian serve --twin`, the release build) runs in front of its embedded
//! engine twin (real time) with admission on, the engine's limit `FLOOD_STREAMS` streams.
//! The twin steps as the H100 measured on the [GPU step-time curve] (`FLOOD_PROFILE_FILE`,
//! by default that page's fitted profile, and `FLOOD_PROFILE`, its name there), or on a
//! built-in profile (`FLOOD_PROFILE_FILE=` empty, `FLOOD_PROFILE=h100-qwen3-8b`). Two tenants send open-loop Poisson arrivals through it:
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

#[path = "../common/mod.rs"]
mod common;
mod kept;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use meridian_core::ModelRegistry;
use meridian_loadtest::arrivals::{Rate, schedule};
use meridian_loadtest::client::{Api, Target};
use meridian_loadtest::dataset::{self, RandomLengths};
use meridian_loadtest::record::RequestRecord;
use meridian_loadtest::run::{Plan, run};

use common::{Proc, client, env_or, sample, start};
use kept::Sitting;
use report::{flood_text, ms, outcomes, report};
use stats::stat;

const VICTIM_KEY: &str = "sk-victim";
const FLOOD_KEY: &str = "sk-flood";

pub(crate) struct Settings {
    pub(crate) rounds: usize,
    pub(crate) victims: usize,
    pub(crate) victim_load: f64,
    pub(crate) flood_load: f64,
    pub(crate) streams: u32,
    /// The flood tenant's `max_streams` in the `capped` condition.
    pub(crate) cap: u32,
    /// `upstream.health_interval_s`: how often the proxy reads the engine's own count.
    pub(crate) health_s: f64,
    pub(crate) lengths: RandomLengths,
    /// The twin's cost model (`twin.profile`), from `profile_file` when set.
    pub(crate) profile: String,
    /// `twin.profile_file`: a measured profile; `None`, the built-in ones.
    pub(crate) profile_file: Option<PathBuf>,
}

/// The H100's measured step-time profile (docs/src/benchmarks/gpu-step-curve.md) and its name.
pub(crate) const MEASURED_PROFILE: (&str, &str) =
    ("docs/src/benchmarks/gpu-step-curve/fitted-profile.toml", "h100-qwen3-8b-pytorch");

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
            profile: std::env::var("FLOOD_PROFILE").unwrap_or_else(|_| MEASURED_PROFILE.1.to_owned()),
            profile_file: match std::env::var("FLOOD_PROFILE_FILE") {
                Ok(f) if f.is_empty() => None,
                Ok(f) => Some(PathBuf::from(f)),
                Err(_) => Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(MEASURED_PROFILE.0)),
            },
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Condition {
    Alone,
    Fair,
    Capped,
    Off,
}

impl Condition {
    pub(crate) const ALL: [Condition; 4] =
        [Condition::Alone, Condition::Fair, Condition::Capped, Condition::Off];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Condition::Alone => "alone",
            Condition::Fair => "fair",
            Condition::Capped => "capped",
            Condition::Off => "off",
        }
    }

    pub(crate) fn flooded(self) -> bool {
        self != Condition::Alone
    }
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
profile = "{profile}"
{profile_file}speed = 1.0
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
        profile = s.profile,
        profile_file = s
            .profile_file
            .as_ref()
            .map_or(String::new(), |f| format!("profile_file = \"{}\"\n", f.display())),
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
    let config = config.to_str().unwrap();
    start(
        "meridian",
        &["serve", "--config", config],
        &[("MERIDIAN_LOG_LEVEL", "error")],
        "scripts/bench-tenants.sh",
    )
}

fn target(client: &reqwest::Client, url: &str, key: &str) -> Target {
    let registry = ModelRegistry::builtin().unwrap();
    Target {
        client: client.clone(),
        urls: [format!("{url}/v1/chat/completions")].into(),
        model: "Qwen/Qwen3-8B".into(),
        api: Api::Chat,
        stream: true,
        api_key: Some(key.into()),
        extra_body: None,
        family: registry.get("qwen3").cloned(),
        ignore_eos: false,
    }
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

pub(crate) struct Run {
    pub(crate) cond: Condition,
    pub(crate) victims: Vec<RequestRecord>,
    /// The flood's requests sent, and what the proxy counted of them (tenants on).
    pub(crate) flood: Flood,
}

#[derive(Default)]
pub(crate) struct Flood {
    pub(crate) sent: usize,
    pub(crate) admitted: f64,
    pub(crate) refused: f64,
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

/// The conditions this invocation runs (`FLOOD_CONDITIONS`, the baseline always), in
/// the order of [`Condition::ALL`].
fn conditions() -> Vec<Condition> {
    let wanted = std::env::var("FLOOD_CONDITIONS").unwrap_or_default();
    Condition::ALL
        .into_iter()
        .filter(|c| *c == Condition::Alone || wanted.is_empty() || wanted.split(',').any(|w| w == c.name()))
        .collect()
}

fn main() {
    let mut s = Settings::from_env();
    assert_eq!(
        sha256_hex("test"),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "sha256sum gives SHA-256"
    );
    let out = std::env::var("FLOOD_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/benchmarks"));
    let data_path = out.join("tenant-flood/runs.json");
    let conditions = conditions();
    let kept = if env_or("FLOOD_APPEND", 0u8) == 1 {
        let kept = kept::read(&data_path, &s).unwrap_or_else(|e| {
            eprintln!("bench-tenants: {e}");
            std::process::exit(2)
        });
        let theirs: Vec<Condition> =
            kept.rounds.first().map_or(vec![], |r| r.iter().map(|r| r.cond).collect());
        if theirs != conditions {
            let names = |c: &[Condition]| c.iter().map(|c| c.name()).collect::<Vec<_>>().join(",");
            eprintln!(
                "bench-tenants: the kept rounds ran {}, this run would run {}: set FLOOD_CONDITIONS as they had it",
                names(&theirs),
                names(&conditions)
            );
            std::process::exit(2);
        }
        Some(kept)
    } else {
        None
    };
    let dir = std::env::temp_dir().join(format!("tenant-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let started = Instant::now();
    let (cap, mut rounds, mut sittings) = match kept {
        Some(k) => {
            println!(
                "capacity at {} streams as the kept rounds were sent by: {:.2} req/s",
                s.streams, k.capacity
            );
            (k.capacity, k.rounds, k.sittings)
        }
        None => {
            let cap = rt.block_on(capacity(&s, &dir));
            println!("capacity at {} streams: {cap:.2} req/s", s.streams);
            (cap, Vec::new(), Vec::new())
        }
    };
    let first = rounds.len();
    for round in first..first + s.rounds {
        let mut order = conditions.clone();
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
    let note = std::env::var("FLOOD_NOTE").ok().filter(|n| !n.is_empty());
    sittings.push(Sitting { first, rounds: s.rounds, wall_s: started.elapsed().as_secs_f64(), note });
    s.rounds = rounds.len();
    let page = report(&s, cap, &rounds, &sittings);
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("tenant-flood.md"), page).unwrap();
    kept::write(&data_path, &s, cap, &rounds, &sittings);
    let _ = std::fs::remove_dir_all(&dir);
    let wall: f64 = sittings.iter().map(|t| t.wall_s).sum();
    println!("wrote {} ({} rounds, {wall:.0} s in all)", out.join("tenant-flood.md").display(), rounds.len());
}
