//! Several proxy replicas in front of the same engines: do they keep each engine within
//! its admission limit, and answer as one replica does? Writes docs/src/benchmarks/fleet.md
//! and its data beside it.
//!
//!   scripts/bench-fleet.sh                                  2 rounds
//!   FLEET_ROUNDS=1 FLEET_CONVERSATIONS=60 scripts/bench-fleet.sh      a quick look
//!   FLEET_HEALTH_S=0.05 FLEET_PAGE=fleet-fast-readings scripts/bench-fleet.sh   a variant, its own page
//!   FLEET_TURNS=8 FLEET_SYSTEM_TOKENS=100 FLEET_PAGE=fleet-long-histories scripts/bench-fleet.sh
//!                                             histories that outweigh the shared system prompt
//!   FLEET_APPEND=1 FLEET_ROUNDS=4 FLEET_ONLY=prefix-affinity/1/parts,prefix-affinity/4/engine_no_waits \
//!     scripts/bench-fleet.sh                  4 more rounds of two conditions for the page
//!
//! `FLEET_APPEND=1` adds `FLEET_ROUNDS` rounds after the page's kept ones (`kept.rs`: the
//! same settings, or it refuses; `FLEET_ROUNDS=0` writes the page again from them alone);
//! `FLEET_ONLY` runs only the conditions it names
//! (`routing/replicas/sharing`, the sharing as the data names it: `not_told`, `parts`,
//! `engine`, `engine_no_waits`; one replica is `parts`), so that a tail still unresolved
//! can gather rounds without measuring every condition again. The page says which rounds
//! ran which conditions, and each comparison pairs only the rounds that ran both.
//!
//! `FLEET_ENGINES` engine twins (`meridian-sim serve`, the H100 Qwen3-8B profile, real
//! time, prefix cache on with stock's LRU order) serve one model. In front of them run
//! 1, 2 or 4 proxy replicas (`meridian serve`, release build), each told of every engine,
//! with admission on at `FLEET_STREAMS` streams per engine and the engines' state read
//! every `FLEET_HEALTH_S`. The load tester sends a multi-turn conversation workload
//! (`--dataset-name conversations`: a shared system prompt, each turn the history with
//! the thinking dropped, each turn's conversation key in `x-session-id`), spreading the
//! requests over the replicas in turn, as a Service spreads new connections. Conditions,
//! per routing policy (`phase-aware`, the default, and `prefix-affinity`): one replica
//! (the baseline), two, four, each told how many replicas share the engines
//! (`admission.replicas`, with its `replica_index`) and, for two and four, not told (each
//! replica takes all the room it sees, as with the default of 1), asking the engines for
//! each request's place (`admission.places = "engine"`), and the same with engines that
//! hold no waits for a place (what the waits do); the order rotated each
//! round, every condition on fresh engines and proxies, the same conversations (the
//! round's seed) in each.
//!
//! Per condition: p99 TTFT, p99 TTOT, p99 answer ITL (every gap between answer tokens,
//! pooled), p99 time per output token and the p99 answer's largest gap over the baseline's on the same
//! requests (a 90% interval from resampling the requests and the rounds; target: within
//! 10%), what sets the TTOT tail and the same comparison by figures more requests set
//! (`tail.rs`), the share of prompt tokens the engines' prefix caches held (summed over the
//! engines' own counters), and the most requests any engine held at once against its
//! limit (target: never above it).

#[path = "../common/mod.rs"]
mod common;
#[path = "../tenant_flood/stats.rs"]
#[allow(dead_code)]
mod stats;

mod kept;
mod report;
mod tail;

use std::path::{Path, PathBuf};
use std::time::Instant;

use meridian_core::ModelRegistry;
use meridian_loadtest::arrivals::{Rate, schedule};
use meridian_loadtest::client::{Api, SESSION_HEADER, Target};
use meridian_loadtest::conversation::{
    ConversationPlan, ConversationRun, ConversationShape, run_conversations,
};
use meridian_loadtest::dataset::RandomLengths;
use meridian_loadtest::record::RequestRecord;

use common::{Proc, client, env_or, sample, start};

/// What builds the binaries this bench starts.
const SCRIPT: &str = "scripts/bench-fleet.sh";
/// The engines and the replicas log errors only.
const QUIET: [(&str, &str); 1] = [("MERIDIAN_LOG_LEVEL", "error")];

pub(crate) struct Settings {
    pub(crate) rounds: usize,
    pub(crate) engines: usize,
    pub(crate) streams: u32,
    pub(crate) health_s: f64,
    pub(crate) conversations: usize,
    /// Conversations started a second.
    pub(crate) rate: f64,
    pub(crate) shape: ConversationShape,
    /// The page's name under docs/src/benchmarks (`FLEET_PAGE`, for a variant's own page).
    pub(crate) page: String,
    /// Add rounds to the page's kept ones (`FLEET_APPEND=1`).
    pub(crate) append: bool,
    /// Run only these conditions (`FLEET_ONLY`); `None`: every one.
    pub(crate) only: Option<Vec<Condition>>,
}

