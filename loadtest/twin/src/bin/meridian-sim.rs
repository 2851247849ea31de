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

/// What every subcommand needs to build an engine.
#[derive(clap::Args)]
struct EngineArgs {
    /// Cost-model profile from loadtest/twin/profiles.toml.
    #[arg(long, default_value = "h100-qwen3-8b")]
    profile: String,
    /// Workload seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Workload file (default: the mix in loadtest/twin/workloads/default.toml).
    #[arg(long)]
    workload: Option<PathBuf>,
}

impl EngineArgs {
    fn profile(&self) -> Result<meridian_sim::Profile, String> {
        meridian_sim::profile(&self.profile).map_err(|e| e.to_string())
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
        /// Write load-vs-latency plots as `<PLOTS>-ttot-p99.svg`, `-itl-p99.svg`,
        /// `-answer-gap-p99.svg` and `-throughput.svg`; with --report, the report links
        /// them (paths relative to it).
        #[arg(long)]
        plots: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Fit the cost model to a `meridian-loadtest --save-result` report of a real engine.
    Calibrate {
        /// The JSON report.
        report: PathBuf,
    },
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
        Command::Run { request_rate, num_prompts, policy, engine } => {
            let res = experiment::run_poisson(
                EngineConfig::from(&engine.profile()?),
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
                engine.profile, engine.seed
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
            plots,
            engine,
        } => {
            let (profile, seed) = (&engine.profile, engine.seed);
            let slo = ab::JointSlo {
                ttot_ms: slo_ttot_ms,
                answer_gap_ms: slo_answer_gap_ms,
                mean_output_itl_ms: slo_output_itl_ms,
            };
            let (cap, cells) = ab::compare(
                EngineConfig::from(&engine.profile()?),
                engine.workload()?,
                &policies,
                &loads,
                num_prompts,
                seed,
                slo,
            )?;
            let mut md = format!(
                "### {profile}\n\n`meridian-sim ab --profile {profile} --policies {} --loads {} --num-prompts {num_prompts} --seed {seed}{}`\n\n{}\n",
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
        Command::Calibrate { report } => {
            let text = std::fs::read_to_string(&report).map_err(|e| format!("{}: {e}", report.display()))?;
            let samples = calibrate::samples_from_report(&text).map_err(|e| e.to_string())?;
            let fit = calibrate::fit(&samples).map_err(|e| e.to_string())?;
            println!("# fitted from {} samples in {}", fit.samples, report.display());
            println!(
                "# fit error: median |error| {:.1}%, R^2 {:.3}",
                fit.median_abs_pct_error, fit.r_squared
            );
            println!("fixed_s = {:.6}", fit.cost.fixed_s);
            println!("per_token_s = {:.9}", fit.cost.per_token_s);
            println!("per_context_token_s = {:.12}", fit.cost.per_context_token_s);
        }
    }
    Ok(())
}

/// `--policies`: a list that keeps each policy's parameters with it.
#[derive(Debug, Clone)]
struct PolicyList(Vec<String>);

fn parse_policies(s: &str) -> Result<PolicyList, String> {
    Ok(PolicyList(ab::split_policies(s)))
}
