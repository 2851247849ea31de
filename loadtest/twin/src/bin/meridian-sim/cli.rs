//! What `meridian-sim` accepts: each subcommand's arguments, as clap parses them, and the
//! engine every subcommand builds from them (a cost-model profile, a workload, a seed).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use meridian_sim::ab;
use meridian_sim::workload::WorkloadSpec;

#[derive(Parser)]
#[command(name = "meridian-sim", version, about = "The Meridian engine twin: a simulated vLLM server")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

const DEFAULT_PROFILE: &str = "h100-qwen3-8b";

/// What every subcommand needs to build an engine.
#[derive(clap::Args)]
pub struct EngineArgs {
    /// Cost-model profile from loadtest/twin/profiles.toml (default h100-qwen3-8b), or
    /// one of --profile-file's.
    #[arg(long)]
    pub profile: Option<String>,
    /// A TOML file of `[[profile]]` tables, e.g. written by `calibrate --profile-out`;
    /// --profile names one of them (the first when --profile is not given; a name the
    /// file lacks is an error, not a silent fallback).
    #[arg(long)]
    pub profile_file: Option<PathBuf>,
    /// Workload seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Workload file (default: the mix in loadtest/twin/workloads/default.toml).
    #[arg(long)]
    pub workload: Option<PathBuf>,
}

impl EngineArgs {
    pub fn profile(&self) -> Result<meridian_sim::Profile, String> {
        let Some(path) = &self.profile_file else {
            return meridian_sim::profile(self.profile.as_deref().unwrap_or(DEFAULT_PROFILE))
                .map_err(|e| e.to_string());
        };
        let all = meridian_sim::cost::profiles_from_file(path)?;
        let Some(name) = &self.profile else {
            return all.into_iter().next().ok_or_else(|| format!("{}: no [[profile]]", path.display()));
        };
        let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        let listed = names.join(", ");
        all.iter()
            .find(|p| &p.name == name)
            .cloned()
            .ok_or_else(|| format!("{}: no [[profile]] named {name:?} (it has: {listed})", path.display()))
    }

    /// The flags that select this profile, for a command line a report prints.
    pub fn profile_flags(&self, resolved: &meridian_sim::Profile) -> String {
        match &self.profile_file {
            Some(path) => format!("--profile-file {} --profile {}", path.display(), resolved.name),
            None => format!("--profile {}", resolved.name),
        }
    }

