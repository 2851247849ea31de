//! The engine twin's command line: serve it, run an experiment in virtual time, or fit
//! its cost model to a load test of a real engine.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use meridian_core::sched::{POLICY_NAMES, SchedulingPolicy, policy_by_name};
use meridian_sim::server::{TwinOptions, TwinServer};
use meridian_sim::workload::WorkloadSpec;
use meridian_sim::{EngineConfig, ab, calibrate, experiment};

#[derive(Parser)]
#[command(name = "meridian-sim", version, about = "The Meridian engine twin: a simulated vLLM server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const DEFAULT_PROFILE: &str = "h100-qwen3-8b";

/// A load tester's JSON report.
fn read_report(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// What every subcommand needs to build an engine.
#[derive(clap::Args)]
struct EngineArgs {
    /// Cost-model profile from loadtest/twin/profiles.toml (default h100-qwen3-8b), or
    /// one of --profile-file's.
    #[arg(long)]
    profile: Option<String>,
    /// A TOML file of `[[profile]]` tables, e.g. written by `calibrate --profile-out`;
    /// --profile names one of them (the first when --profile is not given; a name the
    /// file lacks is an error, not a silent fallback).
    #[arg(long)]
    profile_file: Option<PathBuf>,
    /// Workload seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Workload file (default: the mix in loadtest/twin/workloads/default.toml).
    #[arg(long)]
    workload: Option<PathBuf>,
}

impl EngineArgs {
    fn profile(&self) -> Result<meridian_sim::Profile, String> {
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
    fn profile_flags(&self, resolved: &meridian_sim::Profile) -> String {
        match &self.profile_file {
            Some(path) => format!("--profile-file {} --profile {}", path.display(), resolved.name),
            None => format!("--profile {}", resolved.name),
        }
    }

    fn workload(&self) -> Result<WorkloadSpec, String> {
        self.workload
            .as_deref()
            .map_or(Ok(WorkloadSpec::default()), |p| WorkloadSpec::from_file(p).map_err(|e| e.to_string()))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve the twin as an OpenAI-compatible server in (scaled) real time.
    Serve {
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        #[arg(long, default_value = "Qwen/Qwen3-8B")]
        served_model: String,
        /// Simulated seconds per wall second.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// Scheduling policy, by name (see `meridian_core::sched::policy_by_name`).
        #[arg(long, default_value = "fcfs")]
        policy: String,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run a Poisson workload in virtual time and print what users would feel.
    Run {
        /// Requests per second.
        #[arg(long)]
        request_rate: f64,
        #[arg(long, default_value_t = 1000)]
        num_prompts: usize,
        /// Scheduling policy, by name.
        #[arg(long, default_value = "fcfs")]
        policy: String,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Multi-turn conversations with the prefix cache on: stock's LRU eviction against
    /// the hook's (a finished thought's blocks first), at each cache size and rate, the
    /// same seeds on both; prints (and optionally writes) a markdown table. Each turn's
    /// lengths come from the workload (its prompt is the new user message).
    Conversations {
        /// KV cache sizes, in blocks.
        #[arg(long, value_delimiter = ',', default_value = "1000,2000,4000")]
        kv_blocks: Vec<u32>,
        /// Conversations started per second.
        #[arg(long, value_delimiter = ',', default_value = "0.5,1")]
        rates: Vec<f64>,
        #[arg(long, default_value_t = 200)]
        conversations: u32,
        #[arg(long, default_value_t = 4)]
        turns: u32,
        #[arg(long, default_value_t = 512)]
        system_tokens: u32,
        /// Mean wait between an answer's end and the next message.
        #[arg(long, default_value_t = 5.0)]
        think_time_s: f64,
        /// Seeds, each run under both eviction orders.
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        /// Scheduling policy, by name (the same for both sides).
        #[arg(long, default_value = "fcfs")]
        policy: String,
        /// Write the table to this markdown file.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Write each cell (the medians and the median paired ratios) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Replay a recorded multi-turn run (a `meridian-loadtest --dataset-name
    /// conversations` report: each turn's lengths and the client's wait before it)
    /// through the twin's prefix cache, and set each turn's cached tokens beside the
    /// ones vLLM reported; writes JSON (per turn, and the later turns pooled).
    TraceHits {
        /// The load tester's report (its JSON).
        report: PathBuf,
        /// KV cache size, in blocks (the profile's block size).
        #[arg(long)]
        kv_blocks: u32,
        /// Tokens of the system prompt every conversation opens with.
        #[arg(long)]
        system_tokens: u32,
        /// The eviction order: `lru` (stock vLLM) or `dead-first` (the hook's).
        #[arg(long, default_value = "lru")]
        eviction: String,
        /// Scheduling policy, by name.
        #[arg(long, default_value = "fcfs")]
        policy: String,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Compare scheduling policies on the same workload at loads relative to the stock
    /// engine's capacity; prints (and optionally writes) a markdown report.
    Ab {
        /// Policies, comma-separated; a policy's own parameters may follow it
        /// (`fcfs,output-first:express=1,output_prefill_cap=128`).
        #[arg(long, default_value = "fcfs,output-first", value_parser = parse_policies)]
        policies: PolicyList,
        /// Loads as fractions of the stock engine's capacity.
        #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9,1.0")]
        loads: Vec<f64>,
        #[arg(long, default_value_t = 2000)]
        num_prompts: usize,
        /// Goodput SLO: think-to-output gap bound.
        #[arg(long, default_value_t = 200.0)]
        slo_ttot_ms: f64,
        /// Goodput SLO: bound on each request's largest gap between visible tokens.
        #[arg(long, default_value_t = 250.0)]
        slo_answer_gap_ms: f64,
        /// Goodput SLO: optional bound on each request's mean output ITL.
        #[arg(long)]
        slo_output_itl_ms: Option<f64>,
        /// After the table, write verdicts computed from it: each policy's ratios to
        /// `fcfs` per load, and whether each meets the target at --target-load (p99 TTOT
        /// >= 3x lower, p99 output ITL >= 30% lower, throughput within 5%).
        #[arg(long)]
        verdict: bool,
        /// The load the target is judged at.
        #[arg(long, default_value_t = 0.9)]
        target_load: f64,
        /// Append the report to this markdown file.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Write the cells (one per load and policy) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Loads are fractions of this rate (req/s) instead of this engine's measured
        /// stock capacity: for sides of one A/B run on different profiles.
        #[arg(long)]
        capacity: Option<f64>,
        /// Write load-vs-latency plots as `<PLOTS>-ttot-p99.svg`, `-itl-p99.svg`,
        /// `-answer-gap-p99.svg` and `-throughput.svg`; with --report, the report links
        /// them (paths relative to it).
        #[arg(long)]
        plots: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Fit the cost model to a real engine: its step trace (`--steps`, from
    /// `meridian_hook.steptrace`; exact) or a `meridian-loadtest --save-result` report
    /// (inferred from token arrival times).
    Calibrate {
        /// The load tester's JSON report.
        report: Option<PathBuf>,
        /// A step trace (JSON lines), instead of a report.
        #[arg(long, conflicts_with = "report")]
        steps: Option<PathBuf>,
        /// Write the fit, and the step-time curve of a trace, as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Plot the step-time curve of a trace (measured and fitted) as SVG here.
        #[arg(long, requires = "steps")]
        plot: Option<PathBuf>,
        /// Draw the curve from the steps scheduled in this window only (`T0,T1`, the
        /// trace's clock), say an idle engine's probe; the fit still uses every step.
        /// Repeat it for several windows (the steps in any of them), say every measured
        /// run of a set, so the curve sets the fit beside the very steps a page measured.
        #[arg(long, requires = "steps", value_parser = parse_window)]
        curve_window: Vec<(f64, f64)>,
        /// Fit without a weight-read floor (the datasheet profiles' form), to see what
        /// the floor adds.
        #[arg(long)]
        no_floor: bool,
        /// Write the fit as a twin profile (TOML) here, for `--profile-file`.
        #[arg(long)]
        profile_out: Option<PathBuf>,
        #[command(flatten)]
        limits: ProfileLimits,
    },
    /// Replay a load test's requests (send times, and the lengths the engine reported)
    /// through the twin under a policy; write each request's predicted timings as a
    /// load-test report (`meridian_sim::replay`).
    Replay {
        /// The `meridian-loadtest` JSON report whose first run is replayed.
        report: PathBuf,
        /// Scheduling policy, by name (parameters as for `ab`).
        #[arg(long, default_value = "fcfs")]
        policy: String,
        /// Where the predicted report goes.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Draw a line plot from a JSON spec on standard input
    /// (`{"title", "x_label", "y_label", "series": [{"name", "points": [[x, y], ...]}]}`).
    Plot {
        #[arg(long)]
        out: PathBuf,
    },
}

/// The engine limits a calibrated profile carries beside its cost model.
#[derive(clap::Args)]
struct ProfileLimits {
    #[arg(long, default_value = "calibrated")]
    name: String,
    #[arg(long, default_value = "unknown")]
    gpu: String,
    #[arg(long, default_value = "unknown")]
    model: String,
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    #[arg(long, default_value_t = 100_000)]
    kv_blocks: u32,
    #[arg(long, default_value_t = 256)]
    max_num_seqs: u32,
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: u32,
}

fn pick(name: &str) -> Result<Box<dyn SchedulingPolicy>, String> {
    policy_by_name(name).ok_or_else(|| format!("--policy must be one of {POLICY_NAMES:?}; got {name:?}"))
}

/// The `p`th percentile of `v`, right-aligned in 9 columns; "n/a" for no values.
fn percentile(mut v: Vec<f64>, p: f64) -> String {
    if v.is_empty() {
        return format!("{:>9}", "n/a");
    }
    v.sort_by(|a, b| a.total_cmp(b));
    format!("{:>9.1}", v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1])
}

#[tokio::main]
async fn main() -> Result<(), String> {
    match Cli::parse().command {
        Command::Serve { listen, served_model, speed, policy, engine } => {
            if !(speed.is_finite() && speed > 0.0) {
                return Err(format!("--speed must be a positive number; got {speed}"));
            }
            let opts = TwinOptions {
                listen,
                profile: engine.profile()?,
                workload: engine.workload()?,
                seed: engine.seed,
                speed,
                served_model,
            };
            let twin = TwinServer::start(opts, pick(&policy)?).await.map_err(|e| e.to_string())?;
            println!("listening on {} (engine twin, policy {})", twin.url(), twin.policy_name());
            tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
        }
        Command::Replay { report, policy, out, engine } => {
            let parsed = read_report(&report)?;
            let requests = meridian_sim::replay::requests_of(&parsed)
                .map_err(|e| format!("{}: {e}", report.display()))?;
            let predicted = meridian_sim::replay::replay(
                EngineConfig::from(&engine.profile()?),
                pick(&policy)?,
                &requests,
            );
            std::fs::write(&out, predicted.to_string()).map_err(|e| format!("{}: {e}", out.display()))?;
        }
        Command::Conversations {
            kv_blocks,
            rates,
            conversations,
            turns,
            system_tokens,
            think_time_s,
            seeds,
            policy,
            report,
            json,
            engine,
        } => {
            pick(&policy)?;
            let spec = meridian_sim::conversation::ConversationSpec {
                turn: engine.workload()?,
                turns,
                system_tokens,
                think_time_s,
            };
            let seeds: Vec<u64> = (engine.seed..engine.seed + seeds.max(1)).collect();
            let make = || pick(&policy).unwrap_or_else(|_| Box::new(meridian_core::sched::Fcfs));
            let profile = engine.profile()?;
            let cells = meridian_sim::conversation::eviction_cells(
                EngineConfig::from(&profile),
                &make,
                &spec,
                &kv_blocks,
                &rates,
                conversations,
                &seeds,
            );
            let table = format!(
                "Profile `{}`, policy `{policy}`, {conversations} conversations of {turns} turns, a \
                 {system_tokens}-token system prompt, {think_time_s} s mean think time, seeds {}-{}:\n\n{}",
                profile.name,
                seeds[0],
                seeds[seeds.len() - 1],
                meridian_sim::conversation::eviction_table(&cells)
            );
            println!("{table}");
            if let Some(path) = report {
                std::fs::write(&path, table).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if let Some(path) = json {
                let cells: Vec<serde_json::Value> = cells.iter().map(|c| c.to_json()).collect();
                std::fs::write(&path, serde_json::Value::Array(cells).to_string())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        Command::TraceHits { report, kv_blocks, system_tokens, eviction, policy, out, engine } => {
            use meridian_sim::conversation::trace;
            use meridian_sim::engine::Eviction;
            let eviction = match eviction.as_str() {
                "lru" => Eviction::Lru,
                "dead-first" => Eviction::DeadFirst,
                other => return Err(format!("--eviction {other:?}: expected lru or dead-first")),
            };
            let parsed = read_report(&report)?;
            let turns = trace::turns_of(&parsed).map_err(|e| format!("{}: {e}", report.display()))?;
            let profile = engine.profile()?;
            let block_size = profile.block_size;
            let config =
                EngineConfig { kv_blocks, prefix_cache: Some(eviction), ..EngineConfig::from(&profile) };
            let hits = trace::replay_turns(config, pick(&policy)?, &turns, system_tokens);
            let text = trace::hits_json(&hits, block_size).to_string();
            std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
        }
        Command::Run { request_rate, num_prompts, policy, engine } => {
            let profile = engine.profile()?;
            let res = experiment::run_poisson(
                EngineConfig::from(&profile),
                pick(&policy)?,
                engine.workload()?,
                request_rate,
                num_prompts,
                engine.seed,
            );
            let ms = |f: fn(&experiment::SimRecord) -> Option<f64>| {
                let v: Vec<f64> = res.records.iter().filter_map(f).map(|s| s * 1000.0).collect();
                format!("p50 {}  p99 {}", percentile(v.clone(), 50.0), percentile(v, 99.0))
            };
            let itl: Vec<f64> =
                res.records.iter().flat_map(|r| r.output_itl.iter().map(|s| s * 1000.0)).collect();
            println!(
                "profile {}, policy {policy}, {num_prompts} requests at {request_rate} req/s, seed {}",
                profile.name, engine.seed
            );
            println!("TTFT (ms)               {}", ms(|r| r.ttft));
            println!("TTFO (ms)               {}", ms(|r| r.ttfo));
            println!("think-to-output (ms)    {}", ms(|r| r.think_to_output));
            println!(
                "output ITL (ms)         p50 {}  p99 {}",
                percentile(itl.clone(), 50.0),
                percentile(itl, 99.0)
            );
            println!("largest answer gap (ms) {}", ms(experiment::SimRecord::largest_answer_gap));
            println!(
                "total token throughput  {:.0} tok/s over {:.1} s simulated",
                res.total_token_throughput(),
                res.makespan_s
            );
            println!("preemptions             {}", res.preemptions);
            println!(
                "simulated {} steps in {:.2} s wall: {:.0} steps/s",
                res.steps,
                res.wall_s,
                res.steps_per_second()
            );
        }
        Command::Ab {
            policies: PolicyList(policies),
            loads,
            num_prompts,
            slo_ttot_ms,
            slo_answer_gap_ms,
            slo_output_itl_ms,
            verdict,
            target_load,
            report,
            json,
            capacity,
            plots,
            engine,
        } => {
            let resolved = engine.profile()?;
            let (profile, flags, seed) = (&resolved.name, engine.profile_flags(&resolved), engine.seed);
            let slo = ab::JointSlo {
                ttot_ms: slo_ttot_ms,
                answer_gap_ms: slo_answer_gap_ms,
                mean_output_itl_ms: slo_output_itl_ms,
            };
            let (cap, cells) = ab::compare(
                EngineConfig::from(&resolved),
                engine.workload()?,
                &policies,
                &loads,
                num_prompts,
                seed,
                slo,
                capacity,
            )?;
            if let Some(path) = &json {
                let text =
                    serde_json::to_string_pretty(&serde_json::json!({"capacity": cap, "cells": cells}))
                        .map_err(|e| e.to_string())?;
                std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            let mut md = format!(
                "### {profile}\n\n`meridian-sim ab {flags} --policies {} --loads {} --num-prompts {num_prompts} --seed {seed}{}`\n\n{}\n",
                policies.join(","),
                loads.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(","),
                engine.workload.as_ref().map(|w| format!(" --workload {}", w.display())).unwrap_or_default(),
                ab::markdown(cap, &cells, slo)
            );
            if verdict {
                md.push_str(&ab::verdicts(
                    &cells,
                    &ab::Target { load: target_load, ..ab::Target::default() },
                ));
            }
            if let Some(stem) = &plots {
                let base = report.as_ref().and_then(|r| r.parent()).map(std::path::Path::to_path_buf);
                for (suffix, svg) in ab::plots(&cells) {
                    let path = PathBuf::from(format!("{}-{suffix}.svg", stem.display()));
                    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
                    let link = base
                        .as_ref()
                        .and_then(|b| path.strip_prefix(b).ok())
                        .map_or_else(|| path.display().to_string(), |p| p.display().to_string());
                    md.push_str(&format!("![{profile}: {suffix}]({link})\n"));
                }
                md.push('\n');
            }
            println!("{md}");
            if let Some(path) = report {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                f.write_all(md.as_bytes()).map_err(|e| e.to_string())?;
            }
        }
        Command::Calibrate { report, steps, json, plot, curve_window, no_floor, profile_out, limits } => {
            calibrate_command(report, steps, json, (plot, curve_window), no_floor, profile_out, &limits)?;
        }
        Command::Plot { out } => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| e.to_string())?;
            let spec: PlotSpec = serde_json::from_str(&text).map_err(|e| format!("plot spec: {e}"))?;
            let svg = meridian_plot::plot(&spec.title, &spec.x_label, &spec.y_label, &spec.series);
            std::fs::write(&out, svg).map_err(|e| format!("{}: {e}", out.display()))?;
        }
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct PlotSpec {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<meridian_plot::Series>,
}

fn read(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn calibrate_command(
    report: Option<PathBuf>,
    steps: Option<PathBuf>,
    json: Option<PathBuf>,
    (plot, curve_windows): (Option<PathBuf>, Vec<(f64, f64)>),
    no_floor: bool,
    profile_out: Option<PathBuf>,
    limits: &ProfileLimits,
) -> Result<(), String> {
    let (source, samples, trace) = match (&report, &steps) {
        (_, Some(path)) => {
            let trace = calibrate::read_step_trace(&read(path)?).map_err(|e| e.to_string())?;
            (path, calibrate::samples_from_steps(&trace), Some(trace))
        }
        (Some(path), None) => {
            (path, calibrate::samples_from_report(&read(path)?).map_err(|e| e.to_string())?, None)
        }
        (None, None) => return Err("calibrate needs a load-test report or --steps".into()),
    };
    let fit = if no_floor { calibrate::fit_without_floor(&samples) } else { calibrate::fit(&samples) }
        .map_err(|e| e.to_string())?;
    println!("# fitted from {} samples in {}", fit.samples, source.display());
    println!("# fit error: median |error| {:.1}%, R^2 {:.3}", fit.median_abs_pct_error, fit.r_squared);
    println!("# {}", fit.cost.describe());
    let c = &fit.cost;
    let toml = format!(
        "[[profile]]\nname = {:?}\ngpu = {:?}\nmodel = {:?}\nfixed_s = {:e}\nper_token_s = {:e}\nper_context_token_s = {:e}\nper_decode_request_s = {:e}\nper_prefill_attention_s = {:e}\nweight_read_tokens = {}\nkv_blocks = {}\nblock_size = {}\nmax_num_seqs = {}\nmax_num_batched_tokens = {}\nderivation = {:?}\n",
        limits.name,
        limits.gpu,
        limits.model,
        c.fixed_s,
        c.per_token_s,
        c.per_context_token_s,
        c.per_decode_request_s,
        c.per_prefill_attention_s,
        c.weight_read_tokens,
        limits.kv_blocks,
        limits.block_size,
        limits.max_num_seqs,
        limits.max_num_batched_tokens,
        format!(
            "meridian-sim calibrate on {} ({} samples): median |error| {:.1}%, R^2 {:.3}",
            source.display(),
            fit.samples,
            fit.median_abs_pct_error,
            fit.r_squared
        ),
    );
    println!("{toml}");
    if let Some(path) = &profile_out {
        std::fs::write(path, &toml).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let curve = trace.as_deref().map(|steps| {
        if curve_windows.is_empty() {
            return calibrate::StepCurve::of(steps);
        }
        let inside: Vec<_> = steps
            .iter()
            .filter(|s| curve_windows.iter().any(|&(t0, t1)| (t0..=t1).contains(&s.t)))
            .cloned()
            .collect();
        calibrate::StepCurve::of(&inside)
    });
    if let Some(path) = &json {
        let out = serde_json::json!({
            "fit": {
                "samples": fit.samples,
                "median_abs_pct_error": fit.median_abs_pct_error,
                "r_squared": fit.r_squared,
                "formula": fit.cost.describe(),
            },
            "curve": curve.as_ref().map(|c| c.to_json(&fit.cost)),
            // Over every step whatever the window: for comparing two engines' traces.
            "curve_all": trace.as_deref().map(|t| calibrate::StepCurve::of(t).to_json(&fit.cost)),
        });
        std::fs::write(path, out.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let (Some(path), Some(curve)) = (&plot, &curve) {
        std::fs::write(path, curve.plot(&fit.cost)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
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
struct PolicyList(Vec<String>);

fn parse_policies(s: &str) -> Result<PolicyList, String> {
    Ok(PolicyList(ab::split_policies(s)))
}