impl Settings {
    fn from_env() -> Self {
        Settings {
            rounds: env_or("FLEET_ROUNDS", 2),
            engines: env_or("FLEET_ENGINES", 4),
            streams: env_or("FLEET_STREAMS", 8),
            health_s: env_or("FLEET_HEALTH_S", 0.25),
            conversations: env_or("FLEET_CONVERSATIONS", 240),
            rate: env_or("FLEET_RATE", 6.0),
            shape: ConversationShape {
                turn: RandomLengths { input: 60, output: 40, think: Some(120), range_ratio: 0.5 },
                turns: env_or("FLEET_TURNS", 4),
                system_tokens: env_or("FLEET_SYSTEM_TOKENS", SYSTEM_TOKENS),
                think_time_s: 1.0,
            },
            page: env_or("FLEET_PAGE", "fleet".to_owned()),
            append: match std::env::var("FLEET_APPEND").as_deref() {
                Err(_) | Ok("" | "0") => false,
                Ok("1") => true,
                Ok(other) => {
                    eprintln!(
                        "bench-fleet: FLEET_APPEND={other:?}: 1 adds rounds to the page's, 0 measures anew"
                    );
                    std::process::exit(2)
                }
            },
            only: std::env::var("FLEET_ONLY").ok().filter(|v| !v.trim().is_empty()).map(|v| {
                v.split(',')
                    .map(|name| {
                        kept::condition(name).unwrap_or_else(|| {
                            eprintln!(
                                "bench-fleet: FLEET_ONLY names {name:?}, no condition of this bench \
                                 (routing/replicas/sharing, as the page's data names them)"
                            );
                            std::process::exit(2)
                        })
                    })
                    .collect()
            }),
        }
    }
}

/// A routing policy and a setup: one run of a round.
pub(crate) type Condition = (&'static str, (usize, Sharing));

/// Every condition, in the page's order: each routing with each setup.
pub(crate) fn every_condition() -> impl Iterator<Item = Condition> {
    ROUTINGS.iter().flat_map(|r| SETUPS.iter().map(move |n| (*r, *n)))
}

/// The shared system prompt's length by default (`FLEET_SYSTEM_TOKENS`).
pub(crate) const SYSTEM_TOKENS: u32 = 400;

pub(crate) const ROUTINGS: [&str; 2] = ["phase-aware", "prefix-affinity"];

/// How the replicas share each engine's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Sharing {
    /// Not told how many they are: each takes all the room it sees (`admission.replicas = 1`).
    NotTold,
    /// Told (`admission.replicas`, `admission.replica_index`): fixed parts.
    Parts,
    /// Each request's place granted by the engine (`admission.places = "engine"`), a
    /// refused replica also waiting on the engine for one (`admission.place_waits`).
    Engine,
    /// As shipped: places granted by the engine, no waits (refused replicas ask again on
    /// their 25 ms timer alone; the engines hold none either, `meridian-sim serve
    /// --no-place-waits`, as a hook that predates them). Beside `Engine`, it measures what
    /// the waits do.
    EngineNoWaits,
}

impl Sharing {
    pub(crate) const ALL: [Sharing; 4] =
        [Sharing::NotTold, Sharing::Parts, Sharing::Engine, Sharing::EngineNoWaits];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Sharing::NotTold => "not_told",
            Sharing::Parts => "parts",
            Sharing::Engine => "engine",
            Sharing::EngineNoWaits => "engine_no_waits",
        }
    }

    /// Whether the replicas take each request's place from the engines.
    pub(crate) fn asks_the_engine(self) -> bool {
        matches!(self, Sharing::Engine | Sharing::EngineNoWaits)
    }
}

/// Replica counts, and how they share each engine's limit; one replica's
/// `admission.replicas = 1` is right, so it counts as told.
pub(crate) const SETUPS: [(usize, Sharing); 9] = [
    (1, Sharing::Parts),
    (2, Sharing::NotTold),
    (2, Sharing::Parts),
    (2, Sharing::Engine),
    (2, Sharing::EngineNoWaits),
    (4, Sharing::NotTold),
    (4, Sharing::Parts),
    (4, Sharing::Engine),
    (4, Sharing::EngineNoWaits),
];

/// The secret of the twins' policy channel, in the environment of every process.
const CHANNEL_TOKEN: (&str, &str) = ("MERIDIAN_HOOK_TOKEN", "fleet-bench");