    pub fn workload(&self) -> Result<WorkloadSpec, String> {
        self.workload
            .as_deref()
            .map_or(Ok(WorkloadSpec::default()), |p| WorkloadSpec::from_file(p).map_err(|e| e.to_string()))
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve the twin as an OpenAI-compatible server in (scaled) real time.
    Serve(ServeArgs),
    /// Run a Poisson workload in virtual time and print what users would feel.
    Run(RunArgs),
    /// Multi-turn conversations with the prefix cache on: stock's LRU eviction against
    /// the hook's (a finished thought's blocks first), at each cache size and rate, the
    /// same seeds on both; prints (and optionally writes) a markdown table. Each turn's
    /// lengths come from the workload (its prompt is the new user message).
    Conversations(ConversationsArgs),
    /// Replay a recorded multi-turn run (a `meridian-loadtest --dataset-name
    /// conversations` report: each turn's lengths and the client's wait before it)
    /// through the twin's prefix cache, and set each turn's cached tokens beside the
    /// ones vLLM reported; writes JSON (per turn, and the later turns pooled).
    TraceHits(TraceHitsArgs),
    /// Compare scheduling policies on the same workload at loads relative to the stock
    /// engine's capacity; prints (and optionally writes) a markdown report.
    Ab(AbArgs),
    /// When does migration pay: the same engines as one pool against think and answer
    /// pools (answers handed over at the end of the thought, by re-prefill or by a KV
    /// connector), at loads relative to the one pool's capacity, the same seeds on both;
    /// prints (and optionally writes) a markdown table of the paired ratios.
    Migration(MigrationArgs),
    /// Fit the cost model to a real engine: its step trace (`--steps`, from
    /// `meridian_hook.steptrace`; exact) or a `meridian-loadtest --save-result` report
    /// (inferred from token arrival times).
    Calibrate(CalibrateArgs),
    /// Replay a load test's requests (send times, and the lengths the engine reported)
    /// through the twin under a policy; write each request's predicted timings as a
    /// load-test report (`meridian_sim::replay`).
    Replay(ReplayArgs),
    /// Draw a line plot from a JSON spec on standard input
    /// (`{"title", "x_label", "y_label", "series": [{"name", "points": [[x, y], ...]}]}`).
    Plot(PlotArgs),
}

/// The arguments of `meridian-sim serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    #[arg(long, default_value = "Qwen/Qwen3-8B")]
    pub served_model: String,
    /// Simulated seconds per wall second.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Scheduling policy, by name (see `meridian_core::sched::policy_by_name`).
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    /// Turn the prefix cache on, with this eviction order: `lru` (stock vLLM) or
    /// `dead-first` (the hook's); `/metrics` then counts its queries and hits under vLLM's
    /// names. Off by default, as in every real-engine run.
    #[arg(long)]
    pub prefix_cache: Option<String>,
    /// Serve the part of Meridian's policy channel a twin can (the hello, with the
    /// engine's requests by phase, and places of its limit for proxy replicas with
    /// `admission.places = "engine"`), authenticated by the secret in this environment
    /// variable (the hook's is `MERIDIAN_HOOK_TOKEN`). Point the proxy's
    /// `upstream.endpoints[].hook` at the twin's own address.
    #[arg(long)]
    pub channel_token_env: Option<String>,
    /// With the channel: hold no waits for a place (`/meridian/v1/places/wait` answers
    /// 404, as a hook that predates them does), so refused replicas ask again on their
    /// timer alone.
    #[arg(long)]
    pub no_place_waits: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Requests per second.
    #[arg(long)]
    pub request_rate: f64,
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Scheduling policy, by name.
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim conversations`.
#[derive(clap::Args)]
pub struct ConversationsArgs {
    /// KV cache sizes, in blocks.
    #[arg(long, value_delimiter = ',', default_value = "1000,2000,4000")]
    pub kv_blocks: Vec<u32>,
    /// Conversations started per second.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1")]
    pub rates: Vec<f64>,
    #[arg(long, default_value_t = 200)]
    pub conversations: u32,
    #[arg(long, default_value_t = 4)]
    pub turns: u32,
    #[arg(long, default_value_t = 512)]
    pub system_tokens: u32,
    /// Mean wait between an answer's end and the next message.
    #[arg(long, default_value_t = 5.0)]
    pub think_time_s: f64,
    /// Seeds, each run under both eviction orders.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Scheduling policy, by name (the same for both sides).
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    /// Write the table to this markdown file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write each cell (the medians and the median paired ratios) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim migration`.
#[derive(clap::Args)]
pub struct MigrationArgs {
    /// Engines in all: one pool of them, against each split.
    #[arg(long, default_value_t = 4)]
    pub engines: usize,
    /// Think engines of each split (the rest answer).
    #[arg(long, value_delimiter = ',', default_value = "2,3")]
    pub think: Vec<usize>,
    /// How an answer's KV reaches the answer engine: `reprefill`, `connector`, or both.
    #[arg(long, value_delimiter = ',', default_value = "reprefill,connector")]
    pub moves: Vec<String>,
    /// The connector's bandwidth, in GB/s (NIXL between GPUs of one node: 5-20 by
    /// nixlbench for 64-256 KiB blocks).
    #[arg(long, default_value_t = 10.0)]
    pub connector_gb_s: f64,
    /// KV bytes a token (Qwen3-8B: 36 layers x 8 KV heads x 128 x 2 x 2 bytes).
    #[arg(long, default_value_t = 147_456.0)]
    pub kv_bytes_per_token: f64,
    /// The connector's fixed cost per transfer (handshake, the export's request), in ms.
    #[arg(long, default_value_t = 5.0)]
    pub connector_fixed_ms: f64,
    /// Loads, as fractions of the one pool's capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,0.95")]
    pub loads: Vec<f64>,
    /// Requests a run.
    #[arg(long, default_value_t = 2000)]
    pub num_prompts: usize,
    /// Seeds, each run on both sides.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Scheduling policy in every engine, by name.
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    /// Write the table to this markdown file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim trace-hits`.
#[derive(clap::Args)]
pub struct TraceHitsArgs {
    /// The load tester's report (its JSON).
    pub report: PathBuf,
    /// KV cache size, in blocks (the profile's block size).
    #[arg(long)]
    pub kv_blocks: u32,
    /// Tokens of the system prompt every conversation opens with.
    #[arg(long)]
    pub system_tokens: u32,
    /// The eviction order: `lru` (stock vLLM) or `dead-first` (the hook's).
    #[arg(long, default_value = "lru")]
    pub eviction: String,
    /// Scheduling policy, by name.
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim ab`.
#[derive(clap::Args)]
pub struct AbArgs {
    /// Policies, comma-separated; a policy's own parameters may follow it
    /// (`fcfs,output-first:express=1,output_prefill_cap=128`).
    #[arg(long, default_value = "fcfs,output-first", value_parser = parse_policies)]
    pub policies: PolicyList,
    /// Loads as fractions of the stock engine's capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9,1.0")]
    pub loads: Vec<f64>,
    #[arg(long, default_value_t = 2000)]
    pub num_prompts: usize,
    /// Goodput SLO: think-to-output gap bound.
    #[arg(long, default_value_t = 200.0)]
    pub slo_ttot_ms: f64,
    /// Goodput SLO: bound on each request's largest gap between visible tokens.
    #[arg(long, default_value_t = 250.0)]
    pub slo_answer_gap_ms: f64,
    /// Goodput SLO: optional bound on each request's mean output ITL.
    #[arg(long)]
    pub slo_output_itl_ms: Option<f64>,
    /// After the table, write verdicts computed from it: each policy's ratios to
    /// `fcfs` per load, and whether each meets the target at --target-load (p99 TTOT
    /// >= 3x lower, p99 output ITL >= 30% lower, throughput within 5%).
    #[arg(long)]
    pub verdict: bool,
    /// The load the target is judged at.
    #[arg(long, default_value_t = 0.9)]
    pub target_load: f64,
    /// Append the report to this markdown file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write the cells (one per load and policy) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Loads are fractions of this rate (req/s) instead of this engine's measured
    /// stock capacity: for sides of one A/B run on different profiles.
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Write load-vs-latency plots as `<PLOTS>-ttot-p99.svg`, `-itl-p99.svg`,
    /// `-answer-gap-p99.svg` and `-throughput.svg`; with --report, the report links
    /// them (paths relative to it).
    #[arg(long)]
    pub plots: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim calibrate`.
#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// The load tester's JSON report.
    pub report: Option<PathBuf>,
    /// A step trace (JSON lines), instead of a report.
    #[arg(long, conflicts_with = "report")]
    pub steps: Option<PathBuf>,
    /// Write the fit, and the step-time curve of a trace, as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Plot the step-time curve of a trace (measured and fitted) as SVG here.
    #[arg(long, requires = "steps")]
    pub plot: Option<PathBuf>,
    /// Draw the curve from the steps scheduled in this window only (`T0,T1`, the
    /// trace's clock), say an idle engine's probe; the fit still uses every step.
    /// Repeat it for several windows (the steps in any of them), say every measured
    /// run of a set, so the curve sets the fit beside the very steps a page measured.
    #[arg(long, requires = "steps", value_parser = parse_window)]
    pub curve_window: Vec<(f64, f64)>,
    /// Fit without a weight-read floor (the datasheet profiles' form), to see what
    /// the floor adds.
    #[arg(long)]
    pub no_floor: bool,
    /// Write the fit as a twin profile (TOML) here, for `--profile-file`.
    #[arg(long)]
    pub profile_out: Option<PathBuf>,
    /// Leave the steps' spread around the fit out of the profile (its steps then take
    /// the fitted time exactly): for a trace of shapes each timed alone, say a step-time
    /// sweep, whose residuals are the fit's error by shape, not how a serving engine's
    /// steps vary.
    #[arg(long)]
    pub no_spread: bool,
    #[command(flatten)]
    pub limits: ProfileLimits,
}

/// The arguments of `meridian-sim replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The `meridian-loadtest` JSON report whose first run is replayed.
    pub report: PathBuf,
    /// Scheduling policy, by name (parameters as for `ab`).
    #[arg(long, default_value = "fcfs")]
    pub policy: String,
    /// Where the predicted report goes.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The arguments of `meridian-sim plot`.
#[derive(clap::Args)]
pub struct PlotArgs {
    #[arg(long)]
    pub out: PathBuf,
}

/// The engine limits a calibrated profile carries beside its cost model.
#[derive(clap::Args)]
pub struct ProfileLimits {
    #[arg(long, default_value = "calibrated")]
    pub name: String,
    #[arg(long, default_value = "unknown")]
    pub gpu: String,
    #[arg(long, default_value = "unknown")]
    pub model: String,
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    #[arg(long, default_value_t = 100_000)]
    pub kv_blocks: u32,
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: u32,
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: u32,
}

/// `--curve-window T0,T1`.
fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let parse = |x: &str| x.trim().parse::<f64>().map_err(|_| format!("{x:?} is not a number"));
    match s.split_once(',') {
        Some((a, b)) if parse(a)? <= parse(b)? => Ok((parse(a)?, parse(b)?)),
        _ => Err(format!("--curve-window wants T0,T1 with T0 <= T1; got {s:?}")),
    }
}

/// `--policies`: a list that keeps each policy's parameters with it.
#[derive(Debug, Clone)]
pub struct PolicyList(pub Vec<String>);

fn parse_policies(s: &str) -> Result<PolicyList, String> {
    Ok(PolicyList(ab::split_policies(s)))
}