fn start_engine(workload: &Path, sharing: Sharing) -> (Proc, String) {
    let workload = workload.to_str().unwrap();
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--profile",
        "h100-qwen3-8b",
        "--prefix-cache",
        "lru",
        "--workload",
        workload,
        "--channel-token-env",
        CHANNEL_TOKEN.0,
    ];
    if sharing == Sharing::EngineNoWaits {
        args.push("--no-place-waits");
    }
    start("meridian-sim", &args, &[QUIET[0], CHANNEL_TOKEN], SCRIPT)
}

/// The config of replica `index` of `replicas`, sharing the engines' limits as `sharing`
/// says.
fn proxy_config(
    s: &Settings,
    routing: &str,
    engines: &[String],
    dir: &Path,
    place: (usize, usize, Sharing),
) -> PathBuf {
    let (index, replicas, sharing) = place;
    let fleet = match sharing {
        Sharing::NotTold => String::new(),
        Sharing::Parts => format!("replicas = {replicas}\nreplica_index = {index}\n"),
        Sharing::Engine => "places = \"engine\"\nplace_waits = true\n".into(),
        Sharing::EngineNoWaits => "places = \"engine\"\n".into(),
    };
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[upstream]\nhealth_interval_s = {}\nidle_timeout_s = 120.0\n\
         first_byte_timeout_s = 120.0\nrouting = \"{routing}\"\n[admission]\nenabled = true\nmax_streams = {}\n\
         queue_timeout_s = 120.0\nmax_queued = 4096\n{fleet}",
        s.health_s, s.streams
    );
    for (i, url) in engines.iter().enumerate() {
        let hook = url.trim_start_matches("http://");
        text +=
            &format!("[[upstream.endpoints]]\nurl = \"{url}\"\nname = \"engine-{i}\"\nhook = \"{hook}\"\n");
    }
    let path = dir.join(format!("p{index}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// One condition's outcome.
pub(crate) struct Run {
    pub(crate) routing: &'static str,
    pub(crate) replicas: usize,
    /// How the replicas shared each engine's limit.
    pub(crate) sharing: Sharing,
    pub(crate) records: Vec<RequestRecord>,
    /// Prompt tokens the engines looked up in their prefix caches, and found there.
    pub(crate) queried: f64,
    pub(crate) hit: f64,
    /// The most requests each engine held at once.
    pub(crate) peaks: Vec<f64>,
    /// Summed over the replicas (`admission.places = "engine"`; zero otherwise).
    pub(crate) places: PlaceCounts,
    pub(crate) wall_s: f64,
}

/// What the replicas' place claims and waits came to in a run, summed over the replicas
/// (`meridian_admission_place_claims_total`, `meridian_admission_place_waits_total`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PlaceCounts {
    pub(crate) granted: f64,
    pub(crate) refused: f64,
    pub(crate) unanswered: f64,
    pub(crate) woken: f64,
    pub(crate) expired: f64,
    pub(crate) failed: f64,
}

impl PlaceCounts {
    fn add_from(&mut self, metrics: &str) {
        let claims = "meridian_admission_place_claims_total";
        let waits = "meridian_admission_place_waits_total";
        self.granted += sample(metrics, claims, "outcome=\"granted\"");
        self.refused += sample(metrics, claims, "outcome=\"refused\"");
        self.unanswered += sample(metrics, claims, "outcome=\"unanswered\"");
        self.woken += sample(metrics, waits, "outcome=\"woken\"");
        self.expired += sample(metrics, waits, "outcome=\"expired\"");
        self.failed += sample(metrics, waits, "outcome=\"failed\"");
    }
}

async fn one_run(
    routing: &'static str,
    (replicas, sharing): (usize, Sharing),
    round: u64,
    s: &Settings,
    dir: &Path,
) -> Run {
    let workload = dir.join("workload.toml");
    let engines: Vec<(Proc, String)> = (0..s.engines).map(|_| start_engine(&workload, sharing)).collect();
    let urls: Vec<String> = engines.iter().map(|(_, u)| u.clone()).collect();
    let proxies: Vec<(Proc, String)> = (0..replicas)
        .map(|r| {
            start(
                "meridian",
                &[
                    "serve",
                    "--config",
                    proxy_config(s, routing, &urls, dir, (r, replicas, sharing)).to_str().unwrap(),
                ],
                &[QUIET[0], CHANNEL_TOKEN],
                SCRIPT,
            )
        })
        .collect();
    // Every replica has read every engine once before the first request.
    tokio::time::sleep(std::time::Duration::from_secs_f64(s.health_s * 3.0 + 0.5)).await;
    let registry = ModelRegistry::builtin().unwrap();
    let target = Target {
        client: client(),
        urls: proxies.iter().map(|(_, u)| format!("{u}/v1/chat/completions")).collect(),
        model: "Qwen/Qwen3-8B".into(),
        api: Api::Chat,
        stream: true,
        api_key: None,
        extra_body: None,
        family: registry.get("qwen3").cloned(),
        ignore_eos: false,
    };
    let plan = ConversationPlan::new(s.conversations, s.shape, 500 + round);
    let run = ConversationRun {
        plan,
        offsets: schedule(s.conversations, Rate::Constant(s.rate), 1.0, 600 + round),
        max_concurrency: None,
        duration_s: None,
        sample_seeds: false,
        session_header: Some(SESSION_HEADER.into()),
        seed: 500 + round,
    };
    let started = Instant::now();
    let out = run_conversations(&target, &run).await;
    let wall_s = started.elapsed().as_secs_f64();
    let c = client();
    let (mut queried, mut hit, mut peaks) = (0.0, 0.0, Vec::new());
    for url in &urls {
        let text = c.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
        queried += sample(&text, "vllm:prefix_cache_queries_total", "");
        hit += sample(&text, "vllm:prefix_cache_hits_total", "");
        peaks.push(sample(&text, "meridian_sim_requests_peak", ""));
    }
    let mut places = PlaceCounts::default();
    for (_, url) in &proxies {
        places.add_from(&c.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap());
    }
    drop(proxies);
    drop(engines);
    Run { routing, replicas, sharing, records: out.records, queried, hit, peaks, places, wall_s }
}

fn main() {
    let s = Settings::from_env();
    let dir = std::env::temp_dir().join(format!("fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Natural lengths far above any request's: each request's budget and max_tokens say
    // where its thought and its answer end.
    std::fs::write(
        dir.join("workload.toml"),
        "prompt = { kind = \"fixed\", value = 200 }\n\
         think = { kind = \"fixed\", value = 100000 }\n\
         answer = { kind = \"fixed\", value = 100000 }\n",
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/benchmarks");
    let data_path = out.join(&s.page).join("runs.json.gz");
    if s.rounds == 0 && !s.append {
        eprintln!(
            "bench-fleet: FLEET_ROUNDS=0 measures nothing: with FLEET_APPEND=1 it writes the page again"
        );
        std::process::exit(2);
    }
    // Some conditions alone, measured anew, would leave the page without the others.
    if s.only.is_some() && !s.append && data_path.exists() {
        eprintln!(
            "bench-fleet: FLEET_ONLY without FLEET_APPEND=1 would replace {} with only the conditions named: \
             add FLEET_APPEND=1, or move the kept data away to measure anew",
            data_path.display()
        );
        std::process::exit(2);
    }
    let (mut rounds, mut sittings) = if s.append {
        kept::read(&data_path, &s).unwrap_or_else(|e| {
            eprintln!("bench-fleet: {e}");
            std::process::exit(2)
        })
    } else {
        (Vec::new(), Vec::new())
    };
    let started = Instant::now();
    let conditions: Vec<Condition> = s.only.clone().unwrap_or_else(|| every_condition().collect());
    let first = rounds.len();
    for round in first..first + s.rounds {
        let mut order = conditions.clone();
        let turn = round % order.len();
        order.rotate_left(turn);
        let mut runs = Vec::new();
        for (routing, setup) in order {
            let r = rt.block_on(one_run(routing, setup, round as u64, &s, &dir));
            let (replicas, sharing) = setup;
            println!(
                "round {round} {routing:>15} x{replicas} {}: {} requests ({} failed), hit {:.1}%, peak held {:?} of {}, places {:?}, {:.0} s",
                sharing.name(),
                r.records.len(),
                r.records.iter().filter(|x| !x.ok).count(),
                100.0 * r.hit / r.queried.max(1.0),
                r.peaks,
                s.streams,
                r.places,
                r.wall_s
            );
            runs.push(r);
        }
        runs.sort_by_key(|r| (ROUTINGS.iter().position(|x| *x == r.routing), r.replicas, r.sharing));
        rounds.push(runs);
    }
    // `FLEET_ROUNDS=0` with `FLEET_APPEND=1` writes the page again from the kept data alone.
    if s.rounds > 0 {
        sittings.push(kept::Sitting {
            first,
            rounds: s.rounds,
            wall_s: started.elapsed().as_secs_f64(),
            only: s.only.clone(),
        });
    }
    std::fs::write(out.join(format!("{}.md", s.page)), report::report(&s, &rounds, &sittings)).unwrap();
    kept::write(&data_path, &s, &rounds, &sittings);
    let _ = std::fs::remove_file(out.join(&s.page).join("runs.json"));
    let _ = std::fs::remove_dir_all(&dir);
    println!("wrote docs/src/benchmarks/{}.md ({:.0} s)", s.page, started.elapsed().as_secs_f64());
}
